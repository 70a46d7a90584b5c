"""The publisher against a broker that goes away: spool, replay, exactly once by event id.

A separate tansu broker runs on a fixed port so it can be stopped and started
again on the same address. tansu keeps its log in memory, so a restart loses
the topics (they are recreated) and the messages delivered before the outage
(they are read before it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

import vigil.producers.publisher as publisher_mod
from vigil.producers.publisher import Publisher
from vigil.producers.spool import Spool, SpoolRecord
from vigil.schemas import Heartbeat, Source, decode, encode, message_key
from vigil.schemas.envelope import utcnow
from vigil.schemas.events import EventsDropped
from vigil.streams.kafka import ensure_topics, reader, rewind_shrunk
from tests.integration.conftest import wait_for
from vigil.broker import TansuBroker, find_tansu, free_port


class RestartableBroker:
    """tansu on one fixed port, stopped and started again on it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.broker: TansuBroker | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, monkeypatch) -> None:
        self.broker = TansuBroker(find_tansu(None), port=self.port).start()

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


@pytest.fixture
def own_broker(monkeypatch):
    b = RestartableBroker()
    b.start(monkeypatch)
    try:
        yield b
    finally:
        b.stop()


def heartbeats(n: int, start: int) -> list[Heartbeat]:
    return [Heartbeat(event_time=utcnow(), source=Source(node=f"node-{i % 3}"), seq=start + i, interval_s=1.0)
            for i in range(n)]


class Downstream:
    """Reads topics from the beginning and counts every event id it sees."""

    def __init__(self, conf, topics) -> None:
        self.consumer = reader(conf, topics)
        self.ids: Counter = Counter()
        self.events: list = []

    def read(self) -> None:
        for msg in self.consumer.consume(1000, 0.1):
            if msg.error() is None:
                for e in decode(msg.value()).events:
                    self.ids[e.event_id] += 1
                    self.events.append(e)

    def close(self) -> None:
        self.consumer.close()


def test_broker_down_spooled_broker_up_every_event_exactly_once(own_broker, monkeypatch, tmp_path):
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"spool-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    topic = f"{prefix}.telemetry.heartbeats"
    pub = Publisher(conf, prefix, spool_dir=tmp_path / "spool", message_timeout_ms=5000, probe_interval_s=0.2)
    sent = []

    # 1. broker up: delivered directly, read downstream before the outage
    for hb in heartbeats(200, 0):
        pub.publish([hb])
        sent.append(hb.event_id)
    assert pub.flush(10) == 0
    before = Downstream(conf, [topic])
    assert wait_for(lambda: sum(before.ids.values()) >= 200, 15, before.read)
    before.close()

    # 2. broker down: everything published now lands in the spool
    own_broker.stop()
    for i, hb in enumerate(heartbeats(300, 200)):
        pub.publish([hb])
        sent.append(hb.event_id)
        if i % 50 == 0:
            pub.poll(0)
    assert wait_for(lambda: pub.spooling, 10, lambda: pub.poll(0.05))
    pub.poll(0)
    assert pub.spool is not None and len(pub.spool) >= 299  # (one may still have been in librdkafka's hands)
    assert (tmp_path / "spool").is_dir() and any(p.name.startswith("seg-") for p in (tmp_path / "spool").iterdir())

    # 3. broker back (empty: tansu is in-memory), topics recreated, spool replayed
    own_broker.start(monkeypatch)
    ensure_topics(conf, prefix)
    assert pub.flush(30) == 0
    assert not pub.spooling and pub.spool.empty
    after = Downstream(conf, [topic])
    assert wait_for(lambda: len(after.ids) >= 300, 20, after.read)
    after.read()
    after.close()

    seen = before.ids + after.ids
    assert set(seen) == set(sent), f"missing {len(set(sent) - set(seen))}, unexpected {len(set(seen) - set(sent))}"
    assert len(seen) == 500  # every event exactly once, counted by id
    # Replayed in order: the heartbeats of one node arrive in publication order.
    for node in ("node-0", "node-1", "node-2"):
        seqs = [e.seq for e in after.events if e.source.node == node]
        assert seqs == sorted(seqs)
    pub.close()


