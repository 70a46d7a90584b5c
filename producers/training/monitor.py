"""Training hooks: step timings, torch.distributed collectives, exceptions, and the control channel.

Usage in any PyTorch training loop::

    from vigil.producers.training import TrainingMonitor

    mon = TrainingMonitor.from_env()        # or TrainingMonitor(sink, job=.., rank=.., dp=.., pp=.., tp=..)
    mon.instrument_collectives()            # wraps torch.distributed.all_reduce & co.
    mon.register_ddp_comm_hook(ddp_model)   # DDP only: its gradient all-reduces
    mon.start_hang_watchdog()               # flight-recorder dump when a step hangs
    mon.install_exception_hooks()           # uncaught exceptions are classified and published
    mon.start_control(on_checkpoint=save)   # retry_step / checkpoint / save_and_exit
    # periodic checkpoints: torch.save and torch.distributed.checkpoint.save/async_save called by
    # the loop are marked as checkpoints (instrument_collectives(saves=False) to opt out), so a
    # long save is not taken for a hang; mark any other way of saving yourself:
    #     with mon.checkpoint(step): save(step)
    # a change of configuration that makes steps slower on purpose (not a fail-slow)
    #     mon.note_change("sequence length 4k -> 8k")

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

Traffic seen: every collective and point-to-point call of
``torch.distributed``, DDP's gradient buckets, pipeline bubbles you mark
(:mod:`vigil.producers.training.collectives`). The control channel's
commands: :mod:`vigil.producers.training.commands`; exceptions and the hang
watchdog: :mod:`vigil.producers.training.failures`.

Cost: the hot path appends one list per collective, wait and mark, reads the
clock (or records two events) per call, and does the split once per step;
records leave the process as one datagram per step, at most one per
``flush_interval_s`` (0.2 s: a hang is judged on what arrived, so what waits
here delays its alert), and no record waits longer than that. Validation and encoding happen in the
node batcher.

Time: wall-clock seconds from ``clock`` (default ``time.time``) for start/end,
so records from different ranks line up; on the CPU path durations use the
same clock, on the CUDA path the device's.

Hangs: :meth:`TrainingMonitor.start_hang_watchdog` dumps torch's flight
recorder (:mod:`vigil.producers.training.flight_recorder`) when a step stays
open too long, and publishes it (``flight_recorder_dump``).
"""


from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from vigil.producers.training.collectives import COLLECTIVES, P2P_KIND, CollectiveHooks
from vigil.producers.training.commands import CommandHooks
from vigil.producers.training.control import Command, ControlChannel
from vigil.producers.training.cuda_events import CudaEvents, EventBackend, _events_of, _is_event
from vigil.producers.training.failures import FailureHooks
from vigil.producers.training.saves import SaveHooks
from vigil.producers.training.batching import default_hooks_socket
from vigil.producers.training.timing import BLOCKED, COLLECTIVE, COMPUTE, WAIT, split_step
from vigil.producers.training.wire import Sink, UnixDatagramSink

__all__ = ["TrainingMonitor", "StepContext", "COLLECTIVES", "EventBackend", "CudaEvents", "FLUSH_INTERVAL_S"]

#: At most one datagram per this many seconds (see the module docstring's "Cost").
FLUSH_INTERVAL_S = 0.2


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


