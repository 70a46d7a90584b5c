"""A fake CUDA device and NCCL process group that run work asynchronously, for testing GPU timing on CPU.

No GPU is needed, and none is emulated beyond what timing depends on: a host
clock and device streams. Launching a kernel or a collective costs the host
only ``launch_s``; the work runs on its stream after what is queued there.
A collective runs on its own stream (``nccl``) after the current stream's
queued work (as ProcessGroupNCCL makes its stream wait on the current one),
waits for its peers (``peer_wait_s``: how long after it starts on this rank
the last peer arrives) and transfers (``transfer_s``); a synchronous one
makes the current stream wait for it, an asynchronous one returns a
:class:`FakeWork` whose ``wait()`` does. The host learns nothing until it
synchronises (:meth:`FakeCuda.sync_host`, as ``.item()`` does).

:class:`FakeCuda` is also an :class:`~vigil.producers.training.cuda_events.EventBackend`
(``record``/``query``/``elapsed_s``/``synchronize``): events are recorded on
the *current* stream and complete when the stream passes them, and
``elapsed_s`` of an incomplete event raises, as CUDA's does. A future's
``then`` callback runs at once with the current stream set to a fresh
stream that waits for the work (CUDA futures behave so), so an event
recorded in it completes when the collective does.

The device clock and the host clock are one time axis (seconds); the truth
of a test is what it asked the device to do.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["FakeCuda", "FakeStream", "FakeEvent", "FakeWork", "FakeFuture", "FakeNccl", "FakeBucket", "FakeDDP"]


@dataclass
class FakeStream:
    name: str
    tail: float  # device time at which the work queued on it so far is done


class FakeEvent:
    __slots__ = ("time", "stream")

    def __init__(self) -> None:
        self.time: float | None = None
        self.stream: str | None = None


class FakeCuda:
    """Host clock + device streams; the event backend of the monitor's CUDA path."""

    def __init__(self, t0: float = 1_000.0, launch_s: float = 5e-6, record_s: float = 1e-6) -> None:
        self.host = float(t0)
        self.launch_s = launch_s
        self.record_s = record_s
        self.compute = FakeStream("compute", self.host)
        self.nccl = FakeStream("nccl", self.host)
        self.current = self.compute
        self.events_recorded = 0
        self.host_syncs = 0

    # host side
    def clock(self) -> float:
        """The host's wall clock (what ``time.time`` would read)."""
        return self.host

    def host_work(self, seconds: float) -> None:
        """Python/CPU work on the host (nothing on the device)."""
        self.host += seconds

    def kernel(self, seconds: float, stream: FakeStream | None = None) -> None:
        """Launch a kernel of ``seconds`` on ``stream`` (default the current one); returns at once."""
        st = stream or self.current
        start = max(self.host, st.tail)
        st.tail = start + seconds
        self.host += self.launch_s

    def wait_stream(self, waiter: FakeStream, until: float) -> None:
        waiter.tail = max(waiter.tail, until)

    def sync_host(self) -> None:
        """The host waits for the current stream (``.item()``, ``torch.cuda.synchronize``)."""
        self.host = max(self.host, self.current.tail)
        self.host_syncs += 1

    # the event backend
    def record(self) -> FakeEvent:
        ev = FakeEvent()
        ev.time = max(self.host, self.current.tail)
        ev.stream = self.current.name
        self.host += self.record_s
        self.events_recorded += 1
        return ev

    def query(self, event: FakeEvent) -> bool:
        return event.time is not None and self.host >= event.time

    def elapsed_s(self, a: FakeEvent, b: FakeEvent) -> float:
        if not (self.query(a) and self.query(b)):
            raise RuntimeError("elapsed time of an event that has not completed (CUDA raises here too)")
        return float(b.time - a.time)  # type: ignore[operator]

    def synchronize(self, event: FakeEvent) -> None:
        self.host = max(self.host, event.time or self.host)
        self.host_syncs += 1

    def release(self, events: list[Any]) -> None:
        pass


class FakeFuture:
    def __init__(self, dev: FakeCuda, end: float, value: Any = None) -> None:
        self._dev = dev
        self.end = end
        self._value = value

    def then(self, callback: Callable[["FakeFuture"], Any]) -> "FakeFuture":
        dev = self._dev
        saved = dev.current
        dev.current = FakeStream("pool", self.end)  # a stream synchronised with the work
        try:
            value = callback(self)
        finally:
            dev.current = saved
        return FakeFuture(dev, self.end, value)

    def value(self) -> Any:
        return self._value

    def wait(self) -> Any:
        """What DDP does with a bucket's future: the current stream waits for it."""
        self._dev.wait_stream(self._dev.current, self.end)
        return self._value


