"""The history sink: every topic into ClickHouse, in batches, each event once.

It is a plain confluent-kafka consumer rather than a faust agent because it
does no per-event logic: batch consume + batch insert moves an order of
magnitude more records per second than faust's per-event loop.

Offsets are committed only after the batch is stored (at-least-once); the
store drops ids it already holds, so redelivery never makes a duplicate row.
A message that does not decode is stored as a dead letter, with its reason
and raw bytes, and the sink goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, TopicPartition

from schemas import Envelope, all_topic_names, decode
from streams.config import StreamConfig
from streams.history import HistoryStore
from streams.kafka import dead_letter

log = logging.getLogger(__name__)


@dataclass
class SinkStats:
    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0
    errors: list[str] = field(default_factory=list)


class HistorySink:
    """Consume ``config``'s topics into ``store`` until :meth:`stop`."""

    def __init__(self, config: StreamConfig, store: HistoryStore, *, group_id: str | None = None,
                 batch_size: int = 5000, poll_timeout_s: float = 0.2) -> None:
        self.config = config
        self.store = store
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.stats = SinkStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = Consumer(config.kafka_conf(**{
            "group.id": group_id or f"{config.topic_prefix}-history",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": int(config.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(config.heartbeat_interval_s * 1000),
            "fetch.wait.max.ms": 50,
        }))
        self._consumer.subscribe(all_topic_names(config.topic_prefix))

    def start(self) -> "HistorySink":
        self._thread = threading.Thread(target=self.run, name="history-sink", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                self.poll_once()
        finally:
            self._consumer.close()

    def poll_once(self) -> int:
        """Consume one batch, store it, commit it; return messages handled."""
        messages = self._consumer.consume(self.batch_size, timeout=self.poll_timeout_s)
        if not messages:
            return 0
        events: list[Envelope] = []
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            decoded = decode(msg.value())
            events.extend(decoded.events)
            for err in decoded.errors:
                events.append(dead_letter(err, topic, partition, offset))
                self.stats.dead_letters += 1
            offsets[(topic, partition)] = offset + 1
        self._store_with_retry(events)
        if offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)
        self.stats.messages += len(messages)
        self.stats.batches += 1
        return len(messages)

    def _store_with_retry(self, events: list[Envelope]) -> None:
        # Offsets stay uncommitted until the store takes the batch: nothing is lost
        # while ClickHouse is down, the sink just falls behind.
        delay = 0.2
        while True:
            try:
                written = self.store.insert_events(events)
                self.stats.stored += written
                self.stats.duplicates += len(events) - written
                return
            except Exception as exc:  # the store's failure modes are many; all mean "retry later"
                self.stats.errors.append(str(exc)[:500])
                log.error("history insert failed, retrying in %.1f s: %s", delay, exc)
                if self._stop.wait(delay):
                    raise
                delay = min(delay * 2, 10.0)

    def wait_until(self, predicate, timeout_s: float) -> bool:
        """Wait (without sleeping blindly) until ``predicate(stats)`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.stats):
                return True
            self._stop.wait(0.02)
        return predicate(self.stats)
