"""Publish events to their topics with confluent-kafka (idempotent, acks=all).

A group of events of one type and one key travels as one message (a JSON
array), which is how high-rate telemetry amortizes per-message cost.
The disk spool for broker outages belongs to the producers issue; until then a
delivery failure is counted and reported, never silent.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from confluent_kafka import KafkaError, Producer

from schemas import Envelope, encode, encode_batch, message_key, topic_name

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    pass


class Publisher:
    def __init__(self, kafka_conf: dict[str, Any], topic_prefix: str, linger_ms: int = 2) -> None:
        self.topic_prefix = topic_prefix
        self.delivered = 0
        self.failed = 0
        self.last_error: KafkaError | None = None
        self._producer = Producer({
            **kafka_conf,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "log_level": 3,
        })

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1
            self.last_error = err
            log.error("delivery failed: %s", err)

    def publish(self, events: Sequence[Envelope]) -> None:
        """Publish one group: a single event, or a batch of one type and key."""
        if not events:
            return
        first = events[0]
        key = message_key(first)
        if len(events) == 1:
            value = encode(first)
        else:
            if any(e.event_type != first.event_type or message_key(e) != key for e in events):  # type: ignore[attr-defined]
                raise PublishError("a batch must hold events of one type and one key")
            value = encode_batch(events)
        topic = topic_name(first.event_type, self.topic_prefix)  # type: ignore[attr-defined]
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for outstanding deliveries; return how many are still pending."""
        return self._producer.flush(timeout_s)
