"""What every command shares: the Typer apps, consoles, settings and errors."""

from __future__ import annotations

import logging
import signal
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from vigil.settings import METRICS_PORTS, Settings

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


def settings_and_logging(log_level: str, default: int = logging.WARNING) -> Settings:
    """Configure logging at ``log_level`` and return the settings; exit 2 naming a bad variable."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), default),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return Settings()
    except Exception as exc:  # pydantic's ValidationError names the variable
        typer.echo(f"error: invalid VIGIL_* setting: {exc}", err=True)
        raise typer.Exit(2) from None


def load_settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # pydantic's ValidationError names the variable
        err_console.print(f"[red]invalid VIGIL_* setting:[/red] {exc}")
        raise typer.Exit(2) from None


def print_table(columns: tuple[str, ...], rows: "list[tuple[str, ...]]") -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def terminate_on_sigterm() -> None:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt so `finally` blocks stop what we started."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def require_server(command: str) -> None:
    """Exit 2 with what to install when ``command`` needs the server extra and this install is the light one."""
    import importlib.util

    missing = [m for m in ("numpy", "scipy", "river", "clickhouse_connect") if importlib.util.find_spec(m) is None]
    if missing:
        err_console.print(f"[red]error:[/red] `vigil {command}` runs on the stack's side and needs "
                          f"{', '.join(missing)}: pip install 'vigil[server]' (this install has what "
                          "training processes and node agents need)")
        raise typer.Exit(2)


def metrics_port_option(component: str) -> Any:
    """The ``--metrics-port`` option of a long-running command (its default: :data:`vigil.settings.METRICS_PORTS`)."""
    return typer.Option(None, "--metrics-port", min=0, max=65535, help=(
        f"Port of this process's Prometheus /metrics (default: VIGIL_METRICS_PORT, else {METRICS_PORTS[component]}); "
        "0: serve none."))


def metrics_host_option() -> Any:
    return typer.Option(None, "--metrics-host", help=(
        "Address /metrics binds (default: VIGIL_METRICS_HOST, else 127.0.0.1, this host only; 0.0.0.0 lets a "
        "Prometheus elsewhere scrape it)."))


def serve_metrics(settings: Settings, component: str, port: Optional[int], host: Optional[str], kind: str,
                  announce: bool = True) -> Any:
    """``component``'s metrics (``kind``: a class name of :mod:`vigil.streams.metrics`), serving /metrics where
    the options and settings say; None when the port is 0 or cannot be bound (a logged warning says so)."""
    host, port = settings.metrics_address(component, port, host)
    if port == 0:
        return None
    from vigil.streams import metrics as metrics_module

    metrics = getattr(metrics_module, kind)()
    url = metrics.serve(host, port)  # (a port it cannot bind is logged as a warning)
    if url is None:
        return None
    if announce:
        typer.echo(f"vigil {component}: /metrics on {url}", err=True)
    return metrics
