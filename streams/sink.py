"""The history sink: every topic into ClickHouse, in batches, each event once.

It is a plain confluent-kafka consumer, as every vigil stream app is: batch
consume + batch insert, no per-event framework overhead.

Offsets are committed only after the batch is stored (at-least-once); the
store drops ids it already holds, so redelivery never makes a duplicate row.
A message that does not decode (or holds an event type its topic does not
carry) is stored as a dead letter, with its reason and raw bytes, and the
sink goes on.

No message stops the history. A batch the store refuses is split in halves
until the refused rows are alone; each becomes a dead letter with the store's
error and the raw bytes (capped, with their size and SHA-256), never a copy
of the fields that failed. Only a store that is down or full (it does not
answer, or says so with its own error codes) makes the sink wait and retry,
offsets uncommitted; if even a bare dead letter holding nothing but a hash is
refused, that is the store's fault too. A message that makes the sink itself
fail is dead-lettered with the error, one message at a time.

Decoding and serializing are most of the work: for a large batch they run in
a pool of processes (:mod:`vigil.streams.sinkprep`) while this thread inserts the
chunks already prepared. Whatever the fast path cannot take (a bad message, a
block whose ids may be stored already, a value the store refuses) goes the
careful way here, event by event.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator, TypeVar

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, TopicPartition

from vigil.schemas import DeadLetter, DecodeError, Envelope, all_topic_names, decode, topic_accepts
from vigil.schemas.tables import as_stored
from vigil.streams.config import StreamConfig
from vigil.streams.history import HistoryStore, gc_paused, gc_resumed
from vigil.streams.kafka import dead_letter, refused_event
from vigil.streams.sinkprep import Block, Prepared, default_processes, new_pool, prepare

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Messages are prepared in chunks of about this many bytes: large enough that an
#: insert's fixed cost is small, small enough that inserting overlaps preparing.
CHUNK_BYTES = 8 << 20
#: A batch smaller than this is prepared in the sink's own thread (no round trip).
POOL_MIN_BYTES = 1 << 20


@dataclass
class SinkStats:
    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0
    #: Chunks of messages decoded by the pool of processes (the rest, in the sink's thread).
    pooled_chunks: int = 0
    #: Times the sink waited for the store (down or full) and tried again: only a store outage.
    retries: int = 0
    #: Batches the fast path failed on with an error of the sink's own (they went the careful way).
    sink_errors: int = 0
    #: Messages the broker could not deliver (an error in place of the message): dead-lettered.
    consume_errors: int = 0
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


def _bare(dead: DeadLetter, why: str) -> DeadLetter:
    """A dead letter the store refused, reduced to what cannot fail: its id, time and origin, the
    hash and size of the raw bytes (not the bytes), and why."""
    return DeadLetter(event_id=dead.event_id, event_time=dead.event_time, reason=dead.reason,
                      detail=f"{why[:1500]} (its dead letter was refused too; the raw bytes are not kept: "
                             f"sha256 {dead.raw_sha256}, {dead.raw_size} bytes)",
                      source_topic=dead.source_topic, source_partition=dead.source_partition,
                      source_offset=dead.source_offset, raw_b64="", raw_size=dead.raw_size,
                      raw_sha256=dead.raw_sha256, raw_truncated=bool(dead.raw_size))


def _timestamp(msg: Any) -> float | None:
    kind, ms = msg.timestamp()
    return ms / 1000.0 if kind != TIMESTAMP_NOT_AVAILABLE else None


class HistorySink:
    """Consume ``config``'s topics into ``store`` until :meth:`stop`."""

    def __init__(self, config: StreamConfig, store: HistoryStore, *, group_id: str | None = None,
                 batch_size: int = 5000, poll_timeout_s: float = 0.2, min_batch: int = 100,
                 retry_initial_s: float = 0.2,
                 retry_max_s: float = 10.0, subscribe: bool = True, extra_conf: dict[str, Any] | None = None,
                 decode_processes: int | None = None) -> None:
        self.config = config
        self.store = store
        #: Worker processes that decode large batches (0: decode in this thread).
        self.decode_processes = default_processes() if decode_processes is None else decode_processes
        self._pool: Executor | None = None
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
        #: event id (int) -> (topic, partition, offset, message value if it held that event alone,
        #: message time), for the events of the batch in hand: where a refused event came from.
        self._origins: dict[int, tuple[str, int, int, bytes | None, float | None]] = {}
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
            self.close()

    def close(self) -> None:
        """Leave the consumer group and stop the decoding processes (:meth:`run` does it on its way out)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
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
        kept, offsets = self._select(messages)
        try:
            try:
                for chunk, prepared in self._prepared(kept):
                    careful = set(prepared.careful)
                    for block in prepared.blocks:
                        if self._retrying(partial(self._store_block, block)) is None:
                            careful.update(block.messages)
                    if careful:
                        self._store_carefully([chunk[i] for i in sorted(careful)])
            except (_StoreDown, KafkaException):
                raise
            except Exception as exc:  # noqa: BLE001 - the sink's own failure: never the end of the history
                # Whatever was stored already is dropped by id the second time.
                log.exception("history sink failed on a batch of %d messages; storing it message by message", len(kept))
                self.stats.sink_errors += 1
                self.stats.errors.append(f"sink error: {exc!r}"[:500])
                for msg in kept:
                    self._store_carefully([msg])
        finally:
            self._origins = {}  # (keeps no event alive past the batch)
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

    def _select(self, messages: list) -> tuple[list, dict[tuple[str, int], int]]:
        """The messages of the batch to store, and the offsets to commit after it.

        End-of-partition marks and errors about a partition are not messages
        (an error in place of a message is kept: it becomes a dead letter); a
        replay also leaves out the messages outside its time range.
        """
        kept: list = []
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    self.at_end.add((msg.topic(), msg.partition()))
                    continue
                log.warning("consume error: %s (%s/%s/%s)", msg.error(), msg.topic(), msg.partition(), msg.offset())
                self.stats.consume_errors += 1
                self.stats.errors.append(f"consume error: {msg.error()}"[:500])
                if not msg.topic() or msg.offset() is None or msg.offset() < 0:
                    continue  # about a partition or the connection, not a message
                # A message the broker could not hand over (too large, corrupt): a dead letter for its place.
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
            kept.append(msg)
            offsets[(topic, partition)] = offset + 1
        return kept, offsets

    def _prepared(self, messages: list) -> Iterator[tuple[list, Prepared]]:
        """``messages`` in chunks, each with its prepared blocks, in order.

        A large batch is prepared by the pool, every chunk at once, so that
        the chunks after the first are ready while this thread inserts.
        """
        chunks: list[list] = [[]]
        size = total = 0
        failed = [m for m in messages if m.error()]
        if failed:  # (a consume error in place of a message: the careful way, one dead letter)
            self._store_carefully(failed)
            messages = [m for m in messages if not m.error()]
        for msg in messages:
            if size >= CHUNK_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(msg)
            length = len(msg.value() or b"")
            size += length
            total += length
        pool = self._pool_for(total)
        if pool is None:
            for chunk in chunks:
                yield chunk, prepare([m.value() for m in chunk], [m.topic() for m in chunk])
            return
        futures: list[Future] = [pool.submit(prepare, [m.value() for m in chunk], [m.topic() for m in chunk])
                                 for chunk in chunks]
        for chunk, future in zip(chunks, futures):
            try:
                prepared = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker died (killed, out of memory): go on without the pool
                log.error("history sink: a decoding process failed (%s); decoding in this thread from now on", exc)
                self.decode_processes = 0
                prepared = prepare([m.value() for m in chunk], [m.topic() for m in chunk])
            else:
                self.stats.pooled_chunks += 1
            yield chunk, prepared

    def _pool_for(self, batch_bytes: int) -> Executor | None:
        if self.decode_processes <= 0 or batch_bytes < POOL_MIN_BYTES:
            return None
        return self.start_decoding_processes()

    def start_decoding_processes(self) -> Executor | None:
        """Start the decoding processes now rather than with the first large batch (a second or so)."""
        if self._pool is None and self.decode_processes > 0:
            self._pool = new_pool(self.decode_processes)
        return self._pool

    def _store_carefully(self, messages: list) -> None:
        """Decode ``messages`` one by one and store what they hold; a message the sink itself fails on
        (any error but the store's being down) is dead-lettered with that error."""
        try:
            events = self._decode(messages)
        except Exception:  # noqa: BLE001 - find the message
            if len(messages) > 1:
                for msg in messages:
                    self._store_carefully([msg])
                return
            events = [self._sink_failed(messages[0], "decoding it")]
        try:
            self._store_with_retry(events)
        except (_StoreDown, KafkaException):
            raise
        except Exception:  # noqa: BLE001 - a bug of the sink on some value: isolate the message
            if len(messages) > 1:
                for msg in messages:
                    self._store_carefully([msg])
                return
            self._store_with_retry([self._sink_failed(messages[0], "storing it")])

    def _sink_failed(self, msg: Any, doing: str) -> DeadLetter:
        import traceback

        why = traceback.format_exc(limit=3)
        log.error("history sink failed %s (%s/%d/%d): %s", doing, msg.topic(), msg.partition(), msg.offset(), why)
        self.stats.dead_letters += 1
        return dead_letter(DecodeError("sink_error", f"the history sink failed {doing}: {why}", msg.value() or b""),
                           msg.topic(), msg.partition(), msg.offset(), _timestamp(msg))

    def _decode(self, messages: list) -> list[Envelope]:
        """The events of ``messages`` (checked against their topic's event types), with a dead
        letter for each item that does not decode."""
        events: list[Envelope] = []
        for msg in messages:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            value, stamp = msg.value(), _timestamp(msg)
            if msg.error():
                err = DecodeError("consume_error", f"the broker did not deliver this message: {msg.error()}",
                                  value or b"")
                events.append(dead_letter(err, topic, partition, offset, stamp))
                self.stats.dead_letters += 1
                continue
            decoded = decode(value, accept=topic_accepts(topic))
            stored = as_stored(decoded.events)  # a node's GPU samples in columns: a row per GPU
            events.extend(stored)
            alone = value if len(stored) == 1 and not decoded.errors else None
            for event in stored:
                self._origins[event.event_id.int] = (topic, partition, offset, alone, stamp)
            for err in decoded.errors:
                events.append(dead_letter(err, topic, partition, offset, stamp))
                self.stats.dead_letters += 1
        return events

    def _store_block(self, block: Block) -> int | None:
        """Insert a prepared block; None when it must go the careful way (ids that may be
        stored already, or a value the store refuses)."""
        try:
            written = self.store.insert_block(block)
        except Exception as exc:  # clickhouse-connect raises many types; classified here
            if _store_unavailable(exc) or not self.store.healthy():
                raise _StoreDown(str(exc)) from exc
            log.warning("history store refused a block of %d %s events (%s); storing them one by one",
                        len(block.keys), block.event_type, str(exc)[:200])
            return None
        if written is not None:
            self.stats.stored += written
        return written

    def _store_with_retry(self, events: list[Envelope]) -> None:
        self._retrying(lambda: self._store(events))

    def _retrying(self, attempt: Callable[[], T]) -> T:
        # Offsets stay uncommitted until the store takes the batch: nothing is lost
        # while ClickHouse is down, the sink just falls behind.
        delay = self.retry_initial_s
        while True:
            try:
                return attempt()
            except _StoreDown as exc:
                self.stats.retries += 1
                self.stats.errors.append(str(exc)[:500])
                log.error("history store unavailable, retrying in %.1f s: %s", delay, exc)
                with gc_resumed():  # the store may be down for long: collect meanwhile
                    if self._stop.wait(delay):
                        raise
                delay = min(delay * 2, self.retry_max_s)

    def _store(self, events: list[Envelope], refused: int = 0) -> None:
        """Insert ``events``; an event the store refuses becomes a dead letter.

        A store that is down (it does not answer a trivial query) or out of
        room (disk, memory, too many parts: ClickHouse's own error codes) raises
        :class:`_StoreDown`, and the whole batch is retried later with its
        offsets uncommitted. Any other failure splits the batch in halves until
        the failing event is alone; it is dead-lettered with the store's error
        and the rest goes on. A refused dead letter is replaced by a bare one
        (the raw bytes' hash and size, the error); only if that is refused too
        is the store the problem. ``refused``: how many times this event's
        dead letter has already been refused.
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
            why = f"the history store refused it: {exc}"
            if isinstance(event, DeadLetter):
                if refused >= 1:
                    raise _StoreDown(f"the store refuses even a bare dead letter: {exc}") from exc
                log.error("history refused dead letter %s (%s); storing a bare one", event.event_id, str(exc)[:300])
                self._store([_bare(event, why)], refused + 1)
                return
            log.error("history refused event %s: %s", event.event_id, str(exc)[:300])
            self.stats.dead_letters += 1
            topic, partition, offset, alone, stamp = self._origins.get(event.event_id.int, ("?", 0, 0, None, None))
            self._store([refused_event(event, why, topic, partition, offset, raw=alone, reason="store_refused",
                                       message_time=stamp)], refused)
            return
        self.stats.stored += written
        self.stats.duplicates += len(events) - written

    def wait_until(self, predicate, timeout_s: float) -> bool:
        """Wait (without sleeping blindly) until ``predicate(stats)`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.stats):
                return True
            self._stop.wait(0.02)
        return predicate(self.stats)
