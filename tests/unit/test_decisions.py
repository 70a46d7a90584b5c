"""The decision engine: escalation ladder, ski rental, feedback from actions, re-planning."""

from __future__ import annotations

import uuid

import pytest

from vigil.schemas import ActionResult, Alert, Decision, DetectorFinding, JobState, NodeState, Slowdown, Source, Subject, \
    from_seconds
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.escalation import Escalation
from vigil.streams.engine.incidents import Correlator
from vigil.streams.engine.skirental import FailSlowMitigation


def alert(kind: str, severity: int, *, job: str | None = "gpt", node: str | None = "n1", rank: int | None = None,
          incident: uuid.UUID | None = None, status: str = "open", version: int = 1, jobs=None,
          slowdowns=None) -> Alert:
    t = from_seconds(1_700_000_000)
    return Alert(event_time=t, source=Source(), incident_id=incident or uuid.uuid4(), incident_version=version,
                 status=status, severity=severity, kind=kind, subject=Subject(job=job, node=node, rank=rank),
                 onset_time=t, detection_time=t, detector="test", detector_version="1", jobs=jobs or {},
                 slowdowns=slowdowns or [])


def result(decision: Decision, state: str, detail: str = "", at: float = 1_700_000_000) -> ActionResult:
    """The actuator's report, stamped ``at`` (when the action ended)."""
    return ActionResult(event_time=from_seconds(at), source=Source(), decision_id=decision.decision_id,
                        state=state, backend="local", detail=detail)


def decisions(out) -> list[Decision]:
    return [e for e in out if isinstance(e, Decision)]


def test_each_severity_enters_its_rung():
    eng = DecisionEngine(settle_s=0, silence_settle_s=0)
    assert [d.action for d in eng.on_alert(alert("nccl_timeout", 3, rank=5), 0)] == ["retry_in_place"]
    (retry,) = decisions(eng.on_alert(alert("connection_reset", 3, job="bert", rank=5), 0))
    assert retry.plan == {"ranks": [5]} and retry.target.job == "bert"
    assert [d.action for d in eng.on_alert(alert("process_exit", 2, job="llama"), 0)] == ["restart_process"]
    (reconf,) = decisions(eng.on_alert(alert("node_lost", 1, job="t5", node="n9"), 0))
    assert reconf.action == "reconfigure" and reconf.plan["exclude_nodes"] == ["n9"]


def test_a_node_without_jobs_is_isolated_and_a_node_with_jobs_reconfigures_each_job():
    eng = DecisionEngine(silence_settle_s=0)
    (iso,) = eng.on_alert(alert("xid", 1, job=None, node="n7"), 0)
    assert iso.action == "isolate_node" and iso.target.node == "n7"
    out = decisions(eng.on_alert(alert("node_lost", 1, job=None, node="n3", jobs={"a": ["n3"], "b": ["n3"]}), 0))
    assert sorted((d.action, d.target.job, tuple(d.plan["exclude_nodes"])) for d in out) == [
        ("reconfigure", "a", ("n3",)), ("reconfigure", "b", ("n3",))]


def test_the_same_failure_returning_climbs_the_ladder_up_to_a_human():
    eng = DecisionEngine(escalation=Escalation(window_s=600, max_restarts=2))
    actions = []
    for i in range(4):  # the crash comes back after every remedy
        out = eng.on_alert(alert("process_exit", 2), now=10.0 * i)
        actions += [d.action for d in decisions(out)]
        for d in decisions(out):
            eng.on_action_result(result(d, "succeeded"), 10.0 * i + 5)
    assert actions == ["restart_process", "restart_process", "reconfigure", "notify_human"]
    (human,) = [a for a in out if isinstance(a, Alert)]
    assert human.kind == "recovery_failed" and human.severity == 1 and human.subject.job == "gpt"
    # long after the window it is a new failure again
    assert [d.action for d in decisions(eng.on_alert(alert("process_exit", 2), now=5000))] == ["restart_process"]


