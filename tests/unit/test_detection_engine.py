"""The detection engine driven by the simulator on simulated time (no Kafka)."""

from __future__ import annotations

from producers.simulator import ClusterSimulator, Fault, JobSpec
from schemas import Heartbeat, IterationTiming, to_seconds
from streams.detection import DetectionEngine

TICK = 0.05


def play(sim: ClusterSimulator, seconds: float):
    engine = DetectionEngine()
    alerts, log = [], []
    t = sim.start
    while t < sim.start + seconds:
        t += TICK
        for group in sim.advance(t):
            log.extend(group)
            for ev in group:
                alerts.extend((a, t) for a in engine.on_event(ev, t))
        alerts.extend((a, t) for a in engine.tick(t))
    return alerts, log


def cluster(faults):
    nodes = [f"n{i}" for i in range(6)]
    jobs = [JobSpec("a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.4),
            JobSpec("b", ("n2", "n3"), dp=2, pp=1, tp=8, iteration_s=0.2)]
    return ClusterSimulator(nodes, jobs, faults, start=5000.0, heartbeat_interval_s=1.0, seed=11)


def test_clean_run_raises_nothing():
    alerts, _ = play(cluster([]), 60)
    assert alerts == []


def test_node_loss_is_one_sev1_incident_detected_after_the_missed_intervals():
    sim = cluster([Fault("node_loss", "n5", at=10.0)])
    alerts, log = play(sim, 20)
    last_beat = max(to_seconds(e.event_time) for e in log if isinstance(e, Heartbeat) and e.source.node == "n5")
    [(alert, at)] = [(a, t) for a, t in alerts if a.kind == "node_lost"]
    assert alert.severity == 1 and alert.subject.node == "n5" and alert.status == "open"
    assert to_seconds(alert.onset_time) == last_beat
    assert last_beat + 2.5 < at <= last_beat + 2.5 + TICK + 1e-9
    assert [a for a, _ in alerts if a.kind != "node_lost"] == []  # n5 runs no job


def test_hang_is_sev2_within_three_mean_iterations_and_resolves():
    sim = cluster([Fault("hang", "b", at=10.0, recover_at=15.0)])
    alerts, log = play(sim, 20)
    its = [e for e in log if isinstance(e, IterationTiming) and e.source.job == "b"]
    last = max(to_seconds(e.end) for e in its if to_seconds(e.end) <= 5010.0)
    durations = sorted({(e.step, e.duration_s) for e in its if to_seconds(e.end) <= last})[-50:]
    mean = sum(d for _, d in durations) / len(durations)
    opened = [(a, t) for a, t in alerts if a.kind == "task_hang" and a.status == "open"]
    resolved = [a for a, _ in alerts if a.kind == "task_hang" and a.status == "resolved"]
    [(alert, at)] = opened
    assert alert.severity == 2 and alert.subject.job == "b"
    assert last + 3 * mean < at <= last + 3 * mean + TICK + 1e-9
    assert len(resolved) == 1 and resolved[0].incident_id == alert.incident_id
    assert resolved[0].incident_version == 2


def test_node_loss_under_a_job_also_stalls_that_job():
    sim = cluster([Fault("node_loss", "n1", at=10.0)])
    alerts, _ = play(sim, 20)
    kinds = sorted((a.kind, a.subject.node or a.subject.job) for a, _ in alerts)
    assert kinds == [("node_lost", "n1"), ("task_hang", "a")]


def test_replaying_the_same_events_gives_the_same_incident_ids():
    a1, _ = play(cluster([Fault("node_loss", "n5", at=10.0)]), 20)
    a2, _ = play(cluster([Fault("node_loss", "n5", at=10.0)]), 20)
    assert [a.event_id for a, _ in a1] == [a.event_id for a, _ in a2]


def test_forgotten_subjects_raise_nothing_here():
    """After a rebalance moves a node's partition away, its silence is not a loss here."""
    sim = cluster([])
    engine = DetectionEngine()
    t = sim.start
    for _ in range(100):
        t += TICK
        for group in sim.advance(t):
            for ev in group:
                engine.on_event(ev, t)
        engine.tick(t)
    engine.forget(nodes={"n0", "n1", "n2", "n3", "n4", "n5"}, jobs={"a", "b"})
    assert engine.tick(t + 100) == []


def _iteration(job, step, end, duration=0.2):
    from schemas import Source, from_seconds
    return IterationTiming(event_time=from_seconds(end), source=Source(job=job, rank=0), step=step,
                           start=from_seconds(end - duration), end=from_seconds(end), duration_s=duration)


def _beat(node, t, seq):
    from schemas import Source, from_seconds
    return Heartbeat(event_time=from_seconds(t), source=Source(node=node), seq=seq, interval_s=1.0)


def test_restart_from_a_checkpoint_is_progress_not_a_hang():
    engine = DetectionEngine()
    t = 100.0
    for step in range(100):
        t += 0.2
        engine.on_event(_iteration("j", step, t), t)
        assert engine.tick(t) == []
    for step in range(90, 120):  # resumed from the checkpoint of step 90
        t += 0.2
        engine.on_event(_iteration("j", step, t), t)
        assert engine.tick(t) == []


def test_late_or_redelivered_events_do_not_count_as_progress_or_life():
    engine = DetectionEngine()
    for seq in range(10):
        engine.on_event(_beat("n", 100.0 + seq, seq), 100.0 + seq)
    [opened] = engine.tick(113.0)
    assert opened.kind == "node_lost"
    # a redelivered old heartbeat neither resolves the incident nor reopens it
    assert engine.on_event(_beat("n", 105.0, 5), 113.5) == []
    assert engine.tick(114.0) == []
    [resolved] = engine.on_event(_beat("n", 114.5, 0), 114.5)
    assert resolved.status == "resolved" and resolved.incident_id == opened.incident_id


def test_an_old_log_does_not_report_long_gone_nodes():
    """A new consumer group reading from the start of the log at time `now`."""
    engine = DetectionEngine()
    now = 1_000_000.0
    for seq in range(10):
        engine.on_event(_beat("decommissioned", now - 86_400 + seq, seq), now)
        engine.on_event(_iteration("finished-job", seq, now - 86_400 + seq), now)
    assert engine.tick(now) == []
