"""Detection + correlation driven by the simulator on simulated time (no Kafka).

Ground truth is the simulator's: each injected fault must yield exactly one
incident, whose kind, severity and subject name the fault's root cause.
"""

from __future__ import annotations

import pytest

from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import Alert, Heartbeat, IterationTiming, Source, from_seconds, to_seconds
from vigil.streams.engine.detection import DetectionEngine
from vigil.streams.engine.pipeline import InProcessPipeline

TICK = 0.05


def play(sim: ClusterSimulator, seconds: float):
    pipe = InProcessPipeline()
    alerts: list[tuple[Alert, float]] = []
    log = []
    t = sim.start
    while t < sim.start + seconds:
        t += TICK
        for group in sim.advance(t):
            log.extend(group)
            alerts.extend((a, t) for a in pipe.feed(group, t))
        alerts.extend((a, t) for a in pipe.tick(t))
    return alerts, log


def cluster(faults, telemetry=1.0, seed=11, step_batches=False):
    nodes = [f"n{i}" for i in range(6)]
    jobs = [SimJob("a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.4),
            SimJob("b", ("n2", "n3"), dp=2, pp=2, tp=4, iteration_s=0.2)]
    return ClusterSimulator(nodes, jobs, faults, start=5000.0, heartbeat_interval_s=1.0, seed=seed,
                            telemetry_interval_s=telemetry, step_batches=step_batches)


def incidents(alerts):
    """incident id -> its alert versions, in order."""
    out: dict = {}
    for a, at in alerts:
        out.setdefault(a.incident_id, []).append((a, at))
    return out


def naming(alerts, kinds, subject):
    """First alert (any status but resolved) whose kind and subject name the fault."""
    for a, at in alerts:
        s = a.subject.model_dump(exclude_none=True)
        if a.status != "resolved" and a.kind in kinds and all(s.get(k) == v for k, v in subject.items()):
            return a, at
    return None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_run_raises_nothing(seed):
    alerts, _ = play(cluster([], seed=seed), 60)
    assert alerts == []


FAULTS = [
    Fault("node_loss", "n5", at=10.0),
    Fault("hang", "b", at=10.0, recover_at=15.0),
    Fault("xid", "n4", at=10.0, code=79, gpu=3),
    Fault("xid", "n4", at=10.0, code=13, gpu=1),
    Fault("process_exit", "a", at=10.0, rank=3),
    Fault("exception", "b", at=10.0, rank=5, category="cuda_error"),
    Fault("exception", "a", at=10.0, rank=2, category="illegal_memory_access"),
    Fault("exception", "b", at=10.0, rank=1, category="connection_reset"),
    Fault("gpu_slow", "n2", at=30.0, gpu=5, slowdown=0.4),
    Fault("congestion", "n0", at=30.0, slowdown=1.0),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f.kind}-{f.code if f.kind == 'xid' else f.category if f.kind == 'exception' else f.target}")
def test_each_fault_is_one_incident_naming_its_root_cause(fault):
    sim = cluster([fault])
    alerts, _ = play(sim, fault.at + 20)
    kinds, severity = fault.expected_alert
    hit = naming(alerts, kinds, fault.expected_subject)
    assert hit is not None, [(a.status, a.kind, a.subject) for a, _ in alerts]
    alert, at = hit
    assert alert.severity == severity
    assert at >= fault.injected_at
    # everything raised belongs to that one incident
    assert set(incidents(alerts)) == {alert.incident_id}, [(a.status, a.kind, a.subject) for a, _ in alerts]


def test_node_loss_is_detected_after_the_missed_intervals():
    sim = cluster([Fault("node_loss", "n5", at=10.0)])
    alerts, log = play(sim, 20)
    last_beat = max(to_seconds(e.event_time) for e in log if isinstance(e, Heartbeat) and e.source.node == "n5")
    alert, at = naming(alerts, ("node_lost",), {"node": "n5"})
    assert to_seconds(alert.onset_time) == last_beat
    assert last_beat + 2.5 < at <= last_beat + 2.5 + TICK + 1e-9


def test_hang_within_three_mean_iterations_or_the_floor_then_resolves():
    from vigil.detectors import HangDetector

    sim = cluster([Fault("hang", "b", at=10.0, recover_at=15.0)])
    alerts, log = play(sim, 20)
    its = [e for e in log if isinstance(e, IterationTiming) and e.source.job == "b"]
    last = max(to_seconds(e.end) for e in its if to_seconds(e.end) <= 5010.0)
    durations = sorted({(e.step, e.duration_s) for e in its if to_seconds(e.end) <= last})[-50:]
    mean = sum(d for _, d in durations) / len(durations)
    versions = next(iter(incidents(alerts).values()))
    (opened, at), (resolved, _) = versions
    assert opened.status == "open" and opened.kind == "task_hang" and opened.severity == 2
    # events reach the engine at tick granularity: up to one TICK late, which the timeout allows for;
    # these steps are 0.2 s: 3 x the mean is under the timeout's floor
    timeout = max(3 * mean, HangDetector().min_timeout_s)
    assert last + timeout < at <= last + timeout + 2 * TICK + 1e-9
    assert resolved.status == "resolved"


def test_lost_node_under_a_job_is_one_incident_with_the_hang_and_timeouts_as_evidence():
    """The ranks that time out are healthy: the root cause is the lost node."""
    sim = cluster([Fault("node_loss", "n1", at=10.0, peers_time_out=1.0)])
    alerts, _ = play(sim, 20)
    assert len(incidents(alerts)) == 1
    alert, _ = naming(alerts, ("node_lost",), {"node": "n1"})
    final = [a for a, _ in alerts][-1]
    assert final.kind == "node_lost" and final.severity == 1 and final.subject.node == "n1"
    kinds = {e["kind"] for e in final.evidence}
    assert {"node_lost", "task_hang", "nccl_timeout"} <= kinds
    assert final.evidence_count >= 8 + 1  # the 8 timed-out ranks on n0, the hang, the loss


def test_computation_fail_slow_with_a_throttled_gpu_is_that_gpus_degradation():
    sim = cluster([Fault("gpu_slow", "n2", at=30.0, gpu=5, slowdown=0.4)])
    alerts, _ = play(sim, 50)
    final = [a for a, _ in alerts][-1]
    assert len(incidents(alerts)) == 1
    assert final.kind in ("throttle", "clock_below_peers") and final.subject.node == "n2" and final.subject.gpu == 5
    assert "fail_slow" in {e["kind"] for e in final.evidence}


def test_communication_fail_slow_with_a_cnp_surge_is_congestion_on_that_link():
    sim = cluster([Fault("congestion", "n0", at=30.0, slowdown=1.0)])
    alerts, _ = play(sim, 50)
    final = [a for a, _ in alerts][-1]
    assert len(incidents(alerts)) == 1
    assert final.kind == "congestion" and final.subject.node == "n0" and final.subject.link == "n0/mlx5_0:1"
    assert "fail_slow" in {e["kind"] for e in final.evidence}


def test_replaying_the_same_events_gives_the_same_alert_ids():
    a1, _ = play(cluster([Fault("node_loss", "n5", at=10.0)]), 20)
    a2, _ = play(cluster([Fault("node_loss", "n5", at=10.0)]), 20)
    assert [a.event_id for a, _ in a1] == [a.event_id for a, _ in a2]


def _iteration(job, step, end, duration=0.2):
    return IterationTiming(event_time=from_seconds(end), source=Source(job=job, rank=0), step=step,
                           start=from_seconds(end - duration), end=from_seconds(end), duration_s=duration)


def _beat(node, t, seq):
    return Heartbeat(event_time=from_seconds(t), source=Source(node=node), seq=seq, interval_s=1.0)


def test_restart_from_a_checkpoint_is_progress_not_a_hang():
    engine = DetectionEngine()
    t = 100.0
    for step in range(100):
        t += 0.2
        engine.on_events([_iteration("j", step, t)], t)
        assert [f for f in engine.tick(t) if f.kind == "task_hang"] == []
    for step in range(90, 120):  # resumed from the checkpoint of step 90
        t += 0.2
        engine.on_events([_iteration("j", step, t)], t)
        assert [f for f in engine.tick(t) if f.kind == "task_hang"] == []


def test_late_or_redelivered_heartbeats_are_not_signs_of_life():
    pipe = InProcessPipeline()
    for seq in range(10):
        pipe.feed([_beat("n", 100.0 + seq, seq)], 100.0 + seq)
    [opened] = pipe.tick(113.0)
    assert opened.kind == "node_lost"
    assert pipe.feed([_beat("n", 105.0, 5)], 113.5) == []  # redelivered old heartbeat
    assert pipe.tick(114.0) == []
    [resolved] = pipe.feed([_beat("n", 114.5, 0)], 114.5)
    assert resolved.status == "resolved" and resolved.incident_id == opened.incident_id


def test_an_old_log_does_not_report_long_gone_nodes():
    """A new consumer group reading from the start of the log at time `now`."""
    pipe = InProcessPipeline()
    now = 1_000_000.0
    for seq in range(10):
        pipe.feed([_beat("decommissioned", now - 86_400 + seq, seq)], now)
        pipe.feed([_iteration("finished-job", seq, now - 86_400 + seq)], now)
    assert pipe.tick(now) == []


def test_forgotten_subjects_raise_nothing_here():
    """After a rebalance moves a partition away, its subjects' silence is not a failure here."""
    sim = cluster([])
    pipe = InProcessPipeline()
    t = sim.start
    for _ in range(100):
        t += TICK
        for group in sim.advance(t):
            pipe.feed(group, t)
        pipe.tick(t)
    pipe.engine.forget(nodes=sim.nodes, jobs=list(sim.jobs))
    assert pipe.tick(t + 100) == []


def test_reading_a_backlog_is_not_silence():
    """A worker that takes over reads 20 s of the past in a burst, ticking as it goes."""
    sim = cluster([])
    now = sim.start + 25.0
    groups = sim.advance(sim.start + 20.0)  # produced over 20 s, read now
    pipe = InProcessPipeline()
    alerts = []
    for i, group in enumerate(groups):
        alerts += pipe.feed(group, now + i * 1e-4)
        alerts += pipe.tick(now + i * 1e-4)
    assert alerts == []


def test_duplicated_events_and_events_from_the_future_are_skipped():
    engine = DetectionEngine()
    now = 1000.0
    beat = _beat("n", now, 0)
    assert engine.on_events([beat, beat], now) == []
    assert engine.detector("node", "n", "heartbeat_loss").last_seen == now
    future = _beat("n", now + 3600, 1)
    assert engine.future(future, now)
    engine.on_events([future], now)
    assert engine.detector("node", "n", "heartbeat_loss").last_seen == now  # an hour-ahead clock does not keep the node alive


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.kind in ("hang", "node_loss", "gpu_slow", "congestion")],
                         ids=lambda f: f.kind)