def test_a_hang_after_a_crash_is_a_new_failure_at_its_own_rung():
    eng = DecisionEngine()
    (d,) = eng.on_alert(alert("process_exit", 2), 0)
    eng.on_action_result(result(d, "succeeded"), 10)
    assert [d.action for d in decisions(eng.on_alert(alert("task_hang", 2), 30))] == ["restart_process"]


def test_failures_of_a_job_while_its_remedy_is_under_way_join_that_remedy():
    """A killed rank: the job hangs, its peers' connections reset, the rank exits — one restart."""
    corr = Correlator()
    eng = DecisionEngine(recovered=corr.recovered, settle_s=0)
    hang, peer, exit_ = alert("task_hang", 2), alert("connection_reset", 3, rank=1), alert("process_exit", 2, rank=2)
    (restart,) = eng.on_alert(hang, 0)
    assert eng.on_alert(peer, 1) == [] and eng.on_alert(exit_, 2) == []
    eng.on_action_result(result(restart, "succeeded"), 9)
    assert eng._decided[restart.decision_id].answers == [hang.incident_id, peer.incident_id, exit_.incident_id]
    # once it is over, a new failure gets its own remedy again
    assert [d.action for d in eng.on_alert(alert("xid", 1, node="n4"), 20)] == ["reconfigure"]


def test_a_failed_remedy_escalates_and_a_successful_one_resolves_the_incident():
    corr = Correlator()
    eng = DecisionEngine(recovered=corr.recovered, settle_s=0)
    f = DetectorFinding(event_time=from_seconds(100), source=Source(), status="raised", kind="nccl_timeout",
                        severity=3, subject=Subject(job="gpt", rank=1), onset_time=from_seconds(100),
                        detector="exception_classifier", detector_version="1")
    (opened,) = corr.on_finding(f, 100)
    (retry,) = decisions(eng.on_alert(opened, 100))
    assert retry.action == "retry_in_place" and retry.answers == [opened.incident_id]
    assert eng.on_action_result(result(retry, "running"), 101) == []
    (restart,) = decisions(eng.on_action_result(result(retry, "timed_out", "rank 1 did not answer"), 105))
    assert restart.action == "restart_process" and "timed_out" in restart.reason and restart.answers == retry.answers
    eng.on_action_result(result(restart, "running"), 106)
    (resolved,) = eng.on_action_result(result(restart, "succeeded"), 120)
    assert resolved.status == "resolved" and resolved.incident_id == opened.incident_id
    assert "recovered by restart_process" in resolved.summary
    # a late symptom of the recovered failure opens nothing; one that begins after it does
    late = f.model_copy(update={"event_id": uuid.uuid4(), "onset_time": from_seconds(110)})
    assert corr.on_finding(late, 121) == []
    again = f.model_copy(update={"event_id": uuid.uuid4(), "onset_time": from_seconds(130)})
    (reopened,) = corr.on_finding(again, 131)
    assert reopened.status == "open" and reopened.incident_id != opened.incident_id
    # ... and the decision engine knows it is the same failure returning within the window
    (climb,) = decisions(eng.on_alert(reopened, 131))
    assert climb.action == "restart_process" and "returned" in climb.reason


def test_a_sev3_symptom_waits_briefly_for_its_cause():
    eng = DecisionEngine(settle_s=1.0)
    inc = uuid.uuid4()
    assert eng.on_alert(alert("connection_reset", 3, rank=1, incident=inc), 0.0) == []
    # the crash that caused it takes the incident over before the symptom is answered
    (restart,) = eng.on_alert(alert("process_exit", 2, rank=2, incident=inc, status="update", version=2), 0.4)
    assert restart.action == "restart_process"
    assert decisions(eng.tick(2.0)) == []
    # a symptom nobody explains is answered once it has settled
    lone = alert("nccl_timeout", 3, job="bert", rank=4)
    assert eng.on_alert(lone, 10.0) == [] and eng.tick(10.5) == []
    assert [(d.action, d.target.job) for d in decisions(eng.tick(11.0))] == [("retry_in_place", "bert")]


