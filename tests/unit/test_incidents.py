"""The correlator's bookkeeping on hand-made findings with known causes."""

from __future__ import annotations

import uuid

from vigil.schemas import DetectorFinding, Slowdown, Subject, from_seconds
from vigil.streams.engine.detection import DetectionEngine
from vigil.streams.engine.incidents import MAX_EVIDENCE, Correlator, explains


def finding(kind, severity, subject, onset=10.0, status="raised", job_nodes=(), slowdown_class=None,
            **evidence) -> DetectorFinding:
    slowdown = Slowdown(job=subject.job, slowdown_class=slowdown_class) if slowdown_class else None
    return DetectionEngine._finding(status, kind, severity, subject, onset, "test", "1", evidence, "c",
                                    list(job_nodes), onset + 1, [], slowdown)


def test_a_thousand_ranks_timing_out_are_one_incident_with_a_thousand_pieces_of_evidence():
    c = Correlator()
    alerts = []
    for rank in range(1000):
        alerts += c.on_finding(finding("nccl_timeout", 3, Subject(job="j", rank=rank, node=f"n{rank // 8}")), 11.0)
    assert [a.status for a in alerts] == ["open"]
    [inc] = c.open_incidents()
    assert inc.evidence_count == 1000 and len(inc.evidence) == MAX_EVIDENCE


def test_a_cause_arriving_after_its_symptom_re_roots_the_incident():
    c = Correlator()
    [opened] = c.on_finding(finding("task_hang", 2, Subject(job="j"), job_nodes=["n1", "n2"]), 12.0)
    [update] = c.on_finding(finding("node_lost", 1, Subject(node="n2")), 13.0)
    assert update.incident_id == opened.incident_id and update.status == "update"
    assert (update.kind, update.severity, update.subject.node) == ("node_lost", 1, "n2")


def test_unrelated_failures_stay_separate():
    c = Correlator()
    a = c.on_finding(finding("task_hang", 2, Subject(job="j"), job_nodes=["n1"]), 12.0)
    b = c.on_finding(finding("node_lost", 1, Subject(node="n9")), 13.0)
    assert a[0].incident_id != b[0].incident_id and len(c.open_incidents()) == 2


def test_cleared_findings_resolve_and_transients_expire():
    c = Correlator(transient_hold_s=60)
    f = finding("node_lost", 1, Subject(node="n"))
    [opened] = c.on_finding(f, 13.0)
    cleared = f.model_copy(update={"status": "cleared", "event_id": f.event_id.__class__(int=f.event_id.int + 1)})
    [resolved] = c.on_finding(cleared, 20.0)
    assert resolved.status == "resolved" and resolved.incident_id == opened.incident_id
    c.on_finding(finding("process_exit", 2, Subject(job="j", rank=1)), 30.0)
    assert c.tick(60.0) == []
    [expired] = c.tick(91.0)
    assert expired.status == "resolved" and expired.kind == "process_exit"


def test_redelivered_findings_are_ignored_and_ids_are_deterministic():
    f = finding("xid", 1, Subject(node="n", gpu=0), code=79)
    c1, c2 = Correlator(), Correlator()
    a1, a2 = c1.on_finding(f, 11.0), c2.on_finding(f, 11.0)
    assert a1[0].event_id == a2[0].event_id
    assert c1.on_finding(f, 12.0) == []


def test_attribution_rules():
    comm_slow = finding("fail_slow", 3, Subject(job="j"), job_nodes=["n1", "n2"], slowdown_class="communication")
    comp_slow = finding("fail_slow", 3, Subject(job="j"), job_nodes=["n1", "n2"], slowdown_class="computation")
    congestion = finding("congestion", 3, Subject(node="n2", link="n2/mlx5_0:1"))
    throttle = finding("throttle", 3, Subject(node="n1", gpu=4))
    assert explains(congestion, comm_slow) and not explains(congestion, comp_slow)
    assert explains(throttle, comp_slow) and not explains(throttle, comm_slow)
    assert not explains(finding("congestion", 3, Subject(node="n7", link="n7/mlx5_0:1")), comm_slow)
    crash = finding("cuda_error", 2, Subject(job="j", rank=3, node="n1"))
    timeout = finding("nccl_timeout", 3, Subject(job="j", rank=5, node="n2"))
    assert explains(crash, timeout) and not explains(timeout, crash)
    assert explains(finding("node_lost", 1, Subject(node="n2")), timeout.model_copy(update={"job_nodes": ["n1", "n2"]}))


