"""The load generator's faults through a worker's stages on a simulated clock: each alerted once, by its cause.

Ground truth is the generator's (:attr:`LoadGenerator.injections`: every
fault it injected, its kind, target and job); the alerts are scored by the
live benchmark's own ``match``. Counts only: the clock is simulated, so no
time is asserted. Seeds are fixed, so a failure here replays exactly with
``python -m vigil.bench.pipeline replay``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from vigil.bench.pipeline.replay import replay
from vigil.sim.load import KINDS

FAULTS_PER_KIND = 6


@pytest.mark.parametrize("seed, delivery_s", [(0, 0.02), (3, 0.02), (5, 0.02), (0, 2.0)])
def test_every_injected_fault_is_alerted_once_naming_its_cause_and_nothing_else_pages(seed, delivery_s):
    """``delivery_s`` 2.0: the worker reads everything 2 s after it was written, throughout (behind its
    feed all along, as an overloaded worker is): losses and hangs are judged in the log's own time."""
    out = replay(480, seed=seed, faults_per_kind=FAULTS_PER_KIND, warmup_s=8.0, delivery_s=delivery_s,
                 load_options={"step_s": (0.4, 0.6), "slow_steps": 15})
    scored = out.scored()
    faults = scored["faults"]
    assert Counter(f["kind"] for f in faults) == {k: FAULTS_PER_KIND for k in KINDS}
    unanswered = [f for f in faults if f["delay_s"] is None or f["incidents"] != 1]
    assert unanswered == []
    # no incident that no injected fault explains (no actuator acts here, so no recovery failed either)
    assert scored["unexplained_incidents"] == {}
    assert scored["dead_letters"] == 0
    # the faults met jobs and nodes more than once: repeats are in the test, not only lone faults
    assert max(Counter(f["job"] for f in faults if f["job"]).values()) >= 2


@pytest.mark.parametrize("seed", [0, 3])
def test_a_stalled_telemetry_path_hides_no_fault_and_pages_nothing_else(seed):
    """From 20 s for 6 s nothing the agents and ranks send reaches the worker (its broker still answers it),
    then all of it arrives at once, faults injected meanwhile among it. The stall is one ``nodes_silent``
    incident told in a few versions (not one per node) and resolved when the nodes are heard again; no job
    that merely stopped being heard is paged as hung; every fault is still alerted once by its cause."""
    out = replay(480, seed=seed, faults_per_kind=FAULTS_PER_KIND, warmup_s=8.0, stall=(20.0, 6.0),
                 load_options={"step_s": (0.4, 0.6), "slow_steps": 15})
    scored = out.scored()
    in_stall = [f for f in scored["faults"] if 20.0 <= f["injected_at"] - 1.8e9 < 26.0]
    assert in_stall  # the stall hides some faults' messages: the case under test
    assert [f for f in scored["faults"] if f["delay_s"] is None or f["incidents"] != 1] == []
    assert scored["unexplained_incidents"] in ({}, {"nodes_silent": 1})  # the stall itself, told once
    silence = [a for a, _ in out.alerts if a.kind == "nodes_silent"]
    assert len({a.incident_id for a in silence}) == 1 and len(silence) <= 6 and silence[-1].status == "resolved"
