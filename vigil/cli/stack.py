"""The stack's commands: up, worker, demo, sql, tail, schemas, migrate, replay, report."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from vigil.cli.common import app, console, err_console, fail, load_settings, metrics_host_option, metrics_port_option, \
    require_server, schemas_app, serve_metrics, tail_app, terminate_on_sigterm


@app.command()
def up(port: Optional[int] = typer.Option(None, help="Broker port on 127.0.0.1 (default: a free one)."),
       metrics_port: Optional[int] = metrics_port_option("history"),
       metrics_host: Optional[str] = metrics_host_option()) -> None:
    """Run the embedded stack in the foreground: tansu broker, topics, ClickHouse history and its sink.

    Other vigil commands find it through the state directory
    (VIGIL_STATE_DIR, default ./.vigil). Stop it with Ctrl-C or SIGTERM;
    it stops everything it started.
    """
    from vigil.broker import StackError
    from vigil.secrets import redact_dsn
    from vigil.stack import EMBEDDED_BROKER_WARNING, EmbeddedStack, ensure_stack_key

    require_server("up")
    settings = load_settings()
    terminate_on_sigterm()
    stack = EmbeddedStack(settings, port=port)
    metrics = serve_metrics(settings, "history", metrics_port, metrics_host, "HistoryMetrics", announce=False)
    if metrics is not None:
        metrics.watch(stack)  # the sink's counters and lag, the embedded broker's restarts
    try:
        stack.start()
        ensure_stack_key(settings)
    except (StackError, KeyboardInterrupt) as exc:
        fail(str(exc) or "interrupted")
    try:
        console.print(f"[green]vigil stack up[/green] (pid {os.getpid()})")
        console.print(f"  broker      {stack.bootstrap}   (export VIGIL_KAFKA_BOOTSTRAP={stack.bootstrap} for other tools)")
        console.print(f"  history     {redact_dsn(settings.resolved_clickhouse_dsn)}  (database {settings.clickhouse_database})")
        console.print(f"  topics      {settings.topic_prefix}.*")
        keys = ("VIGIL_DECISION_KEYS" if settings.decision_keys
                else f"this stack's key, in {settings.stack_key_file} (workers and actuators in this state directory use it)")
        console.print(f"  decisions   signed with {keys}")
        if metrics is not None:
            console.print(f"  metrics     {metrics.url}  (Prometheus: the history sink's own health)")
        console.print("  next        vigil worker  |  vigil tail alerts  |  vigil sql \"SELECT ...\"")
        if stack.broker is not None:
            err_console.print(f"[yellow]warning:[/yellow] {EMBEDDED_BROKER_WARNING}")
        console.print("Ctrl-C to stop.")
        restarts = 0
        while not (problem := stack.failure()):
            if stack.broker_restarts != restarts:
                restarts = stack.broker_restarts
                err_console.print(f"[yellow]warning:[/yellow] the embedded broker died and was started again on "
                                  f"{stack.bootstrap} (restart {restarts}); unconsumed events and committed offsets "
                                  f"were lost; recorded as a {settings.topic_prefix}.alerts incident")
            time.sleep(0.5)
        err_console.print(f"[red]error:[/red] {problem}; stopping the stack")
        code = 1
    except KeyboardInterrupt:
        code = 0
    finally:
        stack.stop()
        console.print("stack stopped")
    raise typer.Exit(code)


@app.command()
def worker(
    ready_file: Optional[Path] = typer.Option(None, help="Write this file once partitions are assigned."),
    log_level: str = typer.Option("WARNING", help="Python log level (INFO logs every alert and decision)."),
    metrics_port: Optional[int] = metrics_port_option("worker"),
    metrics_host: Optional[str] = metrics_host_option(),
) -> None:
    """Run a detection worker: every detector on the telemetry, incidents to <prefix>.alerts, decisions.

    Several workers share the topics' partitions in one consumer group
    (VIGIL_GROUP_ID); the one that owns the findings topic correlates and
    decides. A worker that takes over partitions (a restart, a rebalance)
    rebuilds its state from the last VIGIL_RECOVERY_WINDOW_S seconds of the
    log and never publishes an alert or decision twice. Stop it with Ctrl-C
    or SIGTERM. Its own health (events consumed, lag, alerts, detector cost)
    is on /metrics for Prometheus.
    """
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.streams.worker import run_worker

    require_server("worker")
    settings = load_settings()
    try:
        bootstrap = resolve_bootstrap(settings)
        keyring = settings.decision_keyring()
    except (StackError, ValueError) as exc:
        fail(str(exc))
    metrics = serve_metrics(settings, "worker", metrics_port, metrics_host, "WorkerMetrics")
    run_worker(stream_config(settings, bootstrap), ready_file=ready_file, loglevel=log_level,
               sign=keyring.sign if keyring.can_sign else None, metrics=metrics)


@app.command()
def demo(
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the scoreboard as JSON here."),
    workers: int = typer.Option(1, min=1, max=4, help="Detection worker processes."),
    seed: int = typer.Option(0, help="Seed of the simulated cluster's jitter."),
) -> None:
    """Simulate a cluster that loses nodes and hangs a job; show what vigil detects, and how fast.

    Starts the embedded stack and detection workers, plays a scripted scenario
    (~30 s), prints a scoreboard of every injected fault with its detection
    latency, then reads the alerts back from ClickHouse with SQL.
    """
    from vigil.demo import run_demo

    require_server("demo")
    settings = load_settings()
    terminate_on_sigterm()
    code = run_demo(settings, console, json_path=json_path, n_workers=workers, seed=seed)
    raise typer.Exit(code)


@app.command()
def sql(
    query: str = typer.Argument(..., help="SQL, e.g. \"SELECT kind, count() FROM vigil.alerts GROUP BY kind\"."),
    fmt: str = typer.Option("table", "--format", help="table, json or tsv."),
) -> None:
    """Run SQL against the history (through the running stack when it owns the chDB directory).

    Tables live in the database VIGIL_CLICKHOUSE_DATABASE (default vigil),
    one per event type: iterations, iteration_steps, collectives,
    checkpoints, xid_errors, nic_counters, gpu_telemetry, heartbeats,
    process_exits, training_exceptions, flight_recorder_dumps, job_states,
    node_states, agent_health, events_dropped, watchdog_reports, findings,
    alerts, decisions, actions, dead_letters; the views of the SQL cookbook
    (incidents, ettr, run_ettr, mttf_by_size, lemon_nodes, ...) on top.

    Read-only: one SELECT, WITH, SHOW, DESCRIBE, EXPLAIN or EXISTS statement,
    in ClickHouse's read-only mode; no table function that reaches files,
    URLs or other servers. Through a running stack it sends the stack's
    query token (from its stack.json).
    """
    from vigil.streams.history import HistoryError
    from vigil.stack import open_history

    require_server("sql")
    settings = load_settings()
    try:
        history = open_history(settings)
        result = history.query_read_only(query)
    except HistoryError as exc:
        _query_error(query, str(exc))
    if fmt == "json":
        from vigil.stack import _jsonable

        for row in result.rows:
            print(json.dumps(dict(zip(result.columns, _jsonable(list(row))))))
    elif fmt == "tsv":
        print("\t".join(result.columns))
        for row in result.rows:
            print("\t".join("" if v is None else str(v) for v in row))
    elif fmt == "table":
        table = Table(*result.columns, show_lines=False)
        for row in result.rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        console.print(table)
        console.print(f"{len(result.rows)} row(s)")
    else:
        fail(f"unknown --format {fmt!r}: use table, json or tsv", 2)


def _query_error(query: str, message: str) -> None:
    """ClickHouse's message, and the query with a caret under the position it names; exit 1."""
    import re

    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}")
    where = re.search(r"\(line (\d+), col (\d+)\)", message)
    lines = query.splitlines() or [query]
    if where and 1 <= int(where.group(1)) <= len(lines):
        line, col = int(where.group(1)), int(where.group(2))
        err_console.print(escape(lines[line - 1]), highlight=False)
        err_console.print(" " * (col - 1) + f"[red]^[/red] line {line}, column {col}", highlight=False)
    raise typer.Exit(1)


