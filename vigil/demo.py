"""``vigil demo``: a simulated cluster fails; vigil detects it; ClickHouse remembers.

Everything is real except the cluster: the tansu broker, detection
workers in their own processes, the history sink, chDB. The scoreboard's
latencies are end to end: from the moment the simulator injected a fault to
the moment its alert arrived on the alert topic.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from vigil.bench.machine import measured
from vigil.producers.publisher import Publisher
from vigil.sim.simulator import ClusterSimulator, Fault, demo_scenario
from vigil.schemas import Alert, Decision, decode
from vigil.streams.kafka import reader
from vigil.broker import StackError, die_with_parent
from vigil.settings import Settings
from vigil.secrets import private_dir, redact_dsn
from vigil.stack import EmbeddedStack, StackInfo, ensure_stack_key, wait_for_file

SCENARIO_S = 36.0
FAIL_SLOWS = ("gpu_slow", "congestion")
GRACE_S = 15.0


@dataclass
class SeenAlert:
    alert: Alert
    arrived_at: float


def _demo_settings(settings: Settings, run_id: str) -> Settings:
    update: dict[str, Any] = {"state_dir": settings.state_dir / "demo"}
    if settings.kafka_bootstrap:  # a shared Kafka: keep this run's topics apart
        update["topic_prefix"] = f"{settings.topic_prefix}-demo-{run_id}"
    update["group_id"] = f"vigil-demo-{run_id}"
    return settings.model_copy(update=update)


def _fresh_history(settings: Settings) -> None:
    # The demo's own chDB directory starts empty so its counts are this run's.
    if settings.clickhouse_dsn is None:
        shutil.rmtree(settings.state_dir / "history", ignore_errors=True)


class WorkerProcesses:
    """`vigil worker` subprocesses; stopped by PID with SIGTERM, then SIGKILL."""

    def __init__(self, settings: Settings, bootstrap: str, count: int) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.count = count
        self.procs: list[subprocess.Popen] = []
        self.ready_files: list[Path] = []
        self.log_path = settings.state_dir / "workers.log"

    def start(self) -> None:
        env = dict(os.environ)
        env.update({
            "VIGIL_KAFKA_BOOTSTRAP": self.bootstrap,
            "VIGIL_STATE_DIR": str(self.settings.state_dir),
            "VIGIL_TOPIC_PREFIX": self.settings.topic_prefix,
            "VIGIL_GROUP_ID": self.settings.group_id,
            **ensure_stack_key(self.settings),  # the workers sign their decisions with this stack's key
        })
        log = open(self.log_path, "ab")
        for i in range(self.count):
            ready = self.settings.state_dir / f"worker-{i}.ready"
            ready.unlink(missing_ok=True)
            self.ready_files.append(ready)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "worker", "--ready-file", str(ready)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            ))
        log.close()

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for proc, ready in zip(self.procs, self.ready_files):
            left = max(0.0, deadline - time.monotonic())
            if not wait_for_file(ready, left, alive=lambda p=proc: p.poll() is None):
                return False
        return True

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _names(alert: Alert, fault: Fault) -> bool:
    kinds, _ = fault.expected_alert
    subject = alert.subject.model_dump(exclude_none=True)
    return alert.kind in kinds and all(subject.get(k) == v for k, v in fault.expected_subject.items())


def match_faults(faults: list[Fault], alerts: list[SeenAlert]) -> list[dict[str, Any]]:
    """Pair every injected fault with the first alert, after it, that names its root cause."""
    rows = []
    for fault in faults:
        kinds, severity = fault.expected_alert
        injected = fault.injected_at
        hit = next((seen for seen in alerts if seen.alert.status != "resolved" and _names(seen.alert, fault)
                    and injected is not None and seen.arrived_at >= injected), None)
        rows.append({
            "kind": fault.kind,
            "target": fault.target,
            "injected_at": injected,
            "expected_alert": kinds[0] if len(kinds) == 1 else "gpu degraded",
            "expected_severity": severity,
            "detected": hit is not None,
            "alert_kind": hit.alert.kind if hit else None,
            "severity": hit.alert.severity if hit else None,
            "severity_ok": bool(hit and hit.alert.severity == severity),
            "latency_s": round(hit.arrived_at - injected, 3) if hit and injected is not None else None,
            "incident_id": str(hit.alert.incident_id) if hit else None,
        })
    return rows


def explain(alert: Alert, scoreboard: list[dict[str, Any]]) -> str:
    """Why an alert that matches no injected fault was raised."""
    if any(row["incident_id"] == str(alert.incident_id) for row in scoreboard):
        return "an earlier version of a detected fault's incident"
    return "unexplained"


def run_demo(settings: Settings, console: Console, json_path: Path | None = None, n_workers: int = 1,
             seed: int = 0) -> int:
    """Play the demo; write its scoreboard (with the machine and its load before and after) to ``json_path``."""
    machine: dict[str, Any] = {}
    with measured(machine):
        code, summary = _run_demo(settings, console, n_workers, seed)
    if summary is None:
        return code
    summary["machine"] = machine
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
        console.print(f"scoreboard written to {json_path}")
    console.print(f"demo finished in {summary['wall_s']:.1f} s")
    return code


def _run_demo(settings: Settings, console: Console, n_workers: int, seed: int) -> tuple[int, dict[str, Any] | None]:
    """The exit code, and the scoreboard's summary (None when the demo could not run)."""
    started = time.time()
    run_id = uuid.uuid4().hex[:8]
    settings = _demo_settings(settings, run_id)
    private_dir(settings.state_dir)
    running = StackInfo.read(settings.stack_file)
    if running is not None:
        console.print(f"[red]error:[/red] another vigil demo runs from {settings.state_dir} (pid {running.pid}); "
                      "wait for it, or give this one its own VIGIL_STATE_DIR")
        return 1, None
    _fresh_history(settings)
    console.rule("[bold]vigil demo[/bold]")
    stack = EmbeddedStack(settings, query_server=False)
    workers: WorkerProcesses | None = None
    try:
        with console.status("starting the embedded stack (tansu broker, topics, chDB history, sink)..."):
            try:
                stack.start()
            except StackError as exc:
                console.print(f"[red]error:[/red] {exc}")
                return 1, None
        console.print(f"[green]✓[/green] stack up: broker {stack.bootstrap}, "
                      f"history {redact_dsn(settings.resolved_clickhouse_dsn)}")
        assert stack.bootstrap is not None
        workers = WorkerProcesses(settings, stack.bootstrap, n_workers)
        with console.status(f"starting {n_workers} detection worker(s) and joining the consumer group..."):
            t0 = time.monotonic()
            workers.start()
            if not workers.wait_ready(90.0):
                console.print("[red]error:[/red] detection worker did not become ready; its log:")
                console.print(workers.log_tail())
                return 1, None
        console.print(f"[green]✓[/green] {n_workers} worker(s) ready in {time.monotonic() - t0:.1f} s")
        result = _play(settings, stack, console, seed)
        scoreboard, history_rows, history_count, seen = result
    finally:
        if workers is not None:
            workers.stop()
        stack.stop()

    ok = _report(console, scoreboard, history_rows, seen)
    summary = {
        "faults": [{k: row.get(k) for k in ("kind", "target", "injected_at", "detected", "severity", "latency_s",
                                            "decision")}
                   for row in scoreboard],
        "alerts_in_history": history_count,
        "alerts_on_topic": len(seen),
        "wall_s": round(time.time() - started, 2),
    }
    return (0 if ok else 1), summary


