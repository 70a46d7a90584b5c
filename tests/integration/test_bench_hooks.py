"""vigil bench hooks at a tiny size: the JSON has the documented shape and the end-to-end A/B fields (no timings asserted)."""

from __future__ import annotations

import json

from vigil.bench.hooks import run

MEASURES = ("wall", "cpu_main_vs_wall", "cpu_main_vs_cpu", "cpu_process_vs_wall", "cpu_process_vs_cpu", "cpu_main_extra_us")


def test_bench_hooks_tiny(kafka_bootstrap, tmp_path):
    out = tmp_path / "hooks.json"
    result = run(str(out), steps=24, block=4, world=2, hidden=32, batch=8, acf_steps=60, agent_seconds=2.0,
                 real_steps=12, real_block=3, real_hidden=64, real_batch=16, seed=3, bootstrap=kafka_bootstrap)
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(result))
    assert {"overhead_pct", "overhead_ci95", "overhead_target_met", "acf_rel_error", "agent_cpu_pct", "command",
            "loadavg_before", "loadavg_after", "detail"} == set(data)
    d = data["detail"]
    assert set(d["end_to_end"]) == {"short", "realistic"}
    for ab in d["end_to_end"].values():
        assert ab["pairs"] >= 1 and ab["seed"] == 3 and ab["level"] == 0.95
        for name in MEASURES:
            m = ab[name]
            assert m["ci"][0] <= m["median"] <= m["ci"][1]
            assert len(m["estimates"]) == ab["pairs"] and m["spread"] >= 0
        assert all(v > 0 for v in ab["step_ms"].values())
        assert len(ab["loadavg_before"]) == 3 and len(ab["loadavg_after"]) == 3
        assert ab["batcher_cpu_s"] >= 0 and ab["batcher_cpu_pct_of_core"] >= 0
    assert d["end_to_end"]["realistic"]["hidden"] == 64
    # the headline is the realistic step's end-to-end figure (never the isolated one), with its interval
    real = d["end_to_end"]["realistic"]["cpu_main_vs_wall"]
    assert data["overhead_pct"] == real["median"] and data["overhead_ci95"] == real["ci"]
    assert data["overhead_target_met"] == (real["ci"][1] <= 1.0)
    assert d["overhead"]["denominator_ms"] == d["end_to_end"]["realistic"]["step_ms"]["wall_off"]
    assert len(data["loadavg_before"]) == 3 and len(data["loadavg_after"]) == 3
    # the hooks ran the new timing: compute from marked blocks on the host clock
    assert "compute_s=cpu_wall" in d["measured_as"] and "wait_s=cpu_wall" in d["measured_as"]
    # The keys the CLI table reads.
    for key in ("hook_cost_us_per_step", "ab_overhead_pct", "ab_pair_spread_pct", "step_ms_off_median"):
        assert key in d
    assert d["hook_events_published"] > 0 and len(d["loadavg_end"]) == 3