class TrainingMonitor(CollectiveHooks, CommandHooks, FailureHooks, SaveHooks):
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
        Records leave at a step's end once this long has passed since the last datagram, and at least
        this often when no step boundary comes.
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
                 flush_interval_s: float = FLUSH_INTERVAL_S, max_buffer: int = 1024, retry_wait_s: float = 0.0,
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
        self._change: str | None = None  # announced by note_change, for the next step to close
        self._step_changes: dict[int, str] = {}  # CUDA path: step -> the change its record carries
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
        # unmarked saves (:mod:`~vigil.producers.training.saves`)
        self._save_wrapped: list[tuple[Any, str, Callable, Callable]] = []
        self._saves_wanted = False
        self._dcp_wrapped = False
        self._saving = 0  # checkpoints under way (a save inside one is part of it)
        self._loop_thread: int | None = None  # the thread that runs the steps
        self._last_step: int | None = None

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
        self._last_step = step
        self._loop_thread = threading.get_ident()
        if self._saves_wanted and not self._dcp_wrapped:
            self._maybe_wrap_dcp()
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
        # sent now when the next step's end (as far as this one's length says) would be past the interval: no
        # record waits longer than flush_interval_s (steps about as long as it used to wait two of them)
        if len(self._buf) >= 1 and (2 * end - start - self._last_flush >= self.flush_interval_s
                                    or len(self._buf) >= self.max_buffer or ctx.commands):
            self.flush()

    def note_change(self, reason: str) -> None:
        """Say that the job's configuration changed on purpose: its step time may shift, and that is no fail-slow.

        A new batch size or sequence length, a resize, another parallel
        layout, a new phase of training: the step in progress, or else the
        next one, carries ``reason`` (its ``iteration`` event's
        ``config_change``), and vigil starts the job's fail-slow detection
        afresh there, judging the steps after it against each other only. A
        shift nobody announced is still judged. Call it on one rank or on
        every rank (the job's step counts once). ``reason``, for a human, is
        cut to 2000 characters; two changes announced before a step closes
        are both named.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"reason must be a non-empty string, got {reason!r}")
        with self._lock:
            self._change = reason if self._change is None else f"{self._change}; {reason}"
            self._change = self._change[:2000]

    def _close_step(self, step: int, start: float, end: float, e0: Any, e1: Any) -> None:
        iv, self._iv = self._iv, []
        self._durations.append(end - start)
        with self._lock:
            change, self._change = self._change, None
        if e0 is None or e1 is None:  # CPU path (or the path changed inside the step)
            self._emit(step, start, end, (start, end), [x for x in iv if not _is_event(x[1])], [], "cpu_wall", change)
            return
        ext, self._external = self._external, []
        if change is not None:
            self._step_changes[step] = change
        self._pending.append((step, start, end, e0, e1, iv, ext))
        while len(self._pending) > self.max_pending_steps:
            old = self._pending.popleft()
            self._dropped_steps += 1
            self._buf.append(["dr", 1, "cuda_events_pending", end])
            self._events.release(_events_of(old))
            lost = self._step_changes.pop(old[0], None)
            if lost is not None:  # the change still holds: the oldest step left carries it
                first = self._pending[0][0]
                later = self._step_changes.get(first)
                self._step_changes[first] = lost if later is None else f"{lost}; {later}"[:2000]

    def _emit(self, step: int, start: float, end: float, span: tuple[float, float], iv: list[list[Any]],
              external: list[tuple[str | None, float]], source: str, change: str | None = None) -> None:
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
        rec = ["it", step, start, end, sp.compute_s, comm, self.dp, self.pp, self.tp, sp.wait_s, by_kind, measured]
        if change is not None:  # only then: a node agent before this field reads the twelve
            rec.append(change)
        self._buf.append(rec)

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
            self._emit(step, start, end, span, dev, ext, "cuda_events", self._step_changes.pop(step, None))
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
            self._saving += 1
            self._buf.append(["ck", "started", int(step), t0, None])
        self.flush(urgent=True)
        phase = "failed"
        try:
            yield
            phase = "completed"
        finally:
            t1 = clock()
            with self._lock:
                self._saving -= 1
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









    def close(self) -> None:
        """The training loop is done: harvest the CUDA path's last steps (blocking: not the hot path), say
        so (hang detection stops waiting for steps), flush and undo every hook."""
        self.stop_hang_watchdog()
        if self._pending:
            self._harvest(block=True)
        with self._lock:
            self._buf.append(["bye", os.getpid(), self._clock()])
        self.flush(urgent=True)
        self.uninstrument_collectives()  # (and the save wrappers)
        self.uninstall_exception_hooks()
        if self.control is not None:
            self.control.close()
            self.control = None
        self.sink.close()