_SEVERITY_HELP = "Only this severity or worse (1 is worst); a decision or action has its incidents' severity."
_JOB_HELP = "Only records about this job (a decision's target, an action's decision, an alert's jobs)."


def _tail(kinds: tuple[str, ...], severity: Optional[int], job: Optional[str], as_json: bool,
          from_beginning: bool, max_records: Optional[int], lookback_s: float) -> None:
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.tail import KINDS, Follower, format_record, open_consumer, records

    settings = load_settings()
    shown_types = {KINDS[k] for k in kinds}
    try:
        config = stream_config(settings, resolve_bootstrap(settings))
        # alerts and decisions are always read: they tell a decision's or action's severity and job
        read = ("alert", "decision") + (("action_result",) if "action_result" in shown_types else ())
        topics = {t: config.topic(t) for t in read}
        consumer, marks = open_consumer(config.kafka_conf(), topics, from_beginning, lookback_s)
    except (StackError, Exception) as exc:
        fail(str(exc))
    terminate_on_sigterm()
    err_console.print(f"following {', '.join(kinds)} on {config.topic_prefix}.* "
                      f"{'from the beginning' if from_beginning else 'from now'} (Ctrl-C to stop)", highlight=False)
    follower = Follower(severity=severity, job=job)
    shown = 0
    try:
        for event, new in records(consumer, marks):
            if max_records is not None and shown >= max_records:
                break
            known = follower.learn(event)
            if not new or event.event_type not in shown_types or not follower.passes(known):  # type: ignore[attr-defined]
                continue
            shown += 1
            if as_json:
                print(event.model_dump_json(), flush=True)
            else:
                console.print(format_record(event, follower), highlight=False)
            if max_records is not None and shown >= max_records:
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _tail_command(name: str, kinds: tuple[str, ...], doc: str) -> None:
    def command(
        severity: Optional[int] = typer.Option(None, min=1, max=3, help=_SEVERITY_HELP),
        job: Optional[str] = typer.Option(None, help=_JOB_HELP),
        as_json: bool = typer.Option(False, "--json", help="One JSON event per line (its event_type says which)."),
        from_beginning: bool = typer.Option(False, help="Replay the topics from their start first."),
        max_records: Optional[int] = typer.Option(None, "--max", "--max-alerts", min=1,
                                                  help="Exit after printing this many records."),
        lookback: float = typer.Option(3600.0, help="Seconds of earlier alerts and decisions read (not printed) "
                                                    "to filter later decisions and actions."),
    ) -> None:
        _tail(kinds, severity, job, as_json, from_beginning, max_records, lookback)

    command.__doc__ = doc
    tail_app.command(name)(command)


