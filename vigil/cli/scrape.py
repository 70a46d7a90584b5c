"""``vigil scrape``: vigil's node events from the dcgm-exporter and node_exporter a cluster already runs."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path
from typing import List, Optional

import typer

from vigil.cli.common import app, metrics_host_option, metrics_port_option

_HELP = """Read dcgm-exporter and node_exporter endpoints and publish vigil's node events.

\b
Per node and scrape: a heartbeat (so heartbeat loss works with no vigil
agent), GPU telemetry from DCGM fields (temperature, SM clock, power,
utilization, clocks-event/throttle reasons and violation counters, ECC,
remapped rows, NVLink errors), NIC counters from node_exporter's node_infiniband_* (port and
RoCE hw counters, CNP/ECN included); XID errors from
DCGM_FI_DEV_XID_ERRORS, one per change of a GPU's last XID. Events go
through the publisher's disk spool (<state dir>/scrape-spool), so a broker
outage loses nothing.

\b
Targets: --dcgm and --node-exporter take [NODE=]URL (a bare host:port gets
http:// and /metrics); --targets FILE reads Prometheus file_sd JSON/YAML
with labels "exporter" (dcgm or node) and optional "node", re-read when it
changes. The node is NODE / labels.node, else dcgm-exporter's Hostname label
(node_exporter: node_uname_info's nodename), else the URL's host.

\b
Examples:
  vigil scrape --dcgm gpu-07=http://10.0.0.7:9400/metrics --node-exporter gpu-07=10.0.0.7:9100
  vigil scrape --targets /etc/vigil/exporters.json --interval 5
  vigil scrape --dcgm localhost:9400 --once --dry-run     # print the events, publish nothing
"""


@app.command(help=_HELP)
def scrape(
    dcgm: Optional[List[str]] = typer.Option(None, "--dcgm", help="A dcgm-exporter endpoint, [NODE=]URL (repeatable)."),
    node_exporter: Optional[List[str]] = typer.Option(None, "--node-exporter", help="A node_exporter endpoint, [NODE=]URL (repeatable)."),
    targets: Optional[Path] = typer.Option(None, "--targets", help="Prometheus file_sd file (JSON, or YAML) of targets; re-read on change."),
    interval: float = typer.Option(5.0, min=0.05, help="Seconds between scrapes (also the heartbeat interval)."),
    timeout: Optional[float] = typer.Option(None, min=0.01, help="Per-target timeout, seconds (default: 0.8 x interval, at most 10)."),
    cluster: str = typer.Option("default", help="Cluster name in the events."),
    xid_state: Optional[Path] = typer.Option(None, help="Last XID per GPU, kept across restarts (default: <state dir>/scrape-xid.json)."),
    report_existing_xids: bool = typer.Option(False, "--report-existing-xids", help="Report a nonzero last XID seen at the very first scrape (default: take it as a baseline)."),
    once: bool = typer.Option(False, "--once", help="Scrape once, publish, flush and exit (exit 1 if a target failed)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the events as JSON lines instead of publishing them."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    metrics_port: Optional[int] = metrics_port_option("scrape"),
    metrics_host: Optional[str] = metrics_host_option(),
) -> None:
    from vigil.cli.common import serve_metrics, settings_and_logging
    from vigil.producers.exporters import ScrapeError, Scraper, XidTracker, load_targets_file
    from vigil.producers.exporters.scraper import targets_from
    from vigil.schemas import Source, encode

    settings = settings_and_logging(log_level, logging.INFO)
    try:
        static = targets_from(dcgm or [], node_exporter or [])
        if targets is not None:
            load_targets_file(targets)  # fail now, naming the file, not in the loop
    except (ScrapeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not static and targets is None:
        typer.echo("error: no targets: give --dcgm, --node-exporter or --targets", err=True)
        raise typer.Exit(2)
    xids = XidTracker(xid_state or settings.state_dir / "scrape-xid.json", report_existing=report_existing_xids)

    if dry_run:
        class _Printer:
            def publish(self, events, topic_type=None):  # noqa: ANN001
                for ev in events:
                    typer.echo(encode(ev).decode())

            def poll(self, timeout_s: float = 0.0) -> None:
                threading.Event().wait(timeout_s)

            def close(self, timeout_s: float = 0.0) -> int:
                return 0

        publisher = _Printer()
        where = "stdout (dry run)"
    else:
        from vigil.broker import StackError
        from vigil.producers.publisher import Publisher
        from vigil.stack import resolve_bootstrap

        try:
            bootstrap = resolve_bootstrap(settings)
        except StackError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        publisher = Publisher({"bootstrap.servers": bootstrap, **settings.kafka_security()}, settings.topic_prefix,
                              spool_dir=settings.state_dir / "scrape-spool",
                              source=Source(cluster=cluster, node=socket.gethostname()))
        where = f"broker {bootstrap}, topics {settings.topic_prefix}.*"
    try:
        scraper = Scraper(static, publisher, cluster=cluster, interval_s=interval, timeout_s=timeout, xids=xids,
                          targets_file=targets)
    except (ScrapeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"vigil scrape: {len(scraper.targets)} targets every {interval:g} s -> {where}", err=True)
    code = 0
    if once:
        report = scraper.scrape_once()
        for url, why in sorted(report.failed_targets.items()):
            typer.echo(f"failed: {why}", err=True)
        typer.echo(json.dumps({"nodes": sorted(report.nodes), "gpu_samples": report.gpu_samples,
                               "nic_samples": report.nic_samples, "xids": report.xids,
                               "failed_targets": len(report.failed_targets)}), err=True)
        code = 1 if report.failed_targets else 0
    else:
        import signal

        metrics = None if dry_run else serve_metrics(settings, "scrape", metrics_port, metrics_host, "ScrapeMetrics")
        if metrics is not None:
            metrics.watch(publisher)  # deliveries, failures, the spool's depth
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        scraper.run(stop)
    left = publisher.close(10.0)
    if left:
        typer.echo(f"warning: {left} messages not delivered; they stay in the spool for the next start", err=True)
    raise typer.Exit(code)