def test_columnar_steps_give_the_same_incidents_as_per_rank_records(fault):
    def summary(step_batches):
        alerts, _ = play(cluster([Fault(**{**fault.__dict__, "injected_at": None})], step_batches=step_batches),
                         fault.at + 20)
        return [(a.status, a.kind, a.severity, a.subject) for a, _ in alerts]
    assert summary(True) == summary(False)


def test_a_hang_heard_through_a_delivery_delay_is_called_once_the_event_time_deadline_passes():
    """Steps heard 0.5 s after they end (batching): the hang's timeout holds that delay once, so the
    alert comes at the last step's end + k x D + 0.5 s, not half a second later again because the
    engine's gate counted from the (delayed) arrival with the whole timeout."""
    engine = DetectionEngine()
    engine.heard(0.0)
    t, lag = 100.0, 0.5
    for step in range(60):
        t += 0.2
        engine.on_events([_iteration("j", step, t)], t + lag)
        engine.heard(t + lag)
        assert [f for f in engine.tick(t + lag) if f.kind == "task_hang"] == []
    from vigil.detectors import HangDetector

    # the last step's end + k x D (here under the floor) + the delay seen
    deadline = t + max(3 * 0.2, HangDetector().min_timeout_s) + lag
    now, hung = t + lag, []
    while not hung and now < t + 10:
        now += 0.05
        engine.heard(now)  # its broker answers: the worker hears
        hung = [f for f in engine.tick(now) if f.kind == "task_hang" and f.status == "raised"]
    assert hung and deadline < now <= deadline + 0.1 + 1e-9


def test_a_node_whose_beats_arrive_late_is_not_lost_and_one_that_stops_is():
    """The engine tells the heartbeat detector when each beat arrived: beats heard 0.8 s after they were sent
    (and one 1.4 s) page no one; when they stop, node_lost comes 2.5 intervals + the delay allowed (the
    longest recent one, at most an interval) after the last was sent."""
    engine = DetectionEngine()
    t = 100.0
    for seq in range(30):
        t = 100.0 + seq
        arrived = t + (1.4 if seq == 20 else 0.8)
        engine.on_events([_beat("n1", t, seq)], arrived)
        engine.heard(arrived)
        assert [f for f in engine.tick(arrived) if f.kind == "node_lost"] == []
    now, lost = t + 0.8, []
    while not lost and now < t + 10:
        now += 0.05
        engine.heard(now)
        lost = [f for f in engine.tick(now) if f.kind == "node_lost" and f.status == "raised"]
    assert lost and t + 2.5 + 1.0 < now <= t + 2.5 + 1.0 + 0.05 + 1e-9  # the delay allowed: at most 1 interval
