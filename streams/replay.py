"""Rebuild the history from the Kafka log: ``vigil replay --from ... --to ...``.

The Kafka log is the source of truth. Replay reads every vigil topic from the
first message published at or after ``since`` up to the last one published
at or before ``until`` (the log's own timestamps), and stores what it reads
through the history sink's code path: the same tables, the same rollups, the
same dead letters. The store drops event ids it already holds, so replaying
into a database that has the events, or replaying twice, adds no row.

It assigns partitions itself (no consumer group membership, nothing
committed), so it never disturbs the running sink's offsets.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

from vigil.schemas import all_topic_names
from vigil.streams.config import StreamConfig
from vigil.streams.history import HistoryStore
from vigil.streams.sink import HistorySink, SinkStats


@dataclass
class ReplayResult:
    partitions: int
    seconds: float
    stats: SinkStats


def replay(config: StreamConfig, store: HistoryStore, since: datetime | None = None, until: datetime | None = None,
           *, batch_size: int = 5000, idle_s: float = 3.0,
           progress: Callable[[SinkStats], None] | None = None) -> ReplayResult:
    """Store the log's events published in [since, until] into ``store``; return what was done."""
    started = time.monotonic()
    sink = HistorySink(config, store, group_id=f"{config.topic_prefix}-replay-{uuid.uuid4().hex[:8]}",
                       batch_size=batch_size, subscribe=False, extra_conf={"enable.partition.eof": True})
    consumer = sink._consumer
    try:
        metadata = consumer.list_topics(timeout=15)
        wanted = set(all_topic_names(config.topic_prefix))
        tps = [TopicPartition(name, p) for name, t in metadata.topics.items() if name in wanted
               for p in t.partitions]
        if since is not None:
            ms = sink.since_ms = int(since.timestamp() * 1000)
            found = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, ms) for tp in tps], timeout=15)
            # No message at or after `since`: nothing to read in that partition.
            start = [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                     for tp in found]
        else:
            start = [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in tps]
        if until is not None:
            sink.until_ms = int(until.timestamp() * 1000)
        consumer.assign(start)
        everything = {(tp.topic, tp.partition) for tp in tps}
        last_message = time.monotonic()
        while True:
            n = sink.poll_once()
            now = time.monotonic()
            if n:
                last_message = now
                if progress is not None:
                    progress(sink.stats)
            done = everything <= (sink.finished | sink.at_end)
            # A partition at its end may still be fed (a broker's end offset can lag):
            # stop once every partition is done and the log has been quiet a moment.
            if (done and now - last_message > 0.5) or now - last_message > idle_s:
                break
    finally:
        sink.close()  # (and its decoding processes)
    return ReplayResult(partitions=len(tps), seconds=time.monotonic() - started, stats=sink.stats)
