"""Where a worker's replay of the log starts: the first offset written in the recovery window.

The Kafka log is the source of truth. A worker that takes over a partition
reads its recent past (the window) up to the group's committed offset to
rebuild detector and incident state, then goes on live from there
(:mod:`vigil.streams.worker`). Findings, incidents and alerts carry ids
derived from their content, so what the replay derives again is recognised,
not published twice.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition

log = logging.getLogger(__name__)

__all__ = ["window_starts"]


def window_starts(consumer: Any, tps: list[TopicPartition], since: float,
                  timeout_s: float) -> dict[tuple[str, int], int]:
    """First offset at or after ``since`` (seconds) per partition; ``OFFSET_END`` when nothing was
    written since then, ``OFFSET_BEGINNING`` when the broker cannot look offsets up by time."""
    if not tps:
        return {}
    try:
        found = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, int(since * 1000))
                                            for tp in tps], timeout=timeout_s)
        # -1: nothing written at or after ``since``.
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else OFFSET_END for tp in found}
    except KafkaException as exc:  # a broker without timestamp lookup: read from the start
        log.info("offsets_for_times unavailable (%s); replaying from the beginning", exc)
        return {(tp.topic, tp.partition): OFFSET_BEGINNING for tp in tps}
