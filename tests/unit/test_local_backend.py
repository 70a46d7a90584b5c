"""The local backend with real processes: ProcessSupervisor.restart and the ranks' control channel."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from vigil.actuators.backends import LocalBackend
from vigil.actuators.backends.local import ControlDirProcesses
from vigil.actuators.state import ActionState
from vigil.producers.agent import ProcessSupervisor
from vigil.producers.training import CallbackSink, TrainingMonitor, control_path
from vigil.schemas import Decision, ProcessExit, Source, Subject
from vigil.services.actuator import SupervisorControl

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def wait_until(pred, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def decision(action: str, job: str = "job-1", plan: dict | None = None) -> Decision:
    did = uuid.uuid4()
    return Decision(event_time=T0, decision_id=did, idempotency_key=str(did), action=action,
                    target=Subject(job=job), reason="test", plan=plan or {})


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="vctl")  # Unix socket paths must stay short
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


# Each rank writes "<restart count> <pid>" to out/rank<RANK>.<restart count>, then sleeps
# (rank 1 ignores SIGTERM, so only SIGKILL after the grace period stops it).
SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    rank, n = os.environ["RANK"], os.environ["VIGIL_RESTART_COUNT"]
    if rank == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(sys.argv[1], f"rank{rank}.{n}"), "w").write(f"{n} {os.getpid()}")
    time.sleep(120)
""")


