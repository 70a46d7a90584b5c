"""Training hooks: step timings, torch.distributed collectives, exceptions, and the control channel.

Usage in any PyTorch training loop::

    from vigil.producers.training import TrainingMonitor

    mon = TrainingMonitor.from_env()        # or TrainingMonitor(sink, job=.., rank=.., dp=.., pp=.., tp=..)
    mon.instrument_collectives()            # wraps torch.distributed.all_reduce & co.
    mon.install_exception_hooks()           # uncaught exceptions are classified and published
    mon.start_control(on_checkpoint=save)   # retry_step / checkpoint / save_and_exit
    # your own periodic checkpoints: mark them, so a long save is not taken for a hang
    #     with mon.checkpoint(step): save(step)

    step = 0
    while step < n_steps:
        with mon.step(step) as s:
            loss = train_step(batch)        # collectives inside are timed as communication
        if s.retry:                         # "retry the step in place"
            continue
        if s.exit_requested:                # "save and exit" (on_checkpoint already ran)
            break
        step += 1

What is recorded
----------------
* per step: start, end, wall time; communication = time spent inside
  instrumented collectives (blocking calls, and ``wait()`` on the handles of
  async ones); compute = the rest, or the sum of explicit ``mon.compute()``
  blocks when the loop marks them; the rank's dp/pp/tp coordinates.
* per collective: op, process group name, bytes, start and end, whether or
  not a step is open, so iteration time can be derived with no framework
  change (:mod:`vigil.detectors.period`).

Process group names: ``world`` for the default group; a group registered with
:meth:`TrainingMonitor.name_group` (e.g. ``"tp:1"``) has that name; any other
is named by its ranks (``"ranks:0,1"``).

Cost: the hot path appends one tuple per collective and per step and reads
the clock twice; records leave the process as one datagram per step (or per
``flush_interval_s`` without steps). Validation and encoding happen in the
node batcher. Collectives issued by C++ (DDP's reducer) do not pass through
the Python API and are not seen; wrap them with :meth:`record_collective` or
a DDP communication hook if needed.

Time: wall-clock seconds from ``clock`` (default ``time.time``) for start/end,
so records from different ranks line up; durations use the same clock.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
import traceback as tb_mod
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from vigil.producers.training.control import Command, ControlChannel, control_path
from vigil.producers.training.exceptions import classify_exception
from vigil.producers.training.batching import default_hooks_socket
from vigil.producers.training.wire import Sink, UnixDatagramSink

__all__ = ["TrainingMonitor", "StepContext", "COLLECTIVES"]

#: torch.distributed function -> recorded op. Async variants are the same functions with
#: ``async_op=True`` (and isend/irecv), whose handle's ``wait()`` is timed too.
COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
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


def _nbytes(x: Any) -> int:
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


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
    """Proxy of an async collective's handle: ``wait()`` is timed as communication."""

    __slots__ = ("_work", "_mon", "_rec")

    def __init__(self, work: Any, mon: "TrainingMonitor", rec: list) -> None:
        self._work = work
        self._mon = mon
        self._rec = rec

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        clock = self._mon._clock
        t0 = clock()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            t1 = clock()
            self._rec[5] = t1  # the collective ends when its wait returns
            self._mon._comm += t1 - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


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
        Seconds since the epoch (the only clock the hooks read).
    """

    def __init__(self, sink: Sink, *, job: str, rank: int, node: str | None = None, cluster: str = "default",
                 gpu: int | None = None, dp: int | None = None, pp: int | None = None, tp: int | None = None,
                 flush_interval_s: float = 0.5, max_buffer: int = 1024, retry_wait_s: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.sink = sink
        self.job = job
        self.rank = rank
        self.dp, self.pp, self.tp = dp, pp, tp
        self.flush_interval_s = flush_interval_s
        self.max_buffer = max_buffer
        self.retry_wait_s = retry_wait_s
        self._clock = clock
        self.source = {"cluster": cluster, "node": node or socket.gethostname(), "job": job, "rank": rank, "gpu": gpu}
        self._buf: list[list[Any]] = []
        self._lock = threading.Lock()  # collectives may come from several threads
        self._last_flush = clock()
        self._comm = 0.0  # communication seconds inside the open step
        self._compute: float | None = None  # explicit compute seconds inside the open step
        self._in_step = False
        self._group_names: dict[int, str] = {}
        self._originals: dict[str, Callable] = {}
        self._dist: Any = None
        self._prev_excepthook: Any = None
        self._prev_threading_hook: Any = None
        self.control: ControlChannel | None = None
        self._on_checkpoint: Callable[[int], None] | None = None
        self.exit_requested = False

    @classmethod
    def from_env(cls, **overrides: Any) -> "TrainingMonitor":
        """Build from the environment a launcher (``vigil agent -- cmd``, torchrun) sets.

        ``VIGIL_JOB`` (default ``TORCHELASTIC_RUN_ID`` or ``local``), ``RANK``,
        ``VIGIL_NODE`` (default the host name), ``VIGIL_CLUSTER``,
        ``VIGIL_DP``/``VIGIL_PP``/``VIGIL_TP``, ``LOCAL_RANK`` (as the GPU index),
        and ``VIGIL_HOOKS_SOCKET`` (the node batcher; default /tmp/vigil-hooks.sock, the agent's default too).
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
        )
        kw.update(overrides)
        sink = kw.pop("sink", None) or UnixDatagramSink(str(default_hooks_socket()))
        return cls(sink, **kw)

    # -- records ---------------------------------------------------------------------------

    def _append(self, rec: list[Any]) -> None:
        with self._lock:
            self._buf.append(rec)
            n = len(self._buf)
        if not self._in_step and (n >= self.max_buffer or rec[-1] - self._last_flush >= self.flush_interval_s):
            self.flush()

    def flush(self, urgent: bool = False) -> None:
        """Send buffered records now."""
        with self._lock:
            buf, self._buf = self._buf, []
            self._last_flush = self._clock()
        if buf or getattr(self.sink, "pending", 0):  # records waiting in the sink go too
            self.sink.send(self.source, buf, urgent=urgent)

    def record_collective(self, op: str, group: str, nbytes: int, start: float, end: float) -> None:
        """Record a collective the wrappers cannot see (e.g. from C++); counted as communication."""
        self._comm += max(0.0, end - start)
        self._append(["cc", op, group, int(nbytes), start, end])

    # -- steps -------------------------------------------------------------------------------

    @contextmanager
    def step(self, step: int) -> Iterator[StepContext]:
        """Time one iteration; apply control commands at its end."""
        ctx = StepContext(step)
        clock = self._clock
        self._comm = 0.0
        self._compute = None
        self._in_step = True
        start = clock()
        try:
            yield ctx
        except BaseException as exc:
            end = clock()
            self._in_step = False
            self._close_step(step, start, end)
            ctx.exception = exc
            self.report_exception(exc, thread=threading.current_thread().name)
            if self._handle_failure(ctx):
                return  # retry in place: the exception is swallowed
            raise
        end = clock()
        self._in_step = False
        self._close_step(step, start, end)
        self._apply_commands(ctx)
        if len(self._buf) >= 1 and (end - self._last_flush >= self.flush_interval_s or len(self._buf) >= self.max_buffer
                                    or ctx.commands):
            self.flush()

    def _close_step(self, step: int, start: float, end: float) -> None:
        comm = self._comm
        compute = self._compute if self._compute is not None else max(0.0, (end - start) - comm)
        self._buf.append(["it", step, start, end, compute, comm, self.dp, self.pp, self.tp])

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
        """Mark a block of the open step as computation (otherwise compute = step - communication)."""
        t0 = self._clock()
        try:
            yield
        finally:
            self._compute = (self._compute or 0.0) + (self._clock() - t0)

    # -- control -----------------------------------------------------------------------------

    def start_control(self, path: str | os.PathLike | None = None, on_checkpoint: Callable[[int], None] | None = None) -> ControlChannel:
        """Listen for commands on ``path`` (default :func:`~vigil.producers.training.control.control_path`)."""
        self._on_checkpoint = on_checkpoint
        self.control = ControlChannel(path or control_path(self.job, self.rank))
        return self.control

    def _apply_commands(self, ctx: StepContext) -> None:
        if self.control is None:
            return
        for cmd in self.control.poll():
            self._apply(cmd, ctx)

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
            ctx.checkpoint_requested = True
            ctx.exit_requested = True
            self.exit_requested = True
            if self._on_checkpoint is not None:
                with self.checkpoint(ctx.step):
                    self._on_checkpoint(ctx.step)

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
        """Wrap the collectives of ``torch.distributed`` (call after ``import torch.distributed``)."""
        if self._originals:
            return
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415 - torch is optional for the rest
        self._dist = dist
        for name, op in COLLECTIVES.items():
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._originals[name] = fn
            setattr(dist, name, self._wrap(fn, name, op))

    def uninstrument_collectives(self) -> None:
        for name, fn in self._originals.items():
            setattr(self._dist, name, fn)
        self._originals = {}

    def _wrap(self, fn: Callable, name: str, op: str) -> Callable:
        mon = self
        always_async = name in _ASYNC_ALWAYS

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            clock = mon._clock
            t0 = clock()
            result = fn(*args, **kwargs)
            t1 = clock()
            mon._comm += t1 - t0
            group = kwargs.get("group")
            if group is None and name != "barrier":
                group = _positional_group(name, args)
            elif name == "barrier" and group is None and args:
                group = args[0]
            rec = ["cc", op, mon._group_name(group), _nbytes(args[0]) if args and name != "barrier" else 0, t0, t1]
            mon._append(rec)
            if result is not None and (always_async or kwargs.get("async_op")):
                return _TimedWork(result, mon, rec)
            return result

        return wrapper

    def close(self) -> None:
        """The training loop is done: say so (hang detection stops waiting for steps), flush, unhook."""
        with self._lock:
            self._buf.append(["bye", os.getpid(), self._clock()])
        self.flush(urgent=True)
        self.uninstrument_collectives()
        self.uninstall_exception_hooks()
        if self.control is not None:
            self.control.close()
            self.control = None
        self.sink.close()


# Position of the ``group`` parameter in each function's signature.
_GROUP_POS = {"all_reduce": 2, "all_gather": 2, "all_gather_into_tensor": 2, "reduce_scatter": 3,
              "reduce_scatter_tensor": 3, "broadcast": 2, "all_to_all": 2, "all_to_all_single": 4,
              "send": 2, "recv": 2, "isend": 2, "irecv": 2, "reduce": 3, "gather": 3, "scatter": 3}


def _positional_group(name: str, args: tuple) -> Any:
    pos = _GROUP_POS.get(name)
    return args[pos] if pos is not None and len(args) > pos else None
