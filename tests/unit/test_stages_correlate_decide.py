"""The correlate and decide stages and the flow that joins them, on scripted findings, results and states."""

from __future__ import annotations

from vigil.detectors.chain import RunChain
from vigil.schemas import ActionResult, JobState, Source, Subject, from_seconds
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.detection import detector_finding
from vigil.streams.engine.escalation import Escalation
from vigil.streams.engine.incidents import Correlator
from vigil.streams.stages import AlertFlow, CorrelateStage, DecideStage

T = 1000.0


def flow(decide: bool = True, chain_timeout_s: float = 30.0) -> AlertFlow:
    correlator = Correlator()
    decider = DecisionEngine(Escalation(), recovered=correlator.recovered)
    return AlertFlow(CorrelateStage(correlator, chain=RunChain(timeout_s=chain_timeout_s)),
                     DecideStage(decider) if decide else None)


def crash(at: float, rank: int = 3):
    return detector_finding("raised", "process_exit", 2, Subject(job="gpt", node="n1", rank=rank), at, "t", "1",
                            {}, "c", ["n1", "n2"], at + 1, [], None)


def job(state: str, at: float, run: str | None = None) -> JobState:
    return JobState(event_time=from_seconds(at), source=Source(cluster="c", job="gpt"), state=state,
                    nodes=["n1", "n2"], run=run)


def result(decision, state: str, at: float) -> ActionResult:
    return ActionResult(event_time=from_seconds(at), source=Source(cluster="c"), decision_id=decision.decision_id,
                        state=state, backend="stub")


def shape(events) -> list[tuple]:
    return [(e.event_type, e.kind, e.status) if e.event_type == "alert" else (e.event_type, e.action)
            if e.event_type == "decision" else (e.event_type, e.kind) for e in events]


def test_each_alert_is_followed_by_its_decision():
    f = flow()
    f.on_feedback(job("running", T), T, live=True)
    assert shape(f.on_findings([crash(T + 2)], T + 2)) == [("alert", "process_exit", "open"),
                                                           ("decision", "restart_process")]


def test_without_a_decide_stage_alerts_only():
    f = flow(decide=False)
    f.on_feedback(job("running", T), T, live=True)
    assert shape(f.on_findings([crash(T + 2)], T + 2)) == [("alert", "process_exit", "open")]


def test_an_alert_already_on_its_topic_is_neither_published_nor_decided_again():
    first = flow()
    first.on_feedback(job("running", T), T, live=True)
    published = first.on_findings([crash(T + 2)], T + 2)
    second = flow()  # a takeover: it read the alert and the decision back from their topics
    second.on_feedback(job("running", T), T, live=True)
    second.learn_published(published)
    assert second.on_findings([crash(T + 2)], T + 2) == []
    # not decided again: the failed restart it knows nothing of escalates nothing
    assert second.on_feedback(result(published[1], "failed", T + 5), T + 5, live=True) == []


def test_a_replay_decides_without_publishing_and_the_state_is_the_live_ones():
    live, replayed = flow(), flow()
    for f in (live, replayed):
        f.on_feedback(job("running", T), T, live=True)
    decision = live.on_findings([crash(T + 2)], T + 2)[1]
    assert replayed.on_findings([crash(T + 2)], T + 2, replay=True) == []
    # the restart failed: both escalate to the same reconfigure (same decision id)
    a = live.on_feedback(result(decision, "failed", T + 5), T + 5, live=True)
    b = replayed.on_feedback(result(decision, "failed", T + 5), T + 5, live=True)
    assert shape(a) == [("decision", "reconfigure")] and [e.event_id for e in a] == [e.event_id for e in b]


def test_feedback_not_live_updates_state_and_publishes_nothing():
    live, quiet = flow(), flow()
    for f in (live, quiet):
        f.on_feedback(job("running", T), T, live=True)
    decision = live.on_findings([crash(T + 2)], T + 2)[1]
    quiet.on_findings([crash(T + 2)], T + 2)
    failed = result(decision, "failed", T + 5)
    reconfigure = live.on_feedback(failed, T + 5, live=True)[0]
    assert quiet.on_feedback(failed, T + 5, live=False) == []  # heard from before the worker started
    # it escalated all the same: the reconfigure failing too climbs to the next rung in both
    again = result(reconfigure, "failed", T + 9)
    assert shape(quiet.on_feedback(again, T + 9, live=True)) == shape(live.on_feedback(again, T + 9, live=True)) \
        == [("decision", "notify_human"), ("alert", "recovery_failed", "open")]  # and a human is called


def test_the_decide_stages_own_alert_goes_out_once():
    f = flow()
    f.on_feedback(job("running", T), T, live=True)
    restart = next(e for e in f.on_findings([crash(T + 2)], T + 2) if e.event_type == "decision")
    f.on_feedback(result(restart, "running", T + 3), T + 3, live=True)  # an actuator carried it out
    out = f.on_feedback(job("failed", T + 10), T + 10, live=True)
    # the job's incident resolves with the job; the job failing after a restart carried out calls a human
    assert shape(out) == [("alert", "process_exit", "resolved"), ("alert", "recovery_failed", "open")]
    assert f.on_feedback(job("failed", T + 11), T + 11, live=True) == []


def test_a_run_left_unfinished_is_a_finding_then_its_alert():
    f = flow(chain_timeout_s=30.0)
    f.on_feedback(job("running", T, run="r1"), T, live=True)
    f.on_feedback(job("time_limit", T + 10, run="r1"), T + 10, live=True)
    assert f.tick(T + 20) == []
    assert shape(f.tick(T + 41)) == [("finding", "chain_broken"), ("alert", "chain_broken", "open")]
