"""Process supervision: launch the training command like torchrun does, or watch existing PIDs.

:class:`ProcessSupervisor` starts ``nproc`` copies of a command, one per local
rank, with the environment torchrun sets (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and what the hooks read (``VIGIL_JOB``,
``VIGIL_NODE``, ``VIGIL_CLUSTER``, ``VIGIL_HOOKS_SOCKET``,
``VIGIL_CONTROL_DIR``), and reports each exit as a
:class:`~schemas.ProcessExit` with its exit code or the signal that killed it.

:class:`PidWatcher` watches processes it did not start (``/proc/<pid>``);
the exit status of a process that is not our child cannot be known on
Linux, so its exit carries neither code nor signal.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Mapping, Sequence

from producers.agent.base import Collector
from schemas import Envelope, ProcessExit, Source

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


class ProcessSupervisor(Collector):
    name = "process"

    def __init__(self, interval_s: float, source: Source, command: Sequence[str], nproc: int = 1, *,
                 nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int = 29500,
                 env: Mapping[str, str] | None = None, cwd: str | None = None, log_dir: str | os.PathLike | None = None) -> None:
        super().__init__(interval_s, source)
        if not command:
            raise ValueError("no command to supervise")
        if nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {nproc}")
        self.command = list(command)
        self.nproc, self.nnodes, self.node_rank = nproc, nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.procs: list[subprocess.Popen] = []
        self._reported: set[int] = set()
        self.returncodes: dict[int, int] = {}

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
        })
        if self.source.job:
            env["VIGIL_JOB"] = self.source.job
        if self.source.node:
            env["VIGIL_NODE"] = self.source.node
        env["VIGIL_CLUSTER"] = self.source.cluster
        return env

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
    def done(self) -> bool:
        return bool(self.procs) and all(p.poll() is not None for p in self.procs)

    @property
    def exit_code(self) -> int:
        """torchrun's rule: 0 when every rank exited 0, else the first failure's code (128+signal)."""
        for p in self.procs:
            rc = p.poll()
            if rc not in (None, 0):
                return 128 - rc if rc < 0 else rc
        return 0

    def collect(self, now: datetime) -> list[Envelope]:
        out: list[Envelope] = []
        cmd = shlex.join(self.command)[:2000]
        for lr, p in enumerate(self.procs):
            rc = p.poll()
            if rc is not None and p.pid not in self._reported:
                self._reported.add(p.pid)
                self.returncodes[lr] = rc
                src = self.source.model_copy(update={"rank": self.node_rank * self.nproc + lr})
                out.append(exit_event(now, src, p.pid, rc, lr, cmd))
        return out

    def terminate(self, timeout_s: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


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
