"""streams.kafka.take on the real broker: a lone message comes back at once, not after the timeout.

confluent_kafka's ``consume(n, timeout)`` returns early only when ``n`` messages are in; every consumer of
vigil's alert path used it with a timeout (the worker 0.1 s, the actuator 0.2 s, the sdk 0.2 s), which was
latency on each hop for a single alert.
"""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from vigil.streams.kafka import reader, take


def _take_in_thread(consumer, n: int, timeout_s: float, gather_s: float = 0.0) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.extend(take(consumer, n, timeout_s, gather_s)), daemon=True)
    t.start()
    return t, out


def test_a_lone_message_is_taken_without_waiting_out_the_timeout_and_a_burst_in_one_batch(config):
    topic = config.topic("alert")
    consumer = reader(config.kafka_conf(), [topic], from_beginning=False)
    producer = Producer(config.kafka_conf())
    try:
        take(consumer, 10, 1.0)  # (the assignment settles; nothing was sent yet)
        producer.produce(topic, b"one", partition=0)
        producer.flush(10)
        t, got = _take_in_thread(consumer, 500, 600.0)  # consume(500, 600) would sit here ten minutes
        t.join(timeout=60)
        assert not t.is_alive() and [m.value() for m in got if m.error() is None] == [b"one"]
        for i in range(50):
            producer.produce(topic, b"%d" % i, partition=0)
        producer.flush(10)
        t, got = _take_in_thread(consumer, 500, 600.0, gather_s=0.5)
        t.join(timeout=60)
        values = [m.value() for m in got if m.error() is None]
        assert not t.is_alive() and values[0] == b"0"
        while len(values) < 50:  # what did not arrive within the gathering comes with the next take
            values += [m.value() for m in take(consumer, 500, 10.0) if m.error() is None]
        assert values == [b"%d" % i for i in range(50)]
    finally:
        consumer.close()
