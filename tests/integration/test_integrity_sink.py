"""Issue 17 on the real broker and chDB: the history never stalls on a message, dead letters are
small and carry the raw bytes, a topic holds only its own event types, an event without an id is
stored once however often it is delivered.

Each of these failed on the code before the fix (noted per test).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid

from confluent_kafka import Producer

from vigil.schemas import Decision, DeadLetter, Heartbeat, Source, Subject, decode, encode, from_seconds
from vigil.streams.kafka import reader
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for


def beat(node: str, seq: int, t: float | None = None) -> Heartbeat:
    return Heartbeat(event_time=from_seconds(t if t is not None else time.time()), source=Source(node=node), seq=seq,
                     interval_s=1.0)


def count(history, table: str, where: str = "1") -> int:
    return history.query(f"SELECT count() FROM {history.database}.{table} WHERE {where}").rows[0][0]


def test_values_past_64_bits_do_not_stall_the_history(config, history):
    """Old code: a heartbeat with rank 2**64 (and a dead letter with offset 2**70) passed
    validation, ClickHouse refused them and their dead-letter copies, and the sink retried the
    batch forever: nothing after them was stored."""
    producer = Producer(config.kafka_conf())
    bad_beat = json.loads(encode(beat("n-bad", 0)))
    bad_beat["source"]["rank"] = 2**64
    bad_dead = {"event_type": "dead_letter", "version": 1, "event_id": str(uuid.uuid4()),
                "event_time": from_seconds(time.time()).isoformat(), "reason": "x", "detail": "y",
                "source_topic": "t", "source_partition": 0, "source_offset": 2**70, "raw_b64": ""}
    producer.produce(config.topic("heartbeat"), key=b"n-bad", value=json.dumps(bad_beat).encode())
    producer.produce(config.topic("dead_letter"), key=b"t", value=json.dumps(bad_dead).encode())
    later = [beat("n-good", i) for i in range(20)]
    for ev in later:
        producer.produce(config.topic("heartbeat"), key=b"n-good", value=encode(ev))
    producer.flush(10)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-bounds", retry_initial_s=0.05).start()
    try:
        assert wait_for(lambda: count(history, "heartbeats") == 20 and count(history, "dead_letters") == 2, 30), (
            count(history, "heartbeats"), count(history, "dead_letters"), sink.stats)
        assert sink.stats.retries == 0 and sink.alive
    finally:
        sink.stop()
    rows = history.query(f"SELECT reason, field, source_topic FROM {history.database}.dead_letters "
                         "ORDER BY source_topic").rows
    assert sorted(rows) == sorted([("invalid", "source.rank", config.topic("heartbeat")),
                                   ("invalid", "source_offset", config.topic("dead_letter"))])


def test_rows_the_store_refuses_are_isolated_and_dead_lettered_with_its_error(config, history):
    """Real ClickHouse CHECK constraints refuse the rows: three poisoned heartbeats among 300, and
    any dead letter that copies the refused event's node. Old code: the refused events were
    split out, but their dead letters copied the event's source, were refused the same way, and
    the sink retried forever ("the store refuses even a dead letter")."""
    db = history.database
    history._client.command(f"ALTER TABLE {db}.heartbeats ADD CONSTRAINT no_poison CHECK node != 'poison'")
    history._client.command(f"ALTER TABLE {db}.dead_letters ADD CONSTRAINT no_copies CHECK ifNull(node, '') != 'poison'")
    producer = Producer(config.kafka_conf())
    t0 = time.time()
    events = [beat("poison" if i in (7, 150, 299) else f"n{i % 5}", i, t0 + i * 1e-3) for i in range(300)]
    for i in range(0, 300, 30):  # batches of 30, one key
        producer.produce(config.topic("heartbeat"), key=b"k", value=b"[" + b",".join(encode(e) for e in events[i:i + 30]) + b"]")
    producer.flush(10)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-refused", retry_initial_s=0.05).start()
    try:
        assert wait_for(lambda: count(history, "heartbeats") == 297 and count(history, "dead_letters") == 3, 60), (
            count(history, "heartbeats"), count(history, "dead_letters"), sink.stats)
        assert sink.stats.retries == 0 and sink.alive
    finally:
        sink.stop()
    rows = history.query(f"SELECT reason, detail, raw_b64, raw_sha256, raw_size FROM {db}.dead_letters").rows
    poisoned = {str(events[i].event_id) for i in (7, 150, 299)}
    for reason, detail, raw_b64, sha, size in rows:
        assert reason == "store_refused" and "no_poison" in detail, detail
        raw = base64.b64decode(raw_b64)
        [ev] = decode(raw).events
        assert str(ev.event_id) in poisoned and sha == hashlib.sha256(raw).hexdigest() and size == len(raw)


def test_a_5_mb_malformed_message_is_dead_lettered_small_and_the_worker_goes_on(config, worker, history):
    """Old code: the dead letter of a 5 MB message (its bytes base64-encoded, ~7 MB) was too big
    to produce (the faust agent crashed then; the confluent worker raised on produce and died)."""
    garbage = b"{" + os.urandom(5 * 1024 * 1024)
    producer = Producer({**config.kafka_conf(), "message.max.bytes": 16 * 1024 * 1024})
    producer.produce(config.topic("heartbeat"), key=b"big", value=garbage)
    producer.flush(30)
    after = beat("after-big", 1)
    producer.produce(config.topic("heartbeat"), key=b"after-big", value=encode(after))
    producer.flush(10)
    consumer = reader(config.kafka_conf(), [config.topic("dead_letter")])
    dead: list[DeadLetter] = []

    def poll():
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            assert len(msg.value()) < 200_000, len(msg.value())
            dead.extend(e for e in decode(msg.value()).events if isinstance(e, DeadLetter))

    try:
        assert wait_for(lambda: dead, 60, poll), worker.log.read_text()[-3000:]
    finally:
        consumer.close()
    (d,) = dead
    assert d.reason == "not_json" and d.raw_truncated and d.raw_size == len(garbage)
    assert d.raw_sha256 == hashlib.sha256(garbage).hexdigest()
    assert base64.b64decode(d.raw_b64) == garbage[:len(base64.b64decode(d.raw_b64))]
    assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
    # The sink stores it once (the worker's copy and its own are the same record).
    sink = HistorySink(config, history, group_id=f"{config.group_id}-big").start()
    try:
        assert wait_for(lambda: count(history, "dead_letters") == 1 and count(history, "heartbeats") == 1, 60)
    finally:
        sink.stop()


def test_a_decision_on_the_heartbeat_topic_is_dead_lettered_not_stored_as_a_decision(config, history):
    """Old code: a Decision inside a JSON array on telemetry.heartbeats landed in vigil.decisions."""
    d = Decision(event_time=from_seconds(time.time()), decision_id=uuid.uuid4(), idempotency_key="k",
                 action="isolate_node", target=Subject(node="n1"), reason="forged")
    hb = beat("n1", 1)
    producer = Producer(config.kafka_conf())
    producer.produce(config.topic("heartbeat"), key=b"n1",
                     value=json.dumps([json.loads(encode(hb)), json.loads(encode(d))]).encode())
    producer.flush(10)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-types").start()
    try:
        assert wait_for(lambda: count(history, "dead_letters") == 1 and count(history, "heartbeats") == 1, 30)
    finally:
        sink.stop()
    assert count(history, "decisions") == 0
    [(reason, field)] = history.query(f"SELECT reason, field FROM {history.database}.dead_letters").rows
    assert (reason, field) == ("wrong_topic", "event_type")


def test_an_event_without_an_id_is_stored_once_however_often_it_is_delivered(config, history):
    """Old code: a new random id at every decode, so a redelivered message was stored twice."""
    obj = json.loads(encode(beat("no-id", 5)))
    del obj["event_id"]
    producer = Producer(config.kafka_conf())
    for _ in range(3):  # a producer retry, a replay...
        producer.produce(config.topic("heartbeat"), key=b"no-id", value=json.dumps(obj).encode())
    producer.flush(10)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-noid").start()
    try:
        assert wait_for(lambda: sink.stats.messages >= 3, 30)
    finally:
        sink.stop()
    # and a second reader of the whole log (another group: `vigil replay` does the same)
    sink2 = HistorySink(config, history.with_database(history.database), group_id=f"{config.group_id}-noid2").start()
    try:
        assert wait_for(lambda: sink2.stats.messages >= 3, 30)
    finally:
        sink2.stop()
    assert history.query(f"SELECT count(), uniqExact(event_id) FROM {history.database}.heartbeats").rows == [(1, 1)]
