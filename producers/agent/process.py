"""Process supervision: launch the training command like torchrun does, or watch existing PIDs.

:class:`ProcessSupervisor` starts ``nproc`` copies of a command, one per local
rank, with the environment torchrun sets (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and what the hooks read (``VIGIL_JOB``,
``VIGIL_NODE``, ``VIGIL_CLUSTER``, ``VIGIL_HOOKS_SOCKET``,
``VIGIL_CONTROL_DIR``, ``VIGIL_RESTART_COUNT``), and reports each exit as a
:class:`~vigil.schemas.ProcessExit` with its exit code or the signal that killed it.

:meth:`ProcessSupervisor.restart` stops every rank (SIGTERM, SIGKILL after a
grace period) and launches them again with ``VIGIL_RESTART_COUNT`` one
higher. A process the supervisor stops itself (a restart, or
:meth:`~ProcessSupervisor.terminate` at shutdown) did not fail: its exit is
logged, not published; a rank that exited on its own before is still
reported. Between runs it waits on each rank's pidfd, so an exit is reported
as it happens, not at the next poll.

:class:`PidWatcher` watches processes it did not start (``/proc/<pid>``);
the exit status of a process that is not our child cannot be known on
Linux, so its exit carries neither code nor signal.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, Sequence

from vigil.producers.agent.base import Collector
from vigil.schemas import Envelope, ProcessExit, Source

log = logging.getLogger(__name__)

__all__ = ["ProcessSupervisor", "PidWatcher", "exit_event"]


def exit_event(now: datetime, source: Source, pid: int, returncode: int | None, local_rank: int | None,
               command: str | None) -> ProcessExit:
    """``returncode`` as subprocess gives it: negative = killed by that signal."""
    code = sig = None
    if returncode is not None:
        if returncode < 0:
            sig = -returncode
        else:
            code = returncode
    return ProcessExit(event_time=now, source=source, pid=pid, exit_code=code, signal=sig, local_rank=local_rank,
                       command=command)

_TRAMPOLINE = ("import os, signal, sys\n"
               "for s in ({},): signal.signal(s, signal.SIG_IGN)\n"
               "os.execvp(sys.argv[1], sys.argv[1:])")


class ProcessSupervisor(Collector):
    name = "process"

    def __init__(self, interval_s: float, source: Source, command: Sequence[str], nproc: int = 1, *,
                 nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int = 29500,
                 env: Mapping[str, str] | None = None, cwd: str | None = None, log_dir: str | os.PathLike | None = None,
                 ignore_signals: Sequence[int] = ()) -> None:
        super().__init__(interval_s, source)
        if not command:
            raise ValueError("no command to supervise")
        if nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {nproc}")
        self.command = list(command)
        if ignore_signals:
            # Ignored signals stay ignored across exec: a tiny trampoline sets them and becomes the command
            # (preexec_fn is unsafe in a threaded agent). Under Slurm the early warning reaches every
            # process of the step; the ranks must not die of it, the agent answers it.
            import shutil

            if shutil.which(self.command[0]) is None:  # as Popen would say, before the trampoline hides it
                raise FileNotFoundError(f"{self.command[0]}: command not found")
            nums = ",".join(str(int(s)) for s in ignore_signals)
            self.command = [sys.executable, "-c", _TRAMPOLINE.format(nums), *self.command]
        self.nproc, self.nnodes, self.node_rank = nproc, nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.procs: list[subprocess.Popen] = []
        self._reported: set[int] = set()
        self.returncodes: dict[int, int] = {}
        #: Restarts so far; the ranks see it as VIGIL_RESTART_COUNT.
        self.restart_count = 0
        self._lock = threading.RLock()  # collect() and restart() run on different threads
        self._restarting = False
        self._closed = False  # terminate() was called: no more restarts
        self._wake = threading.Event()
        self._carried: list[tuple[int, subprocess.Popen, int]] = []  # exits seen by restart(), reported by collect()
        self._pidfds: dict[int, int] = {}  # pid -> pidfd of a live rank; only pause() opens and closes them
        self._woke: set[int] = set()  # pids whose pidfd already woke a pause (each wakes once: no spinning)

    def rank_env(self, local_rank: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update({
            "RANK": str(self.node_rank * self.nproc + local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.nnodes * self.nproc),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "VIGIL_RESTART_COUNT": str(self.restart_count),
        })
        if self.source.job:
            env["VIGIL_JOB"] = self.source.job
        if self.source.node:
            env["VIGIL_NODE"] = self.source.node
        env["VIGIL_CLUSTER"] = self.source.cluster
        return env

    @property
    def global_ranks(self) -> list[int]:
        return [self.node_rank * self.nproc + lr for lr in range(self.nproc)]

    def start(self) -> None:
        for lr in range(self.nproc):
            out = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                out = open(self.log_dir / f"rank{self.node_rank * self.nproc + lr}.log", "ab")
            try:
                self.procs.append(subprocess.Popen(self.command, env=self.rank_env(lr), cwd=self.cwd,
                                                   stdout=out, stderr=subprocess.STDOUT if out else None))
            finally:
                if out is not None:
                    out.close()

    @property
    def closed(self) -> bool:
        """:meth:`terminate` was called: the supervisor is stopping and restarts no more."""
        return self._closed

    @property
    def done(self) -> bool:
        if self._restarting:
            return False
        procs = self.procs
        return bool(procs) and all(p.poll() is not None for p in procs)

    @property
    def exit_code(self) -> int:
        """torchrun's rule: 0 when every rank exited 0, else the first failure's code (128+signal)."""
        for p in self.procs:
            rc = p.poll()
            if rc not in (None, 0):
                return 128 - rc if rc < 0 else rc
        return 0

    def pause(self, delay_s: float, stop: threading.Event) -> bool:
        """Wait for the next run, or less: until a rank exits (its pidfd turns readable).

        A poll every interval alone leaves an exit unseen for up to an interval (100 ms by default),
        all of it latency of the process_exit alert. Without pidfds (Linux < 5.3) it waits as usual.
        """
        fds = self._live_pidfds()
        if not fds or delay_s <= 0:
            return stop.wait(max(0.0, delay_s))
        try:
            ready, _, _ = select.select(list(fds), [], [], delay_s)
        except (OSError, ValueError):
            return stop.wait(delay_s)
        self._woke.update(fds[fd] for fd in ready)
        return stop.is_set()

    def _live_pidfds(self) -> dict[int, int]:
        """fd -> pid for the ranks not yet reported, opening and closing pidfds as ranks come and go."""
        pids = {p.pid for p in self.procs}
        self._woke &= pids
        live = {pid for pid in pids if pid not in self._reported and pid not in self._woke}
        for pid in [pid for pid in self._pidfds if pid not in live]:
            os.close(self._pidfds.pop(pid))
        for pid in live - self._pidfds.keys():
            try:
                self._pidfds[pid] = os.pidfd_open(pid)
            except (AttributeError, OSError):  # no pidfd here, or already reaped: the poll finds it
                pass
        return {fd: pid for pid, fd in self._pidfds.items()}

    def close(self) -> None:
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()

    def collect(self, now: datetime) -> list[Envelope]:
        out: list[Envelope] = []
        cmd = shlex.join(self.command)[:2000]
        with self._lock:
            exited, self._carried = self._carried, []
            for lr, p in enumerate(self.procs):
                rc = p.poll()
                if rc is not None and p.pid not in self._reported:
                    self._reported.add(p.pid)
                    exited.append((lr, p, rc))
            for lr, p, rc in exited:
                self.returncodes[lr] = rc
                src = self.source.model_copy(update={"rank": self.node_rank * self.nproc + lr})
                out.append(exit_event(now, src, p.pid, rc, lr, cmd))
        return out

    def _stop(self, reason: str, grace_s: float, wait_s: float = 0.0,
              prepare: Callable[[], bool] | None = None) -> None:
        """Stop the live ranks as a deliberate act: their exits are logged, never published.

        Ranks that already exited on their own keep their (published) exit.
        ``prepare`` runs once the live ranks are marked as ours to stop (e.g.
        it asks them to save and exit); when it returns True the ranks get
        ``wait_s`` to exit by themselves before SIGTERM.
        """
        mine: list[tuple[int, subprocess.Popen]] = []
        for lr, p in enumerate(self.procs):
            if p.pid in self._reported:
                continue
            rc = p.poll()
            if rc is not None:  # exited on its own, not yet collected: a real exit, still reported
                self._reported.add(p.pid)
                self._carried.append((lr, p, rc))
            else:
                self._reported.add(p.pid)  # ours to stop: never reported as an exit
                mine.append((lr, p))
        expect_exits = prepare() if prepare is not None else wait_s > 0
        if expect_exits and wait_s > 0:
            deadline = time.monotonic() + wait_s
            for _, p in mine:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        for _, p in mine:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, p in mine:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for lr, p in mine:
            log.info("rank %d (pid %d) stopped by the supervisor (%s): returncode %s; not a failure, not reported",
                     self.node_rank * self.nproc + lr, p.pid, reason, p.returncode)

    def restart(self, reason: str, *, grace_s: float = 10.0, wait_s: float = 0.0,
                prepare: Callable[[], bool] | None = None, delay_s: float = 0.0) -> int:
        """Stop every rank (SIGTERM, SIGKILL after ``grace_s``) and launch them all again; return the restart count.

        The new ranks get the same environment with ``VIGIL_RESTART_COUNT``
        one higher, ``delay_s`` after the old ones stopped (a backoff: a rank
        that crashes at once should not be relaunched in a tight loop).
        ``prepare`` (optional) runs first, once the live ranks are marked as
        stopped on purpose (so their exits are not reported); if it returns
        True (e.g. it asked them to save and exit) the ranks get ``wait_s``
        to exit on their own. Raises what launching raises.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the supervisor is shutting down; not restarting")
            self._restarting = True
            self._stop(f"restart: {reason}", grace_s, wait_s, prepare)
            self.procs = []
        try:
            if delay_s > 0 and self._wake.wait(delay_s):
                raise RuntimeError("the supervisor is shutting down; not restarting")
            with self._lock:
                if self._closed:
                    raise RuntimeError("the supervisor is shutting down; not restarting")
                self.restart_count += 1
                log.warning("restarting %d rank(s) of job %s (restart %d, after %.1f s): %s", self.nproc,
                            self.source.job, self.restart_count, delay_s, reason)
                self.start()
        finally:
            self._restarting = False
        return self.restart_count

    def terminate(self, timeout_s: float = 10.0) -> None:
        """Stop every live rank (SIGTERM, then SIGKILL after ``timeout_s``); a deliberate stop, not reported."""
        self._wake.set()  # a restart waiting out its backoff gives up
        with self._lock:
            self._closed = True
            self._stop("terminate", timeout_s)


class PidWatcher(Collector):
    name = "pids"

    def __init__(self, interval_s: float, source: Source, pids: Sequence[int], proc_root: str = "/proc") -> None:
        super().__init__(interval_s, source)
        self.pids = list(pids)
        self.proc_root = Path(proc_root)
        self._gone: set[int] = set()
        self._cmd: dict[int, str] = {}
        for pid in self.pids:
            self._remember(pid)

    def _remember(self, pid: int) -> None:
        """Keep the command line while the process lives (it is gone with the process)."""
        try:
            cmd = (self.proc_root / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            return
        if cmd:
            self._cmd[pid] = cmd

    def _alive(self, pid: int) -> bool:
        try:
            stat = (self.proc_root / str(pid) / "stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")  # a zombie has exited

    def collect(self, now: datetime) -> list[Envelope]:
        out: list[Envelope] = []
        for pid in self.pids:
            if pid in self._gone:
                continue
            if self._alive(pid):
                self._remember(pid)
            else:
                self._gone.add(pid)
                out.append(exit_event(now, self.source, pid, None, None, self._cmd.get(pid)))
        return out

    @property
    def done(self) -> bool:
        return len(self._gone) == len(self.pids)
