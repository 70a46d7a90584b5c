"""``vigil notify``'s loop: ``<prefix>.alerts`` from Kafka through a :class:`~vigil.streams.notify.notifier.Notifier`.

A plain confluent-kafka consumer in its own group (default ``<prefix>-notify``)
reads the alerts topic from the earliest offset it has not committed. Offsets
are committed only after every alert of a batch reached an outcome with every
receiver (delivered, or dead-lettered and recorded) and the dead letters were
acknowledged by Kafka: at-least-once, and the delivery ledger makes a
redelivered alert a no-op. A message that is not an alert goes to
``<prefix>.deadletter`` with the reason, as every vigil consumer does. Open
incidents are re-posted to Alertmanager on their refresh schedule between
batches. A stop during a retry backoff leaves the batch uncommitted: the next
start retries what was not delivered, and only that.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from vigil.schemas import Alert, Envelope, encode, topic_name
from vigil.streams.config import HEARTBEAT_INTERVAL_S, SESSION_TIMEOUT_S
from vigil.streams.notify.notifier import Notifier, Stopped, Where

log = logging.getLogger(__name__)

__all__ = ["NotifyService"]


class NotifyService:
    def __init__(self, notifier: Notifier, kafka_conf: dict[str, Any], prefix: str, *, group_id: str,
                 ready_file: Path | None = None, batch_size: int = 50, poll_timeout_s: float = 0.2,
                 session_timeout_s: float = SESSION_TIMEOUT_S, heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
                 refresh_every_s: float = 1.0) -> None:
        from confluent_kafka import Consumer, Producer

        self.notifier = notifier
        self.prefix = prefix
        self.alerts_topic = topic_name("alert", prefix)
        self.ready_file = ready_file
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.refresh_every_s = refresh_every_s
        self.handled = 0
        self.dead_letters = 0
        self._last_refresh = 0.0
        self._consumer = Consumer({
            **kafka_conf, "group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": int(session_timeout_s * 1000), "heartbeat.interval.ms": int(heartbeat_interval_s * 1000),
            # a batch may wait out retries (up to the notifier's retry_for_s) between polls
            "max.poll.interval.ms": int(max(300.0, notifier.retry_for_s * 2 + 60) * 1000), "fetch.wait.max.ms": 20,
        })
        self._producer = Producer({**kafka_conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
        self._consumer.subscribe([self.alerts_topic], on_assign=self._on_assign)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if self.ready_file is not None and not self.ready_file.exists():
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.write_text(json.dumps({"pid": os.getpid(), "partitions": len(partitions)}))

    def _publish(self, event: Envelope, key: bytes) -> None:
        self._producer.produce(topic_name(event.event_type, self.prefix), encode(event), key=key)  # type: ignore[attr-defined]
        self._producer.poll(0)
        self.dead_letters += 1

    def _flush(self, timeout_s: float = 30.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise RuntimeError(f"{left} dead letter(s) not delivered within {timeout_s:g} s; offsets not committed")

    def poll_once(self) -> int:
        """One batch: deliver, dead-letter, flush, commit; then refreshes that are due."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, TopicPartition

        from vigil.schemas import decode
        from vigil.streams.kafka import dead_letter, refused_event, take

        messages = take(self._consumer, self.batch_size, self.poll_timeout_s)
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset, raw = msg.topic(), msg.partition(), msg.offset(), msg.value() or b""
            kind, ms = msg.timestamp()
            decoded = decode(raw)
            for err in decoded.errors:
                self._publish(dead_letter(err, topic, partition, offset,
                                          ms / 1000.0 if kind != TIMESTAMP_NOT_AVAILABLE else None), topic.encode())
                log.warning("dead-lettered a message at %s/%d/%d: %s", topic, partition, offset, err.reason)
            for event in decoded.events:
                if not isinstance(event, Alert):
                    self._publish(refused_event(event, f"a {event.event_type} event on the alerts topic "  # type: ignore[attr-defined]
                                                       "(only alert events belong there)", topic, partition, offset,
                                                raw if len(decoded.events) == 1 else None), topic.encode())
                    continue
                for dl in self.notifier.handle(event, Where(topic, partition, offset, raw)):
                    self._publish(dl, topic.encode())
                self.handled += 1
            offsets[(topic, partition)] = offset + 1
        if messages:
            self._flush()
        if offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)
        now = time.monotonic()
        if now - self._last_refresh >= self.refresh_every_s:
            self._last_refresh = now
            self.notifier.refresh_due()
        return len(messages)

    def run(self, stop: threading.Event, until: Callable[[], bool] | None = None) -> None:
        """Poll until ``stop`` is set; Kafka hiccups are logged and retried; a stop mid-retry commits nothing."""
        from confluent_kafka import KafkaException

        while not stop.is_set() and not (until is not None and until()):
            try:
                self.poll_once()
            except Stopped as exc:
                log.warning("%s; the batch stays uncommitted and is retried at the next start", exc)
                return
            except KafkaException as exc:
                log.warning("notify: %s; continuing", exc)

    def close(self) -> None:
        try:
            self._producer.flush(10)
        finally:
            self._consumer.close()
