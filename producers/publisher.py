"""Publish events to their topics with confluent-kafka; spool them to disk while the broker is away.

A group of events of one type and one key travels as one message (a JSON
array), which is how high-rate telemetry amortizes per-message cost. The
producer is idempotent with ``acks=all``; every message has a delivery
callback.

Broker outages (with a ``spool_dir``)
-------------------------------------
The publisher is in one of two modes:

``online``
    messages go to librdkafka. A delivery failure, or librdkafka reporting
    that all brokers are down, switches to ``spooling``: messages still queued
    in librdkafka are purged (their delivery callbacks hand them back) and
    appended to the spool in publish order, ahead of anything newer; what is
    in flight finishes, and if it fails it is spooled too.
``spooling``
    every new message is appended to the disk spool (:mod:`vigil.producers.spool`),
    so the order of the spool is the order of publication. Every
    ``probe_interval_s`` the publisher asks the broker for metadata; when it
    answers and knows the topic at the head of the spool, the spool is
    replayed from its head in chunks: a chunk is acknowledged (removed) only
    when Kafka confirmed every message of it. Once Kafka has taken a chunk,
    the last one (the rest of the spool) is handed to librdkafka and the
    publisher is ``online`` again at once: new messages are produced after
    it, so they keep their order, and a publisher that publishes as fast as
    it replays (an agent's heartbeat, one per poll) does not chase the tail
    of its own spool forever. Should that last chunk fail, it is still in
    the spool (acknowledged only when confirmed) and the publisher spools
    again.

A replay chunk that fails although the broker answered the probe says the
producer itself is stuck (an idempotent producer whose id or epoch the
broker does not know, e.g. after a broker restart lost its state, or a
retention expired the id): the producer is recreated (a fresh producer id)
before the next attempt, instead of failing the same way forever.

A message whose delivery failed after it was sent (timed out, or purged in
flight when the producer is recreated) may have reached the broker and still
be spooled and replayed: ``stats.uncertain`` counts those, and downstream
consumers deduplicate by event id (the design's rule), so it is never counted
twice.

When the spool is full it drops its oldest messages and the publisher appends
an :class:`~vigil.schemas.events.EventsDropped` record ("dropped N events") to be
published like any other event: never silent. Without a ``spool_dir`` a
failed delivery is counted in ``failed`` and logged.

Nothing here starts a thread: the owner calls :meth:`Publisher.poll`
regularly (the node agent does, from its loop), and :meth:`publish` polls too.
All methods are thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from vigil.producers.spool import DropReport, Position, Spool, SpoolRecord
from vigil.schemas import NODE_SAMPLE_TYPES, NODE_SAMPLES, Envelope, Source, encode, encode_batch, group_type, message_key, \
    topic_name
from vigil.schemas.envelope import utcnow
from vigil.schemas.events import EventsDropped

log = logging.getLogger(__name__)

__all__ = ["PublishError", "Publisher", "PublisherStats"]


class PublishError(RuntimeError):
    pass


class _RdkafkaLog:
    """librdkafka's own log lines ("connection refused" during an outage) go to DEBUG."""

    _log = logging.getLogger(__name__ + ".rdkafka")

    def log(self, level: int, fmt: str, *args: object) -> None:
        self._log.debug(fmt, *args)


@dataclass
class PublisherStats:
    """Counters of one publisher (messages, not events, unless named so)."""

    delivered: int = 0
    failed: int = 0
    spooled: int = 0
    replayed: int = 0
    dropped_events: int = 0
    outages: int = 0
    #: failures after which the broker may still have written the message (it was sent; no answer came):
    #: each is spooled and sent again, so downstream may see it twice (and deduplicates it by event id)
    uncertain: int = 0


_DOWN_CODES = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
#: Failures of a message that may have been sent: written or not, only the broker knows.
_UNCERTAIN = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._PURGE_INFLIGHT,
              KafkaError.REQUEST_TIMED_OUT}
#: Errors no retry can cure: such a message is dropped and reported, not spooled forever.
_PERMANENT = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_MSG,
              KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
              KafkaError._INVALID_ARG, KafkaError.INVALID_REQUIRED_ACKS}


