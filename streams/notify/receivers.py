"""Where incidents go: Alertmanager's v2 API, Slack, generic JSON webhooks, email.

Every receiver has a stable ``name`` (the ledger's key: changing it re-sends)
and ``deliver(alert, ctx)``, which returns on success and raises
:class:`TransientError` (retry with backoff) or :class:`PermanentError`
(dead-letter, do not retry). HTTP: a 2xx is success; 429, 5xx, a timeout or a
refused connection are transient (``Retry-After`` is honoured); any other 4xx
is permanent. Secrets (a Slack token, a webhook URL that carries one, an SMTP
password) never appear in an error message or a log line: URLs are shown as
``scheme://host`` only (:func:`redact_url`).

Alertmanager (``POST /api/v2/alerts``, a JSON list of ``postableAlert``)
-------------------------------------------------------------------------
One Alertmanager alert per incident: its labels are ``alertname``
(``vigil_<kind>``), ``severity`` (``sev1``..``sev3``), ``kind``, ``cluster``,
``node`` and ``job`` where they apply, and ``incident`` (the incident id, so
two incidents of one kind on one node stay two alerts). Alertmanager
identifies an alert by its label set, so re-posting the same set updates it in
place. Annotations: ``summary``, ``description``, ``evidence`` (the evidence
link, from a template) and ``incident_version``; ``startsAt`` is the onset,
``generatorURL`` the evidence link. A firing alert is posted with ``endsAt`` =
now + 4 x the refresh interval and re-posted every interval while it is open,
as Prometheus does: Alertmanager resolves an alert that is not re-sent by its
``endsAt`` (or its ``resolve_timeout`` without one), so an unrefreshed alert
would clear itself after minutes. A resolution is posted with ``endsAt`` = the
resolution time. If a later version changes the label set (the kind or subject
was re-attributed), the old set is posted resolved in the same request.

Slack
-----
With a bot token: ``chat.postMessage`` (``POST <api>/chat.postMessage``, bearer
token, ``{"channel", "text", "thread_ts"?}``); the first message of an
incident is the thread root, every later version a reply in its thread (the
resolution also broadcast to the channel). Slack answers HTTP 200 with
``{"ok": false, "error": ...}`` on failure: ``ratelimited`` and Slack-side
errors are transient, anything else (``channel_not_found``,
``invalid_auth``, ...) permanent. With an incoming webhook (no threads: the
API has none) every version is one message.

Generic webhooks
----------------
``POST`` of ``{"receiver": "vigil", "incident_id", "incident_version",
"status", "pages": true, "alert": <the alert event>}``, optionally with a
bearer token.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Protocol

from vigil.schemas import Alert

log = logging.getLogger(__name__)

__all__ = ["AlertmanagerReceiver", "DeliveryContext", "PermanentError", "Receiver", "SlackReceiver",
           "TransientError", "WebhookReceiver", "redact_url", "subject_text", "alert_text"]


class NotifyError(RuntimeError):
    """Root of the notifier's errors; ``retry_after_s`` when the receiver asked for a pause."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TransientError(NotifyError):
    """Worth retrying: the receiver is down, slow, rate-limiting or failing on its side."""


class PermanentError(NotifyError):
    """No retry will help (a 4xx other than 429, a bad channel, refused credentials)."""


@dataclass
class DeliveryContext:
    """What a receiver may need beyond the alert: the ledger's thread reference, the clock."""

    thread: str | None
    set_thread: Callable[[str], None]
    now: datetime
    paged_before: bool
    previous_labels: dict[str, str] | None = None


class Receiver(Protocol):
    name: str

    def deliver(self, alert: Alert, ctx: DeliveryContext) -> Any: ...


