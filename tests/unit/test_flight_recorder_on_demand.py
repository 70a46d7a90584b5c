"""Flight-recorder dumps on demand: the control command, the hooks' answer, the local backend dumping before a restart.

The ranks are real :class:`TrainingMonitor` objects with real control
channels (Unix sockets) in this process. torch's dump API is replaced where
a test needs a recorder that holds entries (``stub_dump_api``: it returns
torch's own dump of a known hang, ``tests/fixtures/flight_recorder``); the
unavailable path runs the real torch of this machine, whose recorder is off.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from vigil.actuators.backends import LocalBackend
from vigil.actuators.plans import parse_action
from vigil.actuators.state import ActionState
from vigil.detectors.flight_recorder import FlightRecorderAnalyzer, dump_record
from vigil.producers.training import CallbackSink, TrainingMonitor, control_path
from vigil.producers.training import flight_recorder as fr
from vigil.producers.training.control import ControlChannel
from vigil.schemas import Decision, Subject
from vigil.schemas.control import Command, ControlError, send_command
from vigil.schemas.events import FlightRecorderDump

FIX = Path(__file__).parents[1] / "fixtures" / "flight_recorder"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="vfr")  # Unix socket paths must stay short
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def stub_dump_api(monkeypatch):
    """torch's dump API answers with torch's own dump of rank 3 of the fixture hang (gloo, torch 2.13)."""
    raw = fr.read_dump_file(FIX / "rank3.json")
    monkeypatch.setattr(fr, "raw_dump", lambda: (raw, None))
    return raw


def rank(job: str, r: int, where: Path) -> tuple[TrainingMonitor, list]:
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job=job, rank=r, node=f"n{r}", flush_interval_s=0.0)
    mon.start_control(control_path(job, r, where))
    return mon, got


def dumps(events: list) -> list[FlightRecorderDump]:
    return [e for e in events if isinstance(e, FlightRecorderDump)]


def test_a_rank_stuck_in_its_step_answers_a_dump_request_stub_dump_api(short_dir, stub_dump_api):
    mon, got = rank("j", 3, short_dir)
    inside, release = threading.Event(), threading.Event()
    ctxs = []

    def train() -> None:
        with mon.step(0) as s:  # stuck in a collective that never completes: no step boundary comes
            ctxs.append(s)
            inside.set()
            release.wait(30)

    t = threading.Thread(target=train)
    t.start()
    try:
        assert inside.wait(10)
        reply = send_command(control_path("j", 3, short_dir), "dump_flight_recorder", timeout_s=10)
        # answered while the step is still open: the dump has left the process by then
        assert t.is_alive() and reply["ok"] and "flight recorder dumped" in reply["detail"]
        (ev,) = dumps(got)
        assert ev.trigger == "on_demand" and ev.available and ev.source.rank == 3 and ev.source.job == "j"
        assert ev.entries_total == len(stub_dump_api["entries"])
    finally:
        release.set()
        t.join(10)
        mon.close()
    assert ctxs[0].commands == []  # served at once, never queued for a step boundary


def test_without_a_recorder_the_rank_says_why_in_its_dump_real_torch(short_dir, monkeypatch):
    pytest.importorskip("torch")
    for name in fr.BUFFER_ENV:
        monkeypatch.delenv(name, raising=False)
    mon, got = rank("j", 0, short_dir)
    try:
        reply = send_command(control_path("j", 0, short_dir), Command.dump_flight_recorder, timeout_s=20)
    finally:
        mon.close()
    (ev,) = dumps(got)
    assert reply["ok"] and reply["detail"].startswith("flight recorder unavailable")
    assert not ev.available and ev.unavailable_reason and ev.unavailable_reason in reply["detail"]


def test_an_immediate_command_needs_a_handler_and_a_failing_one_says_why(short_dir):
    with pytest.raises(ValueError, match="served at once"):
        ControlChannel(short_dir / "x.sock", handlers={Command.retry_step: lambda: "no"})
    bare = ControlChannel(short_dir / "bare.sock")
    failing = ControlChannel(short_dir / "bad.sock", handlers={Command.dump_flight_recorder: lambda: 1 / 0})
    try:
        with pytest.raises(ControlError, match="not served by this process"):
            send_command(bare.path, "dump_flight_recorder", timeout_s=5)
        with pytest.raises(ControlError, match="ZeroDivisionError"):
            send_command(failing.path, "dump_flight_recorder", timeout_s=5)
        assert bare.poll() == [] and failing.poll() == []  # nothing queued for the training loop
    finally:
        bare.close()
        failing.close()


def fake_dist(groups: dict[str, list[int]]) -> SimpleNamespace:
    """A stub of torch.distributed with these process groups (name -> global ranks)."""
    pgs = {object(): name for name in groups}
    return SimpleNamespace(is_initialized=lambda: True, get_backend=lambda: "gloo",
                           distributed_c10d=SimpleNamespace(_world=SimpleNamespace(pg_names=pgs)),
                           get_process_group_ranks=lambda pg: groups[pgs[pg]])


def test_an_unavailable_dump_names_its_groups_so_the_round_closes_when_all_answered_stub_torch_distributed(monkeypatch):
    monkeypatch.setattr(fr, "raw_dump", lambda: (None, "torch 1.13 has no flight-recorder dump API"))
    dist = fake_dist({"0": [0, 1], "1": [1]})
    det = FlightRecorderAnalyzer(settle_s=60.0)
    for r in (0, 1):
        p = fr.collect_dump(dist, trigger="on_demand")
        assert not p["available"] and p["backend"] == "gloo"
        assert {g["name"]: g["ranks"] for g in p["groups"]} == {"0": [0, 1], "1": [1]}
        det.update(dict(p, rank=r), t=10.0 + r)
    # both members answered: analysed now, not settle_s (60 s) later, when a restart may have resolved the hang
    f = det.finding
    assert f is not None and f.kind == "flight_recorder_unavailable"
    assert f.evidence["unavailable"] == {"0": "torch 1.13 has no flight-recorder dump API",
                                         "1": "torch 1.13 has no flight-recorder dump API"}


# --- the local backend: dump first, then restart -------------------------------------------------------

class Ranks:
    """A ProcessControl of job j's ranks here; a restart notes which dumps had been sent by then."""

    def __init__(self, ranks: list[int], sent: list | None = None) -> None:
        self._ranks = ranks
        self.sent = sent if sent is not None else []
        self.restarts: list[tuple[str, int]] = []

    def jobs(self) -> set[str]:
        return {"j"}

    def ranks(self, job: str) -> list[int]:
        return list(self._ranks) if job == "j" else []

    def restart(self, job, reason, wait_s=0.0, prepare=None):
        self.restarts.append((reason, len(dumps(self.sent))))


