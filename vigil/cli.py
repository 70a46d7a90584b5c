"""The ``vigil`` command line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from vigil.settings import Settings

app = typer.Typer(
    help=(
        "vigil: a self-healing control loop for GPU training clusters.\n\n"
        "Telemetry flows through Kafka topics, stream workers detect failures and raise "
        "sev1/sev2/sev3 alerts, and everything lands in ClickHouse for SQL.\n\n"
        "Quick start: `vigil demo`. For a live stack: `vigil up` in one terminal, then "
        "`vigil worker`, `vigil tail alerts` and `vigil sql` in others. Configuration comes from "
        "VIGIL_* environment variables (VIGIL_KAFKA_BOOTSTRAP, VIGIL_CLICKHOUSE_DSN, "
        "VIGIL_STATE_DIR, VIGIL_TOPIC_PREFIX, ...)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
schemas_app = typer.Typer(help="Event schemas: export the JSON Schema of every event.", no_args_is_help=True)
tail_app = typer.Typer(help="Follow a topic live.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that write JSON results.", no_args_is_help=True)
app.add_typer(schemas_app, name="schemas")
app.add_typer(tail_app, name="tail")
app.add_typer(bench_app, name="bench")

console = Console()
err_console = Console(stderr=True)


def _settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # pydantic's ValidationError names the variable
        err_console.print(f"[red]invalid VIGIL_* setting:[/red] {exc}")
        raise typer.Exit(2) from None


def _print_table(columns: tuple[str, ...], rows: "list[tuple[str, ...]]") -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def _terminate_on_sigterm() -> None:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt so `finally` blocks stop what we started."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


@app.command()
def up(port: Optional[int] = typer.Option(None, help="Broker port on 127.0.0.1 (default: a free one).")) -> None:
    """Run the embedded stack in the foreground: tansu broker, topics, ClickHouse history and its sink.

    Other vigil commands find it through the state directory
    (VIGIL_STATE_DIR, default ./.vigil). Stop it with Ctrl-C or SIGTERM;
    it stops everything it started.
    """
    from vigil.broker import StackError
    from vigil.stack import EmbeddedStack

    settings = _settings()
    _terminate_on_sigterm()
    stack = EmbeddedStack(settings, port=port)
    try:
        stack.start()
    except (StackError, KeyboardInterrupt) as exc:
        _fail(str(exc) or "interrupted")
    try:
        console.print(f"[green]vigil stack up[/green] (pid {os.getpid()})")
        console.print(f"  broker      {stack.bootstrap}   (export VIGIL_KAFKA_BOOTSTRAP={stack.bootstrap} for other tools)")
        console.print(f"  history     {settings.resolved_clickhouse_dsn}  (database {settings.clickhouse_database})")
        console.print(f"  topics      {settings.topic_prefix}.*")
        console.print("  next        vigil worker  |  vigil tail alerts  |  vigil sql \"SELECT ...\"")
        console.print("Ctrl-C to stop.")
        while not (problem := stack.failure()):
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
    log_level: str = typer.Option("WARNING", help="faust log level."),
) -> None:
    """Run a detection worker (faust): heartbeat loss and hang detection, alerts to <prefix>.alerts.

    Several workers share the topics' partitions in one consumer group
    (VIGIL_GROUP_ID).
    """
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.streams.worker import run_worker

    settings = _settings()
    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        _fail(str(exc))
    run_worker(stream_config(settings, bootstrap), ready_file=ready_file, loglevel=log_level)


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

    settings = _settings()
    _terminate_on_sigterm()
    code = run_demo(settings, console, json_path=json_path, n_workers=workers, seed=seed)
    raise typer.Exit(code)


@app.command()
def sql(
    query: str = typer.Argument(..., help="SQL, e.g. \"SELECT kind, count() FROM vigil.alerts GROUP BY kind\"."),
    fmt: str = typer.Option("table", "--format", help="table, json or tsv."),
) -> None:
    """Run SQL against the history (through the running stack when it owns the chDB directory).

    Tables live in the database VIGIL_CLICKHOUSE_DATABASE (default vigil):
    alerts, heartbeats, iterations, xid_errors, nic_counters, gpu_telemetry,
    process_exits, training_exceptions, job_states, node_states, decisions,
    actions, dead_letters.
    """
    from vigil.streams.history import HistoryError
    from vigil.stack import open_history

    settings = _settings()
    try:
        history = open_history(settings)
        result = history.query(query)
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
        _fail(f"unknown --format {fmt!r}: use table, json or tsv", 2)


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


@tail_app.command("alerts")
def tail_alerts(
    severity: Optional[int] = typer.Option(None, min=1, max=3, help="Only this severity or worse (1 is worst)."),
    job: Optional[str] = typer.Option(None, help="Only alerts about this job."),
    as_json: bool = typer.Option(False, "--json", help="One JSON alert per line."),
    from_beginning: bool = typer.Option(False, help="Replay the topic from its start first."),
    max_alerts: Optional[int] = typer.Option(None, help="Exit after this many alerts."),
) -> None:
    """Follow the alert topic live (Ctrl-C to stop)."""
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.schemas import Alert, decode
    from vigil.streams.kafka import reader

    settings = _settings()
    try:
        config = stream_config(settings, resolve_bootstrap(settings))
        consumer = reader(config.kafka_conf(), [config.topic("alert")], from_beginning=from_beginning)
    except (StackError, Exception) as exc:
        _fail(str(exc))
    _terminate_on_sigterm()
    shown = 0
    try:
        while max_alerts is None or shown < max_alerts:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            for alert in decode(msg.value()).events:
                if not isinstance(alert, Alert):
                    continue
                if severity is not None and alert.severity > severity:
                    continue
                if job is not None and alert.subject.job != job:
                    continue
                shown += 1
                if as_json:
                    print(alert.model_dump_json(), flush=True)
                else:
                    console.print(format_alert(alert))
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def format_alert(alert: "object") -> str:
    from vigil.schemas import Alert

    assert isinstance(alert, Alert)
    colour = {1: "red", 2: "yellow", 3: "cyan"}[alert.severity]
    subject = " ".join(f"{k}={v}" for k, v in alert.subject.model_dump(exclude_none=True).items())
    return (f"[{colour}]sev{alert.severity}[/{colour}] {alert.status:<8} {alert.kind:<12} {subject:<24} "
            f"onset {alert.onset_time:%H:%M:%S.%f}"[:-3] + f"  {alert.summary}")


@bench_app.command("detectors")
def bench_detectors(
    json_path: Path = typer.Option(Path("bench/results/detectors.json"), "--json", help="Where to write the results."),
    traces: int = typer.Option(500, min=10, help="Labelled traces to generate (half of them clean)."),
    seed: int = typer.Option(0, help="Seed of the trace generator."),
) -> None:
    """Score every change-point detector and baseline on labelled iteration-time traces.

    Reports accuracy, false-positive and false-negative rates, detection
    delay and onset error in iterations, and updates per second; also the
    straggler localizer's accuracy and the ACF iteration-period error.
    Writes JSON and prints a table.
    """
    from vigil.bench.detectors import run

    with console.status("generating traces...") as status:
        result = run(str(json_path), n_traces=traces, seed=seed,
                     progress=lambda what: status.update(f"scoring {what}..."))
    from rich import box

    table = Table("detector", "acc", "fpr", "fnr", "fnr≥10", "delay50", "delay95", "onset", "upd/s",
                  box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    table.columns[0].min_width = 14
    fmt = lambda v, p=3: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))
    for name, r in result["detectors"].items():
        table.add_row(name, fmt(r.get("accuracy")), fmt(r.get("fpr")), fmt(r.get("fnr")), fmt(r.get("fnr_ge10")),
                      fmt(r.get("delay_median"), 0), fmt(r.get("delay_p95"), 0), fmt(r.get("onset_error_median"), 0),
                      f"{r.get('updates_per_s', 0) / 1000:,.0f}k")
    console.print(table)
    console.print(f"localizer accuracy {fmt((result.get('localizer') or {}).get('accuracy'))}, "
                  f"ACF median relative error {fmt((result.get('acf') or {}).get('rel_error_median'), 4)}")
    console.print(f"written to {json_path}")


@bench_app.command("pipeline")
def bench_pipeline(
    json_path: Path = typer.Option(Path("bench/results/pipeline.json"), "--json", help="Where to write the results."),
    seconds: float = typer.Option(20.0, min=2, help="Seconds of a 4,096-GPU cluster's telemetry to push through."),
    rounds: int = typer.Option(2, min=1, help="Latency rounds (each a ~40 s live cluster with a dozen faults)."),
) -> None:
    """Records/s through 1 and 2 detection workers, and fault-to-alert latency per kind.

    Runs on its own embedded broker; takes a few minutes. Writes JSON and
    prints a table.
    """
    from vigil.bench.pipeline import run

    with console.status("starting...") as status:
        result = run(str(json_path), seconds=seconds, latency_rounds=rounds,
                     progress=lambda what: status.update(what + "..."))
    for n, rps in result["throughput"].items():
        d = result["throughput_detail"][n]
        console.print(f"{n} worker(s): {rps:,} records/s ({d['records']:,} records in {d['seconds']} s)")
    table = Table("fault", "p50 s", "p99 s", "n", "missed")
    for kind, r in result["latency"].items():
        table.add_row(kind, str(r["p50"]), str(r["p99"]), str(r["n"]), str(r["missed"]))
    fs = result["fail_slow"]
    table.add_row("fail_slow", f"{fs['p50_iterations']} it", f"{fs['p99_iterations']} it", str(fs["n"]), str(fs["missed"]))
    console.print(table)
    console.print(f"written to {json_path}")


@bench_app.command("planners")
def bench_planners(
    json_path: Path = typer.Option(Path("bench/results/planners.json"), "--json", help="Where to write the results."),
    repeats: int = typer.Option(7, min=1, help="Timed calls per instance; the median is reported."),
    seed: int = typer.Option(0, help="Seed of the generated instances."),
    quality_seeds: int = typer.Option(10, min=1, help="Fragmented clusters on which placement is compared with the baselines."),
) -> None:
    """Time every planner against its target, and compare placement with topology-unaware baselines.

    Pure computation on one core, no broker; takes about half a minute.
    Each timing is the median of REPEATS calls on a seeded instance:

    \b
      micro-batch rebalancing (Falcon S2), 512 DP groups ........ target <= 10 ms
      multi-job re-planning (Unicron), 100 jobs on 10,000 GPUs
        planned in nodes of 8 GPUs (1,250 workers) .............. target <= 100 ms
      placement (Arnold), a 512-node job (dp 64 x pp 8) in a
        fragmented 1,024-node cluster of 32-node minipods ....... target <= 1 s

    plus a size sweep of each (and re-planning in GPU units), and the
    placement objective (max DP-group spread + split PP groups) of best-fit,
    random-fit and packing divided by the exact placement's, over
    QUALITY_SEEDS clusters (Arnold reports up to 1.67x). Writes JSON with
    microbatch_512_ms, waf_100jobs_10k_ms, placement_512of1024_ms,
    placement_spread_vs_best_baseline and a detail section (sweeps, per-seed
    quality, machine), and prints a table.
    """
    from vigil.bench.planners import format_table, run

    with console.status("benchmarking the planners...") as status:
        result = run(str(json_path), repeats=repeats, seed=seed, quality_seeds=quality_seeds,
                     progress=lambda what: status.update(f"timing {what}..."))
    _print_table(("measure", "value", "target"), format_table(result))
    console.print(f"written to {json_path}")


@bench_app.command("history")
def bench_history(
    json_path: Path = typer.Option(Path("bench/results/history.json"), "--json", help="Where to write the results."),
    telemetry_rows: int = typer.Option(100_000_000, min=1000, help="Raw telemetry rows generated in ClickHouse."),
    incidents: int = typer.Option(1_000_000, min=100, help="Incidents generated (about 1.9 alert versions each)."),
    sink_events: int = typer.Option(300_000, min=1000, help="Events pushed through Kafka and the history sink."),
    repeats: int = typer.Option(3, min=1, help="Runs of each cookbook query; the median is reported."),
) -> None:
    """Sink insert rows/s (target >= 100,000) and the cookbook queries' latency over a large history (target < 1 s).

    The history (TELEMETRY_ROWS raw telemetry rows and INCIDENTS incidents with
    decisions and action results) is generated inside ClickHouse with INSERT
    ... SELECT FROM numbers(), in a temporary chDB directory; at the defaults
    it takes several minutes and a few GB of disk. Writes JSON
    {"insert_rows_per_s", "queries": {NAME: seconds}, ...} and prints a table.
    """
    from vigil.bench.history import format_table, run

    with console.status("starting...") as status:
        result = run(str(json_path), telemetry_rows=telemetry_rows, incidents=incidents, sink_events=sink_events,
                     repeats=repeats, progress=lambda what: status.update(what + "..."))
    _print_table(("measure", "value", "target"), format_table(result))
    console.print(f"written to {json_path}")


@bench_app.command("policies")
def bench_policies(
    json_path: Path = typer.Option(Path("bench/results/policies.json"), "--json", help="Where to write the results."),
    trace: str = typer.Option("trace-a", help="Failure trace preset: trace-a (8 weeks) or trace-b (20x the rate, 7 days)."),
    gpus: int = typer.Option(128, min=16, help="Cluster size; 128 runs Unicron's case 5 (six jobs)."),
    seed: int = typer.Option(0, help="Seed of the trace, the job mix and the detectors' inputs."),
    scale: bool = typer.Option(True, help="Also time a 10,000-GPU, 4-week run of every policy (a few minutes)."),
    sweep_seeds: int = typer.Option(10, min=0, help="On 128 GPUs, also run seeds 0..N-1 for the bounds each target "
                                                    "is held against (a few seconds a seed); 0 skips it."),
) -> None:
    """Simulate the cluster under each recovery policy and compare how much training each gets back.

    Policies: restart-only (30 min collective timeout, 9 min resubmit, 14 min
    set-up, recompute since the last 30 min checkpoint, fixed-size jobs),
    per-job reconfiguration (only the failed job re-plans), and vigil (the
    live detectors and decision engine on simulated time: escalation,
    ski-rental fail-slow mitigation, WAF-optimal multi-job re-planning with
    topology-aware placement).

    \b
    Targets (Unicron case 5 on 128 GPUs):
      accumulated WAF >= 1.2x restart-only on trace-a, >= 1.9x on trace-b
      fail-slow slowdown reduced by >= 60.1 % (Falcon)
      vigil's ETTR >= 0.97 on trace-a
      a 10,000-GPU, 4-week run in under 10 minutes

    Each target is shown against a yardstick, on this seed and over the
    seed sweep: the oracle (every healthy node at the best allocation,
    recovery free) bounds any policy's WAF; vigil's ski rental told each
    fail-slow's true remaining duration is a reference for the fail-slow
    figure (not a bound).

    Writes JSON (policies: accumulated_waf, ettr_mean, failslow_slowdown_pct;
    failslow_mitigated_pct; wall_s; targets; detail), a markdown summary and
    a PNG plot of WAF over time next to it, and prints a table. Deterministic
    for a seed.
    """
    from vigil.bench.policies import format_table, run

    if trace not in ("trace-a", "trace-b"):
        _fail(f"--trace must be trace-a or trace-b, got {trace!r}", 2)
    if gpus % 8:
        _fail(f"--gpus must be a multiple of 8, got {gpus}", 2)
    with console.status("simulating...") as status:
        def progress(what: str) -> None:
            status.update(what)
            err_console.log(what)
        result = run(str(json_path), trace=trace, gpus=gpus, seed=seed, scale=scale,
                     sweep_seeds=sweep_seeds, progress=progress)
    _print_table(("policy", "accumulated WAF (weighted EFLOP)", "vs restart-only", "ETTR mean", "fail-slow slowdown"),
                 format_table(result))
    for name, t in result["targets"].items():
        held = ""
        for kind in ("bound", "reference"):
            if t.get(kind) is not None:
                held = f"; {t[f'{kind}_is'].split(':')[0]} {kind} {t[kind]} on this seed"
                if t.get(f"{kind}_max_over_seeds") is not None:
                    held += f", {t[f'{kind}_max_over_seeds']} on the best seed"
        console.print(f"{name}: measured {t['measured']} (target {t['target']}{held}): "
                      f"{'met' if t['met'] else 'NOT met'}")
    console.print(f"written to {json_path} (+ .md, .png)")


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

    settings = _settings()
    try:
        store = HistoryStore(settings.resolved_clickhouse_dsn, settings.clickhouse_database)
        done = store.migrate(settings.telemetry_ttl_days, settings.telemetry_ttl_overrides)
    except HistoryError as exc:
        _fail(str(exc))
    for line in done:
        console.print(f"  {line}")
    console.print(f"history tables ready in {settings.resolved_clickhouse_dsn} ({settings.clickhouse_database})"
                  + ("" if done else ": nothing to change"))


def _parse_time(value: Optional[str], flag: str):
    from datetime import datetime, timezone

    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"{flag} {value!r} is not a date-time: use ISO 8601, e.g. 2026-03-01 or 2026-03-01T12:00:00Z", 2)
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

    settings = _settings()
    t0, t1 = _parse_time(since, "--from"), _parse_time(until, "--to")
    try:
        config = stream_config(settings, resolve_bootstrap(settings))
        store = HistoryStore(settings.resolved_clickhouse_dsn, database or settings.clickhouse_database)
        store.migrate(settings.telemetry_ttl_days, settings.telemetry_ttl_overrides)
    except (StackError, HistoryError) as exc:
        _fail(str(exc))
    _terminate_on_sigterm()
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

    settings = _settings()
    now = datetime.now(timezone.utc)
    try:
        t0, t1 = parse_when(since, now), parse_when(until, now) or now
    except ValueError as exc:
        _fail(f"bad time: {exc}", 2)
    try:
        history = open_history(settings)
        rep = collect(history, settings.clickhouse_database, t0, t1, job)
    except HistoryError as exc:
        _fail(str(exc))
    print_report(rep, console)
    if html_path is not None:
        html_path.write_text(render_html(rep))
        console.print(f"HTML report written to {html_path}")


def _register_producer_commands() -> None:
    from vigil.agent_cli import agent, bench_hooks

    app.command("agent")(agent)
    bench_app.command("hooks")(bench_hooks)


_register_producer_commands()


def _register_actuator_commands() -> None:
    from vigil.actuate import actuate

    app.command("actuate")(actuate)


_register_actuator_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