class Publisher:
    """Idempotent, acks=all Kafka producer of vigil events, with an optional disk spool.

    Parameters
    ----------
    kafka_conf : dict
        librdkafka settings (``bootstrap.servers``, security); passed through.
    topic_prefix : str
        Prefix of the topic names.
    linger_ms : int
        librdkafka batching delay.
    spool_dir : path, optional
        Where to spool while the broker is unreachable; without it, failed
        deliveries are only counted.
    spool_max_bytes : int
        Bound of the spool on disk.
    message_timeout_ms : int
        How long librdkafka keeps trying one message before it fails (and is
        spooled).
    probe_interval_s : float
        How often a spooling publisher asks whether the broker is back.
    replay_chunk : int
        Messages replayed per chunk (each acknowledged as a whole).
    source : Source, optional
        Source of the "dropped N events" records (the node, usually).
    clock : callable
        Returns the current aware UTC time (for the drop records).
    """

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        topic_prefix: str,
        linger_ms: int = 2,
        *,
        spool_dir: str | Path | None = None,
        spool_max_bytes: int = 256 << 20,
        message_timeout_ms: int = 30_000,
        probe_interval_s: float = 1.0,
        replay_chunk: int = 500,
        source: Source | None = None,
        clock: Callable[[], Any] = utcnow,
    ) -> None:
        self.topic_prefix = topic_prefix
        self.stats = PublisherStats()
        self.last_error: KafkaError | None = None
        self.source = source or Source()
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = min(0.25, probe_interval_s)
        self.replay_chunk = replay_chunk
        self._clock = clock
        self._conf = {
            **kafka_conf,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": message_timeout_ms,
            "log_level": 3,
            "logger": _RdkafkaLog(),
            "error_cb": self._on_error,
        }
        self._lock = threading.RLock()
        self._producer = Producer(self._conf)
        self._spool = Spool(spool_dir, max_bytes=spool_max_bytes) if spool_dir is not None else None
        self._seq = 0  # publish order of messages handed to librdkafka
        self._failed_back: list[tuple[int, SpoolRecord]] = []  # failed/purged, to spool in order
        self._down = False  # librdkafka said all brokers are down
        self._next_probe = 0.0
        self._replaying: tuple[Position, int] | None = None  # (end of chunk, outstanding)
        self._chunk_failed = False
        self._verified = False  # the broker took the last replayed chunk
        self._stuck = False  # a replayed message failed other than by our own purge
        self._fatal = False
        self.spooling = self._spool is not None and not self._spool.empty
        if self.spooling:
            log.warning("spool %s holds messages from an earlier run; they are replayed first", spool_dir)

    # -- compatibility ----------------------------------------------------------------

    @property
    def delivered(self) -> int:
        return self.stats.delivered

    @property
    def failed(self) -> int:
        return self.stats.failed

    @property
    def spool(self) -> Spool | None:
        return self._spool

    # -- callbacks (run inside poll/flush) ------------------------------------------------

    def _poll(self, timeout_s: float) -> None:
        """librdkafka's poll; a fatal producer error (e.g. UNKNOWN_PRODUCER_ID after the
        broker lost its state) raises from it and leads to a fresh producer."""
        try:
            self._producer.poll(timeout_s)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            self.last_error = err
            if err is None or err.fatal():
                self._fatal = True
            log.warning("producer error: %s", exc)

    def _on_error(self, err: KafkaError) -> None:
        self.last_error = err
        if err.fatal():
            self._fatal = True
            log.error("producer fatal error: %s; the producer is recreated", err)
        elif err.code() in _DOWN_CODES:
            if err.code() == KafkaError._ALL_BROKERS_DOWN:
                self._down = True
            log.debug("broker unreachable: %s", err)

    def _delivery(self, seq: int, record: SpoolRecord) -> Callable[[KafkaError | None, Any], None]:
        def cb(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                self.stats.delivered += 1
                self._down = False
                return
            self.stats.failed += 1
            self.last_error = err
            if err.code() in _UNCERTAIN:
                self.stats.uncertain += 1
            if err.code() in _PERMANENT:
                self._rejected(record, err)
            elif self._spool is not None:
                self._failed_back.append((seq, record))
            else:
                log.error("delivery to %s failed: %s", record.topic, err)
        return cb

    def _replay_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            self.stats.delivered += 1
            self.stats.replayed += 1
        elif err.code() in _PERMANENT:
            self._rejected(SpoolRecord(_msg.topic(), _msg.key() or b"", _msg.value() or b""), err)
        else:
            self._chunk_failed = True
            self._verified = False
            self.last_error = err
            if err.code() in _UNCERTAIN:
                self.stats.uncertain += 1
            if err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                self._stuck = True
        if self._replaying is not None:
            end, outstanding = self._replaying
            self._replaying = (end, outstanding - 1)

    # -- publishing ---------------------------------------------------------------------

    def publish(self, events: Sequence[Envelope], topic_type: str | None = None) -> None:
        """Publish one group: a single event, a batch of one type and key, or one node's samples.

        ``topic_type`` names the topic by its event type; by default the
        group's own (:func:`vigil.schemas.group_type`). A node agent sends its
        heartbeat to the node-samples topic even when no sample rides with it.
        """
        if not events:
            return
        first = events[0]
        try:
            et = group_type(events)
            if topic_type == NODE_SAMPLES and et in NODE_SAMPLE_TYPES:
                et = NODE_SAMPLES
            elif topic_type is not None and topic_type != et:
                raise ValueError(f"{et} events do not belong on the {topic_type} topic")
        except ValueError as exc:
            raise PublishError(str(exc)) from None
        value = encode(first) if len(events) == 1 else encode_batch(events)
        self.publish_raw(SpoolRecord(topic_name(et, self.topic_prefix), message_key(first), value, len(events), et))

    def publish_raw(self, record: SpoolRecord) -> None:
        """Publish an encoded message (the node batcher's path)."""
        with self._lock:
            self._service(probe=False)  # never blocks on a probe; poll() and flush() do that
            if self.spooling:
                self._to_spool(record)
                return
            self._produce(record)
            self._poll(0)

    def _produce(self, record: SpoolRecord) -> None:
        self._seq += 1
        cb = self._delivery(self._seq, record)
        while True:
            try:
                self._producer.produce(record.topic, key=record.key, value=record.value, on_delivery=cb)
                return
            except KafkaException as exc:  # the producer is in a fatal state
                self._fatal = True
                self.last_error = exc.args[0] if exc.args else None
                if self._spool is None:
                    self.stats.failed += 1
                    log.error("cannot produce to %s: %s", record.topic, exc)
                else:
                    self._failed_back.append((self._seq, record))
                    self._recreate()
                    self._enter_spooling()
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._poll(0.05)
                if self._spool is not None and (self._down or self._failed_back):
                    self._enter_spooling()
                    self._to_spool(record)
                    return

    def _to_spool(self, record: SpoolRecord) -> None:
        assert self._spool is not None
        dropped = self._spool.append(record)
        self.stats.spooled += 1
        if dropped:
            self.stats.dropped_events += dropped.events
            log.error("spool full: dropped its %d oldest events (%d messages); reported when the broker is back",
                      dropped.events, dropped.messages)

    def _drop_record(self, dropped: DropReport, reason: str, component: str) -> SpoolRecord:
        event = EventsDropped(
            event_time=self._clock(), source=self.source, count=dropped.events, messages=dropped.messages,
            by_type=dict(dropped.by_type), reason=reason, component=component,
        )
        return SpoolRecord(topic_name("events_dropped", self.topic_prefix), message_key(event), encode(event), 1, "events_dropped")

    def _rejected(self, record: SpoolRecord, err: KafkaError) -> None:
        """Kafka refused a message for good: it is dropped, and that is published."""
        log.error("Kafka rejected a message to %s for good (%s): dropped", record.topic, err)
        report = DropReport()
        report.add(record)
        self.stats.dropped_events += report.events
        rec = self._drop_record(report, f"rejected:{err.name()}", "publisher")
        if self._spool is not None and self.spooling:
            self._spool.append(rec)
        else:
            self._produce(rec)

    # -- outage handling ------------------------------------------------------------------

    def _enter_spooling(self) -> None:
        if not self.spooling:
            self.spooling = True
            self.stats.outages += 1
            log.warning("broker unreachable (%s): spooling to %s", self.last_error,
                        self._spool.directory if self._spool is not None else None)
        self._verified = False  # a new outage: the broker is asked before the next replay
        # Take back what librdkafka has not sent yet: its callbacks put it in _failed_back. What is in
        # flight is left to finish: delivered, it is not sent twice; failed, it comes back the same way.
        try:
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
        except KafkaException:
            pass
        self._poll(0)
        self._drain_failed_back()

    def _drain_failed_back(self) -> None:
        if self._failed_back:
            back, self._failed_back = sorted(self._failed_back, key=lambda x: x[0]), []
            # Older than anything spooled since: they go first only if the spool
            # was empty; otherwise at its tail (consumers order by event time).
            for _seq, rec in back:
                self._to_spool(rec)

    def _service(self, probe: bool = True) -> str | None:
        """Move between modes and replay; called with the lock held.

        Returns the topic to probe the broker for when a probe is due (the
        caller probes without the lock, then calls :meth:`_start_replay`).
        With ``probe=False`` (the caller will not probe) no probe is due: the
        slot stays for the next :meth:`poll`, or frequent publishing would
        use up every slot and the broker would never be asked.
        """
        if self._spool is None:
            return None
        if self._fatal:
            self._recreate()
        if self.spooling:
            self._poll(0)
            self._drain_failed_back()
        # A chunk in flight: while spooling, or online (the last chunk, handed off).
        if self._replaying is not None:
            end, outstanding = self._replaying
            if outstanding <= 0:
                self._replaying = None
                if self._chunk_failed:
                    self._replay_failed()
                    return None
                self._spool.ack(end)
            elif self.spooling:
                return None
        if not self.spooling:
            if self._failed_back or (self._down and len(self._producer) > 0):
                self._enter_spooling()
            elif self._replaying is None and not self._spool.empty:  # defensive: never leave it unread
                self.spooling = True
            return None
        if self._spool.empty:
            self.spooling = False
            self._verified = False
            log.warning("spool replayed: publishing directly again")
            return None
        if self._verified:  # the broker just took a chunk: no need to ask again
            self._start_replay(handoff=True)
            return None
        now = time.monotonic()
        if not probe or now < self._next_probe:
            return None
        self._next_probe = now + self.probe_interval_s
        head = self._spool.read(1)
        return head[0][1].topic if head else None

    def _replay_failed(self) -> None:
        """A replayed chunk was not confirmed (lock held): it is still in the spool.

        Unless only our own purge failed it, the broker answered the probe and
        still did not take it: the producer's own state (its idempotent
        producer id, sequence or epoch) is suspect, so a fresh producer makes
        the next attempt, as soon as the broker answers it.
        """
        self._chunk_failed = False
        self._verified = False
        stuck, self._stuck = self._stuck, False
        if not self.spooling:  # the handed-off last chunk failed: spool again
            self._enter_spooling()
        if stuck:
            log.warning("replay of the spool failed (%s): recreating the producer for the next attempt",
                        self.last_error)
            self._recreate()
            self._next_probe = time.monotonic()
        else:
            self._next_probe = time.monotonic() + self.probe_interval_s

    def _start_replay(self, handoff: bool = False) -> None:
        """Produce the next chunk of the spool (lock held).

        With ``handoff`` (the broker has just confirmed the previous chunk) and
        the chunk holding the rest of the spool, the publisher is online again
        as soon as the chunk is produced (see the module's doc).
        """
        assert self._spool is not None
        if self._replaying is not None or not self.spooling:
            return
        chunk = self._spool.read(self.replay_chunk + 1)
        if not chunk:
            return
        last = len(chunk) <= self.replay_chunk
        chunk = chunk[:self.replay_chunk]
        self._verified = True
        self._replaying = (chunk[-1][0], len(chunk))
        drops = self._spool.unreported_drops
        if drops:  # "dropped N events", once, ahead of what survived
            self._replaying = (chunk[-1][0], len(chunk) + 1)
            rec = self._drop_record(drops, "spool_full", "publisher.spool")
            spool = self._spool

            def reported(err: KafkaError | None, msg: Any, _drops: DropReport = drops) -> None:
                self._replay_delivery(err, msg)
                if err is None:
                    spool.mark_reported(_drops)

            self._producer.produce(rec.topic, key=rec.key, value=rec.value, on_delivery=reported)
        for _pos, rec in chunk:
            while True:
                try:
                    self._producer.produce(rec.topic, key=rec.key, value=rec.value, on_delivery=self._replay_delivery)
                    break
                except KafkaException:  # fatal state: the chunk is replayed by a fresh producer
                    self._fatal = True
                    self._chunk_failed = True
                    self._replaying = (chunk[-1][0], 0)
                    return
                except BufferError:
                    self._poll(0.05)
        self._poll(0)
        if handoff and last and not (self._fatal or self._chunk_failed or self._failed_back):
            self.spooling = False
            self._verified = False
            log.warning("spool replayed (its last %d messages in flight): publishing directly again", len(chunk))

    def _probe_and_replay(self, topic: str | None) -> None:
        """Ask the broker (without the lock) whether it is back; replay if so."""
        if topic is None:
            return
        if self._broker_knows(topic):
            with self._lock:
                self._start_replay()

    def _broker_knows(self, topic: str) -> bool:
        try:
            md = self._producer.list_topics(topic=topic, timeout=self.probe_timeout_s)
        except KafkaException:
            return False
        t = md.topics.get(topic)
        ok = t is not None and t.error is None and len(t.partitions) > 0
        if ok:
            self._down = False
        return ok

    def _recreate(self) -> None:
        log.warning("recreating the Kafka producer (%s)", self.last_error)
        self._fatal = False
        old = self._producer
        # Take back what the old producer holds: its delivery callbacks spool it.
        for _ in range(20):
            try:
                old.purge(in_queue=True, in_flight=True, blocking=False)
                old.poll(0.01)
            except KafkaException:
                continue
            if len(old) == 0:
                break
        if len(old) > 0:
            log.error("%d messages could not be taken back from the failed producer", len(old))
        self._producer = Producer(self._conf)
        self._replaying = None
        self._chunk_failed = False
        self._stuck = False
        self._verified = False
        self._drain_failed_back()
        if not self.spooling and self._spool is not None and not self._spool.empty:
            self.spooling = True

    # -- driving ------------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery callbacks, notice outages, replay the spool when the broker is back.

        During an outage a call may block for a metadata probe (up to 0.25 s,
        once per ``probe_interval_s``); :meth:`publish` never probes.
        """
        with self._lock:
            self._poll(timeout_s)
            topic = self._service()
        self._probe_and_replay(topic)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for outstanding deliveries (and, with a spool, its replay); return messages still pending.

        With a spool, a message that is safely spooled but not yet replayed
        counts as pending.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._poll(0)
                topic = self._service()
            self._probe_and_replay(topic)
            with self._lock:
                pending = len(self._producer) + (self._spool_pending() if self._spool is not None else 0)
                if pending == 0:
                    return 0
            left = deadline - time.monotonic()
            if left <= 0:
                return pending
            with self._lock:
                self._poll(min(0.05, left))

    def _spool_pending(self) -> int:
        assert self._spool is not None
        return 0 if self._spool.empty else len(self._spool)

    def close(self, timeout_s: float = 5.0) -> int:
        """Flush what can be flushed; what cannot stays in the spool for the next run."""
        pending = self.flush(timeout_s)
        with self._lock:
            if self._spool is not None:
                if len(self._producer) > 0:
                    self._enter_spooling()
                self._spool.close()
        return pending
