"""Which incident versions page, and delivering them to every receiver once, with retries.

:class:`PagePolicy` decides whether a version pages: by default one of
severity 1 or 2, and the resolution of an incident that paged. Machines
(Alertmanager, generic webhooks) get every paging version; people (Slack,
email) get the first, a change of severity, kind or subject, and the
resolution -- not each growth of the evidence.

:class:`Notifier` delivers one alert: for each receiver that has no outcome
in the :class:`~vigil.streams.notify.ledger.DeliveryLedger` for
``(incident, version, receiver)``, it calls ``deliver``; successes are recorded
at once (so a restart skips them). Transient failures are retried, all
together, after a backoff that doubles from ``backoff_s`` up to
``max_backoff_s`` (or what the receiver asked with ``Retry-After``), until
``retry_for_s`` has passed; then, as at once for a permanent failure, the
alert is dead-lettered for that receiver (a ``DeadLetter`` naming it, with the
message's raw bytes) and recorded ``dead``. Waiting goes through ``wait``
(default: a stop event's ``wait``), so a stop interrupts a backoff and
nothing is recorded for what was not delivered.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Sequence

from vigil.schemas import Alert, DeadLetter, Source
from vigil.schemas.envelope import to_seconds, utcnow
from vigil.streams.notify.ledger import DeliveryLedger
from vigil.streams.notify.receivers import AlertmanagerReceiver, DeliveryContext, PermanentError, TransientError

log = logging.getLogger(__name__)

__all__ = ["PagePolicy", "Notifier", "Stopped", "Where"]

_NS = uuid.UUID("0b6f3f39-8a0c-4d8e-9f1e-6d2b5c3a7e41")


class Stopped(RuntimeError):
    """A stop was asked for while a delivery waited to be retried (nothing is recorded for it)."""


@dataclass(frozen=True)
class PagePolicy:
    """Which versions page: ``severities`` (default sev1, sev2) and, with ``resolutions``, the end of what paged.

    >>> from vigil.schemas import Subject
    >>> a = lambda sev, status: Alert.model_construct(severity=sev, status=status)
    >>> p = PagePolicy()
    >>> p.pages(a(1, "open"), paged_before=False), p.pages(a(3, "open"), False), p.pages(a(3, "resolved"), True)
    (True, False, True)
    >>> p.pages(a(3, "resolved"), paged_before=False)
    False
    """

    severities: frozenset[int] = frozenset({1, 2})
    resolutions: bool = True

    def pages(self, alert: Alert, paged_before: bool) -> bool:
        if alert.status == "resolved":
            return self.resolutions and paged_before
        return alert.severity in self.severities


@dataclass(frozen=True)
class Where:
    """Where the alert was read: for its dead letters."""

    topic: str
    partition: int
    offset: int
    raw: bytes


def _signature(alert: Alert) -> str:
    """What a person needs to hear again about: status class, severity, kind, subject."""
    status = "resolved" if alert.status == "resolved" else "active"
    return f"{status}|{alert.severity}|{alert.kind}|{alert.subject.model_dump_json()}"


@dataclass
class Notifier:
    receivers: Sequence[Any]
    ledger: DeliveryLedger
    policy: PagePolicy = field(default_factory=PagePolicy)
    clock: Callable[[], datetime] = utcnow
    wait: Callable[[float], bool] = lambda s: False  # returns True when a stop was asked for
    retry_for_s: float = 300.0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    cluster: str = "default"
    delivered: int = 0
    dead: int = 0

    def __post_init__(self) -> None:
        names = [r.name for r in self.receivers]
        if len(set(names)) != len(names):
            raise ValueError(f"receiver names must be unique (they key the ledger), got {names}")

    def _wants(self, receiver: Any, alert: Alert) -> bool:
        if getattr(receiver, "every_version", True):
            return True
        return self.ledger.note(alert.incident_id, f"{receiver.name}#told") != _signature(alert)

    def handle(self, alert: Alert, where: Where) -> list[DeadLetter]:
        """Deliver one alert version to every receiver that should get it; return its dead letters."""
        if not self.ledger.observe(alert.incident_id, alert.incident_version, alert.status,
                                   alert.model_dump(mode="json")):
            log.info("incident %s version %d is older than one already seen: skipped", alert.incident_id,
                     alert.incident_version)
            return []
        if not self.policy.pages(alert, self.ledger.paged(alert.incident_id)):
            return []
        self.ledger.mark_paged(alert.incident_id)
        pending = [r for r in self.receivers
                   if self.ledger.outcome(alert.incident_id, alert.incident_version, r.name) is None
                   and self._wants(r, alert)]
        attempts: dict[str, int] = {}
        dead: list[DeadLetter] = []
        started = time.monotonic()
        backoff = self.backoff_s
        while pending:
            retry: list[Any] = []
            pause: float | None = None
            for r in pending:
                attempts[r.name] = attempts.get(r.name, 0) + 1
                try:
                    self._deliver(r, alert)
                except PermanentError as exc:
                    dead.append(self._dead(r, alert, where, "notify_failed", str(exc), attempts[r.name]))
                except TransientError as exc:
                    if time.monotonic() - started >= self.retry_for_s:
                        dead.append(self._dead(r, alert, where, "notify_retries_exhausted",
                                               f"{exc} (after {attempts[r.name]} attempts)", attempts[r.name]))
                        continue
                    log.warning("%s: %s; retrying", r.name, exc)
                    retry.append(r)
                    if exc.retry_after_s is not None:
                        pause = max(pause or 0.0, min(exc.retry_after_s, self.max_backoff_s))
                except Exception as exc:  # noqa: BLE001 - a bug in one receiver must not stop the others
                    log.exception("%s failed on incident %s", r.name, alert.incident_id)
                    dead.append(self._dead(r, alert, where, "notify_failed", f"{type(exc).__name__}: {exc}",
                                           attempts[r.name]))
                else:
                    self.ledger.record(alert.incident_id, alert.incident_version, r.name, "delivered",
                                       to_seconds(self.clock()), attempts[r.name])
                    self.delivered += 1
                    log.info("delivered incident %s v%d (%s, sev%d) to %s", alert.incident_id,
                             alert.incident_version, alert.status, alert.severity, r.name)
            pending = retry
            if pending:
                delay = pause if pause is not None else backoff
                backoff = min(backoff * 2, self.max_backoff_s)
                if self.wait(delay):
                    raise Stopped(f"stopped while {len(pending)} receiver(s) waited to retry")
        return dead

    def _deliver(self, receiver: Any, alert: Alert) -> None:
        iid = alert.incident_id
        now = self.clock()
        ctx = DeliveryContext(thread=self.ledger.thread(iid, receiver.name),
                              set_thread=lambda ref: self.ledger.set_thread(iid, receiver.name, ref),
                              now=now, paged_before=True, previous_labels=self.ledger.labels(iid, receiver.name))
        result = receiver.deliver(alert, ctx)
        if isinstance(receiver, AlertmanagerReceiver):
            next_at = None if alert.status == "resolved" else to_seconds(now) + receiver.refresh_s
            self.ledger.schedule_refresh(iid, receiver.name, result, next_at)
        if not getattr(receiver, "every_version", True):
            self.ledger.set_note(iid, f"{receiver.name}#told", _signature(alert))

    def _dead(self, receiver: Any, alert: Alert, where: Where, reason: str, detail: str, attempts: int) -> DeadLetter:
        self.ledger.record(alert.incident_id, alert.incident_version, receiver.name, "dead",
                           to_seconds(self.clock()), attempts, detail)
        self.dead += 1
        log.error("incident %s v%d not delivered to %s: %s", alert.incident_id, alert.incident_version,
                  receiver.name, detail)
        return DeadLetter(
            event_id=uuid.uuid5(_NS, f"{receiver.name}/{alert.incident_id}/{alert.incident_version}"),
            event_time=self.clock(), source=Source(cluster=alert.source.cluster), reason=reason,
            detail=f"receiver {receiver.name}: {detail}"[:2000], field=None, source_topic=where.topic,
            source_partition=where.partition, source_offset=where.offset,
            raw_b64=base64.b64encode(where.raw).decode())

    def refresh_due(self) -> int:
        """Re-post open incidents to Alertmanager whose refresh is due; return how many were posted."""
        now = self.clock()
        by_name = {r.name: r for r in self.receivers if isinstance(r, AlertmanagerReceiver)}
        posted = 0
        for due in self.ledger.due_refreshes(to_seconds(now)):
            r = by_name.get(due.receiver)
            if r is None or due.alert.get("status") == "resolved":
                self.ledger.schedule_refresh(due.incident_id, due.receiver, due.labels, None)
                continue
            alert = Alert.model_validate(due.alert)
            try:
                r.post([r.postable(alert, now, due.labels)])
            except (TransientError, PermanentError) as exc:
                log.warning("refreshing incident %s at %s failed: %s", due.incident_id, r.name, exc)
                self.ledger.schedule_refresh(due.incident_id, r.name, due.labels,
                                             to_seconds(now) + min(r.refresh_s, 10.0))
                continue
            self.ledger.schedule_refresh(due.incident_id, r.name, due.labels, to_seconds(now) + r.refresh_s)
            posted += 1
        return posted
