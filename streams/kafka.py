"""Kafka plumbing shared by the stream apps: topic creation and dead letters."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from vigil.schemas import TOPICS, DeadLetter, DecodeError, Envelope, Source, encode, from_seconds, utcnow

#: Namespace of dead-letter ids: one bad record keeps one id whoever reports it.
_DEAD_LETTER_NS = uuid.UUID("6f1c1d7e-2f55-4d0e-9a51-5a8c0f5d7c11")


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


def dead_letter(err: DecodeError, topic: str, partition: int, offset: int,
                message_time: float | None = None, source: Source | None = None) -> DeadLetter:
    """The dead-letter record for a failed message (or one failed item of a batch).

    Its id and time derive from where the message sits in the log, so every
    reader of the same bad message (worker, sink, a replay) makes the same
    record, and the history keeps one.
    """
    return DeadLetter(
        event_id=uuid.uuid5(_DEAD_LETTER_NS, f"{topic}/{partition}/{offset}/{err.index}"),
        event_time=from_seconds(message_time) if message_time is not None else utcnow(),
        source=source or Source(),
        reason=err.reason,
        detail=err.detail,
        field=err.field,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        raw_b64=base64.b64encode(err.raw).decode(),
    )


def refused_event(event: Envelope, why: str, topic: str, partition: int, offset: int,
                  raw: bytes | None = None) -> DeadLetter:
    """A valid event that a consumer could not use (the store or a detector refused it).

    ``raw`` is the message as read when it held this event alone; otherwise the
    event is kept re-encoded (same content, canonical bytes).
    """
    return DeadLetter(
        event_id=uuid.uuid5(_DEAD_LETTER_NS, f"refused/{event.event_id}"),
        event_time=event.event_time,
        source=event.source,
        reason="refused",
        detail=why[:2000],
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        raw_b64=base64.b64encode(raw if raw is not None else encode(event)).decode(),
    )


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
