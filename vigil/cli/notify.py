"""``vigil notify``: forward incidents to Alertmanager, Slack, webhooks and email."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from vigil.cli.common import app, metrics_host_option, metrics_port_option

_HELP = """Forward incidents from <prefix>.alerts to Alertmanager, Slack, webhooks and email.

\b
What pages (default): sev1 and sev2 versions, and the resolution of an
incident that paged (--severities 1,2,3 / --no-resolutions to change).
Alertmanager and webhooks get every paging version (one Alertmanager alert
per incident, updated in place and re-posted every --am-refresh seconds
while open; endsAt when it resolves); Slack and email get the first, a
change of severity, kind or subject, and the resolution, threaded per
incident.

\b
Exactly once per (incident, version, receiver) across restarts: what was
delivered is kept in --ledger (SQLite, mode 0600); offsets are committed
after delivery (at-least-once) in consumer group --group-id. Transient
failures (timeouts, 429, 5xx, SMTP 4xx) are retried with backoff for
--retry-for seconds; permanent ones (other 4xx, SMTP 5xx, a refused login)
and exhausted retries go to <prefix>.deadletter.

\b
Receivers and secrets come from the environment (never from flags, which
`ps` shows; never printed):
  VIGIL_NOTIFY_ALERTMANAGER_URL   http://alertmanager:9093
  VIGIL_NOTIFY_SLACK_TOKEN        xoxb-... (chat.postMessage, threads) with
  VIGIL_NOTIFY_SLACK_CHANNEL      C0123456 (or #channel)
  VIGIL_NOTIFY_SLACK_WEBHOOK_URL  an incoming webhook (no threads)
  VIGIL_NOTIFY_WEBHOOK_URLS       JSON list of URLs for generic JSON webhooks
  VIGIL_NOTIFY_WEBHOOK_TOKEN      bearer token for them
  VIGIL_NOTIFY_EVIDENCE_URL       link template: {incident_id} {node} {job} {kind} {cluster}
  VIGIL_SMTP_HOST, VIGIL_SMTP_PORT (587), VIGIL_SMTP_STARTTLS (true),
  VIGIL_SMTP_SSL (false: implicit TLS, port 465), VIGIL_SMTP_USER,
  VIGIL_SMTP_PASSWORD, VIGIL_SMTP_FROM, VIGIL_SMTP_TO (comma-separated)

\b
Examples:
  VIGIL_NOTIFY_ALERTMANAGER_URL=http://alertmanager:9093 vigil notify
  vigil notify --severities 1 --no-resolutions --check   # show the receivers, exit
"""


class NotifySettings(BaseSettings):
    """``VIGIL_NOTIFY_*``: the receivers; URLs that may carry a secret and tokens are ``SecretStr``."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_NOTIFY_", frozen=True, extra="ignore")

    alertmanager_url: Optional[str] = None
    slack_token: Optional[SecretStr] = None
    slack_channel: Optional[str] = None
    slack_webhook_url: Optional[SecretStr] = None
    slack_api_url: str = "https://slack.com/api"
    webhook_urls: List[SecretStr] = Field(default_factory=list)
    webhook_token: Optional[SecretStr] = None
    evidence_url: Optional[str] = None


