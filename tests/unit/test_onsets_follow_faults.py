"""An incident's onset is when its fault began, never before it.

The simulator knows when each slowdown took effect (``Fault.onset_at``: the
start of the first slowed step); every finding of the incident it causes,
and so the incident's onset (the earliest of them), must come at or after it.
A straggler localized over a window of steps sampled every ``quiet_every``
steps used to take the window's first step as its onset: up to ~20 s before
the fault in ``vigil demo`` (issue 16, point 7).
"""

from __future__ import annotations

import pytest

from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import to_seconds
from vigil.streams.engine.pipeline import InProcessPipeline

TICK = 0.05


def _play(sim: ClusterSimulator, seconds: float):
    pipe = InProcessPipeline()
    alerts = []
    t = sim.start
    while t < sim.start + seconds:
        t += TICK
        for group in sim.advance(t):
            alerts.extend(pipe.feed(group, t))
        alerts.extend(pipe.tick(t))
    return alerts


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("step_batches", [True, False])
def test_a_slow_gpus_incident_and_every_finding_in_it_begin_after_the_fault(seed, step_batches):
    nodes = [f"n{i}" for i in range(4)]
    # 0.3 s steps for 40 s: the straggler detector's quiet sampling (every 16th step) spans
    # ~38 s of history when the GPU slows down.
    job = SimJob("j", tuple(nodes), dp=4, pp=1, tp=8, iteration_s=0.3)
    fault = Fault("gpu_slow", "n2", at=40.0, gpu=2, slowdown=0.4)
    sim = ClusterSimulator(nodes, [job], [fault], start=10_000.0, seed=seed, telemetry_interval_s=1.0,
                           step_batches=step_batches, node_batches=True)
    alerts = _play(sim, 55.0)
    assert fault.onset_at is not None and fault.injected_at is not None
    about = [a for a in alerts if a.subject.node == "n2" or a.subject.job == "j"]
    assert about, "the slow GPU was not reported"
    kinds = {e["kind"] for a in about for e in a.evidence}
    assert "straggler" in kinds, f"no straggler localized (evidence kinds {kinds})"
    for a in about:
        assert to_seconds(a.onset_time) >= fault.injected_at, (a.kind, to_seconds(a.onset_time) - fault.injected_at)
        for e in a.evidence:
            from datetime import datetime

            onset = datetime.fromisoformat(e["onset"]).timestamp()
            assert onset >= fault.injected_at, (e["kind"], onset - fault.injected_at)
