"""The sink stores every event once, even when Kafka redelivers it."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from vigil.schemas import Heartbeat, Source, encode, encode_batch, from_seconds, message_key
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for


def test_duplicates_and_redelivery_are_stored_once(config, history):
    t0 = time.time()
    events = [Heartbeat(event_time=from_seconds(t0 + i * 0.01), source=Source(node=f"n{i % 7}"), seq=i,
                        interval_s=1.0) for i in range(300)]
    producer = Producer(config.kafka_conf())
    topic = config.topic("heartbeat")
    for e in events[:200]:
        producer.produce(topic, key=message_key(e), value=encode(e))
    producer.produce(topic, key=b"n", value=encode_batch(events[200:]))  # a batch message
    for e in events[:50]:  # a producer retry resends some
        producer.produce(topic, key=message_key(e), value=encode(e))
    producer.flush(10)

    count_sql = f"SELECT count(), uniqExact(event_id) FROM {history.database}.heartbeats"
    sink = HistorySink(config, history, group_id=f"{config.group_id}-a").start()
    try:
        assert wait_for(lambda: sink.stats.messages >= 251, 30)
    finally:
        sink.stop()
    assert history.query(count_sql).rows == [(300, 300)]

    # A second consumer group re-reads the whole log: full redelivery, no new rows.
    sink2 = HistorySink(config, history.with_database(history.database), group_id=f"{config.group_id}-b").start()
    try:
        assert wait_for(lambda: sink2.stats.messages >= 251, 30)
    finally:
        sink2.stop()
    assert history.query(count_sql).rows == [(300, 300)]
    assert sink2.stats.stored == 0


def test_migrate_is_idempotent(history):
    history.migrate()
    history.migrate()
    tables = {r[0] for r in history.query(f"SHOW TABLES FROM {history.database}").rows}
    assert {"alerts", "heartbeats", "iterations", "dead_letters", "decisions", "actions"} <= tables


def test_a_batch_clickhouse_refuses_whole_is_split_and_stored(config, history):
    """ClickHouse refuses an insert touching more than 100 partitions (months);
    the sink splits the batch rather than retrying it forever."""
    from datetime import datetime, timezone

    events = [Heartbeat(event_time=datetime(1990 + i // 12, 1 + i % 12, 15, tzinfo=timezone.utc),
                        source=Source(node="old"), seq=i, interval_s=1.0) for i in range(150)]
    producer = Producer(config.kafka_conf())
    producer.produce(config.topic("heartbeat"), key=b"old", value=encode_batch(events))
    producer.flush(10)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-split").start()
    try:
        assert wait_for(lambda: sink.stats.messages >= 1, 30)
    finally:
        sink.stop()
    assert sink.alive is False and sink.failure is None
    assert history.query(f"SELECT count(), uniqExact(event_id) FROM {history.database}.heartbeats").rows == [(150, 150)]
