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
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, TopicPartition

from schemas import Envelope, all_topic_names, decode
from streams.config import StreamConfig
from streams.history import HistoryStore, gc_paused, gc_resumed
from streams.kafka import dead_letter, refused_event

log = logging.getLogger(__name__)


@dataclass
class SinkStats:
    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0
    errors: list[str] = field(default_factory=list)


class _StoreDown(RuntimeError):
    pass


#: ClickHouse error codes that say the store, not the data, is the problem: out of
#: memory or disk, too many parts, read-only, timeouts, network, overload.
_UNAVAILABLE_CODES = frozenset({159, 160, 164, 202, 209, 210, 236, 241, 242, 243, 252, 319, 425, 999})
_UNAVAILABLE_NAMES = ("NOT_ENOUGH_SPACE", "MEMORY_LIMIT_EXCEEDED", "TOO_MANY_PARTS", "TABLE_IS_READ_ONLY",
                      "TIMEOUT_EXCEEDED", "SOCKET_TIMEOUT", "NETWORK_ERROR", "TOO_MANY_SIMULTANEOUS_QUERIES",
                      "Connection refused", "Max retries exceeded")


def _store_unavailable(exc: BaseException) -> bool:
    text = str(exc)
    if "partitions for single INSERT block" in text:
        return False  # TOO_MANY_PARTS about the batch itself (it spans too many months/days): split it
    match = re.search(r"Code: (\d+)", text)
    if match and int(match.group(1)) in _UNAVAILABLE_CODES:
        return True
    return any(name in text for name in _UNAVAILABLE_NAMES)


def _timestamp(msg: Any) -> float | None:
    kind, ms = msg.timestamp()
    return ms / 1000.0 if kind != TIMESTAMP_NOT_AVAILABLE else None