class SmtpSettings(BaseSettings):
    """``VIGIL_SMTP_*``: email through an SMTP server; the password is a ``SecretStr``."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_SMTP_", frozen=True, extra="ignore")

    host: Optional[str] = None
    port: int = 587
    starttls: bool = True
    ssl: bool = False
    user: Optional[str] = None
    password: Optional[SecretStr] = None
    from_: Optional[str] = Field(None, validation_alias="VIGIL_SMTP_FROM")
    to: str = ""


def build_receivers(ns: NotifySettings, smtp: SmtpSettings, am_refresh_s: float, cluster: str) -> list:
    from vigil.streams.notify import AlertmanagerReceiver, EmailReceiver, SlackReceiver, WebhookReceiver

    out: list = []
    if ns.alertmanager_url:
        out.append(AlertmanagerReceiver(ns.alertmanager_url, evidence_url=ns.evidence_url, refresh_s=am_refresh_s))
    if ns.slack_token is not None:
        out.append(SlackReceiver(token=ns.slack_token, channel=ns.slack_channel, api_url=ns.slack_api_url,
                                 evidence_url=ns.evidence_url))
    elif ns.slack_webhook_url is not None:
        out.append(SlackReceiver(webhook_url=ns.slack_webhook_url, evidence_url=ns.evidence_url, name="slack-webhook"))
    for i, url in enumerate(ns.webhook_urls):
        out.append(WebhookReceiver(url, token=ns.webhook_token, name=f"webhook-{i + 1}"))
    if smtp.host:
        out.append(EmailReceiver(host=smtp.host, port=smtp.port, starttls=smtp.starttls, use_ssl=smtp.ssl,
                                 user=smtp.user, password=smtp.password, sender=smtp.from_ or "",
                                 to=[a.strip() for a in smtp.to.split(",") if a.strip()],
                                 evidence_url=ns.evidence_url))
    return out


def describe(receiver: object) -> str:
    """A receiver in words, secrets left out."""
    from vigil.streams.notify import AlertmanagerReceiver, EmailReceiver, SlackReceiver, WebhookReceiver, redact_url

    if isinstance(receiver, AlertmanagerReceiver):
        return f"alertmanager {redact_url(receiver.url)[:-2]} (POST /api/v2/alerts, refresh {receiver.refresh_s:g} s)"
    if isinstance(receiver, SlackReceiver):
        return f"{receiver.name} " + (f"chat.postMessage to {receiver.channel}" if receiver.channel else "incoming webhook")
    if isinstance(receiver, WebhookReceiver):
        return f"{receiver.name} (JSON webhook)"
    if isinstance(receiver, EmailReceiver):
        tls = "TLS" if receiver.use_ssl else ("STARTTLS" if receiver.starttls else "no TLS")
        return f"email via {receiver.host}:{receiver.port} ({tls}) to {len(receiver.to)} recipient(s)"
    return str(getattr(receiver, "name", receiver))


@app.command(help=_HELP)
def notify(
    severities: str = typer.Option("1,2", help="Severities that page, comma-separated."),
    no_resolutions: bool = typer.Option(False, "--no-resolutions", help="Do not send the resolution of what paged."),
    ledger: Optional[Path] = typer.Option(None, help="Delivery ledger (default: <state dir>/notify-ledger.sqlite)."),
    group_id: Optional[str] = typer.Option(None, help="Consumer group (default: <prefix>-notify)."),
    retry_for: float = typer.Option(300.0, min=0.0, help="Seconds to retry a transient failure before dead-lettering."),
    am_refresh: float = typer.Option(60.0, min=1.0, help="Seconds between re-posts of an open incident to Alertmanager."),
    cluster: str = typer.Option("default", help="Cluster name (dead letters)."),
    check: bool = typer.Option(False, "--check", help="Print the configured receivers (no secrets) and exit."),
    ready_file: Optional[Path] = typer.Option(None, help="Write this file once partitions are assigned."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    metrics_port: Optional[int] = metrics_port_option("notify"),
    metrics_host: Optional[str] = metrics_host_option(),
) -> None:
    from vigil.cli.common import serve_metrics, settings_and_logging
    from vigil.streams.notify import DeliveryLedger, Notifier, PagePolicy

    settings = settings_and_logging(log_level, logging.INFO)
    try:
        ns, smtp = NotifySettings(), SmtpSettings()
        sev = frozenset(int(x) for x in severities.split(",") if x.strip())
        if not sev or not sev <= {1, 2, 3}:
            raise ValueError(f"--severities must name some of 1, 2, 3, got {severities!r}")
        receivers = build_receivers(ns, smtp, am_refresh, cluster)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError; it names the variable, not its value
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not receivers:
        typer.echo("error: no receivers: set VIGIL_NOTIFY_ALERTMANAGER_URL, VIGIL_NOTIFY_SLACK_*, "
                   "VIGIL_NOTIFY_WEBHOOK_URLS or VIGIL_SMTP_HOST (see --help)", err=True)
        raise typer.Exit(2)
    for r in receivers:
        typer.echo(f"receiver: {describe(r)}", err=True)
    if check:
        raise typer.Exit(0)
    from vigil.broker import StackError
    from vigil.stack import resolve_bootstrap
    from vigil.streams.notify.service import NotifyService

    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    stop = threading.Event()
    book = DeliveryLedger(ledger or settings.state_dir / "notify-ledger.sqlite")
    notifier = Notifier(receivers, book, PagePolicy(severities=sev, resolutions=not no_resolutions),
                        wait=stop.wait, retry_for_s=retry_for, cluster=cluster)
    service = NotifyService(notifier, {"bootstrap.servers": bootstrap, **settings.kafka_security()},
                            settings.topic_prefix, group_id=group_id or f"{settings.topic_prefix}-notify",
                            ready_file=ready_file, session_timeout_s=settings.session_timeout_s,
                            heartbeat_interval_s=settings.heartbeat_interval_s)
    metrics = serve_metrics(settings, "notify", metrics_port, metrics_host, "NotifyMetrics")
    if metrics is not None:
        metrics.watch(service, stop)  # alerts handled, deliveries by outcome, dead letters, lag
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    typer.echo(f"vigil notify: {len(receivers)} receiver(s), pages sev{sorted(sev)}"
               f"{'' if not no_resolutions else ' (no resolutions)'}, broker {bootstrap}", err=True)
    code = 0
    try:
        service.run(stop)
    except Exception as exc:  # noqa: BLE001
        typer.echo(f"error: notify stopped: {type(exc).__name__}: {exc}", err=True)
        code = 1
    finally:
        service.close()
        book.close()
    raise typer.Exit(code)
