"""Training hooks: step timings, torch.distributed collectives, exceptions, and the control channel.

Usage in any PyTorch training loop::

    from vigil.producers.training import TrainingMonitor

    mon = TrainingMonitor.from_env()        # or TrainingMonitor(sink, job=.., rank=.., dp=.., pp=.., tp=..)
    mon.instrument_collectives()            # wraps torch.distributed.all_reduce & co.
    mon.register_ddp_comm_hook(ddp_model)   # DDP only: its gradient all-reduces
    mon.start_hang_watchdog()               # flight-recorder dump when a step hangs
    mon.install_exception_hooks()           # uncaught exceptions are classified and published
    mon.start_control(on_checkpoint=save)   # retry_step / checkpoint / save_and_exit
    # your own periodic checkpoints: mark them, so a long save is not taken for a hang
    #     with mon.checkpoint(step): save(step)

    step = 0
    while step < n_steps:
        with mon.step(step) as s:
            with mon.compute():             # optional: what counts as compute
                loss = train_step(batch)    # collectives inside are timed as communication
        if s.retry:                         # "retry the step in place"
            continue
        if s.exit_requested:                # "save and exit" (on_checkpoint already ran)
            break
        step += 1

What is recorded
----------------
* per step: start, end, wall time (host clock); and how the step divided
  (:mod:`vigil.producers.training.timing`): ``communication`` = the union of
  the collectives' intervals, issue to completion; ``wait`` = time blocked
  waiting for a peer outside collectives (point-to-point send/recv incl.
  ``batch_isend_irecv``, and blocks marked with :meth:`TrainingMonitor.pipeline_wait`);
  ``compute`` = the marked ``mon.compute()`` blocks, or the step's span,
  minus the time blocked on collectives and the waits; seconds per group
  kind; and, per figure, how it was measured (``measured``). The rank's
  dp/pp/tp coordinates.
* per collective: op, process group name, bytes, start and end (host clock),
  whether or not a step is open, so iteration time can be derived with no
  framework change (:mod:`vigil.detectors.period`).

Two timelines
-------------
*CPU path* (``timing="cpu"``; gloo, or any CPU backend): the host clock
around each call, exact there because the work runs while the call (or its
``wait()``) blocks. *CUDA path* (``timing="cuda"``; NCCL): a CUDA
collective returns before it runs, so host time around it measures only its
launch, and its real duration lands wherever the host next synchronises.
There every interval is a pair of CUDA events (``enable_timing``) recorded on
the stream the work runs on: the current stream before and after a
synchronous collective (the collective's stream waits for the first, and the
current stream waits for the collective before the second), the stream a
``Work``'s future hands its callbacks for the end of an asynchronous one, the
current stream around ``wait()`` and around marked blocks. A closed step
waits in a queue until its events have completed; the queue is harvested
with non-blocking ``Event.query()`` at the next step boundaries, so the hot
path never synchronises (records of step N leave a few steps later; beyond
``max_pending_steps`` the oldest are dropped and counted). ``timing="auto"``
chooses CUDA when the default process group's backend is NCCL at
:meth:`TrainingMonitor.instrument_collectives`. Both paths produce the same
record; ``measured`` says which made each figure.

Traffic seen
------------
* the functions of ``torch.distributed`` (:data:`COLLECTIVES`), incl. the
  ``*_single`` ones FSDP2 (``fully_shard``) calls, and ``batch_isend_irecv``;
* DDP: its C++ reducer does not call them; :meth:`TrainingMonitor.register_ddp_comm_hook`
  installs a communication hook that times every gradient bucket (it wraps
  the default all-reduce, or the hook you pass);
* Megatron-style pipelines: point-to-point calls issued through
  ``torch.distributed`` (send/recv, isend/irecv, ``batch_isend_irecv``) are
  timed as *wait* (kind ``pp``) with no marking; wrap the schedule's
  bubbles (the warm-up receives before a stage's first forward, the
  cool-down ones after its last, or any wait your schedule knows is a
  bubble) in ``with mon.pipeline_wait():`` (kind ``bubble``), and any wait the
  wrappers cannot see (a framework's own P2P path) likewise.

Process group names: ``world`` for the default group; a group registered with
:meth:`TrainingMonitor.name_group` (e.g. ``"tp:1"``) has that name; any other
is named by its ranks (``"ranks:0,1"``). The kind of a group is its name's
part before the colon.

Cost: the hot path appends one list per collective, wait and mark, reads the
clock (or records two events) per call, and does the split once per step;
records leave the process as one datagram per step (or per
``flush_interval_s`` without steps). Validation and encoding happen in the
node batcher.

Time: wall-clock seconds from ``clock`` (default ``time.time``) for start/end,
so records from different ranks line up; on the CPU path durations use the
same clock, on the CUDA path the device's.

Hangs: :meth:`TrainingMonitor.start_hang_watchdog` dumps torch's flight
recorder (:mod:`vigil.producers.training.flight_recorder`) when a step stays
open too long, and publishes it (``flight_recorder_dump``).
"""


