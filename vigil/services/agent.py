"""``vigil agent`` wired: collectors, the hooks' batcher, the launcher, the actuator, and the lifecycle.

Two ways to run it:

* **node daemon** (no command; a systemd unit in ``infra/systemd/``, or a
  DaemonSet): watches the node (GPUs, kernel log, NICs, disks, heartbeats)
  and batches the training hooks of whatever runs there;
* **per-job launcher** (a command after ``--``, like torchrun; under Slurm
  one per node with ``srun``): the same, plus it launches the ranks, reports
  their exits, and with ``--actuate`` carries out the decisions a node can.

What it says about itself (:mod:`vigil.producers.agent.lifecycle`) keeps an
end from looking like a failure: ``joined`` (after the node's health checks)
or ``unhealthy`` when it starts; the job ``running``, ``restarting``, and
how it ended; ``leaving`` when it stops cleanly. Exit codes:

* ``0`` every rank exited 0 (also when it left on purpose before its time
  limit or on the scheduler's warning, having saved: the next job of the
  chain resumes); otherwise torchrun's rule (the first failed rank's code,
  128 + signal when killed);
* ``143`` stopped by SIGTERM (scancel, an eviction), ``130`` by Ctrl-C;
* ``75`` (EX_TEMPFAIL) gave up: restarts exhausted without progress, or a
  decision a per-job agent cannot carry out (moving the job elsewhere):
  the ranks are stopped so the scheduler can requeue the job on other
  nodes, and the decision engine calls a human (sev1 ``recovery_failed``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from vigil.streams.config import HEARTBEAT_INTERVAL_S, SESSION_TIMEOUT_S

log = logging.getLogger(__name__)

__all__ = ["AgentOptions", "NodeAgent", "EXIT_GAVE_UP", "EXIT_SIGTERM", "EXIT_SIGINT", "first_host",
           "from_environment"]

EXIT_GAVE_UP = 75
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SIGINT = 128 + signal.SIGINT


@dataclass
class AgentOptions:
    """Everything ``vigil agent`` is told (the CLI fills it; defaults here are the agent's own)."""

    command: list[str] = field(default_factory=list)
    node: str | None = None
    cluster: str = "default"
    job: str | None = None
    run: str | None = None
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    watch_pid: list[int] = field(default_factory=list)
    heartbeat_interval: float = 1.0
    gpu_interval: float = 10.0
    xid_interval: float = 1.0
    kmsg_interval: float = 1.0
    nic_interval: float = 10.0
    watchdog_interval: float = 60.0
    flight_recorder_interval: float = 1.0
    kmsg: Path = Path("/dev/kmsg")
    nic_root: Path = Path("/sys/class/infiniband")
    disk: list[Path] = field(default_factory=list)
    log_stale: dict[str, float] = field(default_factory=dict)
    job_liveness: bool = False
    gpu: bool = True
    hooks_socket: Path | None = None
    control_dir: Path | None = None
    spool_dir: Path | None = None
    spool_max_mb: int = 256
    health_check: bool = True
    health_min_free_gb: float = 1.0
    health_gloo: bool = False
    actuate: bool = False
    actuate_dry_run: bool = False
    actuate_ledger: Path | None = None
    max_restarts_without_progress: int | None = None
    restart_grace: float = 10.0
    restart_backoff: float = 1.0
    restart_backoff_max: float = 60.0
    checkpoint_wait: float = 120.0
    duration: float | None = None
    deadline: str | None = None
    warn_signal: str = "USR1"
    term_grace: float = 25.0
    grace_safety: float = 2.0
    checkpoint_estimate: float = 120.0


#: How often the agent compares the time left with the grace a save needs.
WALLTIME_TICK_S = 1.0
#: An early-warning signal this close to a known end time warns of the time limit (else of a preemption).
WARNING_WINDOW_S = 3600.0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``gpu[03-05,9],cpu1`` -> ``gpu03``).

    >>> first_host("gpu[03-05,9],cpu1"), first_host("n1,n2"), first_host("node-7")
    ('gpu03', 'n1', 'node-7')
    """
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if m is None:
        raise ValueError(f"not a Slurm node list: {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """What a launcher already told the job: Slurm's ``SLURM_*`` variables and torchrun's.

    Only what the environment gives; explicit options win over it.

    >>> from_environment({"SLURM_JOB_ID": "812", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
    ...                   "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURMD_NODENAME": "gpu04"})
    {'job': '812', 'node': 'gpu04', 'nnodes': 2, 'node_rank': 1, 'master_addr': 'gpu03', 'master_port': 20812}
    """
    out: dict[str, Any] = {}
    if env.get("SLURM_JOB_ID"):
        out["job"] = env["SLURM_JOB_ID"]
    elif env.get("TORCHELASTIC_RUN_ID"):
        out["job"] = env["TORCHELASTIC_RUN_ID"]
    if env.get("SLURMD_NODENAME"):
        out["node"] = env["SLURMD_NODENAME"]
    nnodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if nnodes:
        out["nnodes"] = int(nnodes)
    if env.get("SLURM_NODEID"):
        out["node_rank"] = int(env["SLURM_NODEID"])
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        out["master_addr"] = first_host(nodelist)
    if env.get("MASTER_ADDR"):
        out["master_addr"] = env["MASTER_ADDR"]
    if env.get("MASTER_PORT"):
        out["master_port"] = int(env["MASTER_PORT"])
    elif env.get("SLURM_JOB_ID", "").isdigit():
        out["master_port"] = 20000 + int(env["SLURM_JOB_ID"]) % 20000  # one port per job, the same on every node
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        out["nproc_per_node"] = int(env["SLURM_GPUS_ON_NODE"])
    if env.get("VIGIL_RUN"):
        out["run"] = env["VIGIL_RUN"]
    elif env.get("SLURM_ARRAY_JOB_ID"):  # a job array run one element at a time: one training run
        out["run"] = env["SLURM_ARRAY_JOB_ID"]
    return out


class NodeAgent:
    """The agent of one node (see the module docstring); :meth:`run` returns the exit code."""

    def __init__(self, opts: AgentOptions, kafka_conf: dict[str, Any], prefix: str, state_dir: Path,
                 session_timeout_s: float = SESSION_TIMEOUT_S, heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        from vigil.producers.agent.lifecycle import Lifecycle
        from vigil.producers.publisher import Publisher
        from vigil.producers.training import NodeBatcher, default_hooks_socket
        from vigil.schemas import Source

        self.opts = opts
        self.node = opts.node or socket.gethostname()
        self.source = Source(cluster=opts.cluster, node=self.node, job=opts.job)
        self.node_source = Source(cluster=opts.cluster, node=self.node)
        self.publisher = Publisher(kafka_conf, prefix, spool_dir=opts.spool_dir or state_dir / "spool",
                                   spool_max_bytes=opts.spool_max_mb << 20, source=self.node_source)
        self.lifecycle = Lifecycle(self.publisher, self.source, gpus=opts.nproc_per_node * opts.nnodes,
                                   dp=max(1, opts.nproc_per_node * opts.nnodes), run=opts.run)
        self.sock = opts.hooks_socket or default_hooks_socket()
        self.batcher = NodeBatcher(str(self.sock), self.publisher)
        self.stop_event = threading.Event()
        self.signal: int | None = None
        #: (how it leaves: time_limit | preempted | cancelled, why, when it asked the ranks to save)
        self.leaving: tuple[str, str, float] | None = None
        self.deadline = self._deadline()
        self.supervisor: Any = None
        self.actuator: Any = None
        self.collectors = self._collectors()
        self.runner = self._runner(kafka_conf, prefix, state_dir, session_timeout_s, heartbeat_interval_s)

    # -- wiring --------------------------------------------------------------------------------------------
    def _collectors(self) -> list[Any]:
        from vigil.producers.agent import (
            DiskWatchdog, FlightRecorderFileCollector, GpuMemoryWatchdog, HeartbeatCollector, JobLivenessWatchdog,
            KmsgCollector, LogStalenessWatchdog, MemoryWatchdog, NicCollector, NvmlTelemetryCollector, NvmlXidCollector,
            PidWatcher, ProcessSupervisor,
        )

        o, ns = self.opts, self.node_source
        out: list[Any] = [HeartbeatCollector(o.heartbeat_interval, ns), KmsgCollector(o.kmsg_interval, ns, o.kmsg),
                          NicCollector(o.nic_interval, ns, o.nic_root), MemoryWatchdog(o.watchdog_interval, ns)]
        if o.gpu:
            out += [NvmlTelemetryCollector(o.gpu_interval, ns), NvmlXidCollector(o.xid_interval, ns),
                    GpuMemoryWatchdog(o.watchdog_interval, ns)]
        if o.disk:
            out.append(DiskWatchdog(o.watchdog_interval, ns, [str(d) for d in o.disk]))
        if o.log_stale:
            out.append(LogStalenessWatchdog(min(o.watchdog_interval, 30.0), self.source, dict(o.log_stale)))
        if o.job_liveness and o.job:
            out.append(JobLivenessWatchdog(o.watchdog_interval, self.source, o.job))
        if o.watch_pid:
            out.append(PidWatcher(1.0, self.source, list(o.watch_pid)))
        if o.command:
            env = {"VIGIL_HOOKS_SOCKET": str(self.sock)}
            if o.control_dir is not None:
                env["VIGIL_CONTROL_DIR"] = str(o.control_dir)
            # A crashed rank's exit must reach the detectors before its peers' broken connections
            # have waited out their settling time (1 s): polling its children costs one waitpid each.
            self.supervisor = ProcessSupervisor(0.1, self.source, o.command, o.nproc_per_node, nnodes=o.nnodes,
                                                node_rank=o.node_rank, master_addr=o.master_addr,
                                                master_port=o.master_port, env=env,
                                                ignore_signals=[w] if (w := self._warn_signal()) else [])
            # Torch writes a rank's recorder to a file when a NCCL collective times out, and the rank dies
            # soon after: the agent, which outlives it, publishes the file.
            if o.job:  # (a dump is judged with its job's other ranks)
                sup = self.supervisor
                out.append(FlightRecorderFileCollector(o.flight_recorder_interval, self.source,
                                                       lambda: sup.global_ranks))
        return out

    def _runner(self, kafka_conf: dict[str, Any], prefix: str, state_dir: Path, session_timeout_s: float,
                heartbeat_interval_s: float) -> Any:
        from vigil.producers.agent import Agent

        o = self.opts
        if not o.actuate:
            collectors = self.collectors + ([self.supervisor] if self.supervisor is not None else [])
            return Agent(collectors, self.publisher, self.source, supervisor=self.supervisor, batcher=self.batcher)
        from vigil.actuators.safety import SafetyLimits
        from vigil.services.actuator import ActuatedSupervisor, AgentActuator

        limits = SafetyLimits(**({"max_restarts_without_progress": o.max_restarts_without_progress}
                                 if o.max_restarts_without_progress is not None else {}))
        self.actuator = AgentActuator(
            self.supervisor, job=o.job, node=self.node, cluster=o.cluster, kafka_conf=kafka_conf,  # type: ignore[arg-type]
            prefix=prefix, ledger_path=o.actuate_ledger or state_dir / f"agent-{self.node}-{o.job}-ledger.sqlite",
            control_dir=o.control_dir, batcher=self.batcher, dry_run=o.actuate_dry_run, limits=limits,
            grace_s=o.restart_grace, checkpoint_wait_s=o.checkpoint_wait, backoff_s=o.restart_backoff,
            backoff_max_s=o.restart_backoff_max, session_timeout_s=session_timeout_s,
            heartbeat_interval_s=heartbeat_interval_s, on_give_up=self._give_up,
            on_restart=lambda n, why: self.lifecycle.job("restarting", f"restart {n}: {why}"))
        # Exits are published as they happen (they are what the decisions answer).
        view = ActuatedSupervisor(self.supervisor, self.actuator)
        return Agent(self.collectors + [view], self.publisher, self.source, supervisor=view, batcher=self.batcher)

    def _give_up(self, reason: str) -> None:
        if self.stop_event.is_set():
            return  # already stopping (a signal came first): the job was cancelled, not given up
        log.warning("giving up: %s; stopping the ranks and exiting %d for the scheduler to requeue the job",
                    reason, EXIT_GAVE_UP)
        self.stop_event.set()

    def _on_signal(self, signum: int, frame: object) -> None:
        import time

        if signum == self._warn_signal():
            now = time.time()
            left = self.deadline - now if self.deadline is not None else self._grace()
            # Slurm's --signal=SIG@T warns T seconds before the time limit: with the end known and near, that is
            # what it is; otherwise a preemption notice
            how = "time_limit" if self.deadline is not None and left <= WARNING_WINDOW_S else "preempted"
            self._leave(how, f"{signal.Signals(signum).name}: the scheduler's early warning", left)
            return
        first = self.signal is None and not self.stop_event.is_set()
        if first:
            self.signal = signum  # stopped from outside (scancel, an eviction, the time limit)
        if signum == signal.SIGTERM and self.opts.term_grace > 0 and self.supervisor is not None:
            # Slurm sends SIGTERM at the time limit (SIGKILL KillWait later), Kubernetes on eviction
            # (SIGKILL after the pod's grace): save within our grace, then stop
            at_limit = self.deadline is not None and time.time() >= self.deadline - 5.0
            self._leave("time_limit" if at_limit else "cancelled", "SIGTERM", self.opts.term_grace)
            return
        self.stop_event.set()

    # -- leaving on purpose: the time limit, the scheduler's warning, SIGTERM with a grace ---------------------
    def _warn_signal(self) -> int | None:
        name = self.opts.warn_signal.upper().removeprefix("SIG")
        return getattr(signal, f"SIG{name}", None) if name else None

    def _deadline(self) -> float | None:
        import time

        from vigil.producers.agent.walltime import parse_deadline, slurm_end_time

        if self.opts.deadline:
            return parse_deadline(self.opts.deadline, time.time())
        return slurm_end_time(environment()) if self.opts.command else None  # a node daemon has no job to end

    def _grace(self) -> float:
        from vigil.producers.agent.walltime import grace_s

        step, ckpt, _ = self.batcher.timings(self.opts.job) if self.opts.job else (None, None, None)
        return grace_s(step, ckpt, safety=self.opts.grace_safety, default_checkpoint_s=self.opts.checkpoint_estimate)

    def _leave(self, how: str, why: str, limit_s: float) -> None:
        """Ask every rank to save and exit; stop them if they are not gone within ``limit_s``.

        Asked again (SIGTERM after the early warning), only the shorter limit counts.
        """
        import time

        from vigil.schemas.control import ControlError, control_path, send_command

        if self.supervisor is None:
            self.stop_event.set()
            return
        threading.Timer(max(0.0, limit_s), self.stop_event.set).start()
        if self.leaving is not None:
            return
        self.leaving = (how, why, time.time())
        asked = 0
        for rank in self.supervisor.global_ranks:
            try:
                send_command(control_path(self.opts.job or "local", rank, self.opts.control_dir), "save_and_exit",
                             timeout_s=2.0)
                asked += 1
            except (ControlError, OSError):
                pass
        log.warning("%s: asked %d rank(s) to save and exit; stopping them in %.0f s if they have not",
                    why, asked, limit_s)
        if asked == 0:  # no control channel: nothing to wait for
            self.stop_event.set()

    def _watch_deadline(self) -> None:
        """Every second: leave when the time left falls below the grace (what a step and a save need)."""
        import time

        from vigil.producers.agent.walltime import due

        while not self.stop_event.wait(WALLTIME_TICK_S) and self.leaving is None:
            if self.batcher.timings(self.opts.job or "")[0] is None:
                continue  # no step yet: nothing to save (a start-up longer than the job's time is the scheduler's)
            now = time.time()
            grace = self._grace()
            if due(self.deadline, now, grace + WALLTIME_TICK_S):  # checked once a tick: up to one tick late
                self._leave("time_limit", f"time limit at {self.deadline:.0f}: {self.deadline - now:.1f} s left, "  # type: ignore[operator]
                            f"a step, a checkpoint and the exit need {grace:.1f} s", max(0.0, self.deadline - now))  # type: ignore[operator]

    # -- running -------------------------------------------------------------------------------------------
    def health(self) -> dict[str, str]:
        """The node's checks before it counts as capacity (see :mod:`vigil.producers.agent.health`)."""
        from vigil.producers.agent.gpu import load_nvml
        from vigil.producers.agent.health import health_checks

        o = self.opts
        disks = [*o.disk, self.sock.parent]
        return health_checks(disks=disks, min_free_bytes=int(o.health_min_free_gb * 2**30), nic_root=o.nic_root,
                             nvml=load_nvml if o.gpu else None, gloo=o.health_gloo)

    def run(self) -> int:
        from vigil.producers.agent.health import passed

        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.opts.health_check:
            checks = self.health()
            ok = passed(checks)
            self.lifecycle.node("joined" if ok else "unhealthy",
                                "agent started; health checks passed" if ok else "agent started; health check failed: "
                                + "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok"), checks)
            if not ok:
                log.warning("node %s failed its health check: %s", self.node, checks)
        else:
            self.lifecycle.node("joined", "agent started (no health check)")
        if self.supervisor is not None:
            self.lifecycle.job("running", f"launched {self.opts.nproc_per_node} rank(s) on {self.node}")
        if self.actuator is not None:
            self.actuator.start()
        warn = self._warn_signal()
        if warn is not None:
            signal.signal(warn, self._on_signal)
        if self.deadline is not None and self.supervisor is not None:
            threading.Thread(target=self._watch_deadline, name="vigil-walltime", daemon=True).start()
        try:
            code = self.runner.run(duration_s=self.opts.duration, stop=self.stop_event, keep_publisher=True)
        finally:
            if self.actuator is not None:
                self.actuator.stop()
        code = self._ended(code)
        self.lifecycle.node("leaving", f"agent stopped (exit {code})")
        self.runner.close_publisher()
        return code

    def _ended(self, code: int) -> int:
        """Say how the job ended; the agent's exit code."""
        gave_up = self.actuator.gave_up if self.actuator is not None else None
        if self.supervisor is None:
            return EXIT_SIGTERM if self.signal == signal.SIGTERM else 0
        codes = {self.supervisor.node_rank * self.supervisor.nproc + lr: rc
                 for lr, rc in self.supervisor.returncodes.items()}
        if self.leaving is not None:
            return self._left(code, codes)
        if self.signal is not None:
            self.lifecycle.job("cancelled", f"stopped by signal {signal.Signals(self.signal).name}", codes)
            return EXIT_SIGTERM if self.signal == signal.SIGTERM else EXIT_SIGINT
        if gave_up is not None:
            self.lifecycle.job("failed", f"the agent gave up: {gave_up}", codes)
            return EXIT_GAVE_UP
        if code == 0 and self.supervisor.done:
            self.lifecycle.job("completed", "every rank exited 0", codes)
            return 0
        if self.supervisor.done:
            self.lifecycle.job("failed", f"a rank failed (exit {code}) and this agent does not restart ranks", codes)
        return code


    def _left(self, code: int, codes: dict[int, int]) -> int:
        """It left on purpose: say where the next job resumes from; 0 when every rank saved.

        Saved means every rank here completed a checkpoint after it was asked
        (a rank stopped while tearing down after its save still saved).
        """
        import time

        how, why, asked_at = self.leaving  # type: ignore[misc]
        job = self.opts.job or ""
        _, _, last = self.batcher.timings(job)
        saved = last is not None and self.batcher.saved_since(job, asked_at, self.supervisor.global_ranks)
        if saved:
            step, took = last  # type: ignore[misc]
            exits = "every rank exited 0" if code == 0 else f"stopped while exiting ({code})"
            reason = f"{why}: checkpoint at step {step} saved in {took:.1f} s; {exits}"
            self.lifecycle.job(how, reason, codes, checkpoint_step=step, checkpoint_s=took)
        else:
            reason = f"{why}: the ranks did not save within the time left ({time.time() - asked_at:.0f} s)"
            self.lifecycle.job(how, reason, codes)
        if how == "cancelled":
            return EXIT_SIGTERM
        if saved and self.opts.node_rank == 0:  # one agent of the job says where the chain goes on
            from vigil.producers.agent.walltime import queued_successors

            for nxt in queued_successors(environment()):
                self.lifecycle.queued(nxt, f"queued to continue job {job} from step {last[0]}")  # type: ignore[index]
        return 0 if saved else (code or EXIT_GAVE_UP)


def parse_log_stale(specs: Sequence[str]) -> dict[str, float]:
    """``PATH:SECONDS`` pairs; ValueError names the bad one."""
    out: dict[str, float] = {}
    for spec in specs:
        path, sep, secs = spec.rpartition(":")
        if not sep or not path:
            raise ValueError(f"--log-stale expects PATH:SECONDS, got {spec!r}")
        try:
            out[path] = float(secs)
        except ValueError:
            raise ValueError(f"--log-stale expects PATH:SECONDS, got {spec!r}") from None
    return out


def environment() -> dict[str, str]:
    return dict(os.environ)