_tail_command("alerts", ("alerts",), "Follow the alert topic live (Ctrl-C to stop).")
_tail_command("decisions", ("decisions",), "Follow the decision engine's decisions live (Ctrl-C to stop).")
_tail_command("actions", ("actions",), "Follow the actuators' action results live, with the decision each "
                                       "carries out (Ctrl-C to stop).")
_tail_command("all", ("alerts", "decisions", "actions"), "Follow alerts, decisions and action results live, "
                                                          "interleaved as they arrive (Ctrl-C to stop).")


def format_alert(alert: "object") -> str:
    from vigil.tail import Follower, format_record

    return format_record(alert, Follower())  # type: ignore[arg-type]


@schemas_app.command("export")
def schemas_export(directory: Path = typer.Argument(..., help="Folder to write <event_type>.json files into.")) -> None:
    """Write the JSON Schema of every event type (what subscribers validate against)."""
    from vigil.schemas.export import export_json_schemas

    written = export_json_schemas(directory)
    console.print(f"wrote {len(written)} schemas to {directory}")


@app.command()
def migrate() -> None:
    """Create or upgrade the history database, tables, rollups and views (idempotent; `vigil up` does it too).

    Keeps every stored row: new columns are added, a table whose layout changed
    is copied into the new layout and swapped in atomically, rollups are
    backfilled from the stored events. Raw telemetry is kept
    VIGIL_TELEMETRY_TTL_DAYS days (0 = forever; per table:
    VIGIL_TELEMETRY_TTL_OVERRIDES='{"gpu_telemetry": 7}').
    """
    from vigil.streams.history import HistoryError, HistoryStore

    require_server("migrate")
    from vigil.secrets import redact_dsn

    settings = load_settings()
    try:
        store = HistoryStore(settings.resolved_clickhouse_dsn, settings.clickhouse_database)
        done = store.migrate(settings.telemetry_ttl_days, settings.telemetry_ttl_overrides)
    except HistoryError as exc:
        fail(str(exc))
    for line in done:
        console.print(f"  {line}")
    console.print(f"history tables ready in {redact_dsn(settings.resolved_clickhouse_dsn)} ({settings.clickhouse_database})"
                  + ("" if done else ": nothing to change"))