def test_a_job_moved_off_a_lost_node_gets_a_new_incident_for_its_next_failure():
    c = Correlator()
    [lost] = c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=10.0), 12.0)
    c.on_finding(finding("task_hang", 2, Subject(job="j"), onset=10.5, job_nodes=["n1", "n2"]), 13.0)
    c.recovered([], "j", 100.0, "re-planned on n1, n3")  # the node stays lost; the job moved on
    # A later hang of the job is a new failure, not more evidence of the lost node it left.
    [again] = c.on_finding(finding("task_hang", 2, Subject(job="j"), onset=500.0, job_nodes=["n1", "n3"]), 510.0)
    assert again.status == "open" and again.incident_id != lost.incident_id
    # While the node itself is still explained by its own incident.
    assert c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=600.0), 601.0) == []


def _lost(node, onset, status="raised"):
    return finding("node_lost", 1, Subject(node=node), onset=onset, status=status, interval_s=1.0)


def test_many_nodes_silent_together_are_one_incident_with_a_shared_cause_that_resolves_when_they_return():
    c = Correlator()
    alerts = []
    for i in range(8):  # heartbeats out of phase: the losses spread over one interval
        alerts += c.on_finding(_lost(f"r{i}", 100.0 + 0.12 * i), 103.0 + 0.12 * i)
        alerts += c.tick(103.0 + 0.12 * i)
    alerts += c.tick(110.0)
    assert len({a.incident_id for a in alerts}) == 1, [(a.kind, a.status) for a in alerts]
    assert alerts[-1].kind == "nodes_silent" and alerts[-1].severity == 2
    assert alerts[-1].subject.node is None  # no node is the culprit
    for i in range(8):
        alerts += c.on_finding(_lost(f"r{i}", 100.0 + 0.12 * i, status="cleared"), 120.0)
    assert c.tick(121.0) == []  # a moment for what they sent meanwhile to be read
    alerts += c.tick(121.6)
    assert alerts[-1].status == "resolved"


def test_two_nodes_lost_together_stay_two_incidents():
    c = Correlator()
    a = c.on_finding(_lost("n1", 100.0), 102.6)
    b = c.on_finding(_lost("n2", 100.4), 103.0)  # held back a moment, in case a third follows
    assert [x.status for x in a] == ["open"] and b == []
    later = c.tick(104.6)
    assert [(x.kind, x.status, x.subject.node) for x in later] == [("node_lost", "open", "n2")]


def test_nodes_still_silent_after_the_others_returned_are_handled_one_by_one():
    c = Correlator(silence_split_s=30.0)
    for i in range(4):
        c.on_finding(_lost(f"r{i}", 100.0 + 0.1 * i), 103.0)
    [told] = c.tick(104.6)  # the fourth, joined after the open, told at the next tick past silence_hold_s
    assert (told.kind, told.status, told.summary.split()[0]) == ("nodes_silent", "update", "4")
    for i in range(3):  # three come back; r3 stays silent
        c.on_finding(_lost(f"r{i}", 100.0 + 0.1 * i, status="cleared"), 110.0)
    assert c.tick(120.0) == []
    out = c.tick(141.0)
    assert [(a.kind, a.status) for a in out] == [("nodes_silent", "resolved"), ("node_lost", "open")]
    assert out[1].subject.node == "r3" and out[1].severity == 1


def test_a_cleared_cause_takes_no_later_fault_and_an_ended_job_takes_its_incidents():
    c = Correlator()
    [lost] = c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=10.0), 12.0)
    c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=10.0, status="cleared"), 20.0)
    # a later job on n2 hangs: its own incident, not the old loss's
    [hang] = c.on_finding(finding("task_hang", 2, Subject(job="later"), onset=30.0, job_nodes=["n2"]), 33.0)
    assert hang.status == "open" and hang.incident_id != lost.incident_id
    [ended] = c.job_ended("later", 40.0, "cancelled")
    assert ended.status == "resolved" and ended.incident_id == hang.incident_id and "ended" in ended.summary