def test_publish_then_poll_loop_notices_the_broker_is_back(own_broker, monkeypatch, tmp_path):
    """The node agent's loop: publish a few events, poll(0), again and again, never flush.

    publish() must not take the probe slot it does not use, or poll() right
    after it never finds a probe due and the spool waits for luck (~20 s).
    """
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"spool-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    pub = Publisher(conf, prefix, spool_dir=tmp_path / "spool", message_timeout_ms=5000, probe_interval_s=0.2)
    sent = []

    def loop() -> None:
        for hb in heartbeats(3, len(sent)):
            pub.publish([hb])
            sent.append(hb.event_id)
        pub.poll(0)

    def looping(condition):
        return lambda: (loop(), condition())[1]  # wait_for's pace: one round per try

    own_broker.stop()
    assert wait_for(looping(lambda: pub.spooling), 10)
    own_broker.start(monkeypatch)
    ensure_topics(conf, prefix)
    back = time.monotonic()
    assert wait_for(looping(lambda: not pub.spooling), 10), f"still spooling {time.monotonic() - back:.1f} s later"
    assert pub.flush(10) == 0
    down = Downstream(conf, [f"{prefix}.telemetry.heartbeats"])
    assert wait_for(lambda: set(sent) <= set(down.ids), 15, down.read), f"missing {len(set(sent) - set(down.ids))}"
    down.close()
    pub.close()


def test_full_spool_drops_oldest_and_publishes_how_many(own_broker, monkeypatch, tmp_path):
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"spool-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    pub = Publisher(conf, prefix, spool_dir=tmp_path / "spool", spool_max_bytes=64 << 10,
                    message_timeout_ms=5000, probe_interval_s=0.2, source=Source(node="node-x"))
    own_broker.stop()
    sent = []
    for hb in heartbeats(2000, 0):  # ~2000 x 250 bytes: far more than 64 KiB
        pub.publish([hb])
        sent.append(hb.event_id)
    assert wait_for(lambda: pub.spooling, 10, lambda: pub.poll(0.05))
    pub.poll(0)
    assert pub.stats.dropped_events > 0
    own_broker.start(monkeypatch)
    ensure_topics(conf, prefix)
    assert pub.flush(30) == 0
    down = Downstream(conf, [f"{prefix}.telemetry.heartbeats", f"{prefix}.telemetry.dropped"])
    expected_total = len(sent)

    def complete() -> bool:
        drops = [e for e in down.events if isinstance(e, EventsDropped)]
        hbs = [e for e in down.events if isinstance(e, Heartbeat)]
        return len(hbs) + sum(d.count for d in drops) >= expected_total

    assert wait_for(complete, 20, down.read)
    down.close()
    drops = [e for e in down.events if isinstance(e, EventsDropped)]
    hbs = [e for e in down.events if isinstance(e, Heartbeat)]
    # Never silent: what was not delivered is exactly what the drop records count.
    assert len(hbs) + sum(d.count for d in drops) == expected_total
    assert all(d.reason == "spool_full" and d.source.node == "node-x" for d in drops)
    assert sum(d.by_type.get("heartbeat", 0) for d in drops) == sum(d.count for d in drops)
    # Oldest first: the survivors are the newest events, each node's in order.
    assert sorted(e.seq for e in hbs) == list(range(expected_total - len(hbs), expected_total))
    for node in ("node-0", "node-1", "node-2"):
        seqs = [e.seq for e in hbs if e.source.node == node]
        assert seqs == sorted(seqs)
    assert len(set(e.event_id for e in hbs)) == len(hbs)
    pub.close()