def _parse_time(value: Optional[str], flag: str):
    from datetime import datetime, timezone

    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{flag} {value!r} is not a date-time: use ISO 8601, e.g. 2026-03-01 or 2026-03-01T12:00:00Z", 2)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@app.command()
def replay(
    since: Optional[str] = typer.Option(None, "--from", help="First log time to replay (ISO 8601, UTC if no zone)."),
    until: Optional[str] = typer.Option(None, "--to", help="Last log time to replay (ISO 8601, UTC if no zone)."),
    database: Optional[str] = typer.Option(None, help="Database to rebuild into (default VIGIL_CLICKHOUSE_DATABASE)."),
) -> None:
    """Rebuild the history from the Kafka log: every topic's messages published in [--from, --to].

    Same tables, rollups and dead letters as the live sink; events already
    stored are skipped by id, so replaying twice, or into a database the sink
    fills, adds no duplicate. Give --database to rebuild side by side (e.g.
    after changing a rollup) and compare. Needs the chDB directory to itself:
    stop `vigil up` first, or use a ClickHouse server (VIGIL_CLICKHOUSE_DSN).
    """
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.streams.history import HistoryError, HistoryStore
    from vigil.streams.replay import replay as run_replay

    require_server("replay")
    from vigil.streams.history import check_identifier

    settings = load_settings()
    t0, t1 = _parse_time(since, "--from"), _parse_time(until, "--to")
    if database is not None:
        try:
            check_identifier(database)
        except HistoryError as exc:
            fail(f"--database: {exc}", 2)
    try:
        config = stream_config(settings, resolve_bootstrap(settings))
        store = HistoryStore(settings.resolved_clickhouse_dsn, database or settings.clickhouse_database)
        store.migrate(settings.telemetry_ttl_days, settings.telemetry_ttl_overrides)
    except (StackError, HistoryError) as exc:
        fail(str(exc))
    terminate_on_sigterm()
    with console.status("replaying...") as status:
        result = run_replay(config, store, t0, t1,
                            progress=lambda st: status.update(f"replaying: {st.messages:,} messages, "
                                                              f"{st.stored:,} stored..."))
    st = result.stats
    console.print(f"replayed {st.messages:,} messages from {result.partitions} partitions in {result.seconds:.1f} s: "
                  f"{st.stored} stored, {st.duplicates} already stored, {st.dead_letters} dead letters "
                  f"(database {store.database})")
    store.close()


@app.command()
def report(
    since: str = typer.Option("7d", help="Window start: 7d, 12h, 30m ago, or an ISO 8601 time (UTC if no zone)."),
    until: Optional[str] = typer.Option(None, help="Window end (default now), same forms."),
    job: Optional[str] = typer.Option(None, help="Only this job (its ETTR, iterations and incidents)."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report with plots here."),
) -> None:
    """The failure history as tables: incidents by domain, ETTR, MTTF, MTTR, detection latency, lemon nodes.

    With --html, also a self-contained page with plots: iteration time per
    job with change points and incidents marked, incidents on a timeline,
    ETTR per job and the lemon-node ranking.
    """
    from datetime import datetime, timezone

    from vigil.streams.history import HistoryError
    from vigil.report import collect, parse_when, print_report, render_html
    from vigil.stack import open_history

    require_server("report")
    settings = load_settings()
    now = datetime.now(timezone.utc)
    try:
        t0, t1 = parse_when(since, now), parse_when(until, now) or now
    except ValueError as exc:
        fail(f"bad time: {exc}", 2)
    try:
        history = open_history(settings)
        rep = collect(history, settings.clickhouse_database, t0, t1, job)
    except HistoryError as exc:
        fail(str(exc))
    print_report(rep, console)
    if html_path is not None:
        html_path.write_text(render_html(rep))
        console.print(f"HTML report written to {html_path}")


