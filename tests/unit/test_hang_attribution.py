"""A hung job's incident takes the flight recorders' verdict as its cause (engine and correlator, no Kafka)."""

from __future__ import annotations

from vigil.schemas import IterationTiming, Source, from_seconds
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
