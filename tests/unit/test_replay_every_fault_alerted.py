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