def test_a_cause_explains_only_what_was_found_after_it_began():
    """A node lost a minute after an XID on it is a new failure, not the XID's cause (it cannot have caused
    what happened before it): its own incident, named by its own kind. A crash on the node soon after the
    XID, in the same run, is the XID's (the GPU fell off the bus)."""
    c = Correlator()
    [xid] = c.on_finding(finding("xid", 1, Subject(node="n1"), onset=10.0, code=79), 11.0)
    [crash] = c.on_finding(finding("process_exit", 2, Subject(job="j", node="n1", rank=3), onset=15.0), 16.0)
    assert crash.incident_id == xid.incident_id and crash.kind == "xid"
    [lost] = c.on_finding(finding("node_lost", 1, Subject(node="n1"), onset=80.0), 82.6)
    assert (lost.status, lost.kind) == ("open", "node_lost") and lost.incident_id != xid.incident_id
    # a cause found a moment after its symptom (clock skew, detection delay) still re-roots it
    [hang] = c.on_finding(finding("task_hang", 2, Subject(job="k"), onset=200.0, job_nodes=["n7"]), 203.0)
    [reroot] = c.on_finding(finding("node_lost", 1, Subject(node="n7"), onset=202.0), 204.6)
    assert (reroot.status, reroot.kind, reroot.incident_id) == ("update", "node_lost", hang.incident_id)


def test_a_later_run_of_a_job_is_not_absorbed_by_an_older_cause_on_its_node():
    """A job requeued by its scheduler after a fault is a new run: its crash on a node whose XID incident is
    still open (nothing repaired it) opens an incident of its own, and so does a new job's on that node."""
    c = Correlator()
    c.job_started("j", 0.0)
    [xid] = c.on_finding(finding("xid", 1, Subject(node="n1"), onset=10.0, code=79), 11.0)
    c.job_ended("j", 18.0, "failed")
    c.job_started("j", 19.0)
    c.job_started("j", 25.0)  # said again: the same run
    [crash] = c.on_finding(finding("process_exit", 2, Subject(job="j", node="n1", rank=3), onset=60.0), 61.0)
    assert (crash.status, crash.kind) == ("open", "process_exit") and crash.incident_id != xid.incident_id
    c.job_started("new", 30.0)
    [other] = c.on_finding(finding("cuda_error", 2, Subject(job="new", node="n1", rank=0), onset=70.0), 71.0)
    assert other.status == "open" and other.incident_id not in (xid.incident_id, crash.incident_id)
    # while a crash of a job whose run began before the XID is still the XID's
    c.job_started("old", 5.0)
    [same] = c.on_finding(finding("process_exit", 2, Subject(job="old", node="n1", rank=1), onset=80.0), 81.0)
    assert (same.status, same.kind, same.incident_id) == ("update", "xid", xid.incident_id)


def _heard_at(f, t):
    """``f`` as its detector made it at ``t`` (a cleared finding's time is when the condition ended)."""
    return f.model_copy(update={"event_time": from_seconds(t)})


def test_a_hang_that_began_while_its_node_was_lost_is_that_loss_s_even_when_found_after_the_node_came_back():
    """The replayed 2,000-GPU run (seed 1, 100 faults per kind): a 1-node job's node is lost just after its
    last step (98.2) and back 6 s later; its hang timeout (6.5 s) ran out 0.2 s after the node was heard
    again and before its scheduler marked it failed. The job never stepped again after the loss (the ground
    truth: the loss stopped it), so the hang is the loss's and pages no one a second time. A hang that
    began after the node came back (the job stepped since) is a new failure with its own page."""
    c = Correlator()
    c.job_started("j", 0.0)
    [lost] = c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=98.4), 101.5)
    [back] = c.on_finding(_heard_at(finding("node_lost", 1, Subject(node="n2"), onset=98.4, status="cleared"), 104.6),
                          104.6)
    assert back.status == "resolved" and back.incident_id == lost.incident_id
    hang = finding("task_hang", 2, Subject(job="j"), onset=98.2, job_nodes=["n2"])
    late = c.on_finding(hang, 104.8)
    assert [(a.status, a.kind, a.incident_id) for a in late] == [("resolved", "node_lost", lost.incident_id)]
    assert [e["kind"] for e in late[0].evidence] == ["node_lost", "task_hang"]
    assert c.open_incidents() == []
    # the hang clearing (the job marked failed) says nothing more
    assert c.on_finding(finding("task_hang", 2, Subject(job="j"), onset=98.2, status="cleared",
                                job_nodes=["n2"]), 104.9) == []
    # the job stepped after its node came back (onset 110): a hang from then on is a failure of its own
    [new] = c.on_finding(finding("task_hang", 2, Subject(job="j"), onset=110.0, job_nodes=["n2"]), 117.0)
    assert (new.status, new.kind) == ("open", "task_hang") and new.incident_id != lost.incident_id