class HistorySink:
    """Consume ``config``'s topics into ``store`` until :meth:`stop`."""

    def __init__(self, config: StreamConfig, store: HistoryStore, *, group_id: str | None = None,
                 batch_size: int = 5000, poll_timeout_s: float = 0.2, min_batch: int = 100,
                 retry_initial_s: float = 0.2,
                 retry_max_s: float = 10.0, subscribe: bool = True, extra_conf: dict[str, Any] | None = None) -> None:
        self.config = config
        self.store = store
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.min_batch = min(min_batch, batch_size)
        self.stats = SinkStats()
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = Consumer(config.kafka_conf(**{
            "group.id": group_id or f"{config.topic_prefix}-history",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": int(config.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(config.heartbeat_interval_s * 1000),
            "fetch.wait.max.ms": 50,
            **(extra_conf or {}),
        }))
        #: Replay: messages with a timestamp before ``since_ms`` are skipped; past ``until_ms``,
        #: skipped and their partition is done.
        self.until_ms: int | None = None
        self.since_ms: int | None = None
        self.finished: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()
        self.commit_offsets = subscribe  # a replay (partitions assigned by hand) commits nothing
        #: (origin, events) per message of the batch in hand: where a refused event came from.
        self._origins: list[tuple[tuple[str, int, int], list[Envelope]]] = []
        if subscribe:
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
                try:
                    self.poll_once()
                except _StoreDown:
                    if self._stop.is_set():
                        break  # stopped while the store was down: the batch stays uncommitted
                    raise
                except KafkaException as exc:
                    # e.g. a commit during a rebalance: the batch is stored, its offsets
                    # will be committed with the next batch or re-read (and deduplicated).
                    log.warning("history sink: %s; continuing", exc)
                    self.stats.errors.append(str(exc)[:500])
        except BaseException as exc:
            self.failure = exc
            log.exception("history sink stopped")
            raise
        finally:
            self._consumer.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll_once(self) -> int:
        """Consume one batch, store it, commit it; return messages handled."""
        messages = self._consume()
        if not messages:
            return 0
        with gc_paused():
            self._handle(messages)  # (its events are freed when it returns, before the collector is back)
        self.stats.messages += len(messages)
        self.stats.batches += 1
        return len(messages)

    def _handle(self, messages: list) -> None:
        try:
            events, offsets = self._decode(messages)
            self._store_with_retry(events)
        finally:
            self._origins = []  # (keeps no event alive past the batch)
        if offsets and self.commit_offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)

    def _consume(self) -> list:
        """A batch: up to ``batch_size`` messages gathered for up to ``poll_timeout_s`` after the
        first, or, once ``min_batch`` are in hand, as many as have arrived.

        (``consume(n, timeout)`` alone waits the whole timeout unless n arrive: with a backlog
        larger than the client's queue, a fifth of a second lost per batch.)
        """
        first = self._consumer.poll(self.poll_timeout_s)
        if first is None:
            return []
        messages = [first]
        deadline = time.monotonic() + self.poll_timeout_s
        while len(messages) < self.batch_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            more = self._consumer.consume(self.batch_size - len(messages), timeout=min(left, 0.01))
            if not more and len(messages) >= self.min_batch:
                break  # all there is for now: store it rather than wait
            messages.extend(more)
        return messages

    def _decode(self, messages: list) -> tuple[list[Envelope], dict[tuple[str, int], int]]:
        """The batch's events (dead letters for what does not decode) and the offsets to commit after it."""
        events: list[Envelope] = []
        offsets: dict[tuple[str, int], int] = {}
        self._origins = []
        for msg in messages:
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    self.at_end.add((msg.topic(), msg.partition()))
                else:
                    log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if self.until_ms is not None or self.since_ms is not None:
                self.at_end.discard((topic, partition))
                ts = _timestamp(msg)
                if ts is not None and self.since_ms is not None and ts * 1000 < self.since_ms:
                    continue  # before the range (a broker that does not seek by time starts earlier)
                if self.until_ms is not None and (
                        (topic, partition) in self.finished or (ts is not None and ts * 1000 > self.until_ms)):
                    self.finished.add((topic, partition))
                    continue
            decoded = decode(msg.value())
            events.extend(decoded.events)
            self._origins.append(((topic, partition, offset), decoded.events))
            for err in decoded.errors:
                events.append(dead_letter(err, topic, partition, offset, _timestamp(msg)))
                self.stats.dead_letters += 1
            offsets[(topic, partition)] = offset + 1
        return events, offsets

    def _store_with_retry(self, events: list[Envelope]) -> None:
        # Offsets stay uncommitted until the store takes the batch: nothing is lost
        # while ClickHouse is down, the sink just falls behind.
        delay = self.retry_initial_s
        while True:
            try:
                self._store(events)
                return
            except _StoreDown as exc:
                self.stats.errors.append(str(exc)[:500])
                log.error("history store unavailable, retrying in %.1f s: %s", delay, exc)
                with gc_resumed():  # the store may be down for long: collect meanwhile
                    if self._stop.wait(delay):
                        raise
                delay = min(delay * 2, self.retry_max_s)

    def _store(self, events: list[Envelope]) -> None:
        """Insert ``events``; an event the store refuses becomes a dead letter.

        A store that is down (it does not answer a trivial query) or out of
        room (disk, memory, too many parts: ClickHouse's own error codes) raises
        :class:`_StoreDown`, and the whole batch is retried later with its
        offsets uncommitted. Any other failure splits the batch in halves until
        the failing event is alone; it is dead-lettered and the rest goes on.
        If even the dead letter cannot be stored, the store is the problem.
        """
        try:
            written = self.store.insert_events(events)
        except Exception as exc:  # clickhouse-connect raises many types; classified below
            if _store_unavailable(exc) or not self.store.healthy():
                raise _StoreDown(str(exc)) from exc
            if len(events) > 1:
                half = len(events) // 2
                self._store(events[:half])
                self._store(events[half:])
                return
            [event] = events
            if event.event_type == "dead_letter":  # type: ignore[attr-defined]
                raise _StoreDown(f"the store refuses even a dead letter: {exc}") from exc
            log.error("history refused event %s: %s", event.event_id, exc)
            self.stats.dead_letters += 1
            self._store([refused_event(event, str(exc), *self._origin_of(event))])
            return
        self.stats.stored += written
        self.stats.duplicates += len(events) - written

    def _origin_of(self, event: Envelope) -> tuple[str, int, int]:
        """(topic, partition, offset) of the message that carried ``event`` in this batch."""
        for origin, carried in self._origins:
            if any(e.event_id == event.event_id for e in carried):
                return origin
        return ("?", 0, 0)

    def wait_until(self, predicate, timeout_s: float) -> bool:
        """Wait (without sleeping blindly) until ``predicate(stats)`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.stats):
                return True
            self._stop.wait(0.02)
        return predicate(self.stats)
