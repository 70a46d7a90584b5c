"""``vigil agent``: the node agent and launcher."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from pathlib import Path
from typing import List, Optional

import typer

from vigil.cli.common import app


def _parse_log(spec: str) -> tuple[str, float]:
    path, sep, secs = spec.rpartition(":")
    if not sep or not path:
        raise typer.BadParameter(f"--log-stale expects PATH:SECONDS, got {spec!r}")
    try:
        return path, float(secs)
    except ValueError:
        raise typer.BadParameter(f"--log-stale expects PATH:SECONDS, got {spec!r}") from None


@app.command()
def agent(
    command: Optional[List[str]] = typer.Argument(
        None, help="Training command to launch and supervise, after `--` (e.g. `-- python train.py --lr 1e-4`)."),
    node: Optional[str] = typer.Option(None, help="Node name in every event (default: the host name)."),
    cluster: str = typer.Option("default", help="Cluster name in every event."),
    job: Optional[str] = typer.Option(None, help="Job id of the supervised training (and of --job-liveness)."),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1, help="Processes (local ranks) to launch."),
    nnodes: int = typer.Option(1, min=1, help="Nodes in the job (for WORLD_SIZE)."),
    node_rank: int = typer.Option(0, min=0, help="This node's rank in the job (for RANK)."),
    master_addr: str = typer.Option("127.0.0.1", help="MASTER_ADDR for the launched ranks."),
    master_port: int = typer.Option(29500, help="MASTER_PORT for the launched ranks."),
    watch_pid: Optional[List[int]] = typer.Option(None, help="Watch this existing process (repeatable)."),
    heartbeat_interval: float = typer.Option(
        5.0, min=0.01, help="Seconds between heartbeats; GPU samples and NIC counters ride with the next one."),
    gpu_interval: float = typer.Option(10.0, min=0.01, help="Seconds between NVML telemetry samples."),
    xid_interval: float = typer.Option(1.0, min=0.01, help="Seconds between drains of NVML XID events."),
    kmsg_interval: float = typer.Option(1.0, min=0.01, help="Seconds between kernel-log reads."),
    nic_interval: float = typer.Option(10.0, min=0.01, help="Seconds between NIC counter reads."),
    watchdog_interval: float = typer.Option(60.0, min=0.01, help="Seconds between watchdog checks."),
    kmsg: Path = typer.Option(Path("/dev/kmsg"), help="Kernel log: /dev/kmsg, or a file of log lines to follow."),
    nic_root: Path = typer.Option(Path("/sys/class/infiniband"), help="Root of the RDMA devices' sysfs tree."),
    disk: Optional[List[Path]] = typer.Option(None, help="Watch space and inodes of this path, e.g. checkpoint storage (repeatable)."),
    log_stale: Optional[List[str]] = typer.Option(None, help="PATH:SECONDS - a training log that must be written at least that often (repeatable)."),
    job_liveness: bool = typer.Option(False, help="Ask the scheduler (squeue) that --job is running or queued."),
    no_gpu: bool = typer.Option(False, help="Do not start the NVML collectors."),
    hooks_socket: Optional[Path] = typer.Option(
        None, help="Unix socket of the node batcher for training hooks (default: <state dir>/hooks.sock)."),
    control_dir: Optional[Path] = typer.Option(None, help="Directory of the ranks' control sockets (VIGIL_CONTROL_DIR)."),
    spool_dir: Optional[Path] = typer.Option(None, help="Disk spool for broker outages (default: <state dir>/spool)."),
    spool_max_mb: int = typer.Option(256, min=1, help="Bound of the spool on disk, in MiB."),
    actuate: bool = typer.Option(
        False, "--actuate", help="Also carry out decisions for --job on the launched ranks (retry in place, restart, "
        "checkpoint-restart) with the local backend; see below."),
    actuate_dry_run: bool = typer.Option(False, "--actuate-dry-run", help="With --actuate: say what would be done, do nothing."),
    actuate_ledger: Optional[Path] = typer.Option(
        None, help="With --actuate: the actuator's ledger (default: <state dir>/agent-<node>-<job>-ledger.sqlite)."),
    max_restarts_without_progress: int = typer.Option(
        3, min=1, help="With --actuate: restarts without a new training step before the agent gives up."),
    restart_grace: float = typer.Option(10.0, min=0.0, help="With --actuate: seconds between SIGTERM and SIGKILL on a restart."),
    checkpoint_wait: float = typer.Option(
        120.0, min=0.0, help="With --actuate: seconds the ranks get to save and exit before a checkpoint-restart."),
    duration: Optional[float] = typer.Option(None, help="Stop after this many seconds (default: run until stopped)."),
    log_level: str = typer.Option("WARNING", help="Python log level of the agent."),
) -> None:
    """Run the node agent: GPU, kernel-log XID, NIC, heartbeat, process and watchdog collectors.

    Every collector runs on its own interval and may fail alone: a missing
    GPU driver, an unreadable counter file or no permission on /dev/kmsg is
    published once as an agent_health event and the rest goes on. Events go
    to Kafka (VIGIL_KAFKA_BOOTSTRAP, or the embedded broker of `vigil up`);
    while the broker is unreachable they wait in a bounded disk spool and are
    replayed in order when it is back (a full spool drops its oldest events
    and says so in an events_dropped record).

    Training hooks of the ranks on this node send to the node batcher on
    --hooks-socket, which batches them before they leave the node.

    With a command after `--` the agent launches it like torchrun
    (--nproc-per-node processes with RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, ... and VIGIL_JOB/VIGIL_HOOKS_SOCKET set), reports every exit
    with its code or signal, and exits when they have all exited, with
    torchrun's exit code. Stop it with Ctrl-C or SIGTERM.

    With --actuate (needs --job and a command) the agent also consumes the
    decisions for its job and carries out those a node can: retry_in_place
    (the ranks' control sockets), restart_process (stop every rank, launch
    again with VIGIL_RESTART_COUNT + 1) and checkpoint_restart (ranks save and
    exit, then restart); each decision at most once (a ledger). Ranks it stops
    itself are not reported as failures. It then exits when every rank exited
    0, on Ctrl-C/SIGTERM, or, with a nonzero code and the reason, when the
    no-progress guard gives up (--max-restarts-without-progress restarts
    without a new training step).
    """
    from vigil.producers.agent import (
        Agent, DiskWatchdog, GpuMemoryWatchdog, HeartbeatCollector, JobLivenessWatchdog, KmsgCollector,
        LogStalenessWatchdog, MemoryWatchdog, NicCollector, NvmlTelemetryCollector, NvmlXidCollector, PidWatcher,
        ProcessSupervisor,
    )
    from vigil.producers.publisher import Publisher
    from vigil.producers.training import NodeBatcher
    from vigil.schemas import Source
    from vigil.broker import StackError
    from vigil.cli.common import settings_and_logging
    from vigil.stack import resolve_bootstrap

    settings = settings_and_logging(log_level, logging.WARNING)
    if job_liveness and not job:
        raise typer.BadParameter("--job-liveness needs --job")
    if actuate and not (job and command):
        raise typer.BadParameter("--actuate needs --job and a training command after `--`")
    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    node_name = node or socket.gethostname()
    source = Source(cluster=cluster, node=node_name, job=job)
    node_source = Source(cluster=cluster, node=node_name)
    state = settings.state_dir
    publisher = Publisher({"bootstrap.servers": bootstrap, **settings.kafka_security()}, settings.topic_prefix,
                          spool_dir=spool_dir or state / "spool", spool_max_bytes=spool_max_mb << 20, source=node_source)
    collectors = [
        HeartbeatCollector(heartbeat_interval, node_source),
        KmsgCollector(kmsg_interval, node_source, kmsg),
        NicCollector(nic_interval, node_source, nic_root),
        MemoryWatchdog(watchdog_interval, node_source),
    ]
    if not no_gpu:
        collectors += [NvmlTelemetryCollector(gpu_interval, node_source), NvmlXidCollector(xid_interval, node_source),
                       GpuMemoryWatchdog(watchdog_interval, node_source)]
    if disk:
        collectors.append(DiskWatchdog(watchdog_interval, node_source, [str(d) for d in disk]))
    if log_stale:
        collectors.append(LogStalenessWatchdog(min(watchdog_interval, 30.0), source, dict(_parse_log(s) for s in log_stale)))
    if job_liveness:
        collectors.append(JobLivenessWatchdog(watchdog_interval, source, job))  # type: ignore[arg-type]
    if watch_pid:
        collectors.append(PidWatcher(1.0, source, list(watch_pid)))
    sock = hooks_socket or state / "hooks.sock"
    batcher = NodeBatcher(str(sock), publisher)
    supervisor = None
    if command:
        env = {"VIGIL_HOOKS_SOCKET": str(sock)}
        if control_dir is not None:
            env["VIGIL_CONTROL_DIR"] = str(control_dir)
        # A crashed rank's exit must reach the detectors before its peers' broken connections
        # have waited out their settling time (1 s): polling its children costs one waitpid each.
        supervisor = ProcessSupervisor(0.1, source, command, nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                                       master_addr=master_addr, master_port=master_port, env=env)
        collectors.append(supervisor)
    stop = threading.Event()
    actuator = None
    if actuate:
        from vigil.actuators.errors import ActuatorError
        from vigil.actuators.safety import SafetyLimits
        from vigil.services.actuator import ActuatedSupervisor, AgentActuator

        def give_up(reason: str) -> None:
            typer.echo(f"vigil agent: {reason}; stopping", err=True)
            stop.set()

        try:
            actuator = AgentActuator(
                supervisor, job=job, node=node_name, cluster=cluster,  # type: ignore[arg-type]
                kafka_conf={"bootstrap.servers": bootstrap, **settings.kafka_security()}, prefix=settings.topic_prefix,
                ledger_path=actuate_ledger or state / f"agent-{node_name}-{job}-ledger.sqlite",
                control_dir=control_dir, batcher=batcher, dry_run=actuate_dry_run,
                limits=SafetyLimits(max_restarts_without_progress=max_restarts_without_progress),
                grace_s=restart_grace, checkpoint_wait_s=checkpoint_wait,
                session_timeout_s=settings.session_timeout_s, heartbeat_interval_s=settings.heartbeat_interval_s,
                on_give_up=give_up)
        except ActuatorError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        # Exits are published as they happen (they are what the decisions answer).
        view = ActuatedSupervisor(supervisor, actuator)
        runner = Agent([c for c in collectors if c is not supervisor] + [view], publisher, source, supervisor=view,
                       batcher=batcher)
    else:
        runner = Agent([c for c in collectors if c is not supervisor], publisher, source, supervisor=supervisor,
                       batcher=batcher)

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    typer.echo(f"vigil agent on {node_name}: {len(collectors)} collectors, hooks socket {sock}, broker {bootstrap}", err=True)
    if actuator is not None:
        actuator.start()
    try:
        code = runner.run(duration_s=duration, stop=stop)
    finally:
        if actuator is not None:
            actuator.stop()
    if actuator is not None and actuator.gave_up is not None:
        typer.echo(f"vigil agent: exiting because {actuator.gave_up}", err=True)
        code = code or 1
    raise typer.Exit(code)