def _play(settings: Settings, stack: EmbeddedStack, console: Console, seed: int):
    config = stack.config
    publisher = Publisher(config.kafka_conf(), config.topic_prefix)
    alerts_reader = reader(config.kafka_conf(), [config.topic("alert"), config.topic("decision")], from_beginning=True)
    decisions: list[Decision] = []
    start = time.time() + 0.2
    sim = demo_scenario(start, seed=seed)
    faults = sim.faults
    seen: list[SeenAlert] = []
    published = 0
    try:
        with Live(console=console, refresh_per_second=8, transient=False) as live:
            deadline = start + SCENARIO_S + GRACE_S
            while True:
                now = time.time()
                for group in sim.advance(now):  # the cluster lives on while the demo waits
                    publisher.publish(group)
                    published += len(group)
                msg = alerts_reader.poll(0.02)  # paces the loop; returns at once when an alert arrives
                if msg is not None and not msg.error():
                    arrived = time.time()
                    events = decode(msg.value()).events
                    seen.extend(SeenAlert(a, arrived) for a in events if isinstance(a, Alert))
                    decisions.extend(d for d in events if isinstance(d, Decision))
                live.update(_live_view(sim, start, now, published, seen, faults))
                rows = match_faults(faults, seen)
                # Fail-stops get a decision at once; a fail-slow is first waited out (ski rental).
                answered = {str(a) for d in decisions for a in d.answers}
                decided = all(r["incident_id"] in answered for r in rows if r["kind"] not in FAIL_SLOWS)
                done = now >= start + SCENARIO_S and all(r["detected"] for r in rows) and decided
                if done or now >= deadline:
                    break
        for group in sim.finish(time.time()):  # the scheduler's end of each job: completed, or failed
            publisher.publish(group)
        publisher.flush()
    finally:
        alerts_reader.close()

    # The sink stores asynchronously: wait until ClickHouse holds every alert seen.
    assert stack.store is not None and stack.sink is not None
    table = f"{settings.clickhouse_database}.alerts"
    since = datetime.fromtimestamp(start - 1, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    count_sql = f"SELECT count() FROM {table} WHERE detection_time >= '{since}'"
    states_sql = f"SELECT count() FROM {settings.clickhouse_database}.job_states WHERE event_time >= '{since}'"
    wait_until = time.monotonic() + 20
    history_count = 0
    while time.monotonic() < wait_until:
        history_count = stack.store.query(count_sql).rows[0][0]
        # every job's start and end too, so that `vigil report` afterwards knows their sizes and spans
        if history_count >= len(seen) and stack.store.query(states_sql).rows[0][0] >= 2 * len(sim.jobs):
            break
        stack.sink.wait_until(lambda s, n=stack.sink.stats.batches: s.batches > n, 1.0)
    history_sql = (
        f"SELECT left(formatDateTime(detection_time, '%H:%i:%S.%f'), 12) AS detected, severity, kind, "
        f"coalesce(subject_node, subject_job) AS subject, status, "
        f"round(dateDiff('millisecond', onset_time, detection_time) / 1000, 2) AS onset_to_detect_s "
        f"FROM {table} WHERE detection_time >= '{since}' "
        f"ORDER BY detection_time, incident_version"
    )
    history_rows = (history_sql, stack.store.query(history_sql))
    scoreboard = match_faults(faults, seen)
    for row in scoreboard:  # what the decision engine chose to do about it (no actuator runs in the demo)
        # the latest: an incident whose cause turns out graver gets a stronger remedy
        row["decision"] = next((d.action for d in reversed(decisions)
                                if row["incident_id"] in {str(a) for a in d.answers}), None)
    return scoreboard, history_rows, history_count, seen


def _live_view(sim: ClusterSimulator, start: float, now: float, published: int, seen: list[SeenAlert],
               faults: list[Fault]) -> Panel:
    t = max(0.0, min(now - start, SCENARIO_S))
    bar = ProgressBar(total=SCENARIO_S, completed=t, width=50)
    status = Text(f"simulated {t:5.1f}/{SCENARIO_S:.0f} s   events published {published:,}   alerts {len(seen)}")
    feed = Table.grid(padding=(0, 1))
    for f in faults:
        mark = "[dim]pending[/dim]" if f.injected_at is None else f"[magenta]injected at +{f.injected_at - start:.1f} s[/magenta]"
        feed.add_row("fault", f"{f.kind} {f.target}", mark)
    for s in seen[-8:]:
        a = s.alert
        colour = {1: "red", 2: "yellow", 3: "cyan"}[a.severity]
        subject = a.subject.node or a.subject.job or "?"
        feed.add_row(f"[{colour}]sev{a.severity}[/{colour}]", f"{a.status} {a.kind} {subject}", f"+{s.arrived_at - start:.2f} s")
    return Panel(Group(status, bar, Text(""), feed),
                 title="18 nodes x 8 GPUs: llama-7b (64 ranks), gpt-1b3 (64), bert-340m (16)")


def _report(console: Console, scoreboard: list[dict[str, Any]], history_rows: tuple,
            seen: list[SeenAlert]) -> bool:
    console.print()
    console.rule("[bold]scoreboard[/bold]")
    table = Table("injected fault", "target", "expected alert", "found", "sev", "latency s", "decision")
    for column in table.columns:
        column.no_wrap = True
    ok = True
    for row in scoreboard:
        good = row["detected"] and row["severity_ok"]
        ok = ok and good
        table.add_row(
            row["kind"], row["target"], f"{row['expected_alert']} (sev{row['expected_severity']})",
            "[green]yes[/green]" if row["detected"] else "[red]NO[/red]",
            (f"sev{row['severity']}" if row["severity"] else "-") + ("" if good else " [red]✗[/red]"),
            f"{row['latency_s']:.2f}" if row["latency_s"] is not None else "-",
            row.get("decision") or "-",
        )
    console.print(table)
    matched = {row["incident_id"] for row in scoreboard}
    others = [s for s in seen if str(s.alert.incident_id) not in matched]
    if others:
        extra = Table("other alert", "status", "severity", "subject", "why")
        for s in others:
            a = s.alert
            extra.add_row(a.kind, a.status, f"sev{a.severity}", a.subject.node or a.subject.job or "?",
                          explain(a, scoreboard))
        console.print(extra)
    sql, result = history_rows
    console.rule("[bold]the same alerts, read back from ClickHouse[/bold]")
    console.print(Text(sql, style="dim"))
    hist = Table(*result.columns)
    for r in result.rows:
        hist.add_row(*("" if v is None else str(v) for v in r))
    console.print(hist)
    console.print("[green]every injected fault detected with the right severity[/green]" if ok
                  else "[red]some injected faults were missed or misclassified[/red]")
    return ok
