"""``vigil agent``: the node agent and launcher."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional

import typer

from vigil.cli.common import app, metrics_host_option, metrics_port_option


def _d(name: str) -> object:
    """The agent's own default of option ``name`` (one home: :class:`vigil.services.agent.AgentOptions`)."""
    import dataclasses

    from vigil.services.agent import AgentOptions

    f = AgentOptions.__dataclass_fields__[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


@app.command()
def agent(
    command: Optional[List[str]] = typer.Argument(
        None, help="Training command to launch and supervise, after `--` (e.g. `-- python train.py --lr 1e-4`)."),
    node: Optional[str] = typer.Option(None, help="Node name in every event (default: SLURMD_NODENAME, else the host name)."),
    cluster: str = typer.Option("default", help="Cluster name in every event."),
    job: Optional[str] = typer.Option(None, help="Job id (default: SLURM_JOB_ID or TORCHELASTIC_RUN_ID)."),
    run: Optional[str] = typer.Option(None, help="Training run the job belongs to: one run across a chain of jobs (default: VIGIL_RUN, else SLURM_ARRAY_JOB_ID)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=1, help="Ranks to launch here (default: SLURM_GPUS_ON_NODE, else 1)."),
    nnodes: Optional[int] = typer.Option(None, min=1, help="Nodes in the job (default: SLURM_NNODES, else 1)."),
    node_rank: Optional[int] = typer.Option(None, min=0, help="This node's rank in the job (default: SLURM_NODEID, else 0)."),
    master_addr: Optional[str] = typer.Option(None, help="Rendezvous host (default: the first node of SLURM_JOB_NODELIST, else 127.0.0.1)."),
    master_port: Optional[int] = typer.Option(None, help="Rendezvous port (default: derived from SLURM_JOB_ID, else 29500)."),
    watch_pid: Optional[List[int]] = typer.Option(None, help="Watch this existing process (repeatable)."),
    heartbeat_interval: float = typer.Option(
        _d("heartbeat_interval"), min=0.01, help="Seconds between heartbeats; GPU samples and NIC counters ride with the next one."),
    gpu_interval: float = typer.Option(_d("gpu_interval"), min=0.01, help="Seconds between NVML telemetry samples."),
    xid_interval: float = typer.Option(_d("xid_interval"), min=0.01, help="Seconds between drains of NVML XID events."),
    kmsg_interval: float = typer.Option(_d("kmsg_interval"), min=0.01, help="Seconds between kernel-log reads."),
    nic_interval: float = typer.Option(_d("nic_interval"), min=0.01, help="Seconds between NIC counter reads."),
    watchdog_interval: float = typer.Option(_d("watchdog_interval"), min=0.01, help="Seconds between watchdog checks."),
    kmsg: Path = typer.Option(_d("kmsg"), help="Kernel log: /dev/kmsg, or a file of log lines to follow."),
    nic_root: Path = typer.Option(_d("nic_root"), help="Root of the RDMA devices' sysfs tree."),
    disk: Optional[List[Path]] = typer.Option(None, help="Watch space and inodes of this path, e.g. checkpoint storage (repeatable)."),
    log_stale: Optional[List[str]] = typer.Option(None, help="PATH:SECONDS - a training log that must be written at least that often (repeatable)."),
    job_liveness: bool = typer.Option(False, help="Ask the scheduler (squeue) that --job is running or queued."),
    no_gpu: bool = typer.Option(False, "--no-gpu", help="Do not start the NVML collectors (nor check the GPUs on joining)."),
    hooks_socket: Optional[Path] = typer.Option(
        None, help="Unix socket the training hooks send to (default: VIGIL_HOOKS_SOCKET, else /tmp/vigil-hooks.sock, "
        "the hooks' default too)."),
    control_dir: Optional[Path] = typer.Option(None, help="Directory of the ranks' control sockets (VIGIL_CONTROL_DIR)."),
    spool_dir: Optional[Path] = typer.Option(None, help="Disk spool for broker outages (default: <state dir>/spool)."),
    spool_max_mb: int = typer.Option(_d("spool_max_mb"), min=1, help="Bound of the spool on disk, in MiB."),
    health_check: bool = typer.Option(_d("health_check"), help="Check the node (GPUs, RDMA ports, disk headroom) on "
                                      "joining; a node that fails joins as unhealthy and stays out of capacity."),
    health_min_free_gb: float = typer.Option(_d("health_min_free_gb"), min=0.0, help="Disk headroom the check needs on --disk paths and the hooks socket's folder."),
    health_gloo: bool = typer.Option(_d("health_gloo"), help="Also run a gloo all-reduce on the loopback (needs torch)."),
    actuate: bool = typer.Option(
        False, "--actuate", help="Also carry out decisions for --job on the launched ranks (retry in place, restart, "
        "checkpoint-restart) with the local backend; see below."),
    actuate_dry_run: bool = typer.Option(False, "--actuate-dry-run", help="With --actuate: say what would be done, do nothing."),
    actuate_ledger: Optional[Path] = typer.Option(
        None, help="With --actuate: the actuator's ledger (default: <state dir>/agent-<node>-<job>-ledger.sqlite)."),
    max_restarts_without_progress: Optional[int] = typer.Option(
        None, min=1, help="With --actuate: restarts without a new training step before the agent gives up "
        "(default: the actuator's SafetyLimits)."),
    restart_grace: float = typer.Option(_d("restart_grace"), min=0.0, help="With --actuate: seconds between SIGTERM and SIGKILL on a restart."),
    restart_backoff: float = typer.Option(_d("restart_backoff"), min=0.0, help="With --actuate: seconds before relaunching after a restart's stop, doubled for each restart close to the last one."),
    restart_backoff_max: float = typer.Option(_d("restart_backoff_max"), min=0.0, help="With --actuate: the longest backoff."),
    checkpoint_wait: float = typer.Option(
        _d("checkpoint_wait"), min=0.0, help="With --actuate: seconds the ranks get to save and exit before a checkpoint-restart."),
    deadline: Optional[str] = typer.Option(
        None, help="When the job must be gone: +20s, +3h, epoch seconds or an ISO 8601 time (default: "
        "SLURM_JOB_END_TIME, else squeue's end time for the job; none outside Slurm)."),
    warn_signal: str = typer.Option(
        _d("warn_signal"), help="The scheduler's early warning (sbatch --signal=USR1@600): on it, save and leave. "
        "Empty: none."),
    term_grace: float = typer.Option(
        _d("term_grace"), min=0.0, help="On SIGTERM (scancel, the time limit, a Kubernetes eviction): seconds the "
        "ranks get to save and exit before they are stopped; keep it below Slurm's KillWait and the pod's grace. "
        "0: stop at once."),
    grace_safety: float = typer.Option(
        _d("grace_safety"), min=1.0, help="Save and leave when the time left falls below this many times "
        "(the longest recent step + the longest recent checkpoint), both measured by the hooks, plus 3 s for "
        "the ranks to exit."),
    checkpoint_estimate: float = typer.Option(
        _d("checkpoint_estimate"), min=0.0, help="Seconds a checkpoint is assumed to take until the hooks measured one."),
    duration: Optional[float] = typer.Option(None, help="Stop after this many seconds (default: run until stopped)."),
    log_level: str = typer.Option("WARNING", help="Python log level of the agent."),
    metrics_port: Optional[int] = metrics_port_option("agent"),
    metrics_host: Optional[str] = metrics_host_option(),
) -> None:
    """Run the node agent: a node daemon (no command), or the launcher of one job's ranks on this node.

    \b
    Node daemon: `vigil agent` (a systemd unit in infra/systemd/): GPU (NVML),
    kernel-log XIDs (/dev/kmsg), NIC counters (sysfs), disks, heartbeats; the
    training hooks of any job on the node send to its socket.
    Per-job launcher: `vigil agent --job J -- python train.py` launches the
    ranks like torchrun (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...),
    reports every exit, and exits when they all have. Under Slurm run one per
    node with srun: job id, node, node count, node rank and the rendezvous
    address come from SLURM_* (examples/slurm/).

    Every collector runs on its own interval and may fail alone (a missing
    driver, an unreadable file: one agent_health event, the rest goes on).
    While the broker is unreachable events wait in a bounded disk spool.

    \b
    What it says about itself, so that an end is never taken for a failure:
      the node joined (after its health checks) or is unhealthy; the job
      running, restarting, completed / cancelled / failed; the node leaving
      when the agent stops cleanly (kill -9 is what node_lost is for).

    With --actuate (needs a job and a command) the agent also carries out the
    decisions for its job that a node can: retry_in_place, restart_process
    (with backoff: --restart-backoff doubling up to --restart-backoff-max),
    checkpoint_restart; each decision at most once (a ledger). It refuses the
    others with the reason, and gives up when asked to move the job
    (reconfigure) or when --max-restarts-without-progress restarts brought no
    new step: it stops the ranks and exits 75 so the scheduler can requeue
    the job elsewhere, and the decision engine calls a human.

    \b
    Long runs (a chain of jobs under a time limit; examples/slurm/): the
    agent knows when the job must end (--deadline, SLURM_JOB_END_TIME or
    squeue) and, when the time left falls below --grace-safety x (longest
    step + longest checkpoint) + 3 s to exit, asks the ranks to save and exit over their
    control channel (the hooks' mon.start_control); so too on --warn-signal
    and, within --term-grace, on SIGTERM. It reports "time_limit" or
    "preempted" with the step saved, not a failure, and exits 0 so the next
    job of the chain starts and resumes from that checkpoint.

    \b
    Exit codes: 0 every rank exited 0 (also after saving and leaving before
    the time limit); the first failed rank's code
    (128 + signal if killed), as torchrun; 143 SIGTERM; 130 Ctrl-C;
    75 gave up (requeue the job elsewhere).
    """
    from vigil.broker import StackError
    from vigil.cli.common import serve_metrics, settings_and_logging
    from vigil.services.agent import AgentOptions, NodeAgent, environment, from_environment, parse_log_stale
    from vigil.stack import resolve_bootstrap

    settings = settings_and_logging(log_level, logging.WARNING)
    given = {k: v for k, v in dict(node=node, job=job, run=run, nproc_per_node=nproc_per_node, nnodes=nnodes,
                                    node_rank=node_rank, master_addr=master_addr, master_port=master_port).items()
             if v is not None}
    try:
        opts = AgentOptions(
            **{**from_environment(environment()), **given}, command=list(command or []), cluster=cluster,
            watch_pid=list(watch_pid or []), heartbeat_interval=heartbeat_interval, gpu_interval=gpu_interval,
            xid_interval=xid_interval, kmsg_interval=kmsg_interval, nic_interval=nic_interval,
            watchdog_interval=watchdog_interval, kmsg=kmsg, nic_root=nic_root, disk=list(disk or []),
            log_stale=parse_log_stale(log_stale or []), job_liveness=job_liveness, gpu=not no_gpu,
            hooks_socket=hooks_socket, control_dir=control_dir, spool_dir=spool_dir, spool_max_mb=spool_max_mb,
            health_check=health_check, health_min_free_gb=health_min_free_gb, health_gloo=health_gloo,
            actuate=actuate, actuate_dry_run=actuate_dry_run, actuate_ledger=actuate_ledger,
            max_restarts_without_progress=max_restarts_without_progress, restart_grace=restart_grace,
            restart_backoff=restart_backoff, restart_backoff_max=restart_backoff_max, checkpoint_wait=checkpoint_wait,
            duration=duration, deadline=deadline, warn_signal=warn_signal, term_grace=term_grace,
            grace_safety=grace_safety, checkpoint_estimate=checkpoint_estimate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if opts.deadline:
        from vigil.producers.agent.walltime import parse_deadline

        try:
            parse_deadline(opts.deadline, 0.0)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--deadline") from None
    if opts.job_liveness and not opts.job:
        raise typer.BadParameter("--job-liveness needs --job")
    if opts.actuate and not (opts.job and opts.command):
        raise typer.BadParameter("--actuate needs a job (--job or SLURM_JOB_ID) and a training command after `--`")
    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    from vigil.actuators.errors import ActuatorError

    try:
        node_agent = NodeAgent(opts, {"bootstrap.servers": bootstrap, **settings.kafka_security()},
                               settings.topic_prefix, settings.state_dir, session_timeout_s=settings.session_timeout_s,
                               heartbeat_interval_s=settings.heartbeat_interval_s)
    except (ActuatorError, ValueError) as exc:  # (ValueError: e.g. a hooks socket path too long for Unix)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if opts.actuate:
        keyring = settings.decision_keyring()
        if not keyring.keys and not keyring.allow_unsigned:
            typer.echo("warning: --actuate with no decision keys (VIGIL_DECISION_KEYS, the worker's key): every "
                       "decision will be refused as unsigned and nothing restarted", err=True)
    metrics = serve_metrics(settings, "agent", metrics_port, metrics_host, "AgentMetrics")
    if metrics is not None:
        metrics.watch(node_agent)  # its publisher (spool depth, failures), collectors, actuator results
    typer.echo(f"vigil agent on {node_agent.node}: {len(node_agent.collectors)} collectors, hooks socket "
               f"{node_agent.sock}, broker {bootstrap}"
               + (f", job {opts.job} ({opts.nproc_per_node} rank(s), node {opts.node_rank} of {opts.nnodes})"
                  if opts.command else ""), err=True)
    code = node_agent.run()
    if node_agent.actuator is not None and node_agent.actuator.gave_up is not None:
        typer.echo(f"vigil agent: gave up: {node_agent.actuator.gave_up}; exiting {code}", err=True)
    raise typer.Exit(code)
