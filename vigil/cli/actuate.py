"""``vigil actuate``: carry out decisions with a Slurm, Kubernetes or local backend."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, List, Optional

import typer

from vigil.actuators.backends import ControlDirProcesses, KubernetesBackend, LocalBackend, SlurmBackend
from vigil.actuators.backends.base import COMMAND_TIMEOUT_S
from vigil.actuators.errors import ActuatorError
from vigil.actuators.executor import MAX_DECISION_AGE_S, Executor
from vigil.actuators.inventory import Inventory
from vigil.cli.common import app, metrics_host_option, metrics_port_option
from vigil.schemas.envelope import to_seconds, utcnow
from vigil.services.actuator import ActuatorService
from vigil.settings import default_of

_HELP = """Carry out decisions: consume <prefix>.decisions, act, publish results to <prefix>.actions.

\b
How it acts (--backend):
  slurm       restart: scontrol requeue JOB
              isolate_node: scontrol update nodename=N state=drain reason=..
              reconfigure: drain the excluded nodes, then requeue (with
              --slurm-resubmit-script: sbatch --dependency=afterany:JOB,
              then scancel JOB)
  kubernetes  isolate_node: kubectl cordon N
              restart: kubectl delete pod -l LABEL=JOB
              reconfigure: cordon, delete the pods there, kubectl scale
  local       retry_in_place through the ranks' control sockets here
              (restarts need `vigil agent --actuate -- CMD`)

\b
Safety:
  * decisions must be signed by vigil's decision engine (VIGIL_DECISION_KEYS,
    or the key `vigil up` keeps in the state directory); unsigned, forged,
    replayed, stale or future-dated decisions are refused, reported on
    <prefix>.actions and raise an alert. VIGIL_ALLOW_UNSIGNED_DECISIONS=1
    accepts unsigned ones (a development stack only)
  * targets come from the operator only: --node, --job, --inventory FILE
    (host ranges like gpu-[01-16] are expanded) and, with
    --inventory-source slurm|kubernetes, the scheduler itself (scontrol show
    nodes + squeue, or the Kubernetes API), re-read every
    --inventory-refresh seconds; never from a topic. ALL, ranges and lists
    in a decision are refused
  * commands are argv lists of validated names, never a shell string
  * each decision acts at most once: the --ledger (SQLite) records every
    decision id and idempotency key; a redelivered decision re-publishes
    its recorded result; an action cut short by a crash is reported
    failed, never re-run
  * blast radius: at most --max-drained-nodes nodes and
    --max-drained-fraction of the known cluster per --drain-window;
    beyond: refuse, raise a sev1 actuator_circuit_open alert, and take
    no action until a human runs `vigil actuate --reset-circuit`
  * no progress: after --max-restarts-without-progress restarts of a
    job without a new training step, stop restarting it (--reset-job)
  * --rate-limit actions per job per --rate-window; decisions older
    than --max-decision-age are refused as stale
  * --dry-run: say what would run ("dry run: ..."), run nothing

\b
Examples:
  vigil actuate --backend slurm --inventory cluster.json --dry-run
  vigil actuate --backend kubernetes --k8s-namespace train --node gpu-01
  vigil actuate --reset-circuit     # a human looked: act again
"""


def _limit(name: str) -> object:
    """A safety limit's default, from its one home (:class:`vigil.actuators.safety.SafetyLimits`)."""
    from vigil.actuators.safety import SafetyLimits

    return default_of(SafetyLimits, name)


def _ledger_default(state_dir: Path) -> Path:
    return state_dir / "actuator-ledger.sqlite"


