"""A node's GPU samples in columns, from the agent's NVML collector (stub NVML: no GPU here) through the real
broker into the history: one row per GPU in gpu_telemetry, as the per-GPU events of an older agent are stored
beside them, each once however often the message comes."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from vigil.producers.agent import NvmlTelemetryCollector
from vigil.schemas import GpuSamples, GpuTelemetry, Heartbeat, Source, encode, encode_batch, from_seconds
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for
from tests.unit.test_agent_nvml_stub import StubNvml

T0 = 1_800_000_000.0


def test_stub_nvml_columns_are_stored_one_row_per_gpu_beside_per_gpu_events(config, history):
    col = NvmlTelemetryCollector(10, Source(cluster="c", node="new-agent"), nvml=StubNvml())
    samples = [col.collect(from_seconds(T0 + i))[0] for i in range(3)]
    assert all(isinstance(s, GpuSamples) and s.gpus == [0, 1] for s in samples)
    beat = Heartbeat(event_time=from_seconds(T0), source=Source(cluster="c", node="new-agent"), seq=0, interval_s=10.0)
    old = [GpuTelemetry(event_time=from_seconds(T0 + i), source=Source(cluster="c", node="old-agent", gpu=g),
                        temperature_c=60.0 + g) for i in range(3) for g in range(8)]
    bad_mix = encode_batch([GpuSamples(event_time=from_seconds(T0), source=Source(cluster="c", node="mixed"),
                                       gpus=[0, 1, 2], sm_clock_mhz=[1980.0, 1975.0, None])])[:-1] + b',{"bad":1}]'
    producer = Producer(config.kafka_conf())
    node_topic, gpu_topic = config.topic("node_samples"), config.topic("gpu_telemetry")
    producer.produce(node_topic, key=b"new-agent", value=encode_batch([beat, samples[0]]))
    producer.produce(gpu_topic, key=b"new-agent", value=encode_batch(samples[1:]))
    producer.produce(gpu_topic, key=b"new-agent", value=encode(samples[2]))  # redelivered: stored once
    producer.produce(gpu_topic, key=b"old-agent", value=encode_batch(old))
    producer.produce(node_topic, key=b"mixed", value=bad_mix)  # one bad item: the careful path stores the rest
    producer.flush(10)

    sink = HistorySink(config, history, group_id=f"{config.group_id}-sink", decode_processes=0).start()
    try:
        assert wait_for(lambda: sink.stats.messages >= 5, 60)
    finally:
        sink.stop()
    db = history.database
    rows = history.query(f"SELECT node, gpu, count(), uniqExact(event_id), any(event_type) FROM {db}.gpu_telemetry "
                         f"GROUP BY node, gpu ORDER BY node, gpu").rows
    assert rows == [("mixed", g, 1, 1, "gpu_telemetry") for g in range(3)] + \
        [("new-agent", g, 3, 3, "gpu_telemetry") for g in range(2)] + \
        [("old-agent", g, 3, 3, "gpu_telemetry") for g in range(8)]
    # the stub's readings, per GPU, as the per-GPU events held them
    got = history.query(f"SELECT gpu, temperature_c, sm_clock_mhz, power_w, ecc_sbe, ecc_dbe, retired_pages, "
                        f"remapped_rows, nvlink_errors FROM {db}.gpu_telemetry WHERE node = 'new-agent' "
                        f"ORDER BY event_time, gpu LIMIT 2").rows
    want = [(t.source.gpu, t.temperature_c, t.sm_clock_mhz, t.power_w, t.ecc_sbe, t.ecc_dbe, t.retired_pages,
             t.remapped_rows, t.nvlink_errors) for t in samples[0].telemetry()]
    assert [r[:-1] for r in got] == [w[:-1] for w in want]
    assert [json.loads(r[-1]) for r in got] == [w[-1] for w in want]
    assert history.query(f"SELECT count() FROM {db}.dead_letters").rows == [(1,)]  # the bad item alone
