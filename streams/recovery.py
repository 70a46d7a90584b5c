"""Rebuild a worker's state from the log after a restart or a rebalance.

The Kafka log is the source of truth. When a worker takes over a partition,
it reads the partition's recent past (``window_s``) up to the group's
committed offset and feeds it to its detectors, so a dead node or a hung job
seen by the previous owner is still tracked; the faust agent then goes on
from the committed offset. Findings, incidents and alerts carry ids derived
from their content, so what the replay derives again is recognised, not
published twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogRecord:
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    value: bytes | None


def read_before_committed(kafka_conf: dict[str, Any], group_id: str, partitions: Iterable[tuple[str, int]],
                          window_s: float, now: float, timeout_s: float = 30.0) -> list[LogRecord]:
    """Records of ``partitions`` written in the last ``window_s`` and not past the
    group's committed offset (what the previous owner had already processed)."""
    tps = [TopicPartition(t, p) for t, p in partitions]
    if not tps:
        return []
    consumer = Consumer({**kafka_conf, "group.id": group_id, "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10, "log_level": 3})
    try:
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(tps, timeout=timeout_s)}
        todo = [tp for tp in tps if committed.get((tp.topic, tp.partition), -1) > 0]
        if not todo:
            return []
        starts = _window_starts(consumer, todo, now - window_s, timeout_s)
        # Nothing written inside the window, or nothing before the committed offset: no replay.
        todo = [tp for tp in todo if starts[(tp.topic, tp.partition)] != OFFSET_END and
                not 0 <= committed[(tp.topic, tp.partition)] <= starts[(tp.topic, tp.partition)]]
        if not todo:
            return []
        consumer.assign([TopicPartition(tp.topic, tp.partition, starts[(tp.topic, tp.partition)]) for tp in todo])
        end = {(tp.topic, tp.partition): committed[(tp.topic, tp.partition)] for tp in todo}
        done: set[tuple[str, int]] = set()
        out: list[LogRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(done) < len(todo) and time.monotonic() < deadline:
            for msg in consumer.consume(5000, timeout=0.2):
                if msg.error():
                    continue
                key = (msg.topic(), msg.partition())
                if msg.offset() >= end[key]:
                    done.add(key)
                    continue
                kind, ms = msg.timestamp()
                out.append(LogRecord(msg.topic(), msg.partition(), msg.offset(), ms / 1000 if ms > 0 else None,
                                  msg.value()))
                if msg.offset() + 1 >= end[key]:
                    done.add(key)
        if len(done) < len(todo):
            log.warning("state replay incomplete after %.0f s: %s", timeout_s, sorted(set(end) - done))
        return out
    finally:
        consumer.close()


def read_recent(kafka_conf: dict[str, Any], topic: str, window_s: float, now: float,
                timeout_s: float = 30.0) -> list[LogRecord]:
    """Every record of ``topic`` written in the last ``window_s`` (no group)."""
    consumer = Consumer({**kafka_conf, "group.id": "vigil-recovery", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10, "enable.partition.eof": True, "log_level": 3})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        starts = _window_starts(consumer, tps, now - window_s, timeout_s)
        tps = [tp for tp in tps if starts[(topic, tp.partition)] != OFFSET_END]
        if not tps:
            return []
        consumer.assign([TopicPartition(topic, tp.partition, starts[(topic, tp.partition)]) for tp in tps])
        out: list[LogRecord] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(tps) and time.monotonic() < deadline:
            for msg in consumer.consume(5000, timeout=0.2):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                    continue
                kind, ms = msg.timestamp()
                out.append(LogRecord(msg.topic(), msg.partition(), msg.offset(), ms / 1000 if ms > 0 else None,
                                  msg.value()))
        return out
    finally:
        consumer.close()


def _window_starts(consumer: Consumer, tps: list[TopicPartition], since: float,
                   timeout_s: float) -> dict[tuple[str, int], int]:
    """First offset at or after ``since`` per partition (the beginning when unknown)."""
    try:
        found = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, int(since * 1000))
                                            for tp in tps], timeout=timeout_s)
        # -1: nothing written at or after ``since``.
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else OFFSET_END for tp in found}
    except KafkaException as exc:  # a broker without timestamp lookup: read from the start
        log.info("offsets_for_times unavailable (%s); replaying from the beginning", exc)
        return {(tp.topic, tp.partition): OFFSET_BEGINNING for tp in tps}