@app.command(help=_HELP)
def actuate(
    backend: str = typer.Option("slurm", "--backend", help="How to act: slurm, kubernetes or local."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Record what would run; run nothing (results say 'dry run: ...')."),
    ledger: Optional[Path] = typer.Option(None, "--ledger", help="The actuator's ledger (default: <state dir>/actuator-ledger.sqlite)."),
    node: Optional[List[str]] = typer.Option(None, "--node", help="A node the actuator may act on (repeatable)."),
    job: Optional[List[str]] = typer.Option(None, "--job", help="A job the actuator may act on (repeatable)."),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help='JSON file with "nodes" (a list of names or host ranges, e.g. gpu-[01-16]) and "jobs" (a list, or an object: job -> its nodes).'),
    inventory_source: Optional[str] = typer.Option(None, "--inventory-source", help="Also ask the scheduler for its nodes and jobs: slurm (scontrol show nodes, squeue) or kubernetes (the API, through kubectl)."),
    inventory_refresh: float = typer.Option(default_of(Inventory, "refresh_s"), min=1.0, help="Seconds between two questions to --inventory-source."),
    filter_job: Optional[List[str]] = typer.Option(None, "--filter-job", help="Act only on decisions for this job (repeatable)."),
    max_drained_nodes: int = typer.Option(_limit("max_drained_nodes"), min=1, help="Circuit breaker: most nodes isolated per window."),
    max_drained_fraction: float = typer.Option(_limit("max_drained_fraction"), min=0.0, max=1.0, help="Circuit breaker: most fraction of the known cluster isolated per window (one node may always go)."),
    drain_window: float = typer.Option(_limit("drain_window_s"), min=1.0, help="Circuit breaker window, seconds."),
    max_restarts_without_progress: int = typer.Option(_limit("max_restarts_without_progress"), min=1, help="No-progress guard: restarts of a job with no new training step before it stops restarting."),
    rate_limit: int = typer.Option(_limit("rate_limit"), min=1, help="Most actions per job per --rate-window."),
    rate_window: float = typer.Option(_limit("rate_window_s"), min=1.0, help="Rate-limit window, seconds."),
    max_decision_age: float = typer.Option(MAX_DECISION_AGE_S, min=0.0, help="Refuse decisions older than this many seconds (0: no limit)."),
    command_timeout: float = typer.Option(COMMAND_TIMEOUT_S, min=0.1, help="A backend command that runs longer is killed: timed_out."),
    slurm_resubmit_script: Optional[Path] = typer.Option(None, help="Slurm: reconfigure resubmits this batch script (sbatch --dependency=afterany) instead of requeueing."),
    k8s_namespace: str = typer.Option("default", help="Kubernetes namespace of the training pods."),
    k8s_job_label: str = typer.Option("job-name", help="Kubernetes pod label whose value is the job id."),
    k8s_kind: str = typer.Option("statefulset", help="Kubernetes kind that `kubectl scale` resizes for reconfigure."),
    control_dir: Optional[Path] = typer.Option(None, help="Local: directory of the ranks' control sockets (VIGIL_CONTROL_DIR)."),
    group_id: Optional[str] = typer.Option(None, help="Consumer group (default: <prefix>-actuator)."),
    cluster: str = typer.Option("default", help="Cluster name in the results."),
    reset_circuit: bool = typer.Option(False, "--reset-circuit", help="Close the circuit breaker in --ledger (a running actuator picks it up) and exit."),
    reset_job: Optional[List[str]] = typer.Option(None, "--reset-job", help="Lift the no-progress guard of this job in --ledger and exit (repeatable)."),
    ready_file: Optional[Path] = typer.Option(None, help="Write this file once partitions are assigned."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    metrics_port: Optional[int] = metrics_port_option("actuator"),
    metrics_host: Optional[str] = metrics_host_option(),
) -> None:
    from vigil.actuators.ledger import Ledger
    from vigil.actuators.safety import Safety, SafetyLimits
    from vigil.schemas import Source
    from vigil.broker import StackError
    from vigil.cli.common import serve_metrics, settings_and_logging
    from vigil.stack import resolve_bootstrap

    settings = settings_and_logging(log_level, logging.INFO)
    ledger_path = ledger or _ledger_default(settings.state_dir)
    who = f"{os.environ.get('USER', '?')}@{socket.gethostname()}"
    if reset_circuit or reset_job:
        try:
            if reset_circuit:
                Ledger.request_reset(ledger_path, at=to_seconds(utcnow()), kind="circuit", who=who)
                typer.echo(f"circuit breaker reset in {ledger_path}")
            for j in reset_job or []:
                Ledger.request_reset(ledger_path, at=to_seconds(utcnow()), kind="job", job=j, who=who)
                typer.echo(f"no-progress guard of job {j} reset in {ledger_path}")
        except ActuatorError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(0)
    if backend not in ("slurm", "kubernetes", "local"):
        raise typer.BadParameter(f"--backend must be slurm, kubernetes or local, got {backend!r}")
    from vigil.actuators.inventory import KubernetesSource, SlurmSource

    if inventory_source not in (None, "slurm", "kubernetes"):
        raise typer.BadParameter(f"--inventory-source must be slurm or kubernetes, got {inventory_source!r}")
    try:
        source: Any = (SlurmSource() if inventory_source == "slurm" else
                       KubernetesSource(k8s_namespace, k8s_job_label) if inventory_source == "kubernetes" else None)
        kw: dict[str, Any] = {"source": source, "refresh_s": inventory_refresh}
        inv = (Inventory.load(inventory, node or [], job or [], **kw) if inventory
               else Inventory(node or [], job or [], **kw))
        inv.refresh(to_seconds(utcnow()), force=True)
        keyring = settings.decision_keyring()
        limits = SafetyLimits(max_drained_nodes=max_drained_nodes, max_drained_fraction=max_drained_fraction,
                              drain_window_s=drain_window, max_restarts_without_progress=max_restarts_without_progress,
                              rate_limit=rate_limit, rate_window_s=rate_window)
        if backend == "slurm":
            be: Any = SlurmBackend(command_timeout, resubmit_script=slurm_resubmit_script)
        elif backend == "kubernetes":
            be = KubernetesBackend(command_timeout, namespace=k8s_namespace, job_label=k8s_job_label, kind=k8s_kind)
        else:
            be = LocalBackend(ControlDirProcesses(control_dir), control_dir, command_timeout_s=min(command_timeout, 30.0))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        book = Ledger(ledger_path, now=to_seconds(utcnow()))
    except ActuatorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    executor = Executor(be, book, inv, Safety(limits), dry_run=dry_run, source=Source(cluster=cluster, node=socket.gethostname()),
                        max_age_s=max_decision_age or None, clock=utcnow, keyring=keyring)
    service = ActuatorService(executor, {"bootstrap.servers": bootstrap, **settings.kafka_security()},
                              settings.topic_prefix, group_id=group_id or f"{settings.topic_prefix}-actuator",
                              filter_jobs=filter_job, ready_file=ready_file,
                              session_timeout_s=settings.session_timeout_s,
                              heartbeat_interval_s=settings.heartbeat_interval_s)
    stop = threading.Event()
    metrics = serve_metrics(settings, "actuator", metrics_port, metrics_host, "ActuatorMetrics")
    if metrics is not None:
        metrics.watch(service, stop)  # action results by outcome, decisions handled, the circuit breaker, lag
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    typer.echo(f"vigil actuate: backend {executor.backend_label}, ledger {ledger_path} ({book.count()} decisions), "
               f"{inv}, broker {bootstrap}", err=True)
    if inv.last_error:
        typer.echo(f"warning: the inventory source did not answer: {inv.last_error}", err=True)
    if not keyring.keys and not keyring.allow_unsigned:
        typer.echo("warning: no decision keys (VIGIL_DECISION_KEYS, or a `vigil up` stack's in the state "
                   "directory): every decision will be refused", err=True)
    elif keyring.allow_unsigned:
        typer.echo("warning: VIGIL_ALLOW_UNSIGNED_DECISIONS is set: anyone who can write the decisions topic can "
                   "make this actuator act (a development stack only)", err=True)
    if executor.safety.circuit_open:
        typer.echo(f"warning: the circuit breaker is open ({executor.safety.circuit_reason}); "
                   "no machine action until `vigil actuate --reset-circuit`", err=True)
    code = 0
    try:
        service.run(stop)
    except Exception as exc:
        typer.echo(f"error: actuator stopped: {exc}", err=True)
        code = 1
    finally:
        service.close()
        book.close()
    raise typer.Exit(code)

