"""A history store that is down or full: the sink retries with backoff, commits no
offsets meanwhile, and loses nothing.

The store is the real chDB-backed HistoryStore behind a wrapper that fails the
first N inserts, as a full disk or a stopped server would.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from vigil.schemas import Heartbeat, Source, encode_batch, from_seconds
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for

FULL = "Code: 243. DB::Exception: Cannot reserve 1.00 MiB, not enough space. (NOT_ENOUGH_SPACE)"
DOWN = "HTTPConnectionPool(host='clickhouse', port=8123): Max retries exceeded (Connection refused)"


class StoreFailingNTimes:
    """The real store, but its first ``n`` inserts fail; ``down`` also fails its health check."""

    def __init__(self, store, n: int, message: str, down: bool) -> None:
        self.store, self.left, self.message, self.down = store, n, message, down
        self.failures = 0
        self.database = store.database

    def insert_events(self, events):
        self._fail_if_due()
        return self.store.insert_events(events)

    def insert_block(self, block):
        self._fail_if_due()
        return self.store.insert_block(block)

    def _fail_if_due(self) -> None:
        if self.left > 0:
            self.left -= 1
            self.failures += 1
            raise RuntimeError(self.message)

    def healthy(self) -> bool:
        return not (self.down and self.left > 0) and self.store.healthy()

    def query(self, *a, **kw):
        return self.store.query(*a, **kw)


def _produce(config, n: int) -> None:
    t0 = time.time()
    events = [Heartbeat(event_time=from_seconds(t0 + i * 0.001), source=Source(node=f"n{i % 13}"), seq=i,
                        interval_s=1.0) for i in range(n)]
    producer = Producer(config.kafka_conf())
    for i in range(0, n, 100):
        producer.produce(config.topic("heartbeat"), key=b"n", value=encode_batch(events[i:i + 100]))
    producer.flush(10)


def _count(history) -> tuple:
    return history.query(f"SELECT count(), uniqExact(event_id) FROM {history.database}.heartbeats").rows[0]


def test_a_full_store_failing_5_inserts_then_recovering_loses_nothing(config, history):
    _produce(config, 1000)
    flaky = StoreFailingNTimes(history, 5, FULL, down=False)
    sink = HistorySink(config, flaky, group_id=f"{config.group_id}-full", retry_initial_s=0.05).start()
    try:
        assert wait_for(lambda: _count(history) == (1000, 1000), 60)
    finally:
        sink.stop()
    assert flaky.failures == 5
    assert sink.stats.dead_letters == 0  # a full store is not a bad event
    assert sum("NOT_ENOUGH_SPACE" in e for e in sink.stats.errors) == 5
    assert _count(history) == (1000, 1000)


def test_a_store_down_keeps_offsets_uncommitted_and_a_restarted_sink_stores_everything(config, history):
    from confluent_kafka import Consumer, TopicPartition

    _produce(config, 1000)
    group = f"{config.group_id}-down"
    down = StoreFailingNTimes(history, 10**9, DOWN, down=True)
    sink = HistorySink(config, down, group_id=group, retry_initial_s=0.05, retry_max_s=0.2).start()
    try:
        assert wait_for(lambda: down.failures >= 4, 60)  # retried, with backoff
    finally:
        sink.stop()
    assert _count(history) == (0, 0) and sink.stats.dead_letters == 0
    probe = Consumer(config.kafka_conf(**{"group.id": group}))
    try:
        committed = probe.committed([TopicPartition(config.topic("heartbeat"), p) for p in range(4)], timeout=10)
    finally:
        probe.close()
    assert all(tp.offset < 0 for tp in committed), committed  # nothing committed while the store was down

    sink2 = HistorySink(config, history, group_id=group).start()  # the store is back
    try:
        assert wait_for(lambda: _count(history) == (1000, 1000), 60)
    finally:
        sink2.stop()
