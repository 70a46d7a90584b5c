"""How the CUDA timing path records time: events on the stream the work runs on.

:class:`EventBackend` is what :class:`~vigil.producers.training.monitor.TrainingMonitor`
needs from an event (record, query, elapsed, synchronize, release);
:class:`CudaEvents` is torch's, pooled. A fake with the real thing's
documented behaviour (work completes after the call returns) is in
:mod:`vigil.sim.fake_cuda`.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["EventBackend", "CudaEvents"]


class EventBackend:
    """What the CUDA path needs from a device (duck-typed; :class:`CudaEvents` is the real one).

    ``record()`` returns a new timing event recorded on the *current* stream;
    ``query(e)`` says, without blocking, whether the stream has passed it;
    ``elapsed_s(a, b)`` is the device time from ``a`` to ``b`` in seconds
    (both completed); ``synchronize(e)`` blocks until ``e`` completes (used
    only by :meth:`TrainingMonitor.close`); ``release(events)`` takes events
    back for reuse once read.
    """

    def record(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def query(self, event: Any) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def elapsed_s(self, a: Any, b: Any) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def synchronize(self, event: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def release(self, events: list[Any]) -> None:
        pass


class CudaEvents(EventBackend):  # pragma: no cover - needs a CUDA device (none in CI); the fake in vigil.sim.fake_cuda stands in
    """``torch.cuda.Event(enable_timing=True)`` recorded on the current stream, reused from a pool."""

    def __init__(self, pool_max: int = 8192) -> None:
        import torch

        self._new = functools.partial(torch.cuda.Event, enable_timing=True)
        self._stream_of, self._device = torch.cuda.current_stream, torch.cuda.current_device
        self._pool: list[Any] = []
        self._pool_max = pool_max

    def record(self) -> Any:
        ev = self._pool.pop() if self._pool else self._new()
        # the current stream of the current device, named by index: Event.record() with no stream finds the
        # device through torch's device-type lookup (availability and NVML checks) on every call, half of a
        # 20 us record on an H200, six records a step
        ev.record(self._stream_of(self._device()))
        return ev

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_s(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1000.0

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def release(self, events: list[Any]) -> None:
        room = self._pool_max - len(self._pool)
        if room > 0:
            self._pool.extend(events[:room])


def _is_event(x: Any) -> bool:
    return x is not None and not isinstance(x, (int, float))


def _events_of(pending: tuple) -> list[Any]:
    _step, _start, _end, e0, e1, iv, _ext = pending
    out = [e0, e1]
    for x in iv:
        out.extend(v for v in (x[1], x[2]) if v is not None)
    return out
