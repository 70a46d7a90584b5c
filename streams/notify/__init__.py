"""``vigil notify``: incidents from ``<prefix>.alerts`` to where on-call looks.

:mod:`~vigil.streams.notify.receivers` (Alertmanager's v2 API, Slack, generic
webhooks), :mod:`~vigil.streams.notify.email` (SMTP),
:mod:`~vigil.streams.notify.ledger` (what was delivered, in SQLite),
:mod:`~vigil.streams.notify.notifier` (which versions page; delivery with
retries and dead letters) and :mod:`~vigil.streams.notify.service` (the
Kafka loop).
"""

from vigil.streams.notify.email import EmailReceiver
from vigil.streams.notify.ledger import DeliveryLedger
from vigil.streams.notify.notifier import Notifier, PagePolicy, Stopped, Where
from vigil.streams.notify.receivers import (
    AlertmanagerReceiver, DeliveryContext, PermanentError, SlackReceiver, TransientError, WebhookReceiver, redact_url,
)

__all__ = [
    "EmailReceiver", "DeliveryLedger", "Notifier", "PagePolicy", "Stopped", "Where", "AlertmanagerReceiver",
    "DeliveryContext", "PermanentError", "SlackReceiver", "TransientError", "WebhookReceiver", "redact_url",
]