def decision(action: str = "restart_process", plan: dict | None = None) -> Decision:
    did = uuid.uuid4()
    return Decision(event_time=T0, decision_id=did, idempotency_key=str(did), action=action,
                    target=Subject(job="j"), reason="sev2 task_hang: restart_process", plan=plan or {})


def test_a_hang_restart_takes_every_ranks_dump_before_stopping_them_stub_dump_api(short_dir, stub_dump_api):
    (m0, got0), (m1, got1) = rank("j", 0, short_dir), rank("j", 1, short_dir)
    sent: list = []
    ctl = Ranks([0, 1], sent)
    m0.sink.fn = m1.sink.fn = sent.extend  # one node batcher: what both ranks sent, in order
    try:
        out = LocalBackend(ctl, short_dir, node="n1").execute(
            decision(plan={"collect_diagnostics": ["flight_recorder"]}))
    finally:
        m0.close()
        m1.close()
    assert out.state is ActionState.succeeded, out.detail
    assert ctl.restarts and ctl.restarts[0][1] == 2  # both dumps were out before the restart began
    assert sorted(e.source.rank for e in dumps(sent)) == [0, 1]
    assert "answered by [0, 1]" in out.detail and "restarted ranks [0, 1]" in out.detail
    assert [a[-1] for a in out.argv] == ["dump_flight_recorder", "dump_flight_recorder", "j"]


def test_a_rank_that_cannot_dump_never_holds_the_restart_back(short_dir):
    stuck = threading.Event()
    slow = ControlChannel(control_path("j", 0, short_dir),
                          handlers={Command.dump_flight_recorder: lambda: stuck.wait(60) and "late"})
    ctl = Ranks([0, 1])  # rank 1 has no control channel at all
    try:
        out = LocalBackend(ctl, short_dir, node="n1", dump_wait_s=0.3).execute(
            decision(plan={"collect_diagnostics": ["flight_recorder"]}))
    finally:
        stuck.set()
        slow.close()
    assert out.state is ActionState.succeeded and len(ctl.restarts) == 1
    assert "answered by []" in out.detail and "rank 0:" in out.detail and "rank 1:" in out.detail
    assert "no training process listens" in out.detail


def test_no_dump_is_asked_unless_the_plan_says_so_and_a_dry_run_says_it_would(short_dir, stub_dump_api):
    mon, got = rank("j", 0, short_dir)
    ctl = Ranks([0])
    backend = LocalBackend(ctl, short_dir, node="n1")
    try:
        out = backend.execute(decision())
        dry = backend.execute(decision(plan={"collect_diagnostics": ["flight_recorder"]}), dry_run=True)
    finally:
        mon.close()
    assert out.state is ActionState.succeeded and "flight recorder" not in out.detail and dumps(got) == []
    assert "for their flight-recorder dumps" in dry.detail and dry.argv[0][-1] == "dump_flight_recorder"
    assert len(ctl.restarts) == 1  # the dry run restarted nothing


def test_the_plan_keeps_known_diagnostics_and_lists_what_it_ignores():
    a = parse_action(decision(plan={"collect_diagnostics": ["flight_recorder", "core_dump", 3, "flight_recorder"]}))
    assert a.diagnostics == ("flight_recorder",)
    assert any(k.startswith("collect_diagnostics") and "core_dump" in k for k in a.ignored_keys)
    assert parse_action(decision(plan={"collect_diagnostics": "flight_recorder"})).diagnostics == ("flight_recorder",)
    assert parse_action(decision(plan={"collect_diagnostics": {"x": 1}})).diagnostics == ()
    assert parse_action(decision(plan={"nodes": ["n1"]})).diagnostics == ()


def test_dump_events_round_trip_as_the_detector_reads_them(stub_dump_api):
    p = fr.collect_dump(fake_dist({"0": [0, 1, 2, 3], "2": [2, 3]}), trigger="on_demand")
    ev = fr.dump_event(p, t=1.7e9, source={"job": "j", "rank": 3, "node": "n3"})
    d = dump_record(FlightRecorderDump.model_validate(json.loads(ev.model_dump_json())))
    assert d["rank"] == 3 and d["available"] and {g["name"]: g["ranks"] for g in d["groups"]}["2"] == [2, 3]