def test_a_symptom_that_began_while_a_cleared_cause_held_joins_its_incident_still_open():
    """The lost node's incident is still open (a peer's NCCL timeout it explained is held as transient) when
    the node comes back; the hang of a job on it that began before the node came back is more evidence."""
    c = Correlator()
    c.job_started("j", 0.0)
    [lost] = c.on_finding(finding("node_lost", 1, Subject(node="n2"), onset=98.4), 101.5)
    c.on_finding(finding("nccl_timeout", 3, Subject(job="k", rank=4, node="n3"), onset=99.0,
                         job_nodes=["n2", "n3"]), 102.0)
    assert c.on_finding(_heard_at(finding("node_lost", 1, Subject(node="n2"), onset=98.4, status="cleared"), 104.6),
                        104.6) == []
    out = c.on_finding(finding("task_hang", 2, Subject(job="j"), onset=98.2, job_nodes=["n2"]), 104.8)
    assert all(a.incident_id == lost.incident_id for a in out)
    [inc] = c.open_incidents()
    assert inc.incident_id == lost.incident_id and {m.kind for m in inc.members.values()} == {
        "node_lost", "nccl_timeout", "task_hang"}


def test_a_node_that_reported_a_crash_after_its_silence_began_was_running_its_crash_is_its_own():
    """A lost node explains the waiting of its jobs, and what it said before it fell silent; a CUDA error or
    an XID it reported from well after its last beat (delivered late, through a stalled path) it was running
    to report: a fault of its own, paged as such."""
    c = Correlator()
    [lost] = c.on_finding(_lost("n1", 100.0), 103.0)
    [crash] = c.on_finding(finding("cuda_error", 2, Subject(job="j", node="n1", rank=0), onset=102.5), 103.5)
    assert (crash.status, crash.kind) == ("open", "cuda_error") and crash.incident_id != lost.incident_id
    [xid] = c.on_finding(finding("xid", 1, Subject(node="n1", gpu=2), onset=102.0, code=79), 103.6)
    assert (xid.kind, xid.incident_id) == ("xid", crash.incident_id)  # the GPU fell off the bus: the crash's cause
    # within a beat of the last one: it may have gone down with the node, which explains it
    [went] = c.on_finding(finding("process_exit", 2, Subject(job="k", node="n1", rank=3), onset=100.5), 103.7)
    # a timeout is waiting, whoever reports it and when: the node's
    timeout = finding("nccl_timeout", 3, Subject(job="k", node="n1", rank=4), onset=102.8, job_nodes=["n1"])
    [waits] = c.on_finding(timeout, 103.8)
    assert {(a.incident_id, a.kind, a.status) for a in (went, waits)} == {(lost.incident_id, "node_lost", "update")}


def _silence(c, n, onset=100.0, found=103.0, spread=1.0):
    """``n`` nodes whose beats all stop within ``spread`` s; their losses found as the worker ticks (10 Hz)."""
    alerts, t = [], found
    for i in range(n):
        at = found + spread * i / n
        while t < at:
            alerts += c.tick(t)
            t += 0.1
        lost = finding("node_lost", 1, Subject(node=f"n{i}"), onset=onset + spread * i / n, interval_s=1.0,
                       silent_peers=[f"n{k}" for k in range(min(n, 65)) if k != i][:64])  # all quiet by then
        alerts += c.on_finding(lost, at)
    return alerts, t


def test_a_thousand_nodes_falling_silent_within_a_second_are_a_few_versions_of_one_incident():
    c = Correlator()
    alerts, t = _silence(c, 1000)
    alerts += c.tick(t + 2.0)
    assert len({a.incident_id for a in alerts}) == 1
    assert [a.status for a in alerts][0] == "open" and len(alerts) <= 3, [a.status for a in alerts]
    assert alerts[-1].kind == "nodes_silent" and alerts[-1].summary.startswith("1000 nodes")


