"""``vigil analyze``: profiler traces to per-rank step records to a verdict.

``tests/fixtures/kineto/rank*.json`` are torch.profiler's own traces of a real
job (gloo, CPU, 8 processes: dp 4 x pp 2; see ``make_traces.py`` there) in
which rank 1 does twice the matrix products of its peers. No GPU exists
here, so the GPU-trace path is tested on a small trace written by hand in
Kineto's layout (its name says so).
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vigil.analyze import analyze, load_trace, step_records
from vigil.cli import app

KINETO = Path(__file__).parents[1] / "fixtures" / "kineto"


def test_real_cpu_traces_name_the_slow_worker():
    a = analyze([KINETO], grid=(4, 2, 1))
    assert (a.localization.culprit, a.localization.location) == ("worker", ("rank", 1))
    assert a.steps == [2, 3, 4, 5, 6] and not a.gpu
    med = {r["rank"]: r for r in a.to_dict()["per_rank_median"]}
    peers = statistics.median(med[r]["compute"] for r in (0, 2, 3))
    assert 1.5 < med[1]["compute"] / peers < 2.5  # it did twice the work
    assert med[1]["comm"] == min(med[r]["comm"] for r in range(4))  # it arrives last at the all-reduce
    assert med[5]["wait"] > max(med[r]["wait"] for r in (4, 6, 7))  # its stage-1 partner waits for it
    for it in a.records:  # figures are unions: never more than the step
        for r in it:
            assert r["compute"] + r["comm"] + r["wait"] <= r["step_s"] * 1.001


def test_trace_reading_keeps_torchs_layout_and_gzip(tmp_path):
    tr = load_trace(KINETO / "rank4.json")
    assert tr.rank == 4 and tr.world_size == 8 and sorted(tr.steps) == [2, 3, 4, 5, 6]
    assert tr.comm and tr.wait and tr.compute
    gz = tmp_path / "worker4.pt.trace.json.gz"
    gz.write_bytes(gzip.compress((KINETO / "rank4.json").read_bytes()))
    assert step_records(load_trace(gz), (4, 2, 1)) == step_records(tr, (4, 2, 1))


def test_grid_must_match_the_world():
    with pytest.raises(ValueError, match="world of 8"):
        analyze([KINETO], grid=(3, 2, 1))


def test_cli_prints_the_verdict_and_writes_json(tmp_path):
    out = tmp_path / "verdict.json"
    res = CliRunner().invoke(app, ["analyze", str(KINETO), "--pp", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "verdict: worker at ('rank', 1)" in res.output
    d = json.loads(out.read_text())
    assert d["culprit"] == "worker" and d["grid"] == [4, 2, 1] and len(d["per_rank_median"]) == 8


def _synthetic_gpu_trace(rank: int, slow: float) -> dict:
    """A hand-written trace in Kineto's layout (no GPU here): CPU steps launch kernels that run later."""
    ev = []
    corr = 0
    for step in range(1, 4):
        t0 = step * 100_000.0  # microseconds
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": 1_000.0})
        gpu_t = t0 + 5_000.0  # the GPU runs this step's kernels after the CPU's step has ended
        for name, dur in (("void gemm_kernel", 20_000.0 * slow), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 8_000.0),
                          ("ncclDevKernel_SendRecv(x)", 3_000.0), ("void elementwise_kernel", 10_000.0)):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t0 + corr % 4 * 100.0, "dur": 5.0, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": gpu_t, "dur": dur,
                       "args": {"correlation": corr, "stream": 7}})
            gpu_t += dur
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": ev}


def test_synthetic_gpu_trace_kernels_count_in_the_step_that_launched_them(tmp_path):
    for r, slow in ((0, 1.0), (1, 1.5)):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(_synthetic_gpu_trace(r, slow)))
    tr = load_trace(tmp_path / "rank1.json")
    assert tr.gpu
    recs = step_records(tr, (2, 1, 1))
    assert set(recs) == {1, 2, 3}
    assert recs[2]["compute"] == pytest.approx(0.030 + 0.010)  # gemm (1.5 x 20 ms) + elementwise
    assert recs[2]["comm"] == pytest.approx(0.008) and recs[2]["wait"] == pytest.approx(0.003)
