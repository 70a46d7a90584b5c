"""The simulator publishes each job's state as a scheduler would: running at the start, and how it ended."""

from __future__ import annotations

from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import JobState, to_seconds

NODES = [f"n{i}" for i in range(6)]
JOBS = [SimJob("a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.4),
        SimJob("b", ("n2", "n3"), dp=2, pp=2, tp=4, iteration_s=0.2),
        SimJob("c", ("n4", "n5"), dp=1, pp=1, tp=8, iteration_s=0.3)]


def _states(groups) -> list[JobState]:
    return [e for g in groups for e in g if isinstance(e, JobState)]


def test_every_job_starts_running_with_its_size_and_ends_completed_or_failed():
    faults = [Fault("node_loss", "n1", at=5.0),                      # a: stopped for good
              Fault("hang", "b", at=4.0, recover_at=6.0),            # b: hangs, then trains again
              Fault("process_exit", "c", at=8.0)]                    # c: a rank died, never restarted
    sim = ClusterSimulator(NODES, JOBS, faults, start=1000.0, job_states=True)
    first = sim.advance(1000.0)
    started = _states(first)
    assert [(s.source.job, s.state, to_seconds(s.event_time)) for s in started] == \
        [("a", "running", 1000.0), ("b", "running", 1000.0), ("c", "running", 1000.0)]
    for s, job in zip(started, JOBS):
        assert (s.nodes, s.gpus, s.dp, s.pp, s.tp) == (list(job.nodes), job.dp * job.pp * job.tp, job.dp, job.pp,
                                                       job.tp)
    assert not _states(sim.advance(1010.0))  # no state changes while they run
    ended = _states(sim.finish(1012.0))
    assert {s.source.job: s.state for s in ended} == {"a": "failed", "b": "completed", "c": "failed"}
    assert {to_seconds(s.event_time) for s in ended} == {1012.0}
    assert sim.advance(1100.0) == []  # the cluster stopped


def test_without_job_states_nothing_changes():
    sim = ClusterSimulator(NODES, JOBS, [], start=1000.0)
    assert not _states(sim.advance(1010.0)) and not _states(sim.finish(1011.0))