def test_a_shared_silence_explains_its_jobs_waiting_not_their_crashes():
    c = Correlator()
    alerts, t = _silence(c, 8)
    [silence] = {a.incident_id for a in alerts}
    hang = finding("task_hang", 2, Subject(job="j"), onset=100.2, job_nodes=["n1", "n2"])
    [more] = c.on_finding(hang, t)  # waiting on the silent nodes: the silence's evidence
    assert (more.incident_id, more.kind, more.status) == (silence, "nodes_silent", "update")
    exit_ = finding("process_exit", 2, Subject(job="k", node="n3", rank=1), onset=100.05, job_nodes=["n3", "n4"])
    [crash] = c.on_finding(exit_, t + 0.1)  # a path that stalls kills no process, even on a peer's node
    assert crash.status == "open" and crash.kind == "process_exit" and crash.incident_id != silence


def _hang(job, onset, nodes, timeout_s=3.0, **ev):
    return finding("task_hang", 2, Subject(job=job), onset=onset, job_nodes=nodes, timeout_s=timeout_s,
                   silence_s=timeout_s + 0.1, **ev)


def _members(c, job):
    return [inc.root.kind for inc in c.open_incidents() if any(m.subject.job == job for m in inc.members.values())]


def test_when_every_silent_node_is_back_the_silence_resolves_and_a_job_still_hung_is_paged_on_its_own():
    """A job heard stepping again within its own timeout of its nodes' return was only unheard; one still
    silent after that is hung: its own incident, once the silence resolved."""
    c = Correlator()
    alerts, t = _silence(c, 8)
    stays, resumes = _hang("j", 100.2, ["n1"]), _hang("k", 100.3, ["n2"])
    c.on_finding(stays, t)
    c.on_finding(resumes, t)
    assert _members(c, "j") == _members(c, "k") == ["nodes_silent"]  # waiting on the silent nodes
    back = t + 3.0
    for i in range(8):  # the stall ends: every node is heard again
        c.on_finding(_lost(f"n{i}", 100.0 + i / 8, status="cleared"), back)
    out = []
    for k in range(1, 60):  # job k's steps are read 2 s after its nodes' beats (another topic, a busy worker)
        if k == 20:
            out += c.on_finding(resumes.model_copy(update={"status": "cleared", "event_id": uuid.uuid4()}), back + 2.0)
        out += c.tick(back + 0.1 * k)
    assert [(a.kind, a.status, a.subject.job) for a in out] == [
        ("nodes_silent", "resolved", None), ("task_hang", "open", "j")]
    # a hang found later that began in the silence is not the closed silence's either
    [own] = c.on_finding(_hang("m", 100.4, ["n5"]), back + 8.0)
    assert own.status == "open" and own.kind == "task_hang"
    # but a peer's timeout that the silence made, read late, still is (no page of its own)
    timeout = finding("nccl_timeout", 3, Subject(job="p", rank=1, node="n9"), onset=101.0, job_nodes=["n3", "n9"])
    assert [a.status for a in c.on_finding(timeout, back + 9.0)] == ["resolved"]


def test_partition_timeouts_read_just_after_the_nodes_beats_are_the_silences():
    c = Correlator()
    alerts, t = _silence(c, 8)
    for i in range(8):  # agents that spooled through a partition: beats first, then their ranks' timeouts
        back = _lost(f"n{i}", 100.0 + i / 8, status="cleared").model_copy(update={"event_time": from_seconds(170.0)})
        c.on_finding(back, 170.0)  # the engine clears a loss when it hears the node (a partition: not before)
    out = []
    for j in range(4):
        timeout = finding("nccl_timeout", 3, Subject(job=f"j{j}", rank=0, node=f"n{j}"), onset=160.0,
                          job_nodes=[f"n{j}", f"n{j + 4}"])
        out += c.on_finding(timeout, 170.2)
    out += c.tick(172.0)
    assert {(a.kind, a.status) for a in out} == {("nodes_silent", "update"), ("nodes_silent", "resolved")}