def redact_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: paths and queries may hold secrets (Slack webhooks do).

    >>> redact_url("https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    'https://hooks.slack.com/…'
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"


def subject_text(alert: Alert) -> str:
    """The subject of an alert in words: ``job J on node N GPU G``...

    >>> from vigil.schemas import Subject
    >>> subject_text(Alert.model_construct(subject=Subject(job="gpt-1b3", node="gpu-07", gpu=3)))
    'job gpt-1b3 node gpu-07 GPU 3'
    """
    s = alert.subject
    parts = []
    if s.job:
        parts.append(f"job {s.job}")
    if s.node:
        parts.append(f"node {s.node}")
    if s.gpu is not None:
        parts.append(f"GPU {s.gpu}")
    if s.rank is not None:
        parts.append(f"rank {s.rank}")
    if s.link:
        parts.append(f"link {s.link}")
    return " ".join(parts) or alert.source.cluster


def alert_text(alert: Alert, evidence_url: str | None = None) -> str:
    """One line for a human: ``[vigil] SEV1 OPEN node_lost - node gpu-07: ...``."""
    word = {"open": "OPEN", "update": "UPDATE", "resolved": "RESOLVED"}[alert.status]
    line = f"[vigil] SEV{alert.severity} {word} {alert.kind} - {subject_text(alert)}"
    if alert.summary:
        line += f": {alert.summary}"
    if evidence_url:
        line += f" <{evidence_url}>"
    return line


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def http_request(url: str, body: bytes, headers: dict[str, str], timeout_s: float, what: str) -> tuple[int, bytes]:
    """POST ``body``; return (status, response body) for a 2xx; raise Transient/Permanent otherwise."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": "vigil-notify", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - operator-configured URLs
            return resp.status, resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace").strip().replace("\n", " ") if exc.fp else ""
        msg = f"{what} at {redact_url(url)} answered HTTP {exc.code}" + (f": {detail}" if detail else "")
        if exc.code == 429 or exc.code >= 500:
            raise TransientError(msg, _retry_after(exc.headers)) from None
        raise PermanentError(msg) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TransientError(f"{what} at {redact_url(url)} unreachable: {type(exc).__name__}: {reason}") from None


def evidence_link(template: str | None, alert: Alert) -> str | None:
    """The evidence URL from a template with ``{incident_id}``, ``{node}``, ``{job}``, ``{kind}``, ``{cluster}``."""
    if not template:
        return None
    q = urllib.parse.quote
    return template.format(incident_id=alert.incident_id, node=q(alert.subject.node or ""),
                           job=q(alert.subject.job or ""), kind=q(alert.kind), cluster=q(alert.source.cluster))


class AlertmanagerReceiver:
    """Alertmanager's v2 API: one alert per incident, refreshed while open (see the module's doc)."""

    every_version = True  # a machine: every paging version updates the alert in place

    def __init__(self, url: str, *, evidence_url: str | None = None, refresh_s: float = 60.0,
                 timeout_s: float = 10.0, name: str = "alertmanager", extra_labels: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        if not self.url.endswith("/api/v2/alerts"):
            self.url += "/api/v2/alerts"
        self.evidence_url = evidence_url
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.name = name
        self.extra_labels = dict(extra_labels or {})

    def labels(self, alert: Alert) -> dict[str, str]:
        labels = {
            **self.extra_labels,
            "alertname": f"vigil_{alert.kind}",
            "severity": f"sev{alert.severity}",
            "kind": alert.kind,
            "cluster": alert.source.cluster,
            "incident": str(alert.incident_id),
        }
        if alert.subject.node:
            labels["node"] = alert.subject.node
        if alert.subject.job:
            labels["job"] = alert.subject.job
        if alert.subject.gpu is not None:
            labels["gpu"] = str(alert.subject.gpu)
        return labels

    def postable(self, alert: Alert, now: datetime, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """The ``postableAlert`` for this version of the incident."""
        link = evidence_link(self.evidence_url, alert)
        ends = alert.event_time if alert.status == "resolved" else now + timedelta(seconds=4 * self.refresh_s)
        body: dict[str, Any] = {
            "labels": labels or self.labels(alert),
            "annotations": {
                "summary": alert.summary or f"{alert.kind} on {subject_text(alert)}",
                "description": alert_text(alert),
                "incident_version": str(alert.incident_version),
                "detector": alert.detector,
                "evidence_count": str(alert.evidence_count),
            },
            "startsAt": _iso(alert.onset_time),
            "endsAt": _iso(max(ends, alert.onset_time)),
        }
        if link:
            body["annotations"]["evidence"] = link
            body["generatorURL"] = link
        return body

    def deliver(self, alert: Alert, ctx: DeliveryContext) -> dict[str, str]:
        """Post this version; return the label set posted (the caller keeps it for refreshes)."""
        labels = self.labels(alert)
        batch = [self.postable(alert, ctx.now, labels)]
        if ctx.previous_labels is not None and ctx.previous_labels != labels:
            gone = self.postable(alert, ctx.now, ctx.previous_labels)
            gone["endsAt"] = _iso(max(ctx.now, alert.onset_time))
            batch.append(gone)  # the re-attributed incident's old label set, resolved
        self.post(batch)
        return labels

    def post(self, alerts: list[dict[str, Any]]) -> None:
        http_request(self.url, json.dumps(alerts).encode(), {"Content-Type": "application/json"}, self.timeout_s,
                     "Alertmanager")


class SlackReceiver:
    """Slack: ``chat.postMessage`` with threads (bot token), or an incoming webhook (no threads)."""

    every_version = False  # people: the first version, changes of severity/kind/subject, the resolution

    def __init__(self, *, token: Any = None, channel: str | None = None, webhook_url: Any = None,
                 api_url: str = "https://slack.com/api", evidence_url: str | None = None, timeout_s: float = 10.0,
                 name: str = "slack") -> None:
        if (token is None) == (webhook_url is None):
            raise ValueError("Slack needs a bot token and a channel, or an incoming webhook URL (one of them)")
        if token is not None and not channel:
            raise ValueError("Slack with a bot token needs a channel")
        self._token = token  # SecretStr or str; never printed
        self._webhook = webhook_url
        self.channel = channel
        self.api_url = api_url.rstrip("/")
        self.evidence_url = evidence_url
        self.timeout_s = timeout_s
        self.name = name

    @staticmethod
    def _secret(value: Any) -> str:
        return value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)

    def deliver(self, alert: Alert, ctx: DeliveryContext) -> None:
        text = alert_text(alert, evidence_link(self.evidence_url, alert))
        if self._webhook is not None:
            url = self._secret(self._webhook)
            status, body = http_request(url, json.dumps({"text": text}).encode(), {"Content-Type": "application/json"},
                                        self.timeout_s, "Slack webhook")
            return
        payload: dict[str, Any] = {"channel": self.channel, "text": text, "unfurl_links": False}
        if ctx.thread is not None:
            payload["thread_ts"] = ctx.thread
            if alert.status == "resolved":
                payload["reply_broadcast"] = True
        url = f"{self.api_url}/chat.postMessage"
        _, body = http_request(url, json.dumps(payload).encode(),
                               {"Content-Type": "application/json; charset=utf-8",
                                "Authorization": f"Bearer {self._secret(self._token)}"}, self.timeout_s, "Slack")
        try:
            answer = json.loads(body)
        except ValueError:
            raise TransientError(f"Slack at {redact_url(url)} answered something that is not JSON") from None
        if not answer.get("ok"):
            error = str(answer.get("error", "unknown"))
            if error in ("ratelimited", "internal_error", "service_unavailable", "fatal_error", "request_timeout"):
                raise TransientError(f"Slack chat.postMessage: {error}")
            raise PermanentError(f"Slack chat.postMessage: {error}")
        if ctx.thread is None and answer.get("ts"):
            ctx.set_thread(str(answer["ts"]))


class WebhookReceiver:
    """A generic JSON webhook (a URL, optionally a bearer token)."""

    every_version = True

    def __init__(self, url: Any, *, token: Any = None, name: str = "webhook", timeout_s: float = 10.0) -> None:
        self._url = url
        self._token = token
        self.name = name
        self.timeout_s = timeout_s

    def deliver(self, alert: Alert, ctx: DeliveryContext) -> None:
        url = SlackReceiver._secret(self._url)
        body = {"receiver": "vigil", "incident_id": str(alert.incident_id),
                "incident_version": alert.incident_version, "status": alert.status, "pages": True,
                "text": alert_text(alert), "alert": json.loads(alert.model_dump_json())}
        headers = {"Content-Type": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {SlackReceiver._secret(self._token)}"
        http_request(url, json.dumps(body).encode(), headers, self.timeout_s, "webhook")


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
