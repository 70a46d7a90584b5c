"""Job and node states through the engine (``DetectionEngine.on_lifecycle``), on simulated time.

Known answers: a job that restarts warms up again (no hang while it loads);
a job that ends takes its hang with it; a node that leaves cleanly is not
lost; a node that says it joined is routed to its health detector.
"""

from __future__ import annotations

from vigil.schemas import Heartbeat, IterationTiming, JobState, NodeState, Source, from_seconds
from vigil.streams.engine.detection import DetectionEngine

T0 = 1_700_000_000.0


def step(job: str, n: int, t: float) -> IterationTiming:
    return IterationTiming(event_time=from_seconds(t), source=Source(job=job, node="n1", rank=0), step=n,
                           start=from_seconds(t - 1.0), end=from_seconds(t), duration_s=1.0)


def state(job: str, s: str, t: float) -> JobState:
    return JobState(event_time=from_seconds(t), source=Source(job=job), state=s)  # type: ignore[arg-type]


def run_steps(engine: DetectionEngine, job: str, first: int, count: int, t: float) -> float:
    for k in range(count):
        t += 1.0
        engine.on_events([step(job, first + k, t)], t)
        engine.on_events([step(job, first + k + 1, t + 0.01)], t + 0.01)  # the next step's first record closes it
        engine.tick(t)
    return t


def kinds(findings, status="raised"):
    return [(f.kind, f.subject.job or f.subject.node) for f in findings if f.status == status]


def test_a_restarting_job_warms_up_again_and_an_ended_job_takes_its_hang_with_it():
    engine = DetectionEngine()
    t = run_steps(engine, "j", 0, 20, T0)
    # the job restarts: loading a checkpoint takes 30 s, which is no hang (the warm-up's timeout)
    assert kinds(engine.on_lifecycle(state("j", "restarting", t), t)) == []
    assert [f for k in range(300) for f in kinds(engine.tick(t + 0.1 * k))] == []
    t = run_steps(engine, "j", 0, 20, t + 30.0)
    # then it hangs: found after its learned timeout
    hung = [f for k in range(100) for f in kinds(engine.tick(t + 0.1 * k))]
    assert hung == [("task_hang", "j")]
    # it is cancelled: the hang clears, and what its ranks had in flight is its past
    assert kinds(engine.on_lifecycle(state("j", "cancelled", t + 11.0), t + 11.0), "cleared") == [("task_hang", "j")]
    assert kinds(engine.on_events([step("j", 99, t + 10.5)], t + 11.5)) == []
    assert "j" not in engine.jobs


def test_a_node_that_leaves_is_not_lost_and_a_joining_node_reaches_its_health_detector():
    engine = DetectionEngine()
    for k in range(10):
        engine.on_events([Heartbeat(event_time=from_seconds(T0 + k), source=Source(node="n1"), seq=k,
                                    interval_s=1.0)], T0 + k)
    assert engine.on_lifecycle(NodeState(event_time=from_seconds(T0 + 9.5), source=Source(node="n1"),
                                         state="leaving"), T0 + 9.5) == []
    assert [f for k in range(60) for f in kinds(engine.tick(T0 + 10 + 0.1 * k))] == []
    engine.on_lifecycle(NodeState(event_time=from_seconds(T0 + 20), source=Source(node="n2"), state="joined"),
                        T0 + 20)
    assert "node_health" in engine.nodes["n2"].detectors


def test_a_job_that_ended_before_the_tick_is_not_judged_hung_by_it():
    """The worker's tick takes the states heard since the last one before its timers: a job its scheduler
    marked failed (its node was lost) a moment before its hang timeout ran out raises no hang at that tick,
    while a job still running past its timeout does."""
    from vigil.streams.config import StreamConfig
    from vigil.streams.stages import build_stages
    from vigil.streams.worker import TELEMETRY

    detect, _ = build_stages(StreamConfig(bootstrap="-"), None, TELEMETRY)
    t = run_steps(detect.engine, "ended", 0, 20, T0)
    run_steps(detect.engine, "hung", 0, 20, T0)
    t_out = t + 5.0  # past both jobs' learned timeouts (about 3 x 1 s)
    found = detect.tick(t_out, [state("ended", "failed", t_out - 0.1)])
    assert kinds(found) == [("task_hang", "hung")]


def test_a_hangs_evidence_names_the_nodes_of_its_job_not_heard_then():
    """A job on n1 and n2 stops stepping: with both nodes' heartbeats still arriving its hang names no quiet
    node (its nodes talk: no silence of theirs explains it); with n2's beats stopped too, it names n2; a node
    never heard here (another worker's, no agent) counts as quiet (nothing says it talks)."""
    def beat(node: str, k: int, t: float) -> Heartbeat:
        return Heartbeat(event_time=from_seconds(t), source=Source(node=node), seq=k, interval_s=1.0)

    for quiet in ([], ["n2"]):
        engine = DetectionEngine()
        t, k = T0, 0
        for n in range(20):  # 20 steps of 1 s, each rank's node named, both nodes beating
            t += 1.0
            for rank, node in ((0, "n1"), (1, "n2")):
                engine.on_events([IterationTiming(event_time=from_seconds(t), source=Source(job="j", node=node,
                                  rank=rank), step=n, start=from_seconds(t - 1.0), end=from_seconds(t),
                                  duration_s=1.0)], t)
            engine.on_events([beat("n1", k, t), beat("n2", k, t)], t)
            engine.tick(t)
            k += 1
        hung = []
        for i in range(1, 80):  # the job stops; n1 beats on, n2 too unless it is the quiet one
            now = t + 0.1 * i
            if i % 10 == 0:
                engine.on_events([beat("n1", k, now)] + ([] if quiet else [beat("n2", k, now)]), now)
                k += 1
            hung += [f for f in engine.tick(now) if f.kind == "task_hang" and f.status == "raised"]
        [f] = hung
        assert f.evidence["quiet_nodes"] == quiet, (quiet, f.evidence)
    # a node of the job this engine never heard
    engine = DetectionEngine()
    t = run_steps(engine, "j", 0, 20, T0)  # its steps name n1, which sends no heartbeat here
    [f] = [f for i in range(100) for f in engine.tick(t + 0.1 * i) if f.kind == "task_hang" and f.status == "raised"]
    assert f.evidence["quiet_nodes"] == ["n1"]
