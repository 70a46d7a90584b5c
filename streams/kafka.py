"""Kafka plumbing shared by the stream apps: topic creation and dead letters."""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from vigil.schemas import TOPICS, DeadLetter, DecodeError, Envelope, Source, encode, from_seconds, utcnow
from vigil.schemas.envelope import EARLIEST, FORBIDDEN_CLASS, INT32_MAX, LABEL_MAX, LATEST
from vigil.schemas.events import DETAIL_MAX, RAW_KEEP

#: Namespace of dead-letter ids: one bad record keeps one id whoever reports it.
_DEAD_LETTER_NS = uuid.UUID("6f1c1d7e-2f55-4d0e-9a51-5a8c0f5d7c11")
_FORBIDDEN = re.compile(f"[{FORBIDDEN_CLASS}]")
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


def ensure_topics(kafka_conf: dict[str, Any], prefix: str, timeout_s: float = 15.0) -> list[str]:
    """Create every topic of :data:`vigil.schemas.TOPICS` under ``prefix``; existing ones are kept."""
    admin = AdminClient(kafka_conf)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [NewTopic(spec.name(prefix), num_partitions=spec.partitions, replication_factor=1)
              for spec in TOPICS.values() if spec.name(prefix) not in existing]
    if wanted:
        for name, fut in admin.create_topics(wanted, operation_timeout=timeout_s).items():
            try:
                fut.result(timeout=timeout_s)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    return [spec.name(prefix) for spec in TOPICS.values()]


def raw_fields(raw: bytes) -> dict[str, Any]:
    """What a dead letter keeps of a message's bytes: all of them up to :data:`RAW_KEEP`, else the first
    RAW_KEEP; always their size and the SHA-256 of the whole (so a truncated copy is still identified).

    >>> f = raw_fields(b"x" * (RAW_KEEP + 1))
    >>> f["raw_truncated"], f["raw_size"], len(base64.b64decode(f["raw_b64"])) == RAW_KEEP
    (True, 65537, True)
    """
    raw = raw or b""
    return {"raw_b64": base64.b64encode(raw[:RAW_KEEP]).decode(), "raw_size": len(raw),
            "raw_sha256": hashlib.sha256(raw).hexdigest(), "raw_truncated": len(raw) > RAW_KEEP}


def _text(value: object, limit: int) -> str:
    """Free text capped at ``limit`` characters (a dead letter must always be small enough to produce)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _label(value: object | None, limit: int = LABEL_MAX) -> str | None:
    """A label field made safe: forbidden characters replaced, capped; None stays None, "" becomes None."""
    if value is None:
        return None
    text = _FORBIDDEN.sub("?", str(value))[:limit]
    return text or None


def _topic(topic: str | None) -> str:
    return topic if topic and _TOPIC.fullmatch(topic) and len(topic) <= 249 else "?"


def dead_letter(err: DecodeError, topic: str, partition: int, offset: int,
                message_time: float | None = None, source: Source | None = None) -> DeadLetter:
    """The dead-letter record for a failed message (or one failed item of a batch).

    Its id and time derive from where the message sits in the log, so every
    reader of the same bad message (worker, sink, a replay) makes the same
    record, and the history keeps one. It holds the raw bytes (capped, with
    their size and SHA-256) and nothing re-typed from the message, so it
    cannot fail the way the message did, and it is always small enough to
    produce.
    """
    return DeadLetter(
        event_id=uuid.uuid5(_DEAD_LETTER_NS, f"{topic}/{partition}/{offset}/{err.index}"),
        event_time=_when(message_time),
        source=source or Source(),
        reason=_label(err.reason) or "invalid",
        detail=_text(err.detail, DETAIL_MAX),
        field=_label(err.field),
        source_topic=_topic(topic),
        source_partition=min(max(partition, 0), INT32_MAX),
        source_offset=max(offset, 0),
        **raw_fields(err.raw),
    )


def refused_event(event: Envelope, why: str, topic: str, partition: int, offset: int,
                  raw: bytes | None = None, reason: str = "refused", message_time: float | None = None) -> DeadLetter:
    """A valid event that a consumer could not use (the store or a detector refused it).

    ``raw`` is the message as read when it held this event alone; otherwise the
    event is kept re-encoded (same content, canonical bytes). Nothing else of
    the event is copied (not its source: a value the store refused would be
    refused again in the dead letter); its id and type are in the detail.
    The time is the message's (when known), else the event's: either way
    the same for every reader, so the record is stored once.
    """
    what = f"{getattr(event, 'event_type', '?')} {event.event_id}: "
    return DeadLetter(
        event_id=uuid.uuid5(_DEAD_LETTER_NS, f"refused/{event.event_id}"),
        event_time=_when(message_time) if message_time is not None else event.event_time,
        reason=reason,
        detail=_text(what + why, DETAIL_MAX),
        source_topic=_topic(topic),
        source_partition=min(max(partition, 0), INT32_MAX),
        source_offset=max(offset, 0),
        **raw_fields(raw if raw is not None else encode(event)),
    )


def _when(message_time: float | None) -> datetime:
    """A message's time as a dead letter's event time (the log's clock; now when the log has none)."""
    if message_time is None:
        return utcnow()
    moment = from_seconds(message_time)
    return moment if EARLIEST <= moment <= LATEST else utcnow()


def rewind_shrunk(consumer: Consumer) -> list[TopicPartition]:
    """Seek to its start every assigned partition whose log ends before this consumer's position.

    A log only shrinks when the broker lost it (an in-memory dev broker restarted, a topic deleted and
    made again). Kafka answers the fetch with OFFSET_OUT_OF_RANGE and ``auto.offset.reset`` applies;
    tansu answers nothing, and a consumer left past the new end would miss everything until the log
    grew back to its old length. Local calls only (the high watermarks of the last fetch responses):
    cheap enough for every poll. Returns the partitions rewound.
    """
    rewound = []
    try:
        for tp in consumer.position(consumer.assignment()):
            if tp.offset < 0:
                continue  # nothing fetched yet
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if 0 <= high < tp.offset:
                rewound.append(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
        for tp in rewound:
            consumer.seek(tp)
    except KafkaException:
        return []  # not assigned yet, or mid-rebalance: the next poll asks again
    return rewound


def take(consumer: Consumer, max_messages: int, timeout_s: float) -> list:
    """Up to ``max_messages`` messages: wait up to ``timeout_s`` for the first, then only what has arrived.

    ``consumer.consume(n, timeout)`` returns early only when ``n`` messages are in: with a trickle (one
    alert, one decision) every message waits out the whole timeout, which is latency on every hop.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, timeout=0)] if max_messages > 1 else [first]


def reader(kafka_conf: dict[str, Any], topics: list[str], from_beginning: bool = True,
           timeout_s: float = 10.0) -> Consumer:
    """A consumer assigned every partition of ``topics``, with no group.

    Group join costs about half the session timeout; a subscriber that reads
    everything (``vigil tail``, the demo's scoreboard) needs no group at all.
    """
    consumer = Consumer({**kafka_conf, "group.id": "vigil-reader", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10, "log_level": 3})
    metadata = consumer.list_topics(timeout=timeout_s)
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    partitions = []
    for topic in topics:
        tmeta = metadata.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            raise KafkaException(f"topic {topic} does not exist; start the stack with `vigil up`")
        partitions.extend(TopicPartition(topic, p, start) for p in tmeta.partitions)
    consumer.assign(partitions)
    return consumer