from __future__ import annotations

import functools
import os
import socket
import statistics
import sys
import threading
import time
import traceback as tb_mod
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from vigil.producers.training.control import Command, ControlChannel, control_path
from vigil.producers.training.exceptions import classify_exception
from vigil.producers.training.batching import default_hooks_socket
from vigil.producers.training.timing import BLOCKED, COLLECTIVE, COMPUTE, WAIT, split_step
from vigil.producers.training.wire import MAX_DATAGRAM, Sink, UnixDatagramSink, encode_datagram

__all__ = ["TrainingMonitor", "StepContext", "COLLECTIVES", "EventBackend", "CudaEvents"]

#: torch.distributed function -> recorded op. Async variants are the same functions with
#: ``async_op=True`` (and isend/irecv), whose handle's ``wait()`` is timed too.
COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",  # FSDP2 (torch >= 2.10)
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",  # FSDP2
    "broadcast": "broadcast",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "barrier": "barrier",
    "reduce": "other",
    "gather": "other",
    "scatter": "other",
}
_ASYNC_ALWAYS = {"isend", "irecv"}
#: Point-to-point functions: their blocking time is *wait* (for a peer), not communication.
_P2P = {"send", "recv", "isend", "irecv"}
#: The group kind under which point-to-point time is reported.
P2P_KIND = "pp"


def _nbytes(x: Any) -> int:
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


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
        self._pool: list[Any] = []
        self._pool_max = pool_max

    def record(self) -> Any:
        ev = self._pool.pop() if self._pool else self._new()
        ev.record()
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


class StepContext:
    """What one ``with mon.step(i)`` block found out (read it after the block)."""

    __slots__ = ("step", "retry", "checkpoint_requested", "exit_requested", "commands", "exception")

    def __init__(self, step: int) -> None:
        self.step = step
        self.retry = False
        self.checkpoint_requested = False
        self.exit_requested = False
        self.commands: list[Command] = []
        self.exception: BaseException | None = None


class _TimedWork:
    """Proxy of an async operation's handle: ``wait()`` is timed (blocked on a collective, or waiting for a peer)."""

    __slots__ = ("_work", "_mon", "_rec", "_iv", "_p2p")

    def __init__(self, work: Any, mon: "TrainingMonitor", rec: list, iv: list | None, p2p: bool) -> None:
        self._work = work
        self._mon = mon
        self._rec = rec
        self._iv = iv
        self._p2p = p2p

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        mon = self._mon
        clock = mon._clock
        t0 = clock()
        s0 = mon._events.record() if mon._cuda else t0
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            t1 = clock()
            s1 = mon._events.record() if mon._cuda else t1
            if self._p2p:
                mon._iv.append([WAIT | BLOCKED, s0, s1, P2P_KIND])
                self._rec[5] = t1
            else:
                mon._iv.append([BLOCKED, s0, s1, None])
                iv = self._iv
                if iv is not None and iv[2] is None:  # no completion callback (yet): it ended by now
                    iv[2] = s1
                    self._rec[5] = t1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class _P2PWrapper:
    """``isend``/``irecv`` wrapped, still equal to the original: ``P2POp`` checks ``op in [isend, irecv]``."""

    def __init__(self, fn: Callable, wrapper: Callable) -> None:
        self._fn = fn
        self._wrapper = wrapper
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self._fn

    def __hash__(self) -> int:
        return hash(self._fn)