class FakeWork:
    def __init__(self, dev: FakeCuda, end: float, value: Any = None) -> None:
        self._dev = dev
        self.end = end
        self._value = value

    def wait(self, timeout: Any = None) -> bool:
        self._dev.wait_stream(self._dev.current, self.end)  # non-blocking for the host, as NCCL's
        self._dev.host += self._dev.launch_s
        return True

    def get_future(self) -> FakeFuture:
        return FakeFuture(self._dev, self.end, self._value)

    def is_completed(self) -> bool:
        return self._dev.host >= self.end


class FakeNccl:
    """The parts of ``torch.distributed`` the hooks wrap, on a :class:`FakeCuda`; one rank's view.

    Each call takes the next ``(peer_wait_s, transfer_s)`` from :attr:`script`
    (``(0, default_transfer_s)`` when empty) and appends what it did to
    :attr:`log`: ``(op, group, device start, device end)``.
    """

    def __init__(self, dev: FakeCuda, world: int = 8, default_transfer_s: float = 1e-3) -> None:
        self.dev = dev
        self.world = world
        self.default_transfer_s = default_transfer_s
        self.script: deque[tuple[float, float]] = deque()
        self.log: list[tuple[str, Any, float, float]] = []

    def get_backend(self, group: Any = None) -> str:
        return "nccl"

    def get_world_size(self, group: Any = None) -> int:
        return self.world

    def get_process_group_ranks(self, group: Any) -> list[int]:
        return list(getattr(group, "ranks", range(self.world)))

    def _run(self, op: str, group: Any, async_op: bool, value: Any = None) -> FakeWork | None:
        dev = self.dev
        peer_wait, transfer = self.script.popleft() if self.script else (0.0, self.default_transfer_s)
        dev.wait_stream(dev.nccl, dev.current.tail)  # the collective's stream waits for the current one
        start = max(dev.host, dev.nccl.tail)
        end = start + peer_wait + transfer
        dev.nccl.tail = end
        dev.host += dev.launch_s
        self.log.append((op, group, start, end))
        if async_op:
            return FakeWork(dev, end, value)
        dev.wait_stream(dev.current, end)  # a synchronous collective: the current stream waits for it
        return None

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> FakeWork | None:
        return self._run("all_reduce", group, async_op, tensor)

    def all_gather_into_tensor(self, output: Any, input: Any, group: Any = None, async_op: bool = False) -> FakeWork | None:
        return self._run("all_gather", group, async_op, output)

    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = None, group: Any = None,
                              async_op: bool = False) -> FakeWork | None:
        return self._run("reduce_scatter", group, async_op, output)

    def send(self, tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0) -> None:
        self._run("send", group, False, tensor)

    def recv(self, tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> None:
        self._run("recv", group, False, tensor)

    def isend(self, tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0) -> FakeWork:
        return self._run("send", group, True, tensor)  # type: ignore[return-value]

    def irecv(self, tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> FakeWork:
        return self._run("recv", group, True, tensor)  # type: ignore[return-value]


class FakeBucket:
    """A DDP gradient bucket (``buffer()``, ``is_last()``)."""

    def __init__(self, nbytes: int, last: bool) -> None:
        self._nbytes = nbytes
        self._last = last

    def buffer(self) -> Any:
        class _Buf:
            def __init__(self, n: int) -> None:
                self._n = n

            def numel(self) -> int:
                return self._n // 4

            def element_size(self) -> int:
                return 4

        return _Buf(self._nbytes)

    def is_last(self) -> bool:
        return self._last


class FakeDDP:
    """The part of a DDP model the hooks touch: ``register_comm_hook`` and a backward that calls the hook.

    :meth:`backward` runs each bucket's gradient kernels, calls the hook when
    the bucket is ready (DDP's reducer does so), then makes the current
    stream wait for every bucket's future (DDP's ``finalize_backward``).
    """

    def __init__(self, dev: FakeCuda) -> None:
        self.dev = dev
        self.process_group = None
        self._hook: Callable | None = None
        self._state: Any = None
        self._comm_hooks: list = []

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        if self._hook is not None:
            raise RuntimeError("register_comm_hook can only be called once")
        self._hook, self._state = hook, state
        self._comm_hooks.append((hook, state))

    def backward(self, bucket_compute_s: list[float], bucket_nbytes: int = 1 << 20) -> None:
        futures = []
        for i, sec in enumerate(bucket_compute_s):
            self.dev.kernel(sec)
            b = FakeBucket(bucket_nbytes, last=i == len(bucket_compute_s) - 1)
            futures.append(self._hook(self._state, b))  # type: ignore[misc]
        for f in futures:
            f.wait()