def test_redelivery_and_updates_do_not_decide_twice_and_ids_are_deterministic():
    inc = uuid.uuid4()
    a1 = alert("process_exit", 2, incident=inc)
    e1, e2 = DecisionEngine(silence_settle_s=0), DecisionEngine(silence_settle_s=0)
    (d1,) = e1.on_alert(a1, 5)
    (d2,) = e2.on_alert(a1, 5)
    assert d1.decision_id == d2.decision_id and d1.idempotency_key == d2.idempotency_key
    assert e1.on_alert(a1, 6) == []
    assert e1.on_alert(alert("process_exit", 2, incident=inc, status="update", version=2), 7) == []
    # the incident gets worse: a sev1 cause took it over
    (d3,) = e1.on_alert(alert("node_lost", 1, incident=inc, status="update", version=3), 8)
    assert d3.action == "reconfigure"
    # the restart it replaced failing climbs nothing: the reconfiguration answers its failure
    assert e1.on_action_result(result(d1, "failed", "node gone"), 9) == []
    # a result delivered twice is applied once
    r = result(d3, "failed", "boom")
    assert [d.action for d in decisions(e1.on_action_result(r, 10))] == ["notify_human"]
    assert e1.on_action_result(r, 10) == []


def failslow_alert(job: str, cls: str, before: float, after: float, incident: uuid.UUID | None = None) -> Alert:
    return alert("fail_slow", 3, job=job, node=None, incident=incident, jobs={job: []},
                 slowdowns=[Slowdown(job=job, before_s=before, after_s=after, slowdown_class=cls)])


def test_ski_rental_buys_each_strategy_when_the_slowdown_has_paid_for_it():
    eng = DecisionEngine(mitigation=FailSlowMitigation(
        {"rebalance_microbatches": 10, "adjust_topology": 40, "checkpoint_restart": 100}))
    inc = uuid.uuid4()
    assert eng.on_alert(failslow_alert("gpt", "computation", 1.0, 2.0, inc), 0) == []  # S1: wait
    bought = []
    for t in range(0, 400):
        bought += [(t, d.action) for d in decisions(eng.tick(float(t)))]
    # 2.0 s iterations instead of 1.0 s: half of every second is lost
    assert bought == [(20, "rebalance_microbatches"), (80, "adjust_topology"), (200, "checkpoint_restart")]


def test_communication_fail_slow_skips_rebalancing_and_ends_when_resolved():
    eng = DecisionEngine(mitigation=FailSlowMitigation(
        {"rebalance_microbatches": 1, "adjust_topology": 30, "checkpoint_restart": 100}))
    inc = uuid.uuid4()
    eng.on_alert(failslow_alert("bert", "communication", 1.0, 2.0, inc), 0)
    bought = []
    for t in range(0, 200):
        if t == 150:
            eng.on_alert(alert("fail_slow", 3, job="bert", node=None, incident=inc, status="resolved", version=2), t)
        bought += [(t, d.action, tuple(d.answers)) for d in decisions(eng.tick(float(t)))]
    assert bought == [(60, "adjust_topology", (inc,))]  # half of each second lost; stopped before S4 at 200 s


def test_overheads_are_learned_from_action_durations():
    eng = DecisionEngine(mitigation=FailSlowMitigation({"adjust_topology": 100}, learning_rate=0.5))
    eng.on_alert(failslow_alert("gpt", "communication", 1.0, 3.0, uuid.uuid4()), 0)
    (d,) = [d for t in range(0, 200) for d in decisions(eng.tick(float(t)))][:1]
    eng.on_action_result(result(d, "running"), 200)
    eng.on_action_result(result(d, "succeeded"), 220)
    assert eng.mitigation.overhead_s["adjust_topology"] == pytest.approx(60.0)