class TrainingMonitor:
    """Hooks of one training process (one rank).

    Parameters
    ----------
    sink : Sink
        Where records go: :class:`~vigil.producers.training.wire.UnixDatagramSink` to
        the node batcher (the default of :meth:`from_env`),
        :class:`~vigil.producers.training.wire.PublisherSink`, or a test sink.
    job, rank : identity of the process; ``node``, ``cluster``, ``gpu`` optional.
    dp, pp, tp : int, optional
        The rank's coordinates in the data/pipeline/tensor-parallel grid.
    flush_interval_s : float
        Records leave at least this often when no step boundary comes.
    max_buffer : int
        Records kept before a flush is forced.
    retry_wait_s : float
        When a step raises, wait up to this long for a control command
        (``retry_step`` swallows the exception and sets ``retry``).
    clock : callable
        Seconds since the epoch (the only host clock the hooks read).
    timing : {"auto", "cpu", "cuda"}
        The timeline of the figures (see the module docstring); ``auto``
        resolves to ``cuda`` at :meth:`instrument_collectives` when the
        default group's backend is NCCL, else ``cpu``.
    events : EventBackend, optional
        The CUDA path's events (default :class:`CudaEvents`).
    max_pending_steps : int
        Closed steps whose events have not all completed, kept before the
        oldest is dropped (and counted).
    """

    def __init__(self, sink: Sink, *, job: str, rank: int, node: str | None = None, cluster: str = "default",
                 gpu: int | None = None, dp: int | None = None, pp: int | None = None, tp: int | None = None,
                 flush_interval_s: float = 0.5, max_buffer: int = 1024, retry_wait_s: float = 0.0,
                 clock: Callable[[], float] = time.time, timing: str = "auto", events: EventBackend | None = None,
                 max_pending_steps: int = 64) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if timing not in ("auto", "cpu", "cuda"):
            raise ValueError(f"timing must be 'auto', 'cpu' or 'cuda', got {timing!r}")
        if max_pending_steps < 1:
            raise ValueError(f"max_pending_steps must be >= 1, got {max_pending_steps}")
        self.sink = sink
        self.job = job
        self.rank = rank
        self.dp, self.pp, self.tp = dp, pp, tp
        self.flush_interval_s = flush_interval_s
        self.max_buffer = max_buffer
        self.retry_wait_s = retry_wait_s
        self.timing = timing
        self.max_pending_steps = max_pending_steps
        self._clock = clock
        self.source = {"cluster": cluster, "node": node or socket.gethostname(), "job": job, "rank": rank, "gpu": gpu}
        self._buf: list[list[Any]] = []
        self._lock = threading.Lock()  # collectives may come from several threads
        self._last_flush = clock()
        self._events: Any = events
        self._cuda = False
        if timing == "cuda":
            self._use_cuda()
        self._iv: list[list[Any]] = []  # the open step's intervals: [flags, start, end, kind(, members)]
        self._external: list[tuple[str | None, float]] = []  # record_collective on the CUDA path: (kind, seconds)
        self._pending: deque = deque()  # CUDA path: closed steps waiting for their events
        self._dropped_steps = 0
        self._tls = threading.local()  # depth of calls already timed by an outer wrapper (DDP hook, batch P2P)
        self._in_step = False
        self._step_open_at: float | None = None
        self._durations: deque[float] = deque(maxlen=50)
        self._group_names: dict[int, str] = {}
        self._originals: dict[str, Callable] = {}
        self._dist: Any = None
        self._prev_excepthook: Any = None
        self._prev_threading_hook: Any = None
        self.control: ControlChannel | None = None
        self._on_checkpoint: Callable[[int], None] | None = None
        self._agree_every = 1
        self._exit_asked = False
        self.exit_requested = False
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()
        self.dumps_sent = 0

    @classmethod
    def from_env(cls, **overrides: Any) -> "TrainingMonitor":
        """Build from the environment a launcher (``vigil agent -- cmd``, torchrun) sets.

        ``VIGIL_JOB`` (default ``TORCHELASTIC_RUN_ID`` or ``local``), ``RANK``,
        ``VIGIL_NODE`` (default the host name), ``VIGIL_CLUSTER``,
        ``VIGIL_DP``/``VIGIL_PP``/``VIGIL_TP``, ``LOCAL_RANK`` (as the GPU index),
        ``VIGIL_TIMING`` (auto | cpu | cuda) and ``VIGIL_HOOKS_SOCKET`` (the node
        batcher; default /tmp/vigil-hooks.sock, the agent's default too).
        """
        env = os.environ

        def opt_int(name: str) -> int | None:
            v = env.get(name)
            return int(v) if v not in (None, "") else None

        kw: dict[str, Any] = dict(
            job=env.get("VIGIL_JOB") or env.get("TORCHELASTIC_RUN_ID") or "local",
            rank=int(env.get("RANK", "0")),
            node=env.get("VIGIL_NODE") or None,
            cluster=env.get("VIGIL_CLUSTER") or "default",
            gpu=opt_int("LOCAL_RANK"),
            dp=opt_int("VIGIL_DP"), pp=opt_int("VIGIL_PP"), tp=opt_int("VIGIL_TP"),
            timing=env.get("VIGIL_TIMING") or "auto",
        )
        kw.update(overrides)
        sink = kw.pop("sink", None) or UnixDatagramSink(str(default_hooks_socket()))
        return cls(sink, **kw)

    def _use_cuda(self) -> None:
        if self._events is None:
            self._events = CudaEvents()
        self._cuda = True

    @property
    def timing_path(self) -> str:
        """``cuda`` or ``cpu``: the timeline the figures are measured on now."""
        return "cuda" if self._cuda else "cpu"

    # -- records ---------------------------------------------------------------------------

    def _append(self, rec: list[Any]) -> None:
        with self._lock:
            self._buf.append(rec)
            n = len(self._buf)
        if not self._in_step and (n >= self.max_buffer or self._clock() - self._last_flush >= self.flush_interval_s):
            self.flush()

    def flush(self, urgent: bool = False) -> None:
        """Send buffered records now (after harvesting the CUDA path's completed steps)."""
        if self._pending:
            self._harvest()
        with self._lock:
            buf, self._buf = self._buf, []
            self._last_flush = self._clock()
        if buf or getattr(self.sink, "pending", 0):  # records waiting in the sink go too
            self.sink.send(self.source, buf, urgent=urgent)

    def record_collective(self, op: str, group: str, nbytes: int, start: float, end: float) -> None:
        """Record a collective the wrappers cannot see (host clock); counted as communication.

        On the CPU path it is also blocked time (not compute). On the CUDA path
        host times cannot be placed on the device timeline: its duration is
        added to communication (``measured`` then says ``external``) and
        compute is left as the events found it.
        """
        kind = group.split(":", 1)[0]
        if self._cuda:
            self._external.append((kind, max(0.0, end - start)))
        else:
            self._iv.append([COLLECTIVE | BLOCKED, start, end, kind])
        self._append(["cc", op, group, int(nbytes), start, end])

    def record_wait(self, start: float, end: float, kind: str = P2P_KIND) -> None:
        """Record time blocked waiting for a peer (host clock; CPU path), e.g. measured by a framework."""
        if self._cuda:
            raise RuntimeError("record_wait takes host times, which the CUDA path cannot place on the device "
                               "timeline: use `with mon.pipeline_wait():` around the waiting call instead")
        self._iv.append([WAIT | BLOCKED, start, end, kind])

    # -- steps -------------------------------------------------------------------------------

    @contextmanager
    def step(self, step: int) -> Iterator[StepContext]:
        """Time one iteration; apply control commands at its end."""
        ctx = StepContext(step)
        clock = self._clock
        if self._pending:
            self._harvest()
        self._iv = []
        self._external = []
        self._in_step = True
        start = clock()
        e0 = self._events.record() if self._cuda else None
        self._step_open_at = start
        try:
            yield ctx
        except BaseException as exc:
            e1 = self._events.record() if self._cuda else None
            end = clock()
            self._in_step = False
            self._step_open_at = None
            self._close_step(step, start, end, e0, e1)
            ctx.exception = exc
            self.report_exception(exc, thread=threading.current_thread().name)
            if self._handle_failure(ctx):
                return  # retry in place: the exception is swallowed
            raise
        e1 = self._events.record() if self._cuda else None
        end = clock()
        self._in_step = False
        self._step_open_at = None
        self._close_step(step, start, end, e0, e1)
        self._apply_commands(ctx)
        if len(self._buf) >= 1 and (end - self._last_flush >= self.flush_interval_s or len(self._buf) >= self.max_buffer
                                    or ctx.commands):
            self.flush()

    def _close_step(self, step: int, start: float, end: float, e0: Any, e1: Any) -> None:
        iv, self._iv = self._iv, []
        self._durations.append(end - start)
        if e0 is None or e1 is None:  # CPU path (or the path changed inside the step)
            self._emit(step, start, end, (start, end), [x for x in iv if not _is_event(x[1])], [], "cpu_wall")
            return
        ext, self._external = self._external, []
        self._pending.append((step, start, end, e0, e1, iv, ext))
        while len(self._pending) > self.max_pending_steps:
            old = self._pending.popleft()
            self._dropped_steps += 1
            self._buf.append(["dr", 1, "cuda_events_pending", end])
            self._events.release(_events_of(old))

    def _emit(self, step: int, start: float, end: float, span: tuple[float, float], iv: list[list[Any]],
              external: list[tuple[str | None, float]], source: str) -> None:
        resolved = []
        for x in iv:
            s_, e_ = x[1], x[2]
            if len(x) == 5:  # DDP's wait for a backward's buckets: until the last of them completes
                ends = [m[2] for m in x[4] if m[2] is not None]
                e_ = max(ends) if len(ends) == len(x[4]) else span[1]
            elif e_ is None:  # still in flight when the step closed (CPU path): it lasted the rest of the step
                e_ = span[1]
            resolved.append((x[0], s_, e_, x[3]))
        sp = split_step(span, resolved, source=source)
        comm, by_kind, measured = sp.communication_s, sp.by_kind, sp.measured
        if external:
            by_kind = dict(by_kind)
            for kind, sec in external:
                comm += sec
                if kind is not None:
                    by_kind[kind] = by_kind.get(kind, 0.0) + sec
            measured = dict(measured, communication_s="external" if not any(x[0] & COLLECTIVE for x in resolved)
                            else measured["communication_s"])
        self._buf.append(["it", step, start, end, sp.compute_s, comm, self.dp, self.pp, self.tp, sp.wait_s,
                          by_kind, measured])

    def _harvest(self, block: bool = False) -> None:
        """Emit the CUDA path's closed steps whose events have all completed (oldest first; never blocks unless ``block``)."""
        ev = self._events
        while self._pending:
            step, start, end, e0, e1, iv, ext = self._pending[0]
            events = _events_of(self._pending[0])
            if any(x[2] is None for x in iv if len(x) == 4):
                if not block:
                    return  # an asynchronous end not recorded yet
            if block:
                for x in events:
                    ev.synchronize(x)
            elif not ev.query(e1) or not all(ev.query(x) for x in events):
                return
            self._pending.popleft()
            conv: dict[int, float] = {}

            def t(x: Any) -> float | None:
                if x is None:
                    return None
                k = id(x)
                if k not in conv:
                    conv[k] = ev.elapsed_s(e0, x)
                return conv[k]

            span = (0.0, t(e1))
            dev: list[list[Any]] = []
            memo: dict[int, list[Any]] = {}
            for x in iv:
                y = [x[0], t(x[1]), t(x[2]), x[3]]
                memo[id(x)] = y
                dev.append(y)
            for x, y in zip(iv, dev):
                if len(x) == 5:
                    y.append([memo[id(m)] for m in x[4]])
            self._emit(step, start, end, span, dev, ext, "cuda_events")
            ev.release(events)

    @contextmanager
    def checkpoint(self, step: int) -> Iterator[None]:
        """Mark a checkpoint being saved: hang detection waits for it, and its duration is learned.

        Its start leaves the process at once (the save may take longer than
        the job's hang timeout); its end, with the time it took, too.
        """
        clock = self._clock
        t0 = clock()
        with self._lock:
            self._buf.append(["ck", "started", int(step), t0, None])
        self.flush(urgent=True)
        phase = "failed"
        try:
            yield
            phase = "completed"
        finally:
            t1 = clock()
            with self._lock:
                self._buf.append(["ck", phase, int(step), t1, t1 - t0])
            self.flush(urgent=True)

    @contextmanager
    def compute(self) -> Iterator[None]:
        """Mark a block of the open step as computation (otherwise compute = the step's span minus what was blocked)."""
        rec = [COMPUTE, self._events.record() if self._cuda else self._clock(), None, None]
        try:
            yield
        finally:
            rec[2] = self._events.record() if self._cuda else self._clock()
            self._iv.append(rec)

    @contextmanager
    def pipeline_wait(self, kind: str = "bubble") -> Iterator[None]:
        """Mark a block in which the rank waits for a peer: a pipeline bubble (the schedule's warm-up and
        cool-down waits, a Megatron ``recv_forward`` before the first micro-batch...).

        Its time is ``wait``, never compute or communication, reported under
        group kind ``kind`` (``bubble``: apart from the ``pp`` time of the
        point-to-point calls the wrappers time themselves, which is what a
        slow pipeline link lengthens; mark the schedule's bubbles, not every
        send/recv). Collectives and
        point-to-point calls inside are recorded (``collective`` events) but
        their time is the block's, not counted again.
        """
        cuda = self._cuda
        rec = [WAIT | BLOCKED, self._events.record() if cuda else self._clock(), None, kind]
        tls = self._tls
        tls.marked = getattr(tls, "marked", 0) + 1
        try:
            yield
        finally:
            tls.marked -= 1
            rec[2] = self._events.record() if cuda else self._clock()
            self._iv.append(rec)

    # -- control -----------------------------------------------------------------------------

    def start_control(self, path: str | os.PathLike | None = None, on_checkpoint: Callable[[int], None] | None = None,
                      agree_every: int = 1) -> ControlChannel:
        """Listen for commands on ``path`` (default :func:`~vigil.producers.training.control.control_path`).

        "Save and exit" reaches the ranks at slightly different step
        boundaries; a rank that left alone would leave its peers blocked in
        the next step's collective. So in a ``torch.distributed`` job the
        ranks agree first: every ``agree_every`` steps one tiny all-reduce
        (MAX of a flag; on NCCL it waits for the step's GPU work) tells every
        rank whether any of them was asked; they then save and exit after the
        same step. ``agree_every=0``: no agreement (each rank acts alone).
        """
        if agree_every < 0:
            raise ValueError(f"agree_every must be >= 0, got {agree_every}")
        self._on_checkpoint = on_checkpoint
        self._agree_every = agree_every
        self.control = ControlChannel(path or control_path(self.job, self.rank))
        return self.control

    def _apply_commands(self, ctx: StepContext) -> None:
        if self.control is None:
            return
        for cmd in self.control.poll():
            self._apply(cmd, ctx)
        if self._agree_every and self._world() > 1 and ctx.step % self._agree_every == 0 and self._agree(self._exit_asked):
            self._exit_asked = False
            self._save_and_exit(ctx)

    def _world(self) -> int:
        if self._dist is None and "torch.distributed" in sys.modules:  # not instrumented: still a distributed job
            self._dist = sys.modules["torch.distributed"]
        dist = self._dist
        try:
            return dist.get_world_size() if dist is not None and dist.is_initialized() else 1
        except Exception:
            return 1

    def _agree(self, mine: bool) -> bool:
        """Was any rank asked? One all-reduce (MAX) of a flag, outside the timed collectives."""
        import torch  # noqa: PLC0415 - only reached in a torch.distributed job

        dist = self._dist
        device = "cuda" if "nccl" in str(dist.get_backend()).lower() else "cpu"
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
        self._originals.get("all_reduce", dist.all_reduce)(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _save_and_exit(self, ctx: StepContext) -> None:
        ctx.checkpoint_requested = True
        ctx.exit_requested = True
        self.exit_requested = True
        if self._on_checkpoint is not None:
            with self.checkpoint(ctx.step):
                self._on_checkpoint(ctx.step)

    def _apply(self, cmd: Command, ctx: StepContext) -> None:
        ctx.commands.append(cmd)
        if cmd is Command.retry_step:
            ctx.retry = True
        elif cmd is Command.checkpoint:
            ctx.checkpoint_requested = True
            if self._on_checkpoint is not None:
                with self.checkpoint(ctx.step):
                    self._on_checkpoint(ctx.step)
        elif cmd is Command.save_and_exit:
            if self._agree_every and self._world() > 1:
                self._exit_asked = True  # the ranks agree at the next agreement step (see start_control)
            else:
                self._save_and_exit(ctx)

    def _handle_failure(self, ctx: StepContext) -> bool:
        """After a failed step: apply queued commands, wait ``retry_wait_s`` for one; True = retry."""
        if self.control is None:
            return False
        self._apply_commands(ctx)
        if not ctx.commands and self.retry_wait_s > 0:
            cmd = self.control.wait(self.retry_wait_s)
            if cmd is not None:
                self._apply(cmd, ctx)
        return ctx.retry and not ctx.exit_requested

    # -- exceptions --------------------------------------------------------------------------

    def report_exception(self, exc: BaseException, thread: str | None = None) -> None:
        """Classify and send an exception now (once per exception object)."""
        if getattr(exc, "_vigil_reported", False):
            return
        try:
            exc._vigil_reported = True  # type: ignore[attr-defined]
        except AttributeError:
            pass
        text = "".join(tb_mod.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        rec = ["ex", classify_exception(exc), type(exc).__name__, str(exc)[:4000], text,
               thread or threading.current_thread().name, self._clock()]
        with self._lock:
            self._buf.append(rec)
        self.flush(urgent=True)

    def install_exception_hooks(self) -> None:
        """Publish uncaught exceptions of the main thread and of other threads before the process exits."""
        if self._prev_excepthook is not None:
            return
        self._prev_excepthook = sys.excepthook
        self._prev_threading_hook = threading.excepthook

        def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
            if not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
                try:
                    self.report_exception(exc, thread="MainThread")
                except Exception:  # reporting must never mask the original failure
                    pass
            self._prev_excepthook(exc_type, exc, tb)

        def thread_hook(args: Any) -> None:
            if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
                try:
                    self.report_exception(args.exc_value, thread=getattr(args.thread, "name", None))
                except Exception:
                    pass
            self._prev_threading_hook(args)

        sys.excepthook = excepthook
        threading.excepthook = thread_hook

    def uninstall_exception_hooks(self) -> None:
        if self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
            threading.excepthook = self._prev_threading_hook
            self._prev_excepthook = self._prev_threading_hook = None

    # -- torch.distributed -------------------------------------------------------------------

    def name_group(self, group: Any, name: str) -> None:
        """Name a process group in the records (e.g. ``"tp:0"``: the kind before the colon)."""
        self._group_names[id(group)] = name

    def _group_name(self, group: Any) -> str:
        if group is None:
            return "world"
        name = self._group_names.get(id(group))
        if name is None:
            try:
                ranks = self._dist.get_process_group_ranks(group)
                name = "world" if len(ranks) == self._dist.get_world_size() else "ranks:" + ",".join(map(str, ranks))
            except Exception:
                name = f"group:{id(group):x}"
            self._group_names[id(group)] = name
        return name

    def instrument_collectives(self, dist: Any = None) -> None:
        """Wrap the collectives of ``torch.distributed`` (call after ``init_process_group``).

        With ``timing="auto"`` this is where the path is chosen: CUDA events
        when the default group's backend is NCCL, the host clock otherwise.
        """
        if self._originals:
            return
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415 - torch is optional for the rest
        self._dist = dist
        if self.timing == "auto" and not self._cuda:
            try:
                backend = str(dist.get_backend()).lower()
            except Exception:
                backend = ""
            if "nccl" in backend:
                self._use_cuda()
        for name, op in COLLECTIVES.items():
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._originals[name] = fn
            w = self._wrap(fn, name, op)
            setattr(dist, name, _P2PWrapper(fn, w) if name in _ASYNC_ALWAYS else w)
        batch = getattr(dist, "batch_isend_irecv", None)
        if batch is not None:
            self._originals["batch_isend_irecv"] = batch
            setattr(dist, "batch_isend_irecv", self._wrap_batch(batch))

    def uninstrument_collectives(self) -> None:
        for name, fn in self._originals.items():
            setattr(self._dist, name, fn)
        self._originals = {}

    def _wrap(self, fn: Callable, name: str, op: str) -> Callable:
        mon = self
        always_async = name in _ASYNC_ALWAYS
        p2p = name in _P2P
        async_pos = _ASYNC_POS.get(name)
        tls = self._tls

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "depth", 0):
                return fn(*args, **kwargs)  # inside a call timed as a whole (a DDP hook, a batch of P2P ops)
            clock = mon._clock
            cuda = mon._cuda
            t0 = clock()
            s0 = mon._events.record() if cuda else t0
            result = fn(*args, **kwargs)
            t1 = clock()
            group = kwargs.get("group")
            if group is None and name != "barrier":
                group = _positional_group(name, args)
            elif name == "barrier" and group is None and args:
                group = args[0]
            gname = mon._group_name(group)
            rec = ["cc", op, gname, _nbytes(args[0]) if args and name != "barrier" else 0, t0, t1]
            is_async = always_async or bool(kwargs.get("async_op")) or (
                async_pos is not None and len(args) > async_pos and bool(args[async_pos]))
            if getattr(tls, "marked", 0):  # inside pipeline_wait(): the call is recorded, its time is the block's
                mon._append(rec)
                return result
            if not is_async or result is None:
                s1 = mon._events.record() if cuda else t1
                if p2p:
                    mon._iv.append([WAIT | BLOCKED, s0, s1, P2P_KIND])
                else:
                    mon._iv.append([COLLECTIVE | BLOCKED, s0, s1, gname.split(":", 1)[0]])
                mon._append(rec)
                return result
            mon._append(rec)
            if p2p:
                return _TimedWork(result, mon, rec, None, True)
            iv = [COLLECTIVE, s0, None, gname.split(":", 1)[0]]
            mon._iv.append(iv)
            mon._on_completion(result, iv, rec)
            return _TimedWork(result, mon, rec, iv, False)

        return wrapper

    def _on_completion(self, work: Any, iv: list[Any], rec: list[Any]) -> None:
        """End an async collective's interval when it completes: a callback on its future.

        CPU (gloo): the callback runs on the backend's thread when the work
        completes; the host clock then is its end. CUDA: the callback runs with
        the current stream synchronised with the collective's stream, so an
        event recorded there completes when the collective does.
        """
        try:
            fut = work.get_future()
        except Exception:  # no futures on this backend: the end is when wait() returns
            return
        mon = self
        if self._cuda:
            def done(f: Any) -> None:
                iv[2] = mon._events.record()
        else:
            def done(f: Any) -> None:
                t = mon._clock()
                iv[2] = t
                rec[5] = t
        fut.then(done)

    def _wrap_batch(self, fn: Callable) -> Callable:
        """``batch_isend_irecv``: one wait per returned request; the isend/irecv inside are not timed again."""
        mon = self
        tls = self._tls
        originals = self._originals

        @functools.wraps(fn)
        def wrapper(p2p_op_list: list) -> Any:
            if getattr(tls, "depth", 0):
                return fn(p2p_op_list)
            for p in p2p_op_list:  # torch tells send from recv by identity (`op.op is isend`)
                o = getattr(p, "op", None)
                if isinstance(o, _P2PWrapper):
                    p.op = o._fn
            t0 = mon._clock()
            tls.depth = getattr(tls, "depth", 0) + 1
            try:
                works = fn(p2p_op_list)
            finally:
                tls.depth -= 1
            t1 = mon._clock()
            out = []
            for p, w in zip(p2p_op_list, works or []):
                op = "send" if getattr(p, "op", None) is originals.get("isend") or getattr(getattr(p, "op", None), "__name__", "") == "isend" else "recv"
                rec = ["cc", op, mon._group_name(getattr(p, "group", None)), _nbytes(getattr(p, "tensor", None)), t0, t1]
                mon._append(rec)
                out.append(w if getattr(tls, "marked", 0) else _TimedWork(w, mon, rec, None, True))
            return out if works is not None else works

        return wrapper

    def register_ddp_comm_hook(self, model: Any, hook: Callable | None = None, state: Any = None,
                               group_name: str | None = None) -> None:
        """Install on a ``DistributedDataParallel`` model a communication hook that times every gradient bucket.

        One call instead of ``model.register_comm_hook(state, hook)``: with no
        ``hook`` it wraps torch's default all-reduce (``allreduce_hook``, with
        ``state`` the process group, default DDP's); otherwise it wraps yours
        with your ``state``. DDP accepts one hook per model: if one is already
        registered, pass it here instead.

        Each bucket is a collective from the hook's call to its future's
        completion (kind ``dp`` unless the group was named with
        :meth:`name_group`); the rank is *blocked* from the last bucket's call
        (the end of the backward's compute) until every bucket of that
        backward has completed (DDP waits for them there).
        """
        if getattr(model, "_comm_hooks", None):
            raise RuntimeError("this DDP model already has a communication hook; DDP accepts one: pass it as "
                               "register_ddp_comm_hook(model, hook=your_hook, state=your_state)")
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as hook  # noqa: PLC0415
        default = getattr(hook, "__name__", "") == "allreduce_hook"
        group = state if default and state is not None else getattr(model, "process_group", None)
        if group_name is None:
            group_name = self._group_names.get(id(group)) if group is not None else None
        gname = group_name or "dp"
        kind = gname.split(":", 1)[0]
        mon = self
        tls = self._tls
        batch: list[list[Any]] = []

        def timed_hook(st, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations: none here
            cuda = mon._cuda
            t0 = mon._clock()
            s0 = mon._events.record() if cuda else t0
            tls.depth = getattr(tls, "depth", 0) + 1
            try:
                fut = hook(st, bucket)
            finally:
                tls.depth -= 1
            buf = bucket.buffer()
            rec = ["cc", "all_reduce", gname, int(buf.numel() * buf.element_size()), t0, t0]
            iv = [COLLECTIVE, s0, None, kind]
            mon._iv.append(iv)
            batch.append(iv)
            if bucket.is_last():
                mon._iv.append([BLOCKED, s0, None, None, list(batch)])
                batch.clear()

            def done(f: Any) -> Any:
                if cuda:
                    iv[2] = mon._events.record()
                else:
                    t = mon._clock()
                    iv[2] = t
                    rec[5] = t
                return f.value()

            mon._append(rec)
            return fut.then(done)

        model.register_comm_hook(state, timed_hook)

    # -- hangs: the flight recorder --------------------------------------------------------

    def dump_flight_recorder(self, trigger: str = "on_demand") -> dict[str, Any]:
        """Take this rank's flight-recorder dump now and send it (urgent); returns the payload sent.

        Safe from another thread while the training thread is blocked in a
        collective. Where torch has no recorder (or its buffer size is 0) the
        payload says so (``available`` false, ``unavailable_reason``).
        """
        from vigil.producers.training.flight_recorder import collect_dump, fit_payload

        payload = collect_dump(self._dist, trigger=trigger)
        payload = fit_payload(payload, lambda p: len(encode_datagram(self.source, [["fr", 0.0, p]])) <= MAX_DATAGRAM)
        with self._lock:
            self._buf.append(["fr", self._clock(), payload])
        self.flush(urgent=True)
        self.dumps_sent += 1
        return payload

    def start_hang_watchdog(self, factor: float = 3.0, min_timeout_s: float = 30.0, poll_s: float = 1.0,
                            warmup_steps: int = 3) -> threading.Thread:
        """Dump the flight recorder once when a step stays open longer than ``factor`` x the median step time.

        The timeout is never below ``min_timeout_s``; nothing fires before
        ``warmup_steps`` steps have closed. The thread wakes every ``poll_s``
        seconds (the only work it does then is a comparison).
        """
        if factor <= 1 or min_timeout_s < 0 or poll_s <= 0 or warmup_steps < 1:
            raise ValueError("factor must be > 1, min_timeout_s >= 0, poll_s > 0, warmup_steps >= 1")
        if self._watchdog is not None:
            return self._watchdog
        mon = self

        def run() -> None:
            dumped_for: float | None = None
            while not mon._watchdog_stop.wait(poll_s):
                opened = mon._step_open_at
                if opened is None or len(mon._durations) < warmup_steps or opened == dumped_for:
                    continue
                timeout = max(min_timeout_s, factor * statistics.median(list(mon._durations)))
                if mon._clock() - opened > timeout:
                    dumped_for = opened
                    try:
                        mon.dump_flight_recorder("hang")
                    except Exception:  # the watchdog must not die with the dump
                        pass

        self._watchdog_stop.clear()
        self._watchdog = threading.Thread(target=run, name="vigil-hang-watchdog", daemon=True)
        self._watchdog.start()
        return self._watchdog

    def stop_hang_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog_stop.set()
            self._watchdog.join(timeout=5.0)
            self._watchdog = None

    def close(self) -> None:
        """The training loop is done: harvest the CUDA path's last steps (blocking: not the hot path), say
        so (hang detection stops waiting for steps), flush and undo every hook."""
        self.stop_hang_watchdog()
        if self._pending:
            self._harvest(block=True)
        with self._lock:
            self._buf.append(["bye", os.getpid(), self._clock()])
        self.flush(urgent=True)
        self.uninstrument_collectives()
        self.uninstall_exception_hooks()
        if self.control is not None:
            self.control.close()
            self.control = None
        self.sink.close()


def _is_event(x: Any) -> bool:
    return x is not None and not isinstance(x, (int, float))


def _events_of(pending: tuple) -> list[Any]:
    _step, _start, _end, e0, e1, iv, _ext = pending
    out = [e0, e1]
    for x in iv:
        out.extend(v for v in (x[1], x[2]) if v is not None)
    return out


# Position of the ``group`` parameter in each function's signature.
_GROUP_POS = {"all_reduce": 2, "all_gather": 2, "all_gather_into_tensor": 2, "all_gather_single": 2,
              "reduce_scatter": 3, "reduce_scatter_tensor": 3, "reduce_scatter_single": 3, "broadcast": 2,
              "all_to_all": 2, "all_to_all_single": 4, "send": 2, "recv": 2, "isend": 2, "irecv": 2, "reduce": 3,
              "gather": 3, "scatter": 3}
# Position of ``async_op`` (when passed positionally).
_ASYNC_POS = {"all_reduce": 3, "all_gather": 3, "all_gather_into_tensor": 3, "all_gather_single": 3,
              "reduce_scatter": 4, "reduce_scatter_tensor": 4, "reduce_scatter_single": 4, "broadcast": 3,
              "all_to_all": 3, "all_to_all_single": 5, "barrier": 1, "reduce": 4, "gather": 4, "scatter": 4}


def _positional_group(name: str, args: tuple) -> Any:
    pos = _GROUP_POS.get(name)
    return args[pos] if pos is not None and len(args) > pos else None
