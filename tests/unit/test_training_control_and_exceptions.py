"""Exception capture (classified, published before exit) and the control channel."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from vigil.producers.training import (
    CallbackSink, Command, ControlError, NodeBatcher, TrainingMonitor, classify_exception, send_command,
)
from vigil.schemas import TrainingException


@pytest.mark.parametrize("exc, category", [
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)"), "out_of_memory"),
    (MemoryError(), "out_of_memory"),
    (RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"), "illegal_memory_access"),
    (RuntimeError("CUDA error: device-side assert triggered"), "cuda_error"),
    (RuntimeError("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled cuda error, NCCL version 2.18.1"), "nccl_error"),
    (RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600409 milliseconds before timing out."), "nccl_timeout"),
    (ConnectionResetError(104, "Connection reset by peer"), "connection_reset"),
    # what gloo says on the surviving ranks when a peer process dies
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5827. "
                  "This is typically caused by a remote worker crashing."), "connection_reset"),
    (KeyError("x"), "other"),
])
def test_classification(exc, category):
    assert classify_exception(exc) == category


def test_classification_follows_the_cause():
    try:
        try:
            raise RuntimeError("NCCL communicator was aborted")
        except RuntimeError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        assert classify_exception(outer) == "nccl_error"


def test_uncaught_exceptions_in_main_and_other_threads_are_published_before_exit(tmp_path):
    published: list = []

    class Pub:
        def publish(self, events):
            published.extend(events)

        def poll(self, timeout_s=0.0):
            pass

    sock = tmp_path / "h.sock"
    batcher = NodeBatcher(sock, Pub())
    script = textwrap.dedent(f"""
        import threading
        from vigil.producers.training import TrainingMonitor, UnixDatagramSink
        mon = TrainingMonitor(UnixDatagramSink({str(sock)!r}), job="j", rank=2, node="n")
        mon.install_exception_hooks()
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("NCCL error: remote process exited")), name="loader")
        t.start(); t.join()
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "CUDA out of memory" in p.stderr  # the original hook still ran
    for _ in range(20):
        batcher.step(time.monotonic())
    batcher.stop()
    exc = sorted((e for e in published if isinstance(e, TrainingException)), key=lambda e: e.thread)
    assert [(e.thread, e.category.value, e.exc_type) for e in exc] == [
        ("MainThread", "out_of_memory", "RuntimeError"), ("loader", "nccl_error", "RuntimeError")]
    assert all(e.source.rank == 2 and "Traceback" in e.traceback for e in exc)


def _queued(ch, timeout_s: float = 5.0) -> None:
    """A command is confirmed on receipt and queued a moment later: wait for the queue."""
    deadline = time.monotonic() + timeout_s
    while ch._queue.empty() and time.monotonic() < deadline:
        time.sleep(0.001)


def test_control_channel_checkpoint_and_save_and_exit(tmp_path):
    saved: list[int] = []
    mon = TrainingMonitor(CallbackSink(lambda ev: None), job="job/1", rank=0)
    ch = mon.start_control(tmp_path / "ctl.sock", on_checkpoint=saved.append)
    try:
        with mon.step(0) as s:
            pass
        assert not s.commands
        assert send_command(ch.path, "checkpoint")["ok"]
        _queued(ch)
        with mon.step(1) as s:
            pass
        assert s.checkpoint_requested and not s.exit_requested and saved == [1]
        send_command(ch.path, Command.save_and_exit)
        _queued(ch)
        with mon.step(2) as s:
            pass
        assert s.exit_requested and mon.exit_requested and saved == [1, 2]
        with pytest.raises(ControlError, match="refused|expected"):
            import json, socket as so

            # a malformed command is refused with a reason
            c = so.socket(so.AF_UNIX, so.SOCK_DGRAM)
            c.bind("\0vigil-test-bad")
            c.settimeout(5)
            c.sendto(json.dumps({"command": "format_disk"}).encode(), str(ch.path))
            reply = json.loads(c.recv(4096))
            c.close()
            raise ControlError(reply["error"])
    finally:
        mon.close()
    with pytest.raises(ControlError, match="no training process"):
        send_command(tmp_path / "ctl.sock", "checkpoint", timeout_s=1)


def test_retry_step_in_place_after_a_failed_step(tmp_path):
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, retry_wait_s=5.0)
    ch = mon.start_control(tmp_path / "ctl.sock")
    attempts = []
    replies: list = []
    step = 0
    import threading

    sender = threading.Timer(0.1, lambda: replies.append(send_command(ch.path, "retry_step")))
    try:
        while step < 3:
            with mon.step(step) as s:
                attempts.append(step)
                if step == 1 and attempts.count(1) == 1:
                    # the decision engine answers the published exception with "retry in place"
                    sender.start()
                    raise RuntimeError("[Rank 0] Watchdog caught collective operation timeout: ran for 1800000 milliseconds before timing out")
            if s.retry:
                continue
            step += 1
    finally:
        mon.close()
        sender.join(10)
    assert attempts == [0, 1, 1, 2]
    assert [r["ok"] for r in replies] == [True]  # the sender heard back even though the loop closed the channel
    exc = [e for e in got if isinstance(e, TrainingException)]
    assert [e.category.value for e in exc] == ["nccl_timeout"]


def test_failed_step_without_a_retry_command_raises(tmp_path):
    mon = TrainingMonitor(CallbackSink(lambda ev: None), job="j", rank=0, retry_wait_s=0.05)
    mon.start_control(tmp_path / "ctl.sock")
    try:
        with pytest.raises(ZeroDivisionError):
            with mon.step(0):
                1 / 0
    finally:
        mon.close()


class _StubDist:
    """Stands in for torch.distributed (no second process here): world of 2, the peer's flag given.

    Follows all_reduce(MAX)'s documented result: every rank ends with the largest value.
    """

    class ReduceOp:
        MAX = "max"

    def __init__(self, peer_flag: int) -> None:
        self.peer_flag = peer_flag
        self.calls = 0

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def get_backend(self) -> str:
        return "gloo"

    def all_reduce(self, tensor, op=None) -> None:
        assert op == self.ReduceOp.MAX
        self.calls += 1
        tensor.fill_(max(int(tensor.item()), self.peer_flag))


@pytest.mark.parametrize("asked_here", [True, False])
def test_save_and_exit_is_agreed_by_every_rank_stub_dist(tmp_path, asked_here):
    pytest.importorskip("torch")
    saved: list[int] = []
    mon = TrainingMonitor(CallbackSink(lambda ev: None), job="j", rank=0)
    mon._dist = _StubDist(peer_flag=0 if asked_here else 1)  # the peer was asked, or this rank was
    ch = mon.start_control(tmp_path / "ctl.sock", on_checkpoint=saved.append, agree_every=2)
    try:
        if asked_here:
            send_command(ch.path, "save_and_exit")
            _queued(ch)
        with mon.step(3) as s:  # not an agreement step: the ranks go on together
            pass
        assert not s.exit_requested and saved == []
        with mon.step(4) as s:  # they agree: every rank saves this step and leaves
            pass
        assert s.exit_requested and s.checkpoint_requested and saved == [4]
        assert mon._dist.calls == 1
    finally:
        mon.close()
