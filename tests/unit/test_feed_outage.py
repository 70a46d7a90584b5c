"""A worker that hears nobody (its broker is down) does not declare the cluster dead."""

from __future__ import annotations

from vigil.schemas import Heartbeat, Source, from_seconds
from vigil.streams.engine.detection import DetectionEngine, EngineParams


def beat(node: str, t: float, seq: int) -> Heartbeat:
    return Heartbeat(event_time=from_seconds(t), source=Source(node=node), seq=seq, interval_s=1.0)


def lost(findings) -> list[str]:
    return [f.subject.node for f in findings if f.kind == "node_lost" and f.status == "raised"]


T0 = 1_700_000_000.0


def run(eng: DetectionEngine, start: float, end: float, nodes, raised: list, seq: dict) -> None:
    t = start
    while t < end:
        for n in nodes:
            seq[n] = seq.get(n, 0) + 1
            raised += lost(eng.on_events([beat(n, t, seq[n])], t))
        for k in range(10):
            raised += lost(eng.tick(t + k * 0.1))
        t += 1.0


def test_a_broker_outage_is_not_a_cluster_wide_node_loss_but_a_real_loss_after_it_is():
    eng = DetectionEngine(EngineParams(detectors={"heartbeat_loss": {"missed_intervals": 2.5}}))
    raised: list[str] = []
    seq: dict = {}
    run(eng, T0, T0 + 10, ["a", "b", "c"], raised, seq)
    # 6 s with nothing heard from anyone: the worker's silence, not the nodes'
    for k in range(60):
        raised += lost(eng.tick(T0 + 10 + k * 0.1))
    assert raised == []
    # the feed comes back one node at a time; nobody is lost for arriving a little later
    raised += lost(eng.on_events([beat("a", T0 + 16.0, 99)], T0 + 16.0))
    for k in range(1, 5):
        raised += lost(eng.tick(T0 + 16.0 + k * 0.1))
    run(eng, T0 + 16.5, T0 + 25, ["a", "b", "c"], raised, seq)
    assert raised == []
    # c really dies: lost after its 2.5 s, while a and b keep beating
    run(eng, T0 + 25, T0 + 30, ["a", "b"], raised, seq)
    assert raised == ["c"]


def test_a_lone_node_is_still_declared_lost():
    eng = DetectionEngine(EngineParams(detectors={"heartbeat_loss": {"missed_intervals": 2.5}}))
    raised: list[str] = []
    run(eng, T0, T0 + 10, ["solo"], raised, {})
    for k in range(40):
        raised += lost(eng.tick(T0 + 10 + k * 0.1))
    assert raised == ["solo"]


def test_the_broker_pulse_lets_a_worker_judge_nodes_it_hears_nothing_else_from():
    """A worker whose partitions hold only dying nodes hears no data: its broker contact says it is not deaf."""
    eng = DetectionEngine(EngineParams(detectors={"heartbeat_loss": {"missed_intervals": 2.5}}))
    raised: list[str] = []
    seq: dict = {}
    run(eng, T0, T0 + 10, ["a", "b"], raised, seq)
    for k in range(40):  # both die; the broker answers every 0.5 s
        if k % 5 == 0:
            eng.heard(T0 + 10 + k * 0.1)
        raised += lost(eng.tick(T0 + 10 + k * 0.1))
    assert sorted(raised) == ["a", "b"]
