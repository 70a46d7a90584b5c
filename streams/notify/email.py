"""Email as a notification path: one message per incident version that pages, threaded.

SMTP with ``smtplib``: implicit TLS (port 465, ``ssl``), or plain with
``STARTTLS`` (port 587, the default), and ``AUTH`` when a user is set. Each
message has a deterministic ``Message-ID``
(``<vigil.<incident id>.v<version>@<domain>>``); every message after the first
of an incident carries ``In-Reply-To`` and ``References`` naming the first, and
keeps its subject (with ``Re:``), so mail clients show one thread per
incident. A deterministic id also lets a mail system drop the duplicate of a
message re-sent after a crash between sending and recording it.

SMTP replies 4xx (and a dropped connection) are transient, 5xx permanent
(RFC 5321, section 4.2.1); a refused login is permanent. The password is a
secret: it never appears in a message or a log line.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any, Sequence

from vigil.schemas import Alert
from vigil.streams.notify.receivers import (
    DeliveryContext, PermanentError, TransientError, alert_text, evidence_link, subject_text,
)

__all__ = ["EmailReceiver", "message_id"]


def message_id(alert: Alert, domain: str, version: int | None = None) -> str:
    """``<vigil.<incident>.v<version>@<domain>>``."""
    return f"<vigil.{alert.incident_id}.v{version if version is not None else alert.incident_version}@{domain}>"


class EmailReceiver:
    """Send each paging version of an incident as one email, threaded per incident."""

    every_version = False  # people: the first version, changes of severity/kind/subject, the resolution

    def __init__(self, *, host: str, port: int = 587, starttls: bool = True, use_ssl: bool = False,
                 user: str | None = None, password: Any = None, sender: str, to: Sequence[str],
                 evidence_url: str | None = None, timeout_s: float = 20.0, name: str = "email",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if not to:
            raise ValueError("email needs at least one recipient (VIGIL_SMTP_TO)")
        if not sender or "@" not in sender:
            raise ValueError(f"email needs a sender address (VIGIL_SMTP_FROM), got {sender!r}")
        self.host, self.port = host, port
        self.starttls, self.use_ssl = starttls, use_ssl
        self.user = user
        self._password = password
        self.sender = sender
        self.to = list(to)
        self.evidence_url = evidence_url
        self.timeout_s = timeout_s
        self.name = name
        self.domain = sender.rsplit("@", 1)[1]
        self._ssl = ssl_context

    def build(self, alert: Alert, ctx: DeliveryContext) -> EmailMessage:
        msg = EmailMessage()
        base = f"[vigil] {alert.kind} - {subject_text(alert)}"
        first = ctx.thread
        msg["Subject"] = f"Re: {base}" if first else base
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.to)
        msg["Date"] = format_datetime(ctx.now)
        msg["Message-ID"] = message_id(alert, self.domain)
        if first:
            msg["In-Reply-To"] = first
            msg["References"] = first
        msg["X-Vigil-Incident"] = str(alert.incident_id)
        msg["X-Vigil-Severity"] = f"sev{alert.severity}"
        link = evidence_link(self.evidence_url, alert)
        lines = [alert_text(alert), "",
                 f"incident   {alert.incident_id} (version {alert.incident_version}, {alert.status})",
                 f"severity   sev{alert.severity}", f"kind       {alert.kind}", f"subject    {subject_text(alert)}",
                 f"cluster    {alert.source.cluster}", f"onset      {alert.onset_time.isoformat()}",
                 f"detected   {alert.detection_time.isoformat()} by {alert.detector}",
                 f"evidence   {alert.evidence_count} observation(s)"]
        if link:
            lines.append(f"details    {link}")
        msg.set_content("\n".join(lines) + "\n")
        return msg

    def deliver(self, alert: Alert, ctx: DeliveryContext) -> None:
        msg = self.build(alert, ctx)
        try:
            if self.use_ssl:
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout_s,
                                                      context=self._ssl or ssl.create_default_context())
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
            with smtp:
                smtp.ehlo()
                if self.starttls and not self.use_ssl:
                    smtp.starttls(context=self._ssl or ssl.create_default_context())
                    smtp.ehlo()
                if self.user:
                    secret = self._password.get_secret_value() if hasattr(self._password, "get_secret_value") \
                        else (self._password or "")
                    smtp.login(self.user, secret)
                smtp.send_message(msg)  # some recipients refused (not all): delivered to the others
        except smtplib.SMTPAuthenticationError as exc:
            raise PermanentError(f"SMTP {self.host}:{self.port} refused the login of {self.user!r}: {exc.smtp_code}") \
                from None
        except smtplib.SMTPRecipientsRefused as exc:
            codes = sorted({code for code, _ in exc.recipients.values()})
            err = TransientError if all(400 <= c < 500 for c in codes) else PermanentError
            raise err(f"SMTP {self.host}:{self.port} refused every recipient: codes {codes}") from None
        except smtplib.SMTPResponseException as exc:
            err = TransientError if 400 <= exc.smtp_code < 500 else PermanentError
            text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
            raise err(f"SMTP {self.host}:{self.port} answered {exc.smtp_code}: {text[:200]}") from None
        except (smtplib.SMTPException, socket.timeout, OSError) as exc:
            raise TransientError(f"SMTP {self.host}:{self.port}: {type(exc).__name__}: {exc}"[:300]) from None
        if ctx.thread is None:
            ctx.set_thread(msg["Message-ID"])

