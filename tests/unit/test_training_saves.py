"""The hooks mark the training loop's unmarked saves as checkpoints: ``torch.save`` and DCP's, real torch.

Ground truth is what each test does: which saves it makes, from which thread, inside which marks.
"""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import pytest

from vigil.producers.training import CallbackSink, TrainingMonitor
from vigil.schemas import Checkpoint

torch = pytest.importorskip("torch")


def make():
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, node="n", flush_interval_s=0.0)
    return mon, got


def marks(got) -> list[tuple[str, int]]:
    return [(e.phase, e.step) for e in got if isinstance(e, Checkpoint)]


def test_an_unmarked_torch_save_in_the_loop_is_a_checkpoint_of_the_last_step(tmp_path):
    mon, got = make()
    original = torch.save
    mon.instrument_saves()
    try:
        for step in range(3):
            with mon.step(step):
                pass
            if step == 1:
                t0 = time.time()
                torch.save({"w": torch.ones(16)}, tmp_path / "ckpt.pt")
                took = time.time() - t0
        assert marks(got) == [("started", 1), ("completed", 1)]
        (done,) = [e for e in got if isinstance(e, Checkpoint) and e.phase == "completed"]
        assert 0 <= done.duration_s <= took
        assert torch.load(tmp_path / "ckpt.pt")["w"].sum() == 16  # the save itself is untouched
    finally:
        mon.close()
    assert torch.save is original  # closing puts it back


def test_a_save_inside_a_marked_checkpoint_is_marked_once(tmp_path):
    mon, got = make()
    mon.instrument_saves()
    try:
        with mon.step(0):
            pass
        with mon.checkpoint(7):
            torch.save(torch.ones(4), tmp_path / "a.pt")
            torch.save(torch.ones(4), tmp_path / "b.pt")
        assert marks(got) == [("started", 7), ("completed", 7)]
    finally:
        mon.close()


def test_a_save_from_another_thread_than_the_loop_is_not_marked(tmp_path):
    """A background writer's save (DCP's async staging threads, a user's saver thread) blocks no step."""
    mon, got = make()
    mon.instrument_saves()
    try:
        with mon.step(0):
            pass
        saver = threading.Thread(target=torch.save, args=(torch.ones(4), tmp_path / "bg.pt"))
        saver.start()
        saver.join()
        assert (tmp_path / "bg.pt").exists() and marks(got) == []
    finally:
        mon.close()


def test_opting_out_leaves_torch_save_alone(tmp_path):
    mon, got = make()
    original = torch.save
    try:
        import torch.distributed as dist

        mon.instrument_collectives(dist, saves=False)
        with mon.step(0):
            pass
        torch.save(torch.ones(4), tmp_path / "x.pt")
        assert torch.save is original and marks(got) == []
    finally:
        mon.close()


def test_instrumenting_torch_distributed_marks_saves_and_undoing_it_puts_torch_save_back(tmp_path):
    import torch.distributed as dist

    mon, got = make()
    original = torch.save
    mon.instrument_collectives(dist)
    assert torch.save is not original
    with mon.step(3):
        pass
    torch.save(torch.ones(4), tmp_path / "y.pt")
    mon.uninstrument_collectives()
    assert torch.save is original and marks(got) == [("started", 3), ("completed", 3)]
    mon.close()


def test_dcp_save_and_async_save_are_marked_once_imported(monkeypatch):
    """DCP is wrapped at the first step after the script imported it (importing it costs seconds)."""
    calls = []
    stub_dcp = SimpleNamespace(save=lambda *a, **k: calls.append("save"),
                               async_save=lambda *a, **k: calls.append("async_save") or "future")
    monkeypatch.delitem(sys.modules, "torch.distributed.checkpoint", raising=False)
    mon, got = make()
    mon.instrument_saves(torch=SimpleNamespace())  # (torch.save stays as it is in this test)
    try:
        with mon.step(0):
            pass
        stub_save = stub_dcp.save
        monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint", stub_dcp)  # the script imports DCP
        assert stub_dcp.save is stub_save  # not yet: at the next step
        with mon.step(1):
            pass
        stub_dcp.save({"w": 1}, checkpoint_id="/nowhere")
        assert stub_dcp.async_save({"w": 1}) == "future"  # its blocking part is the mark
        assert calls == ["save", "async_save"]
        assert marks(got) == [("started", 1), ("completed", 1)] * 2
    finally:
        mon.close()
    assert stub_dcp.save is stub_save


def test_a_real_dcp_save_is_one_checkpoint_not_one_per_file_it_writes(tmp_path):
    import torch.distributed.checkpoint as dcp

    mon, got = make()
    mon.instrument_saves()
    try:
        with mon.step(4):
            pass
        dcp.save({"w": torch.ones(64), "meta": {"lr": 0.1}}, checkpoint_id=str(tmp_path / "dcp"))
        assert marks(got) == [("started", 4), ("completed", 4)]
        assert any((tmp_path / "dcp").iterdir())
    finally:
        mon.close()