def test_restart_relaunches_every_rank_and_reports_no_exit_for_the_ones_it_stopped(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(SLEEPER)
    src = Source(node="n1", job="job-1")
    sup = ProcessSupervisor(0.05, src, [sys.executable, str(script), str(tmp_path)], nproc=3)
    sup.start()
    try:
        assert wait_until(lambda: all((tmp_path / f"rank{r}.0").exists() for r in range(3)))
        first = [p.pid for p in sup.procs]
        assert sup.collect(T0) == []
        t = time.monotonic()
        assert sup.restart("decision d1: restart", grace_s=1.0) == 1
        assert time.monotonic() - t < 15  # rank 1 ignored SIGTERM and was killed after the grace period
        assert wait_until(lambda: all((tmp_path / f"rank{r}.1").exists() for r in range(3)))
        assert [(tmp_path / f"rank{r}.1").read_text().split()[0] for r in range(3)] == ["1", "1", "1"]
        assert {p.pid for p in sup.procs}.isdisjoint(first) and not sup.done
        assert sup.collect(T0) == []  # stopped on purpose: not a failure, not reported
        # A rank that dies on its own after the restart is reported as usual.
        sup.procs[2].kill()
        assert wait_until(lambda: sup.procs[2].poll() is not None)
        (exit_,) = sup.collect(T0)
        assert isinstance(exit_, ProcessExit) and exit_.signal == 9 and exit_.source.rank == 2
    finally:
        sup.terminate(timeout_s=1.0)
    assert sup.collect(T0) == []  # terminate() is a deliberate stop too
    with pytest.raises(RuntimeError, match="shutting down"):
        sup.restart("too late")


def test_an_exit_just_before_a_restart_is_still_reported(tmp_path):
    src = Source(node="n1", job="job-1")
    sup = ProcessSupervisor(0.05, src, [sys.executable, "-c",
                                        "import os, sys, time\n"
                                        "if os.environ['RANK'] == '0' and os.environ['VIGIL_RESTART_COUNT'] == '0': sys.exit(7)\n"
                                        "time.sleep(120)"], nproc=2)
    sup.start()
    try:
        assert wait_until(lambda: sup.procs[0].poll() is not None)
        sup.restart("rank 0 exited", grace_s=1.0)  # before any collect() saw the exit
        (exit_,) = sup.collect(T0)
        assert (exit_.exit_code, exit_.source.rank) == (7, 0)
        assert sup.collect(T0) == []
    finally:
        sup.terminate(timeout_s=1.0)


class OneRank:
    """A ProcessControl with one rank (0) of job-1, run by a TrainingMonitor in this process."""

    def __init__(self) -> None:
        self.restarts: list[str] = []

    def jobs(self) -> set[str]:
        return {"job-1"}

    def ranks(self, job: str) -> list[int]:
        return [0] if job == "job-1" else []

    def restart(self, job, reason, wait_s=0.0, prepare=None):
        self.restarts.append(reason)


def test_retry_in_place_through_the_real_control_channel(short_dir):
    mon = TrainingMonitor(CallbackSink(lambda ev: None), job="job-1", rank=0, retry_wait_s=15.0)
    mon.start_control(control_path("job-1", 0, short_dir))
    backend = LocalBackend(OneRank(), short_dir, node="n1")
    attempts: list[int] = []
    outcomes: list = []
    failing = threading.Event()

    def train() -> None:
        step = 0
        while step < 3:
            with mon.step(step) as s:
                attempts.append(step)
                if step == 1 and attempts.count(1) == 1:
                    failing.set()
                    raise RuntimeError("NCCL timeout: ran for 1800000 milliseconds before timing out")
            if s.retry:
                continue
            step += 1

    t = threading.Thread(target=train)
    t.start()
    try:
        assert failing.wait(10)
        outcomes.append(backend.execute(decision("retry_in_place", plan={"ranks": [0]})))
        t.join(20)
    finally:
        mon.close()
    (out,) = outcomes
    assert out.state is ActionState.succeeded and "retry_step queued on ranks [0]" in out.detail
    assert attempts == [0, 1, 1, 2]
    assert out.argv == [["send_command", str(control_path("job-1", 0, short_dir)), "retry_step"]]


def test_retry_in_place_failures_and_nothing_to_do(short_dir):
    backend = LocalBackend(OneRank(), short_dir, node="n1", command_timeout_s=1.0)
    out = backend.execute(decision("retry_in_place"))  # rank 0 has no listener
    assert out.state is ActionState.failed and "no training process listens" in out.detail
    out = backend.execute(decision("retry_in_place", plan={"ranks": [5, 6]}))
    assert out.state is ActionState.succeeded and "nothing to do here" in out.detail
    out = backend.execute(decision("retry_in_place", job="job-2"))
    assert out.state is ActionState.failed and "job job-2 has no ranks under this supervisor" in out.detail
    out = backend.execute(decision("restart_process", plan={"nodes": ["n7"]}))
    assert out.state is ActionState.succeeded and "nothing to do on node n1" in out.detail
    out = backend.execute(decision("rebalance_microbatches", plan={"microbatches": [1, 2]}))
    assert out.state is ActionState.failed and "not supported by the local backend" in out.detail
    dry = backend.execute(decision("restart_process"), dry_run=True)
    assert dry.state is ActionState.succeeded and dry.detail.startswith("dry run:")
    assert backend.control.restarts == []


TRAINER = textwrap.dedent("""
    import os, sys, time
    from vigil.producers.training import CallbackSink, TrainingMonitor
    out, rank, n = sys.argv[1], int(os.environ["RANK"]), os.environ["VIGIL_RESTART_COUNT"]
    mon = TrainingMonitor(CallbackSink(lambda ev: None), job=os.environ["VIGIL_JOB"], rank=rank)
    mon.start_control(on_checkpoint=lambda step: open(os.path.join(out, f"ckpt{rank}.{n}"), "w").write(str(step)))
    open(os.path.join(out, f"up{rank}.{n}"), "w").write("")
    step = 0
    while True:
        with mon.step(step) as s:
            time.sleep(0.02)
        if s.exit_requested:
            mon.close()
            sys.exit(0)
        step += 1
""")


def test_checkpoint_restart_saves_then_restarts_through_the_supervisor(tmp_path, short_dir):
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    src = Source(node="n1", job="job-1")
    sup = ProcessSupervisor(0.05, src, [sys.executable, str(script), str(tmp_path)], nproc=2,
                            env={"VIGIL_CONTROL_DIR": str(short_dir), "PYTHONPATH": os.getcwd()})
    backend = LocalBackend(SupervisorControl(sup, "job-1", grace_s=2.0), short_dir, node="n1", checkpoint_wait_s=20)
    sup.start()
    try:
        assert wait_until(lambda: all((tmp_path / f"up{r}.0").exists() for r in range(2)))
        assert wait_until(lambda: all(control_path("job-1", r, short_dir).exists() for r in range(2)))
        out = backend.execute(decision("checkpoint_restart"))
        assert out.state is ActionState.succeeded, out.detail
        assert "ranks [0, 1] asked to save and exit" in out.detail
        assert all(int((tmp_path / f"ckpt{r}.0").read_text()) >= 0 for r in range(2))  # saved before the restart
        assert [p.returncode for p in sup.procs] == [None, None] and sup.restart_count == 1
        assert wait_until(lambda: all((tmp_path / f"up{r}.1").exists() for r in range(2)))
        assert sup.collect(T0) == []  # they exited because we asked: no ProcessExit
    finally:
        sup.terminate(timeout_s=2.0)


def test_control_dir_processes_finds_ranks_and_cannot_restart(short_dir):
    for r in (0, 3):
        control_path("job-1", r, short_dir).touch()
    control_path("other", 1, short_dir).touch()
    ctl = ControlDirProcesses(short_dir)
    assert ctl.jobs() == {"job-1", "other"} and ctl.ranks("job-1") == [0, 3] and ctl.ranks("job-2") == []
    out = LocalBackend(ctl, short_dir).execute(decision("restart_process"))
    assert out.state is ActionState.failed and "vigil agent --actuate" in out.detail


def test_node_batcher_knows_the_highest_step_of_each_job(short_dir):
    from vigil.producers.training import NodeBatcher, UnixDatagramSink

    class Pub:
        def publish(self, events):
            pass

        def poll(self, timeout_s=0.0):
            pass

    sock = short_dir / "h.sock"
    batcher = NodeBatcher(sock, Pub())
    try:
        assert batcher.highest_step("job-1") is None
        mon = TrainingMonitor(UnixDatagramSink(str(sock)), job="job-1", rank=0, flush_interval_s=0.0)
        for step in (0, 1, 2, 7, 3):  # after a restart from a checkpoint the step goes back: the highest stays
            with mon.step(step):
                pass
        mon.flush()
        assert wait_until(lambda: (batcher.step(time.monotonic()), batcher.highest_step("job-1"))[1] == 7, 10)
        assert batcher.highest_step("job-2") is None
    finally:
        batcher.stop()


def test_pause_ends_when_a_rank_exits_not_at_the_next_poll(tmp_path):
    """Between runs the supervisor waits on its ranks' pidfds: a SIGKILLed rank wakes it at once (the
    pause asked for 10 minutes), its exit is reported by the next collect, and its pidfd is closed."""
    sup = ProcessSupervisor(600.0, Source(cluster="c", job="job-1", node="n1"), [sys.executable, "-c", SLEEPER,
                                                                                 str(tmp_path)], nproc=2)
    sup.start()
    stop = threading.Event()
    try:
        assert wait_until(lambda: all((tmp_path / f"rank{r}.0").exists() for r in range(2)))
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(sup.pause(600.0, stop)), daemon=True)
        waiter.start()
        assert wait_until(lambda: len(sup._pidfds) == 2)  # both ranks watched before the kill
        victim = sup.procs[0].pid
        os.kill(victim, 9)
        waiter.join(timeout=30)
        assert woke == [False]  # woken by the exit, not by stop, long before the 600 s it would wait
        exits = sup.collect(T0)
        assert [(e.pid, e.signal) for e in exits if isinstance(e, ProcessExit)] == [(victim, 9)]
        assert not stop.wait(0.2) and not sup.pause(0.2, stop)  # the other rank still watched, the dead one not
        assert set(sup._pidfds) == {sup.procs[1].pid}
    finally:
        stop.set()
        sup.terminate(timeout_s=1.0)
        sup.close()
    assert sup._pidfds == {}
