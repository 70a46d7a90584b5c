"""A large backlog is decoded by the sink's pool of processes, and loses nothing:
bad messages are dead-lettered, redelivered ids are stored once, and a value the
store cannot hold is refused alone (when decoded: schema bounds) while its neighbours are stored."""

from __future__ import annotations

import json
import time

from confluent_kafka import Producer

import vigil.streams.sink as sink_module
from vigil.schemas import Heartbeat, Source, encode_batch, from_seconds
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for


def test_a_backlog_decoded_by_the_pool_is_stored_once_with_bad_input_dead_lettered(config, history, monkeypatch):
    # Chunks of ~64 KB: the backlog spans many chunks, so repeats cross chunk boundaries.
    monkeypatch.setattr(sink_module, "CHUNK_BYTES", 64 << 10)
    t0 = time.time()
    beats = [Heartbeat(event_time=from_seconds(t0 + i * 1e-3), source=Source(node=f"n{i % 16}"), seq=i,
                       interval_s=1.0) for i in range(12_000)]
    messages = [encode_batch(beats[i:i + 200]) for i in range(0, len(beats), 200)]
    messages.insert(7, messages[2])  # redelivered: every id again, two chunks later
    messages.insert(30, b"{not json")
    with_bad_item = [json.loads(m) for m in [encode_batch(beats[:2])]][0]
    with_bad_item[1] = {**with_bad_item[1], "event_id": "00000000-0000-0000-0000-0000000000b1", "seq": -5}
    messages.insert(40, json.dumps(with_bad_item).encode())
    too_big = json.loads(encode_batch([Heartbeat(event_time=from_seconds(t0), source=Source(node="n99"), seq=1,
                                                 interval_s=1.0)]))
    too_big[0]["seq"] = 2 ** 70  # past what the Int64 column holds: refused by the schema's bounds
    messages.insert(50, json.dumps(too_big).encode())
    assert sum(map(len, messages)) > sink_module.POOL_MIN_BYTES  # (else the sink decodes in its own thread)

    producer = Producer(config.kafka_conf(**{"linger.ms": 20}))
    for value in messages:
        producer.produce(config.topic("heartbeat"), key=b"n", value=value)
    producer.flush(30)

    sink = HistorySink(config, history, group_id=f"{config.group_id}-pool", batch_size=10_000,
                       decode_processes=2).start()
    try:
        assert wait_for(lambda: sink.stats.messages >= len(messages), 120), sink.stats
    finally:
        sink.stop(30)
    assert sink.failure is None
    assert sink.stats.pooled_chunks > 1 and sink.decode_processes == 2, sink.stats  # the pool did the work
    db = history.database
    assert history.query(f"SELECT count(), uniqExact(event_id), min(seq), max(seq) FROM {db}.heartbeats").rows \
        == [(12_000, 12_000, 0, 11_999)]
    reasons = sorted(r[0] for r in history.query(f"SELECT reason FROM {db}.dead_letters").rows)
    assert reasons == ["invalid", "invalid", "not_json"], reasons
    assert sink.alive is False and sink._pool is None  # its processes are gone with it