def test_a_node_lost_again_after_it_was_heard_in_a_silence_is_a_loss_of_its_own():
    c = Correlator()
    alerts, t = _silence(c, 8)
    for i in range(6):  # the backlog: six nodes heard again; n5 had beaten only briefly after the stall began
        c.on_finding(_lost(f"n{i}", 100.0 + i / 8, status="cleared"), 106.0)
    again = finding("node_lost", 1, Subject(node="n5"), onset=103.0, interval_s=1.0, silent_peers=["n6", "n7"])
    out = c.on_finding(again, 106.05)
    for i in (6, 7):
        out += c.on_finding(_lost(f"n{i}", 100.0 + i / 8, status="cleared"), 106.1)
    for k in range(1, 30):
        out += c.tick(106.1 + 0.1 * k)
    assert ("node_lost", "open", "n5") in [(a.kind, a.status, a.subject.node) for a in out]


def test_a_held_hang_of_a_job_that_ended_meanwhile_is_its_past():
    c = Correlator()
    assert c.on_finding(_hang("j", 99.9, ["n1"], silent_peers=[f"job{i}" for i in range(5)]), 101.5) == []
    c.job_ended("j", 102.0, "cancelled")
    assert c.tick(106.0) == [] and c.open_incidents() == []


def test_hostile_heartbeat_intervals_in_evidence_neither_crash_nor_switch_the_rule_off():
    for bad in (10**400, float("inf"), float("nan"), -1.0, "x", None, 1e308):
        c = Correlator()
        lost = DetectorFinding.model_validate_json(
            finding("node_lost", 1, Subject(node="n1"), onset=100.0, interval_s=bad).model_dump_json())
        c.on_finding(lost, 103.0)
        [xid] = c.on_finding(finding("xid", 1, Subject(node="n1", gpu=0), onset=105.0, code=79), 106.0)
        assert (xid.status, xid.kind) == ("open", "xid"), bad


def test_a_hang_found_before_its_nodes_silence_is_told_waits_for_it_among_many_silent_jobs():
    """Fast steps time out before heartbeats do: the hang of one of many jobs that stopped together waits
    for its nodes' news, which then explains it (no page for a stalled telemetry path)."""
    c = Correlator()
    peers = [f"job{i}" for i in range(5)]
    hang = _hang("j", 99.9, ["n1"], silent_peers=peers)
    assert c.on_finding(hang, 101.5) == []  # held
    alerts, t = _silence(c, 8)
    alerts += c.tick(t + 5.0)
    assert {a.kind for a in alerts} == {"nodes_silent"}, [(a.kind, a.status) for a in alerts]
    assert _members(c, "j") == ["nodes_silent"]
    # one job hanging alone is paged at once, whoever else is silent for a reason already told
    c2 = Correlator()
    for k in range(3):
        c2.on_finding(finding("cuda_error", 2, Subject(job=f"job{k}", node=f"x{k}", rank=0), onset=50.0), 51.0)
    alone = _hang("j", 99.9, ["n1"], silent_peers=["job0", "job1", "job2"])
    [paged] = c2.on_finding(alone, 101.5)
    assert (paged.kind, paged.status) == ("task_hang", "open")


def test_a_hang_among_many_silent_jobs_is_paged_at_once_when_every_node_of_its_job_talks():
    """Many jobs quiet at once (stopped by other faults whose news names their nodes, not the jobs) hold a
    hang back only while some node of its job is quiet too: a job hung on nodes that all talk is no stalled
    path's or partition's, and waiting for a silence to explain it only delays the page (by 1.5 s and more,
    the pipeline benchmark's hang tail)."""
    peers = [f"job{i}" for i in range(5)]
    c = Correlator()
    [paged] = c.on_finding(_hang("j", 99.9, ["n1", "n2"], silent_peers=peers, quiet_nodes=[]), 101.5)
    assert (paged.kind, paged.status, paged.subject.job) == ("task_hang", "open", "j")
    # a node of the job is quiet: held as before, and the silence that comes takes it
    c2 = Correlator()
    assert c2.on_finding(_hang("j", 99.9, ["n1"], silent_peers=peers, quiet_nodes=["n1"]), 101.5) == []
    alerts, t = _silence(c2, 8)
    alerts += c2.tick(t + 5.0)
    assert {a.kind for a in alerts} == {"nodes_silent"} and _members(c2, "j") == ["nodes_silent"]
