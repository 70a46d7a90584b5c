"""The load run at a small size: a real broker, a real worker, a generated cluster with faults of every kind.

Ground truth is the generator's: every fault it injected must be alerted,
once (one incident), by an alert naming its root cause (its job, its node, its
GPU); no incident may go unexplained by an injected fault except the decision
engine calling a human for a job that keeps failing. No timing is asserted.
"""

from __future__ import annotations

from collections import Counter

from vigil.bench.pipeline import live
from vigil.sim.load import KINDS


def test_every_injected_fault_is_alerted_once_naming_its_cause(tmp_path):
    point = live(480, faults_per_kind=3, seed=4, warmup_s=8.0, workdir=tmp_path,
                 load_options={"step_s": (0.4, 0.6), "slow_steps": 15})
    faults = point["faults"]
    assert Counter(f["kind"] for f in faults) == {k: 3 for k in KINDS}
    unanswered = [f for f in faults if f["delay_s"] is None or f["incidents"] != 1]
    assert unanswered == []
    assert set(point["unexplained_incidents"]) <= {"recovery_failed"}
    for kind, entry in point["latency"].items():
        assert entry["n"] == 3 and entry["missed"] == 0 and entry["p99"] is None  # no p99 from 3 samples
    assert point["records_per_s"] > 0 and point["rss_mb"] > 0 and point["lag"][0]["messages"] > 0
