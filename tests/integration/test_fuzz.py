"""Fuzzing as a test: hypothesis throws garbage and edge-case events at decode -> worker -> sink on the
real stack (tansu, a detection worker process, the history sink, chDB).

The invariant, per message: every item ends stored once or dead-lettered once; the sink never stops
(no retry: the store is healthy) and the worker never dies. What each message must become is the
generator's ground truth (:mod:`vigil.bench.fuzz`), plus arbitrary bytes and JSON from hypothesis
(never an event: every item is dead-lettered). On the code before the fix this failed at once
(the sink stalled on an Int64 overflow, the worker died on a large dead letter, ids without
``event_id`` were stored twice, a decision on a telemetry topic was stored as a decision).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings, strategies as st

from vigil.bench.fuzz import BAD, Expect, FuzzMessage, Generator, account
from vigil.schemas import topic_name
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for

KINDS = ("good", "malformed", "mixed")
#: One clock for every generator: the same seed makes the same events (an id is never reused for another).
NOW = datetime.now(timezone.utc)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def from_hypothesis(value: bytes | None, topic_type: str) -> FuzzMessage:
    """Arbitrary bytes or JSON: never an event; each item of a non-empty array is a dead letter, else one."""
    try:
        parsed = json.loads(value) if value is not None else None
        bad = len(parsed) if isinstance(parsed, list) and parsed else 1
    except (ValueError, RecursionError):
        bad = 1
    return FuzzMessage(topic_type, b"h", value, [Expect(BAD)] * bad, "hypothesis")


message_plans = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(KINDS), st.integers(0, 2**32)),
        st.tuples(st.just("bytes"), st.binary(max_size=300)),
        st.tuples(st.just("json"), json_values),
    ),
    min_size=10, max_size=40)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plans=message_plans, topic_type=st.sampled_from(["heartbeat", "gpu_telemetry", "node_samples", "xid",
                                                        "decision", "dead_letter"]))
def test_every_message_ends_stored_once_or_dead_lettered_once(config, worker, history, plans, topic_type):
    producer = Producer({**config.kafka_conf(), "message.max.bytes": 8 << 20})
    messages: list[FuzzMessage] = []
    for kind, arg in plans:
        if kind == "bytes":
            m = from_hypothesis(arg, topic_type)
        elif kind == "json":
            m = from_hypothesis(json.dumps(arg).encode(), topic_type)
        else:
            gen = Generator(arg, now=NOW)
            m = {"good": gen.good, "malformed": gen.malformed, "mixed": gen.mixed_batch}[kind]()
        messages.append(m)

    def landed(m: FuzzMessage):
        def cb(err, msg):
            assert err is None, err
            m.partition, m.offset = msg.partition(), msg.offset()
        return cb

    for m in messages:
        producer.produce(topic_name(m.topic_type, config.topic_prefix), key=m.key, value=m.value, on_delivery=landed(m))
    assert producer.flush(60) == 0
    sink = HistorySink(config, history, group_id=f"{config.group_id}-fuzz", retry_initial_s=0.05).start()
    try:
        query = lambda sql: history.query(sql).rows  # noqa: E731
        verdict = {}

        def settled() -> bool:
            verdict.update(account(query, history.database, messages, config.topic_prefix))
            return verdict["lost"] == 0

        assert wait_for(settled, 120), verdict
        assert verdict["duplicated"] == 0, verdict
        assert sink.alive and sink.stats.retries == 0, sink.stats
        assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
    finally:
        sink.stop()
