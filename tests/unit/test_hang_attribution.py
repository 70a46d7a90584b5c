"""A hung job's incident takes the flight recorders' verdict as its cause (engine and correlator, no Kafka)."""

from __future__ import annotations

from vigil.schemas import IterationTiming, JobState, Source, from_seconds
from vigil.schemas.events import FlightRecorderDump
from vigil.streams.engine.pipeline import InProcessPipeline


def _step(job: str, rank: int, step: int, end: float) -> IterationTiming:
    return IterationTiming(event_time=from_seconds(end), source=Source(job=job, rank=rank, node=f"n{rank}"), step=step,
                           start=from_seconds(end - 1.0), end=from_seconds(end), duration_s=1.0)


def _dump(job: str, rank: int, seq: int, retired: bool, at: float) -> FlightRecorderDump:
    grp = [{"name": "0", "desc": "default_pg", "ranks": [0, 1]}]
    return FlightRecorderDump.model_validate({
        "event_time": from_seconds(at), "source": {"job": job, "rank": rank, "node": f"n{rank}"}, "trigger": "hang",
        "available": True, "groups": grp, "entries_total": 1,
        "entries": [{"group": "0", "seq": seq, "op": "gloo:all_reduce", "state": "scheduled", "retired": retired,
                     "created_ns": int((at - 5) * 1e9)}]})


def test_the_hang_incident_is_rerooted_on_the_rank_that_never_entered_the_collective():
    pipe = InProcessPipeline()
    t = 1000.0
    alerts = []
    for step in range(30):
        t += 1.0
        alerts += pipe.feed([_step("j", r, step, t) for r in (0, 1)], t)
    for now in (t + 2.0, t + 3.5):  # 3 x 1 s without a step: a hang
        alerts += pipe.tick(now)
    [hang] = [a for a in alerts if a.kind == "task_hang"]
    alerts = pipe.feed([_dump("j", 0, 31, False, t + 4.0), _dump("j", 1, 30, True, t + 4.1)], t + 4.2)
    [cause] = [a for a in alerts if a.incident_id == hang.incident_id]
    assert cause.status == "update" and cause.kind == "collective_stuck" and cause.severity == 2
    assert cause.subject.job == "j" and cause.subject.rank == 1 and cause.subject.node == "n1"
    assert "rank" in cause.summary


def _unavailable(job: str, rank: int, at: float, why: str) -> FlightRecorderDump:
    return FlightRecorderDump.model_validate({
        "event_time": from_seconds(at), "source": {"job": job, "rank": rank, "node": f"n{rank}"},
        "trigger": "on_demand", "available": False, "unavailable_reason": why, "backend": "gloo",
        "groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1]}]})


def _hung(pipe: InProcessPipeline, job: str = "j") -> tuple[float, list]:
    t = 1000.0
    alerts = []
    for step in range(30):
        t += 1.0
        alerts += pipe.feed([_step(job, r, step, t) for r in (0, 1)], t)
    for now in (t + 2.0, t + 3.5):  # 3 x 1 s without a step: a hang
        alerts += pipe.tick(now)
    return t, alerts


def test_the_hang_incident_says_when_the_recorders_could_not_name_a_culprit():
    pipe = InProcessPipeline()
    t, alerts = _hung(pipe)
    [hang] = [a for a in alerts if a.kind == "task_hang"]
    why = "the flight recorder holds no entries: its buffer is off (set TORCH_FR_BUFFER_SIZE ...)"
    alerts = pipe.feed([_unavailable("j", 0, t + 4.0, why), _unavailable("j", 1, t + 4.1, why)], t + 4.2)
    # both ranks answered: analysed at once, and the hang incident is updated, not a new one opened
    [update] = alerts
    assert update.incident_id == hang.incident_id and update.status == "update"
    assert update.kind == "task_hang" and update.severity == hang.severity  # still the hang, annotated
    [note] = [e for e in update.evidence if e["kind"] == "flight_recorder_unavailable"]
    assert note["unavailable"] == {"0": why, "1": why} and note["subject"]["job"] == "j"


def test_an_unavailable_recorder_with_no_hang_pages_no_one():
    pipe = InProcessPipeline()
    t = 1000.0
    for step in range(10):
        t += 1.0
        assert [a for a in pipe.feed([_step("j", r, step, t) for r in (0, 1)], t) if a.status == "open"] == []
    why = "torch 1.13 has no flight-recorder dump API"
    assert pipe.feed([_unavailable("j", 0, t + 0.1, why), _unavailable("j", 1, t + 0.2, why)], t + 0.3) == []
    assert any(f.kind == "flight_recorder_unavailable" for f in pipe.findings)  # found, and only an annotation


def _restarting(job: str, at: float) -> JobState:
    return JobState(event_time=from_seconds(at), source=Source(job=job, node="n0"), state="restarting",
                    reason="restart 1: sev2 task_hang")


def test_a_verdict_heard_after_the_restart_closed_the_hang_still_names_its_cause():
    """The dumps are taken before the restart, but the restart's 'restarting' can be heard first (another topic)."""
    pipe = InProcessPipeline()
    t, alerts = _hung(pipe)
    [hang] = [a for a in alerts if a.kind == "task_hang"]
    [closed] = pipe.feed([_restarting("j", t + 4.5)], t + 4.6)  # dumps taken at t + 4.0, heard at t + 5
    assert closed.incident_id == hang.incident_id and closed.status == "resolved"
    alerts = pipe.feed([_dump("j", 0, 31, False, t + 4.0), _dump("j", 1, 30, True, t + 4.1)], t + 5.0)
    [cause] = alerts  # no incident of its own: the closed hang's cause, in a further resolved version
    assert cause.incident_id == hang.incident_id and cause.status == "resolved"
    assert cause.incident_version == closed.incident_version + 1
    assert cause.kind == "collective_stuck" and cause.subject.rank == 1 and "resolved: task_hang cleared" in cause.summary


def test_an_unavailable_verdict_heard_late_annotates_the_closed_hang_and_a_later_one_nothing():
    why = "torch 1.13 has no flight-recorder dump API"
    pipe = InProcessPipeline()
    t, alerts = _hung(pipe)
    [hang] = [a for a in alerts if a.kind == "task_hang"]
    [closed] = pipe.feed([_restarting("j", t + 4.5)], t + 4.6)
    [note] = pipe.feed([_unavailable("j", 0, t + 4.0, why), _unavailable("j", 1, t + 4.1, why)], t + 5.0)
    assert note.incident_id == hang.incident_id and note.status == "resolved" and note.kind == "task_hang"
    assert any(e["kind"] == "flight_recorder_unavailable" for e in note.evidence)
    # dumps asked for after that incident closed are about something else: no page, no annotation
    assert pipe.feed([_unavailable("j", 0, t + 100.0, why), _unavailable("j", 1, t + 100.1, why)], t + 100.2) == []
