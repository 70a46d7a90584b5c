"""The simulator's own ground truth: what it emits around each fault."""

from __future__ import annotations

import pytest

from vigil.sim.simulator import ClusterSimulator, Fault, SimJob, demo_scenario
from vigil.schemas import Heartbeat, IterationTiming, to_seconds


def small(faults, seed=0):
    nodes = [f"n{i}" for i in range(4)]
    jobs = [SimJob("a", ("n0", "n1"), dp=2, pp=2, tp=4, iteration_s=0.5),
            SimJob("b", ("n2",), dp=2, pp=1, tp=4, iteration_s=0.25)]
    return ClusterSimulator(nodes, jobs, faults, start=1000.0, heartbeat_interval_s=1.0, seed=seed)


def flatten(groups):
    return [e for g in groups for e in g]


def test_clean_run_heartbeats_and_iterations():
    sim = small([])
    events = flatten(sim.advance(1000.0 + 20))
    beats = [e for e in events if isinstance(e, Heartbeat)]
    its = [e for e in events if isinstance(e, IterationTiming)]
    assert {b.source.node for b in beats} == {"n0", "n1", "n2", "n3"}
    assert all(19 <= sum(b.source.node == n for b in beats) <= 21 for n in ("n0", "n1", "n2", "n3"))
    steps_a = {e.step for e in its if e.source.job == "a"}
    assert 35 <= len(steps_a) <= 45  # 20 s / 0.5 s with jitter
    assert sum(e.source.job == "a" for e in its) == 16 * len(steps_a)  # every rank each step
    for e in its:
        assert e.compute_s + e.communication_s == pytest.approx(e.duration_s)


def test_events_come_out_in_time_order_and_groups_share_a_step():
    sim = small([])
    groups = sim.advance(1000.0 + 10)
    times = [to_seconds(g[0].event_time) for g in groups]
    assert times == sorted(times)
    for g in groups:
        if isinstance(g[0], IterationTiming):
            assert len({e.step for e in g}) == 1 and len({e.source.rank for e in g}) == len(g)


def test_node_loss_stops_its_heartbeats_and_stalls_its_job():
    sim = small([Fault("node_loss", "n1", at=5.0)])
    events = flatten(sim.advance(1000.0 + 15))
    lost_at = sim.faults[0].injected_at
    assert lost_at == 1005.0
    assert max(to_seconds(e.event_time) for e in events if isinstance(e, Heartbeat) and e.source.node == "n1") < lost_at
    assert max(to_seconds(e.end) for e in events if isinstance(e, IterationTiming) and e.source.job == "a") < lost_at
    assert max(to_seconds(e.end) for e in events if isinstance(e, IterationTiming) and e.source.job == "b") > 1014


def test_hang_stops_iterations_until_recovery():
    sim = small([Fault("hang", "b", at=5.0, recover_at=8.0)])
    events = flatten(sim.advance(1000.0 + 12))
    ends = sorted(to_seconds(e.end) for e in events if isinstance(e, IterationTiming) and e.source.job == "b")
    assert not [t for t in ends if 1005.0 < t <= 1008.0]
    assert [t for t in ends if t > 1008.0]
    beats_n2 = [e for e in events if isinstance(e, Heartbeat) and e.source.node == "n2"]
    assert len(beats_n2) >= 11  # the node itself is healthy


def test_same_seed_same_events():
    a = flatten(small([], seed=3).advance(1000.0 + 5))
    b = flatten(small([], seed=3).advance(1000.0 + 5))
    strip = lambda evs: [e.model_dump(exclude={"event_id"}) for e in evs]
    assert strip(a) == strip(b)


def test_rank_coordinates_follow_megatron_order():
    job = SimJob("j", tuple(f"n{i}" for i in range(8)), dp=4, pp=2, tp=8, iteration_s=1.0)
    assert job.coordinates(0) == (0, 0, 0)
    assert job.coordinates(7) == (0, 0, 7)
    assert job.coordinates(8) == (0, 1, 0)
    assert job.coordinates(16) == (1, 0, 0)
    assert job.placement(17) == ("n2", 1)


def test_invalid_scenarios_are_refused():
    with pytest.raises(ValueError):
        SimJob("j", ("n0",), dp=2, pp=1, tp=8, iteration_s=1.0)
    with pytest.raises(ValueError):
        small([Fault("node_loss", "nope", at=1.0)])


def test_demo_scenario_is_valid():
    sim = demo_scenario(start=0.0)
    assert len(sim.faults) == 4 and len(sim.nodes) == 18


def test_a_slowdown_starts_with_the_first_step_planned_after_it():
    nodes = ["n0", "n1"]
    job = SimJob("a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.5, jitter=0.0)
    sim = ClusterSimulator(nodes, [job], [Fault("gpu_slow", "n1", at=5.2, gpu=3, slowdown=1.0)], start=0.0,
                           telemetry_interval_s=1.0, step_batches=True)
    steps = [g[0] for g in sim.advance(10.0) if g[0].event_type == "iteration_step"]
    fault = sim.faults[0]
    first_slow = next(s for s in steps if s.duration_s > 0.6)
    assert fault.injected_at == 5.2 and fault.onset_at == pytest.approx(first_slow.start.timestamp(), abs=1e-6)
    assert all(s.duration_s == pytest.approx(0.5, rel=0.03) for s in steps if s.end.timestamp() <= fault.onset_at + 1e-6)
    assert first_slow.duration_s == pytest.approx(0.5 * 0.7 * 2 + 0.5 * 0.3, rel=0.03)  # the rank computes twice as long


def test_node_batches_send_each_nodes_samples_with_its_heartbeat():
    nodes = ["n0", "n1", "n2"]
    job = SimJob("a", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=0.5)

    def run(node_batches):
        sim = ClusterSimulator(nodes, [job], [Fault("node_loss", "n2", at=4.5)], start=0.0, telemetry_interval_s=1.0,
                               step_batches=True, node_batches=node_batches)
        return sim.advance(9.9)  # not 10.0: the separate mode samples 1 ms after the beat

    batched, separate = run(True), run(False)
    beats = [g for g in batched if g[0].event_type == "heartbeat"]
    # one message per node and interval: the beat, its 8 GPUs' samples in one columnar event, the NIC counters;
    # none after n2 is lost
    assert len(beats) == 10 + 10 + 4
    assert all([e.event_type for e in g] == ["heartbeat", "gpu_samples", "nic_counters"] for g in beats)
    assert all(g[1].gpus == list(range(8)) for g in beats)
    assert all(len({e.source.node for e in g}) == 1 for g in beats)
    count = lambda groups, t: sum(e.event_type == t for g in groups for e in g)
    for t in ("heartbeat", "gpu_samples", "nic_counters", "iteration_step"):
        assert count(batched, t) == count(separate, t), t