def test_agent_paced_publisher_leaves_spooling_after_a_broker_restart(own_broker, monkeypatch, tmp_path):
    """A node agent's pace (one event, then ``poll(0)``, every 50 ms) through a broker restart.

    The restarted tansu has forgotten the idempotent producer's id: the first
    replayed chunk fails with the fatal UNKNOWN_PRODUCER_ID and the producer is
    recreated. The spool then takes several chunks to replay (a long outage:
    more than ``replay_chunk`` messages), each started by a publish before that
    publish's own event is spooled. The publisher must still leave spooling
    mode for good, not chase the tail of its own spool one message behind at
    every publish, and every event published before, during and after the
    outage must be on the topic.
    """
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"spool-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    topic = f"{prefix}.telemetry.heartbeats"
    pub = Publisher(conf, prefix, linger_ms=0, spool_dir=tmp_path / "spool", message_timeout_ms=1000,
                    probe_interval_s=0.2, replay_chunk=5)
    sent: list = []
    pace = {"next": time.monotonic()}

    def step() -> None:
        """One turn of the agent's loop, at its pace."""
        wait = pace["next"] - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the agent's cadence, not a wait for a condition
        pace["next"] = max(pace["next"] + 0.05, time.monotonic())
        hb = heartbeats(1, len(sent))[0]
        pub.publish([hb])
        sent.append(hb.event_id)
        pub.poll(0)

    try:
        # 1. broker up: delivered directly, read downstream before tansu forgets it
        assert wait_for(lambda: len(sent) >= 20, 10, step)
        assert pub.flush(10) == 0 and not pub.spooling
        n_before = len(sent)
        before = Downstream(conf, [topic])
        assert wait_for(lambda: set(sent) <= set(before.ids), 15, before.read)
        before.close()

        # 2. broker down: the agent goes on; its publisher spools
        own_broker.stop()
        assert wait_for(lambda: pub.spooling, 15, step)
        spooled_at = len(sent)
        assert wait_for(lambda: len(sent) >= spooled_at + 20, 10, step)
        assert pub.spooling and pub.spool is not None and not pub.spool.empty

        # 3. a new, empty broker on the same address: the publisher must go online again and stay so
        own_broker.start(monkeypatch)
        ensure_topics(conf, prefix)
        back = time.monotonic()
        assert wait_for(lambda: not pub.spooling, 15, step), (
            f"still spooling {time.monotonic() - back:.1f} s after the broker came back: {pub.stats}, "
            f"{len(pub.spool)} spooled, last error {pub.last_error}")
        for _ in range(20):
            step()
            assert not pub.spooling, f"spooling again: {pub.stats}, last error {pub.last_error}"
        assert pub.stats.replayed > 0
        assert pub.flush(10) == 0 and pub.spool.empty

        # 4. every event is on the topic: before the restart, or on the new broker
        after = Downstream(conf, [topic])
        assert wait_for(lambda: set(sent[n_before:]) <= set(after.ids), 20, after.read), \
            f"missing {len(set(sent[n_before:]) - set(after.ids))} of {len(sent) - n_before}"
        after.read()
        after.close()
        seen = before.ids + after.ids
        assert set(seen) == set(sent), f"missing {len(set(sent) - set(seen))}, unexpected {len(set(seen) - set(sent))}"
        # Only a message whose delivery was uncertain (sent, then timed out or purged in flight) may be
        # written twice (downstream deduplicates by event id): no more copies than the publisher counted.
        copies = sum(n - 1 for n in seen.values() if n > 1)
        assert copies <= pub.stats.uncertain, f"{copies} extra copies, {pub.stats.uncertain} uncertain: {pub.stats}"
    finally:
        pub.close(timeout_s=1)


