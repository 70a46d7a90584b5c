"""Malformed messages go to the dead-letter topic with reason, origin and raw
bytes; the worker keeps processing the good events that follow."""

from __future__ import annotations

import base64
import json
import time

from confluent_kafka import Producer

from vigil.schemas import Alert, DeadLetter, Heartbeat, Source, decode, encode, from_seconds
from vigil.streams.kafka import reader
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for


def heartbeat(node: str, seq: int) -> Heartbeat:
    return Heartbeat(event_time=from_seconds(time.time()), source=Source(node=node), seq=seq, interval_s=0.2)


def produce_and_locate(producer: Producer, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
    where = {}
    producer.produce(topic, key=key, value=value,
                     on_delivery=lambda err, msg: where.update(p=msg.partition(), o=msg.offset(), err=err))
    producer.flush(10)
    assert where.get("err") is None
    return where["p"], where["o"]


def test_each_kind_of_bad_input_is_dead_lettered_and_processing_continues(config, worker, history):
    topic = config.topic("heartbeat")
    good = json.loads(encode(heartbeat("good-node", 0)))
    bad_inputs = {
        "not_json": b"\x00\x01 definitely not json",
        "unknown_event_type": json.dumps({**good, "event_type": "heartbeet"}).encode(),
        "unsupported_version": json.dumps({**good, "version": 99}).encode(),
        "invalid:seq": json.dumps({k: v for k, v in good.items() if k != "seq"}).encode(),  # missing field
        "invalid:interval_s": json.dumps({**good, "interval_s": "fast"}).encode(),  # wrong type
        "invalid:event_time": json.dumps({**good, "event_time": "yesterday"}).encode(),
        # valid, but stamped a year ahead: refused by the detectors, still stored by the history
        "refused": json.dumps({**good, "event_id": "00000000-0000-0000-0000-0000000000ff",
                               "source": {"node": "skewed-node"},
                               "event_time": f"{time.gmtime().tm_year + 1}-01-01T00:00:00Z"}).encode(),
    }
    producer = Producer(config.kafka_conf())
    sent = {}
    for label, raw in bad_inputs.items():
        sent[label] = (raw, *produce_and_locate(producer, topic, b"bad", raw))
    # a batch with one bad item among good ones
    batch = [json.loads(encode(heartbeat("batch-node", i))) for i in range(3)]
    batch.insert(1, {**batch[0], "event_id": "00000000-0000-0000-0000-000000000001", "seq": -1})
    batch_raw = json.dumps(batch).encode()
    _, batch_p, batch_o = (None, *produce_and_locate(producer, topic, b"batch-node", batch_raw))

    # good events after the bad ones: a node that then falls silent must be reported lost
    for seq in range(5):
        hb = heartbeat("good-node", seq)
        produce_and_locate(producer, topic, b"good-node", encode(hb))

    consumer = reader(config.kafka_conf(), [config.topic("dead_letter"), config.topic("alert")])
    dead: list[DeadLetter] = []
    alerts: list[Alert] = []

    def poll():
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            for ev in decode(msg.value()).events:
                (dead if isinstance(ev, DeadLetter) else alerts).append(ev)

    lost = lambda: any(a.kind == "node_lost" and a.subject.node == "good-node" for a in alerts)
    assert wait_for(lambda: len(dead) >= len(bad_inputs) + 1 and lost(), 30, poll), (dead, alerts)
    consumer.close()

    by_origin = {(d.source_partition, d.source_offset): d for d in dead}
    for label, (raw, partition, offset) in sent.items():
        d = by_origin[(partition, offset)]
        reason, _, fieldname = label.partition(":")
        assert d.reason == reason, (label, d)
        assert d.source_topic == topic
        assert base64.b64decode(d.raw_b64) == raw
        if fieldname:
            assert d.field == fieldname
    batch_dead = by_origin[(batch_p, batch_o)]
    assert batch_dead.reason == "invalid" and json.loads(base64.b64decode(batch_dead.raw_b64))["seq"] == -1

    # The history sink stores the same dead letters once each, and the good heartbeats.
    sink = HistorySink(config, history, group_id=f"{config.group_id}-sink").start()
    try:
        def dead_letters():
            return history.query(f"SELECT count() FROM {history.database}.dead_letters").rows[0][0]

        def heartbeats():
            return history.query(f"SELECT node, count() FROM {history.database}.heartbeats "
                                 "GROUP BY node ORDER BY node").rows

        # (Clean messages and bad ones are stored by separate inserts: wait for both.)
        expected = [("batch-node", 3), ("good-node", 5), ("skewed-node", 1)]
        assert wait_for(lambda: dead_letters() == len(bad_inputs) + 1 and heartbeats() == expected, 30), \
            (dead_letters(), heartbeats())
    finally:
        sink.stop()
