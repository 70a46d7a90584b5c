"""Simulator -> broker -> detection worker -> alerts topic -> history sink -> ClickHouse.

Every injected fault gives exactly one open incident of the right kind,
severity and subject; the incidents are stored in ClickHouse.
"""

from __future__ import annotations

import time


from vigil.producers.publisher import Publisher
from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import Alert, decode
from vigil.streams.kafka import reader
from vigil.streams.sink import HistorySink
from tests.integration.conftest import wait_for

def test_node_loss_and_hang_are_detected_end_to_end(config, worker, history):
    nodes = [f"n{i}" for i in range(6)]
    jobs = [SimJob("train-a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.3),
            SimJob("train-b", ("n2", "n3"), dp=2, pp=2, tp=4, iteration_s=0.2)]
    faults = [Fault("node_loss", "n5", at=3.0), Fault("hang", "train-b", at=4.0)]
    start = time.time()
    sim = ClusterSimulator(nodes, jobs, faults, start=start, heartbeat_interval_s=0.5, seed=2)
    publisher = Publisher(config.kafka_conf(), config.topic_prefix)
    alerts_reader = reader(config.kafka_conf(), [config.topic("alert")])
    sink = HistorySink(config, history, group_id=f"{config.group_id}-sink").start()
    seen: list[Alert] = []

    def step():
        for group in sim.advance(min(time.time(), start + 12.0)):
            publisher.publish(group)
        msg = alerts_reader.poll(0.02)
        if msg is not None and not msg.error():
            seen.extend(a for a in decode(msg.value()).events if isinstance(a, Alert))

    def detected():
        kinds = {(a.kind, a.subject.node or a.subject.job) for a in seen if a.status == "open"}
        return {("node_lost", "n5"), ("task_hang", "train-b")} <= kinds and time.time() > start + 8.0

    try:
        assert wait_for(detected, 40, step), seen
        publisher.flush()
        opened = [a for a in seen if a.status == "open"]
        assert sorted((a.kind, a.severity, a.subject.node or a.subject.job) for a in opened) == [
            ("node_lost", 1, "n5"), ("task_hang", 2, "train-b")]
        for a in opened:
            injected = next(f.injected_at for f in faults if f.target in (a.subject.node, a.subject.job))
            assert a.onset_time.timestamp() <= injected < a.detection_time.timestamp()

        stored_sql = (f"SELECT kind, severity, coalesce(subject_node, subject_job) FROM {history.database}.alerts "
                      f"WHERE status = 'open' ORDER BY kind")
        assert wait_for(lambda: len(history.query(stored_sql).rows) == 2, 30)
        assert history.query(stored_sql).rows == [("node_lost", 1, "n5"), ("task_hang", 2, "train-b")]
    finally:
        alerts_reader.close()
        sink.stop()
