"""The publisher's outage logic against a scripted producer: leaving spooling mode after a broker restart.

The fake producer keeps librdkafka's contract as the publisher uses it, on a
clock the test advances: a message is confirmed (its delivery callback runs in
``poll``) a round trip after it was produced, never in the ``poll(0)`` that
follows its ``produce`` at once; while the broker is down it fails after the
message timeout. A broker restart forgets the idempotent producer's id: the
old producer's next send fails with the fatal UNKNOWN_PRODUCER_ID, or (when
the broker is told to) is refused for good without a fatal error. Both paths
are checked against the real broker (tansu) in
``tests/integration/test_publisher_spool.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

import vigil.producers.publisher as publisher_mod
from vigil.producers.publisher import Publisher
from vigil.producers.spool import SpoolRecord

TOPIC = "t.telemetry.heartbeats"
ROUND_TRIP_S = 0.01
MESSAGE_TIMEOUT_S = 0.3
STEP_S = 0.05  # the agent's loop: one message, then poll(0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBroker:
    """What was written, in order; restarts forget producer ids (``generation``)."""

    def __init__(self) -> None:
        self.up = True
        self.generation = 1
        self.written: list[bytes] = []
        #: None, or how the restarted broker refuses a producer it does not know, non-fatally and for good:
        #: PRODUCER_FENCED at once (a Kafka broker fencing the epoch), or _MSG_TIMED_OUT when the message
        #: times out (tansu: it accepts librdkafka's epoch bump, then answers every send UNKNOWN_PRODUCER_ID,
        #: which librdkafka retries until the timeout; measured in the integration test named above)
        self.refuse_after_restart: int | None = None

    def restart(self) -> None:
        self.up = True
        self.generation += 1


class FakeProducer:
    def __init__(self, broker: FakeBroker, clock: Clock) -> None:
        self.broker, self.clock = broker, clock
        self.queue: list[list] = []  # [due, value, callback, error or None]
        self.generation: int | None = None  # the producer id's broker generation
        self.fatal = False
        self.refused: int | None = None  # the code it is refused with, once refused
        self.raise_next: KafkaError | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def produce(self, topic, key=None, value=None, on_delivery=None) -> None:
        if self.fatal:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fatal state", fatal=True))
        self.queue.append([self.clock() + ROUND_TRIP_S, value, on_delivery, None])

    def _settle(self) -> None:
        now = self.clock()
        for item in self.queue:
            due, value, _cb, err = item
            if err is not None or now < due:
                continue
            if not self.broker.up:
                if now >= due - ROUND_TRIP_S + MESSAGE_TIMEOUT_S:
                    item[3] = KafkaError(KafkaError._MSG_TIMED_OUT)
                continue
            if self.generation is None:
                self.generation = self.broker.generation
            if self.refused is None and self.generation != self.broker.generation:
                self.refused = self.broker.refuse_after_restart
            if self.refused is not None:
                if self.refused != KafkaError._MSG_TIMED_OUT or now >= due - ROUND_TRIP_S + MESSAGE_TIMEOUT_S:
                    item[3] = KafkaError(self.refused)
                continue
            if self.generation != self.broker.generation:
                self.fatal = True
                self.raise_next = KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "unable to retry without risking "
                                             "duplication/reordering", fatal=True)
                for other in self.queue:
                    if other[3] is None:
                        other[3] = KafkaError(KafkaError.UNKNOWN_PRODUCER_ID)
                return
            self.broker.written.append(value)
            item[3] = False  # delivered

    def poll(self, timeout: float = 0) -> int:
        self._settle()
        done = [item for item in self.queue if item[3] is not None]
        self.queue = [item for item in self.queue if item[3] is None]
        for _due, value, cb, err in done:
            msg = SimpleNamespace(topic=lambda: TOPIC, key=lambda: b"k", value=lambda v=value: v)
            cb(err or None, msg)
        if self.raise_next is not None:
            err, self.raise_next = self.raise_next, None
            raise KafkaException(err)
        return len(done)

    def purge(self, in_queue=True, in_flight=True, blocking=True) -> None:
        for item in self.queue:
            if item[3] is None:
                item[3] = KafkaError(KafkaError._PURGE_QUEUE)

    def list_topics(self, topic=None, timeout=None):
        if not self.broker.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None})})


@pytest.fixture
def rig(monkeypatch, tmp_path):
    clock = Clock()
    broker = FakeBroker()
    producers: list[FakeProducer] = []

    def make(conf):
        p = FakeProducer(broker, clock)
        producers.append(p)
        return p

    monkeypatch.setattr(publisher_mod, "Producer", make)
    monkeypatch.setattr(publisher_mod, "time", SimpleNamespace(monotonic=clock))
    pub = Publisher({"bootstrap.servers": "fake:9092"}, "t", spool_dir=tmp_path / "spool",
                    message_timeout_ms=int(MESSAGE_TIMEOUT_S * 1000), probe_interval_s=0.2, replay_chunk=5)
    sent: list[bytes] = []

    def step() -> None:
        clock.now += STEP_S
        value = b"%d" % len(sent)
        pub.publish_raw(SpoolRecord(TOPIC, b"k", value, 1, "heartbeat"))
        sent.append(value)
        pub.poll(0)

    def idle() -> None:
        clock.now += STEP_S
        pub.poll(0)

    return SimpleNamespace(pub=pub, broker=broker, producers=producers, step=step, idle=idle, sent=sent)


def _through_a_restart(rig, outage_steps: int = 40) -> int:
    """Publish through an outage and a restart; the steps the publisher took to go online again."""
    for _ in range(10):
        rig.step()
    assert not rig.pub.spooling and rig.broker.written == rig.sent[:-1]  # the last one is in flight
    rig.broker.up = False
    for _ in range(outage_steps):
        rig.step()
    assert rig.pub.spooling and len(rig.pub.spool) > 2 * rig.pub.replay_chunk
    rig.broker.restart()
    for n in range(1, 201):
        rig.step()
        if not rig.pub.spooling:
            return n
    raise AssertionError(f"still spooling 200 steps after the broker came back: {rig.pub.stats}, "
                         f"{len(rig.pub.spool)} spooled, last error {rig.pub.last_error}")


def _settled(rig) -> None:
    for _ in range(20):  # and it stays online
        rig.step()
        assert not rig.pub.spooling, rig.pub.stats
    rig.idle()
    assert rig.pub.spool.empty and len(rig.producers[-1]) == 0
    # Every message exactly once, in publication order.
    assert rig.broker.written == rig.sent


def test_an_agent_paced_publisher_goes_online_after_a_restart_that_forgot_its_producer_id(rig):
    steps = _through_a_restart(rig)
    assert len(rig.producers) == 2  # the fatal UNKNOWN_PRODUCER_ID led to a fresh producer
    # (probe, fatal chunk, probe again, then chunks of 5 while one message a step arrives)
    assert steps <= 40 // 4 + 10, steps
    _settled(rig)


@pytest.mark.parametrize("refusal", [KafkaError.PRODUCER_FENCED, KafkaError._MSG_TIMED_OUT],
                         ids=["fenced", "timed-out"])
def test_a_producer_the_broker_keeps_refusing_is_recreated(rig, refusal):
    """Not fatal, and the broker answers metadata, yet every replay fails: a fresh producer is used."""
    rig.broker.refuse_after_restart = refusal
    _through_a_restart(rig)
    assert len(rig.producers) == 2 and rig.producers[0].refused == refusal
    _settled(rig)