def test_arrival_finish_and_join_trigger_replanning():
    seen = []

    def replan(jobs, healthy):
        seen.append((sorted(jobs), sorted(healthy)))
        return {"allocations": {j: 1 for j in jobs}}

    eng = DecisionEngine(replan=replan)
    t = from_seconds(0)
    for n in ("n1", "n2"):
        assert eng.on_state(NodeState(event_time=t, source=Source(node=n), state="healthy"), 0) == []
    (d,) = eng.on_state(JobState(event_time=t, source=Source(job="a"), state="running", nodes=["n1"]), 1)
    assert d.action == "replan" and d.plan["trigger"] == "job a arrived" and d.plan["allocations"] == {"a": 1}
    assert eng.on_state(JobState(event_time=t, source=Source(job="a"), state="running", nodes=["n1"]), 2) == []
    assert eng.on_state(NodeState(event_time=t, source=Source(node="n2"), state="lost"), 3) == []
    # back from repair, the node counts once it passed its health check (its agent says joined)
    assert eng.on_state(NodeState(event_time=t, source=Source(node="n2"), state="repaired"), 4) == []
    (d,) = eng.on_state(NodeState(event_time=t, source=Source(node="n2"), state="joined"), 4)
    assert d.plan["trigger"] == "node n2 joined"
    (d,) = eng.on_state(JobState(event_time=t, source=Source(job="a"), state="completed"), 5)
    assert d.plan["trigger"] == "job a completed"
    assert seen[0] == (["a"], ["n1", "n2"]) and seen[1] == (["a"], ["n1", "n2"]) and seen[2] == ([], ["n1", "n2"])


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match="window_s"):
        Escalation(window_s=0)
    with pytest.raises(ValueError, match="max_restarts"):
        Escalation(max_restarts=0)
    with pytest.raises(ValueError, match="unknown strategy"):
        FailSlowMitigation({"reboot_the_datacenter": 1.0})


def test_reconfiguration_excludes_the_nodes_known_down_and_forgets_nodes_a_job_left():
    eng = DecisionEngine(settle_s=0, silence_settle_s=0)
    t = from_seconds(0)
    eng.on_state(JobState(event_time=t, source=Source(job="gpt"), state="running", nodes=["n1", "n2", "n3"]), 0)
    (restart,) = decisions(eng.on_alert(alert("process_exit", 2, node="n1"), 1))
    # the restart fails because n3 died meanwhile: n3 is drained, not n1 where the first rank crashed
    eng.on_state(NodeState(event_time=t, source=Source(node="n3"), state="lost"), 2)
    (reconf,) = decisions(eng.on_action_result(result(restart, "failed", "rank on n3 unreachable"), 3))
    assert reconf.action == "reconfigure" and reconf.plan == {"exclude_nodes": ["n3"]}
    # the job moved to n1, n2, n4: a later loss of n3 is not its concern
    eng.on_state(JobState(event_time=t, source=Source(job="gpt"), state="running", nodes=["n1", "n2", "n4"]), 4)
    (iso,) = decisions(eng.on_alert(alert("node_lost", 1, job=None, node="n3"), 5))
    assert iso.action == "isolate_node" and iso.target.node == "n3" and iso.target.job is None


def test_a_node_failure_reconfigures_the_jobs_the_detectors_saw_running_there():
    from vigil.schemas import IterationTiming
    from vigil.streams.engine.pipeline import InProcessPipeline
    from vigil.schemas import XidError

    pipe = InProcessPipeline()
    t0 = 1_700_000_000.0
    for step in range(3):
        pipe.feed([IterationTiming(event_time=from_seconds(t0 + step), source=Source(job="gpt", node="n12", rank=0),
                                   step=step, start=from_seconds(t0 + step - 1), end=from_seconds(t0 + step),
                                   duration_s=1.0)], t0 + step)
    alerts = pipe.feed([XidError(event_time=from_seconds(t0 + 4), source=Source(node="n12", gpu=1), code=79,
                                 message="NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus")], t0 + 4)
    (xid,) = [a for a in alerts if a.kind == "xid"]
    (d,) = decisions(DecisionEngine(settle_s=0, silence_settle_s=0).on_alert(xid, t0 + 4))
    assert (d.action, d.target.job, d.plan) == ("reconfigure", "gpt", {"exclude_nodes": ["n12"]})


