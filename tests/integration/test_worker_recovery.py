"""A worker killed mid-stream (SIGKILL) and replaced loses no alert and emits no duplicate;
two workers share the load of one consumer group."""

from __future__ import annotations

import collections
import signal
import time

from vigil.producers.publisher import Publisher
from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import Alert, decode
from vigil.streams.kafka import reader
from tests.integration.conftest import WorkerProcess, wait_for


def _cluster(start: float, faults):
    nodes = [f"n{i}" for i in range(6)]
    jobs = [SimJob("train-a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.3),
            SimJob("train-b", ("n2", "n3"), dp=2, pp=2, tp=4, iteration_s=0.25)]
    return ClusterSimulator(nodes, jobs, faults, start=start, heartbeat_interval_s=0.5, seed=4)


class Pump:
    """Plays the simulator in real time and collects the alerts on the topic."""

    def __init__(self, config, sim: ClusterSimulator, until: float) -> None:
        self.sim, self.until = sim, until
        self.publisher = Publisher(config.kafka_conf(), config.topic_prefix)
        self.reader = reader(config.kafka_conf(), [config.topic("alert")])
        self.alerts: list[Alert] = []

    def __call__(self) -> None:
        for group in self.sim.advance(min(time.time(), self.until)):
            self.publisher.publish(group)
        msg = self.reader.poll(0.02)
        if msg is not None and not msg.error():
            self.alerts.extend(a for a in decode(msg.value()).events if isinstance(a, Alert))

    def opened(self, kind: str, subject: str) -> bool:
        return any(a.kind == kind and (a.subject.node or a.subject.job) == subject for a in self.alerts)


def test_killed_worker_is_replaced_without_lost_or_duplicate_alerts(config, tmp_path):
    start = time.time()
    sim = _cluster(start, [Fault("node_loss", "n5", at=3.0), Fault("hang", "train-b", at=14.0)])
    pump = Pump(config, sim, until=start + 40)
    first = WorkerProcess(config, tmp_path / "a")
    second = None
    try:
        first.wait_ready()
        assert wait_for(lambda: pump.opened("node_lost", "n5"), 30, pump)
        # run on past a few offset commits, so the successor rebuilds from the log
        assert wait_for(lambda: time.time() > start + 9, 20, pump)
        first.proc.send_signal(signal.SIGKILL)  # no goodbye: partitions move after the session timeout
        first.proc.wait()
        second = WorkerProcess(config, tmp_path / "b")
        second.wait_ready()
        assert wait_for(lambda: pump.opened("task_hang", "train-b"), 45, pump), pump.alerts
        # let the new worker run on a while: a re-detection of the lost node would show up now
        deadline = time.time() + 4
        wait_for(lambda: time.time() > deadline, 10, pump)
        replayed = [line for line in second.log.read_text().splitlines() if "recovered state from" in line]
        assert replayed and " 0 records" not in replayed[0], replayed
    finally:
        first.stop()
        if second is not None:
            second.stop()
        pump.reader.close()
    versions = collections.Counter((a.incident_id, a.incident_version) for a in pump.alerts)
    assert all(n == 1 for n in versions.values()), versions
    opened = [(a.kind, a.subject.node or a.subject.job) for a in pump.alerts if a.status == "open"]
    assert sorted(opened) == [("node_lost", "n5"), ("task_hang", "train-b")], pump.alerts


def test_two_workers_share_the_partitions_and_detect_everything(config, tmp_path):
    one, two = WorkerProcess(config, tmp_path / "one"), WorkerProcess(config, tmp_path / "two")
    try:
        one.wait_ready()
        two.wait_ready()
        # both hold part of the telemetry once the group has settled
        def shared() -> bool:
            a, b = one.ready.read_text(), two.ready.read_text()
            return "telemetry" in a and "telemetry" in b
        assert shared(), (one.ready.read_text(), two.ready.read_text())
        start = time.time()
        sim = _cluster(start, [Fault("node_loss", "n5", at=3.0), Fault("node_loss", "n4", at=3.5),
                               # a hang is told once the job has run its warm-up and 10 more steps (0.3 s each)
                               Fault("hang", "train-a", at=5.5), Fault("hang", "train-b", at=4.5)])
        pump = Pump(config, sim, until=start + 20)
        expected = {("node_lost", "n5"), ("node_lost", "n4"), ("task_hang", "train-a"), ("task_hang", "train-b")}
        opened = lambda: {(a.kind, a.subject.node or a.subject.job) for a in pump.alerts if a.status == "open"}
        assert wait_for(lambda: expected <= opened(), 30, pump), pump.alerts
        pump.reader.close()
        assert opened() == expected
    finally:
        one.stop()
        two.stop()