def test_a_producer_the_restarted_broker_keeps_refusing_is_recreated(own_broker, monkeypatch, tmp_path):
    """The refusal path of ``tests/unit/test_publisher_replay.py`` (``fence_after_restart``) on the real broker.

    tansu has no transactions and never answers PRODUCER_FENCED to librdkafka's
    idempotent producer. What it does instead, measured here: after a restart
    it does not know the producer id, librdkafka bumps the epoch (InitProducerId
    with the old id: accepted), and every produce is refused again with
    UNKNOWN_PRODUCER_ID, until ``message.timeout.ms`` fails the messages with a
    non-fatal ``_MSG_TIMED_OUT`` while the broker answers metadata throughout.
    librdkafka takes that non-fatal path only when the producer has no gap in
    its sequence (nothing purged or lost); a publisher that spooled during the
    outage has purged messages from librdkafka, so its replay gets the fatal
    UNKNOWN_PRODUCER_ID instead (the test above). A clean producer meets a
    restarted broker when an agent starts with a spool left by an earlier run
    and the broker restarts before the first replay: that is this test.
    """
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"spool-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    topic = f"{prefix}.telemetry.heartbeats"
    # A spool left by an earlier run: 12 heartbeats never delivered.
    left = heartbeats(12, 0)
    earlier = Spool(tmp_path / "spool")
    for hb in left:
        earlier.append(SpoolRecord(topic, message_key(hb), encode(hb), 1, "heartbeat"))
    earlier.close()

    real_producer = publisher_mod.Producer
    producers: list = []
    eos: dict[int, dict] = {}  # producer index -> its last idempotence statistics

    def make(producer_conf):
        i = len(producers)

        def stats(raw: str, i: int = i) -> None:
            eos[i] = json.loads(raw)["eos"]

        p = real_producer({**producer_conf, "statistics.interval.ms": 100, "stats_cb": stats})
        producers.append(p)
        return p

    recreated_on: list = []
    recreate = Publisher._recreate

    def spy(self) -> None:
        recreated_on.append(self.last_error)
        recreate(self)

    monkeypatch.setattr(publisher_mod, "Producer", make)
    monkeypatch.setattr(Publisher, "_recreate", spy)
    # enable.sparse.connections off: the producer connects at once and gets its producer id from
    # this broker before the restart (librdkafka otherwise connects only when it has something to send).
    pub = Publisher({**conf, "enable.sparse.connections": False}, prefix, linger_ms=0, spool_dir=tmp_path / "spool",
                    message_timeout_ms=1500, probe_interval_s=0.2, replay_chunk=5)
    try:
        assert pub.spooling and len(pub.spool) == 12
        sent = [hb.event_id for hb in left]
        pace = {"next": time.monotonic()}

        def step() -> None:
            """One turn of an agent's loop at its pace: publish() spools and serves callbacks, never probes."""
            wait = pace["next"] - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the agent's cadence, not a wait for a condition
            pace["next"] = max(pace["next"] + 0.05, time.monotonic())
            hb = heartbeats(1, len(sent))[0]
            pub.publish([hb])
            sent.append(hb.event_id)

        assert wait_for(lambda: eos.get(0, {}).get("idemp_state") == "Assigned", 10, step), eos
        first_id = eos[0]["producer_id"]
        assert eos[0]["producer_epoch"] == 0 and pub.stats.replayed == 0 and len(pub.spool) == len(sent)

        # The broker restarts (empty: tansu is in-memory) before the first replay.
        own_broker.stop()
        own_broker.start(monkeypatch)
        ensure_topics(conf, prefix)
        assert wait_for(lambda: not pub.spooling and pub.spool.empty, 30, lambda: pub.poll(0.05)), (
            f"still spooling: {pub.stats}, last error {pub.last_error}, recreated on {recreated_on}")

        # The old producer's replay was refused without a fatal error, and it was recreated.
        assert len(producers) == 2, recreated_on
        [err] = recreated_on
        assert err.code() == KafkaError._MSG_TIMED_OUT and not err.fatal(), err
        assert eos[0]["producer_id"] == first_id and eos[0]["producer_epoch"] > 0  # bumped, and still refused
        assert all(e is not None and e.code() != KafkaError.PRODUCER_FENCED for e in recreated_on)
        assert pub.flush(10) == 0

        # Every spooled event is on the restarted broker, exactly once (refused sends wrote nothing).
        down = Downstream(conf, [topic])
        assert wait_for(lambda: set(sent) <= set(down.ids), 20, down.read), \
            f"missing {len(set(sent) - set(down.ids))} of {len(sent)}"
        down.read()
        down.close()
        assert sum(down.ids.values()) == len(sent) and set(down.ids) == set(sent)
    finally:
        pub.close(timeout_s=1)


def test_a_reader_past_the_end_of_a_log_that_restarted_empty_reads_it_from_its_start(own_broker, monkeypatch):
    """The worker's broadcast reader across a broker that lost its log (tansu keeps it in memory).

    A consumer that had read 10 messages sits at offset 10; the new log has 3. Kafka would answer
    OFFSET_OUT_OF_RANGE; tansu answers nothing, so without ``rewind_shrunk`` the 3 new messages
    (a node's ``leaving``, say) would be read only once the log grew past 10 again.
    """
    conf = {"bootstrap.servers": own_broker.bootstrap}
    prefix = f"shrunk-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, prefix)
    topic = f"{prefix}.telemetry.heartbeats"
    pub = Publisher(conf, prefix, linger_ms=0)
    for hb in heartbeats(10, 0):
        pub.publish([hb])
    assert pub.flush(10) == 0
    down = Downstream(conf, [topic])
    try:
        assert wait_for(lambda: len(down.ids) == 10, 15, down.read)
        pub.close(timeout_s=1)
        own_broker.stop()
        own_broker.start(monkeypatch)
        ensure_topics(conf, prefix)
        pub = Publisher(conf, prefix, linger_ms=0)
        new = heartbeats(3, 10)
        for hb in new:
            pub.publish([hb])
        assert pub.flush(10) == 0
        rewound: list = []

        def read() -> None:
            rewound.extend(rewind_shrunk(down.consumer))
            down.read()

        assert wait_for(lambda: {hb.event_id for hb in new} <= set(down.ids), 15, read), \
            f"read {len(down.ids)} events; rewound {rewound}"
        assert [(tp.topic, tp.offset) for tp in rewound] == [(topic, OFFSET_BEGINNING)] * len(rewound) and rewound
    finally:
        pub.close(timeout_s=1)
        down.consumer.close()