def test_a_failure_that_returned_soon_but_was_seen_late_still_climbs():
    """A hang missed in-band shows only at the 30-minute collective timeout: it began a minute after the retry."""
    eng = DecisionEngine(settle_s=0, escalation=Escalation(window_s=600, max_restarts=1))
    t0 = 1_700_000_000.0
    (retry,) = decisions(eng.on_alert(alert("nccl_timeout", 3, rank=1), t0))
    eng.on_action_result(result(retry, "succeeded"), t0 + 30)
    late = alert("nccl_timeout", 3, rank=1).model_copy(update={"onset_time": from_seconds(t0 + 60)})
    (climb,) = decisions(eng.on_alert(late, t0 + 60 + 1800))
    assert climb.action == "restart_process" and "returned within 600 s" in climb.reason
    fresh = alert("nccl_timeout", 3, rank=1).model_copy(update={"onset_time": from_seconds(t0 + 5000)})
    (again,) = decisions(eng.on_alert(fresh, t0 + 5000))
    assert again.action == "retry_in_place" and "returned" not in again.reason


def test_a_retry_of_a_peer_overtaken_by_the_crash_that_caused_it_climbs_nothing():
    """The peer's broken connection settles before the crash is known: retry, then restart — one restart."""
    eng = DecisionEngine(settle_s=1.0)
    inc = uuid.uuid4()
    assert eng.on_alert(alert("connection_reset", 3, rank=1, incident=inc), 0.0) == []
    (retry,) = decisions(eng.tick(1.0))
    assert retry.action == "retry_in_place"
    (restart,) = decisions(eng.on_alert(alert("process_exit", 2, rank=2, incident=inc, status="update", version=2), 1.2))
    assert restart.action == "restart_process" and restart.answers == [inc]
    # the retry reaches a rank the restart is replacing: its failure is not the job's
    assert eng.on_action_result(result(retry, "failed", "rank 1: no control socket"), 1.3) == []
    eng.on_action_result(result(restart, "succeeded"), 5.0)
    # the same, with the retry's failure heard after the restart worked
    eng2 = DecisionEngine(settle_s=0, silence_settle_s=0)
    (retry2,) = decisions(eng2.on_alert(alert("nccl_timeout", 3, rank=1), 0.0))
    (restart2,) = decisions(eng2.on_alert(alert("process_exit", 2, rank=2), 0.5))
    eng2.on_action_result(result(restart2, "succeeded"), 2.0)
    assert eng2.on_action_result(result(retry2, "timed_out"), 30.0) == []


def test_a_symptom_that_settles_after_its_job_recovered_is_resolved_not_answered():
    told = []
    eng = DecisionEngine(settle_s=1.0, recovered=lambda ids, job, at, why: told.append((ids, job, why)) or [])
    t0 = 1_700_000_000.0  # the symptom's onset (see alert())
    (restart,) = decisions(eng.on_alert(alert("process_exit", 2, rank=2), t0 + 0.1))
    peer = alert("connection_reset", 3, rank=1)
    assert eng.on_alert(peer, t0 + 0.2) == []
    eng.on_action_result(result(restart, "succeeded", at=t0 + 0.4), t0 + 0.5)
    assert decisions(eng.tick(t0 + 1.5)) == []
    assert told[-1][:2] == ([peer.incident_id], "gpt") and "before the job's last recovery" in told[-1][2]
    # a failure that begins after the recovery is answered, as the same failure returning
    back = alert("process_exit", 2, rank=2).model_copy(update={"onset_time": from_seconds(t0 + 9)})
    (again,) = decisions(eng.on_alert(back, t0 + 9.1))
    assert again.action == "restart_process" and "returned" in again.reason
    # ... even when it began before the restart's success was heard: the restart had ended
    eng.on_action_result(result(again, "succeeded", at=t0 + 10.0), t0 + 12.0)
    crashloop = alert("process_exit", 2, rank=0).model_copy(update={"onset_time": from_seconds(t0 + 10.3)})
    (climb,) = decisions(eng.on_alert(crashloop, t0 + 12.1))
    assert climb.action == "restart_process" and "returned" in climb.reason


def _job(job: str, state: str, reason: str = "") -> JobState:
    return JobState(event_time=from_seconds(1_700_000_000), source=Source(job=job), state=state, reason=reason)


def test_a_job_that_fails_while_being_recovered_calls_a_human_once():
    """The per-job agent gives up (a reconfigure it cannot carry out, restarts without progress) and the
    job fails: that is automatic recovery failing, a sev1 recovery_failed for a human."""
    eng = DecisionEngine(settle_s=0, escalation=Escalation(window_s=600, max_restarts=3))
    (d,) = decisions(eng.on_alert(alert("process_exit", 2, job="crashy"), 10.0))
    assert d.action == "restart_process"
    eng.on_action_result(result(d, "running"), 11.0)  # the agent's actuator carries it out
    out = eng.on_state(_job("crashy", "failed", "the agent gave up"), 20.0)
    (page,) = [a for a in out if isinstance(a, Alert)]
    assert (page.kind, page.severity, page.subject.job) == ("recovery_failed", 1, "crashy")
    assert "the agent gave up" in page.summary and "restart_process" in page.summary
    assert eng.on_state(_job("crashy", "failed", "the agent gave up"), 21.0) == []  # the same state again


def test_a_job_that_fails_or_ends_with_no_remedy_tried_calls_no_one():
    eng = DecisionEngine(settle_s=0, escalation=Escalation(window_s=600))
    assert [a for a in eng.on_state(_job("plain", "failed", "exit 1"), 5.0) if isinstance(a, Alert)] == []
    decisions(eng.on_alert(alert("process_exit", 2, job="fixed"), 10.0))
    assert [a for a in eng.on_state(_job("fixed", "completed"), 20.0) if isinstance(a, Alert)] == []
    decisions(eng.on_alert(alert("process_exit", 2, job="old"), 10.0))  # long before: not this failure's
    assert [a for a in eng.on_state(_job("old", "failed"), 10.0 + 601 + 1e-3) if isinstance(a, Alert)] == []


def test_a_hang_restart_asks_for_the_flight_recorders_first_and_no_other_restart_does():
    from vigil.schemas.control import DIAGNOSTICS
    from vigil.streams.engine.decisions import DIAGNOSE

    assert all(set(v) <= DIAGNOSTICS for v in DIAGNOSE.values())  # only what the actuators know how to collect
    eng = DecisionEngine(settle_s=0, silence_settle_s=0)
    (hang,) = decisions(eng.on_alert(alert("task_hang", 2, job="gpt"), 0))
    assert hang.action == "restart_process" and hang.plan["collect_diagnostics"] == ["flight_recorder"]
    (crash,) = decisions(eng.on_alert(alert("process_exit", 2, job="llama"), 0))
    assert crash.action == "restart_process" and "collect_diagnostics" not in crash.plan


def test_no_page_for_recovery_when_no_remedy_was_carried_out_and_a_requeued_job_is_a_new_run():
    """recovery_failed pages a human only when vigil's own remedy failed. With no actuator taking the
    decisions (alerts only; the scheduler requeues failed jobs), a job that fails after a decision, or a
    failure returning until the ladder reaches a human, pages no one beyond the failures' own alerts. A job
    requeued by its scheduler is a new run: its next failure enters at its own rung, not as the last
    run's returning."""
    eng = DecisionEngine(settle_s=0, escalation=Escalation(window_s=600, max_restarts=1))
    (d,) = decisions(eng.on_alert(alert("process_exit", 2, job="j"), 10.0))
    assert d.action == "restart_process"
    assert [a for a in eng.on_state(_job("j", "failed", "requeued by the scheduler"), 18.0)
            if isinstance(a, Alert)] == []
    eng.on_state(_job("j", "running", "requeued"), 19.0)
    (again,) = decisions(eng.on_alert(alert("process_exit", 2, job="j"), 40.0))
    assert again.action == "restart_process" and "returned" not in again.reason
    # the same run: the failure returns, the ladder climbs to a human, but nothing was carried out
    out = []
    for t in (50.0, 60.0):
        out += eng.on_alert(alert("process_exit", 2, job="j"), t)
    assert [d.action for d in decisions(out)] == ["reconfigure", "notify_human"]
    assert [a for a in out if isinstance(a, Alert)] == []
    assert [a for a in eng.on_state(_job("j", "failed", "exit 1"), 70.0) if isinstance(a, Alert)] == []
