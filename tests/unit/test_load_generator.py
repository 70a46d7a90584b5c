"""The load generator: real rates and sizes, the agent's message shapes, faults with their ground truth.

Everything here runs the generator on a simulated clock; what it must do is
known from its parameters (nodes of 8 GPUs, 1 Hz node messages of 10 records,
one step message per job step, faults of every kind with their effects).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from vigil.schemas import GPUS_PER_NODE, GpuSamples, IterationStep, decode, encode_batch
from vigil.sim.load import KINDS, NODE_RECORDS, LoadGenerator, plan_jobs
from vigil.sim.simulator import ClusterSimulator, SimJob

T0 = 1_000_000.25  # not on a whole second: every time string carries its fraction


def play(gen: LoadGenerator, seconds: float, step: float = 0.05):
    out = []
    t = gen.start
    while t < gen.start + seconds:
        t += step
        out += [(t, m) for m in gen.advance(t)]
    return out


def test_every_message_decodes_and_holds_the_records_it_says():
    gen = LoadGenerator(400, T0, seed=3)
    msgs = play(gen, 12.0)
    assert msgs
    for _, m in msgs:
        decoded = decode(m.value)
        assert decoded.errors == []
        assert m.records == sum(len(e.ranks) if isinstance(e, IterationStep) else len(e.gpus)
                                if isinstance(e, GpuSamples) else 1 for e in decoded.events)
    assert gen.records == sum(m.records for _, m in msgs)


def test_each_node_sends_one_message_a_second_with_heartbeat_gpus_and_nic():
    gen = LoadGenerator(256, T0, seed=1)
    msgs = [m for _, m in play(gen, 10.5) if m.event_type == "node_samples"
            and decode(m.value).events[0].event_time.timestamp() < T0 + 10.0]
    per_node = Counter(m.key for m in msgs)
    assert set(per_node.values()) == {10}  # 10 s, 1 Hz
    assert len(per_node) == 256 // GPUS_PER_NODE
    for m in msgs[:50]:
        events = decode(m.value).events
        assert m.records == NODE_RECORDS
        assert [e.event_type for e in events] == ["heartbeat", "gpu_samples", "nic_counters"]  # the GPUs in columns
        assert {e.source.node for e in events} == {m.key.decode()}
        assert events[1].gpus == list(range(8))


def test_each_job_steps_every_one_to_three_seconds_with_every_rank():
    gen = LoadGenerator(2000, T0, seed=2)
    steps = defaultdict(list)
    for _, m in play(gen, 20.0):
        if m.event_type == "iteration_step":
            [st] = decode(m.value).events
            steps[st.source.job].append(st)
    assert set(steps) == set(gen.jobs)
    for name, sts in steps.items():
        spec = gen.jobs[name].spec
        assert 1.0 <= spec.iteration_s <= 3.0
        for st in sts:
            assert len(st.ranks) == spec.world_size
            assert st.nodes == [spec.placement(r)[0] for r in range(spec.world_size)]
            assert (st.dp[-1] + 1, st.pp[-1] + 1, st.tp[-1] + 1) == (spec.dp, spec.pp, spec.tp)
        assert [st.step for st in sts] == list(range(len(sts)))


def test_the_same_fields_as_the_simulator_sends():
    """Field for field what the agent (and the simulator) publish: same keys per event type."""
    gen = LoadGenerator(64, T0, seed=1)
    mine: dict[str, set] = defaultdict(set)
    for _, m in play(gen, 4.0):
        for obj in json.loads(m.value) if m.value.startswith(b"[") else [json.loads(m.value)]:
            mine[obj["event_type"]].add(tuple(sorted(obj)))
    sim = ClusterSimulator([f"n{i}" for i in range(2)], [SimJob("j", ("n0", "n1"), dp=2, pp=1, tp=8, iteration_s=1.0)],
                           [], start=T0, telemetry_interval_s=1.0, step_batches=True, node_batches=True)
    theirs: dict[str, set] = defaultdict(set)
    for group in sim.advance(T0 + 4.0):
        for obj in json.loads(encode_batch(group)):
            theirs[obj["event_type"]].add(tuple(sorted(obj)))
    for etype in ("heartbeat", "gpu_samples", "nic_counters", "iteration_step"):
        assert mine[etype] and mine[etype] == theirs[etype], etype


def test_jobs_have_realistic_sizes_and_layouts():
    import random

    nodes = [f"n{i}" for i in range(25_000 // 8)]
    jobs = plan_jobs(nodes, random.Random(0))
    sizes = [j.world_size for j in jobs]
    assert sum(len(j.nodes) for j in jobs) == int(len(nodes) * 0.9)  # 10 % idle
    assert min(sizes) == 8 and max(sizes) >= 1024  # small jobs and large ones
    assert Counter(sizes).most_common(1)[0][0] <= 32  # most jobs are small
    for j in jobs:
        assert j.tp == 8 and j.dp * j.pp * j.tp == j.world_size == len(j.nodes) * 8


@pytest.fixture(scope="module")
def faulty():
    gen = LoadGenerator(1000, T0, seed=5, faults_per_kind=4, faults_from=5.0, step_s=(0.3, 0.5),
                        fail_slow_history=20)
    msgs = play(gen, 160.0)
    return gen, msgs


def test_every_kind_is_injected_as_planned(faulty):
    gen, _ = faulty
    assert Counter(i.kind for i in gen.injections) == {k: 4 for k in KINDS}
    for inj in gen.injections:
        assert inj.fault.injected_at is not None
        assert inj.ended_at is not None and inj.ended_at >= inj.injected_at


def test_node_losses_are_spread_and_the_node_is_silent_until_it_returns(faulty):
    gen, msgs = faulty
    losses = sorted((i for i in gen.injections if i.kind == "node_lost"), key=lambda i: i.injected_at)
    assert all(b.injected_at - a.injected_at >= 6.0 for a, b in zip(losses, losses[1:]))
    for inj in losses:
        node = inj.fault.target.encode()
        sent = [t for t, m in msgs if m.event_type == "node_samples" and m.key == node]
        assert not [t for t in sent if inj.injected_at < t < inj.injected_at + gen.node_down_s]
        assert [t for t in sent if t > inj.injected_at + gen.node_down_s]  # back


def test_a_stopped_job_sends_no_step_until_it_is_requeued(faulty):
    gen, msgs = faulty
    for inj in gen.injections:
        if inj.kind not in ("exception", "process_exit", "hang", "node_lost", "xid") or inj.job is None:
            continue
        key = inj.job.encode()
        steps = [t for t, m in msgs if m.event_type == "iteration_step" and m.key == key]
        assert not [t for t in steps if inj.injected_at + 0.06 < t < inj.ended_at]
        states = [json.loads(m.value)["state"] for t, m in msgs if m.event_type == "job_state" and m.key == key
                  and inj.ended_at - 0.06 <= t <= inj.ended_at + 1.1]
        assert states == ["failed", "running"]
        assert [t for t in steps if t > inj.ended_at]  # it steps again


def test_the_fault_events_name_their_target(faulty):
    gen, msgs = faulty
    sent = [(t, decode(m.value).events[0]) for t, m in msgs
            if m.event_type in ("training_exception", "process_exit", "xid")]
    for inj in gen.injections:
        if inj.kind not in ("exception", "process_exit", "xid"):
            continue
        at_once = [e for t, e in sent if abs(e.event_time.timestamp() - inj.injected_at) < 1e-5]
        [ev] = [e for e in at_once if e.event_type == {"exception": "training_exception"}.get(inj.kind, inj.kind)]
        if inj.kind == "xid":
            assert (ev.source.node, ev.source.gpu, ev.code) == (inj.fault.target, inj.fault.gpu, 79)
            # the rank on that GPU dies with it (an idle node has none)
            exits = [e for e in at_once if e.event_type == "process_exit"]
            if inj.job is None:
                assert exits == []
            else:
                [ex] = exits
                assert (ex.source.job, ex.source.node, ex.source.gpu, ex.source.rank) == (
                    inj.job, inj.fault.target, inj.fault.gpu, inj.fault.rank)
                assert gen.jobs[inj.job].spec.placement(inj.fault.rank) == (inj.fault.target, inj.fault.gpu)
        else:
            assert ev.source.job == inj.job and ev.source.rank == inj.fault.rank


def test_a_broken_node_takes_no_other_fault_of_its_own_and_a_lost_node_is_heard_before_it_is_lost_again():
    """A node whose GPU fell off the bus stays broken (nothing repairs it here): no second XID, no loss. A
    node back from a loss is heard for node_down_s before it can be lost again (else two losses would be
    one silence)."""
    gen = LoadGenerator(160, T0, seed=2, faults_per_kind=8, faults_from=5.0, step_s=(0.3, 0.5),
                        kinds=("xid", "node_lost"), node_loss_gap_s=3.0)
    msgs = play(gen, 120.0)
    xids = [i for i in gen.injections if i.kind == "xid"]
    broken = {i.fault.target: i.injected_at for i in xids}
    assert len(broken) == len(xids) == 8
    losses = sorted((i for i in gen.injections if i.kind == "node_lost"), key=lambda i: i.injected_at)
    assert len(losses) == 8
    for inj in losses:
        assert inj.fault.target not in broken or broken[inj.fault.target] > inj.injected_at
    # two nodes, losses planned a second apart: each waits until a node has been heard long enough
    gen = LoadGenerator(16, T0, seed=3, faults_per_kind=6, faults_from=5.0, step_s=(0.3, 0.5),
                        kinds=("node_lost",), node_loss_gap_s=1.0)
    msgs = play(gen, 90.0)
    losses = sorted(gen.injections, key=lambda i: i.injected_at)
    assert len(losses) == 6 and len({i.fault.target for i in losses}) < 6  # a node is lost again
    for a, b in zip(losses, losses[1:]):
        if a.fault.target == b.fault.target:
            heard = [t for t, m in msgs if m.event_type == "node_samples" and m.key == a.fault.target.encode()
                     and a.injected_at + gen.node_down_s <= t <= b.injected_at]
            assert len(heard) >= 2


def test_a_fail_slow_slows_its_gpu_and_its_job_from_the_onset(faulty):
    gen, msgs = faulty
    for inj in [i for i in gen.injections if i.kind == "fail_slow"]:
        assert inj.fault.onset_at is not None and inj.fault.onset_at >= inj.injected_at - 0.6
        rank = inj.fault.rank
        key = inj.job.encode()
        steps = [decode(m.value).events[0] for t, m in msgs if m.event_type == "iteration_step" and m.key == key]
        during = [st for st in steps if inj.fault.onset_at - 1e-5 <= st.start.timestamp()
                  and st.end.timestamp() <= inj.ended_at]
        assert len(during) >= gen.slow_steps - 1  # (jitter: the last may still be in flight when it ends)
        for st in during:
            others = sorted(c for r, c in enumerate(st.compute_s) if r != rank)
            assert st.compute_s[rank] > 1.3 * others[len(others) // 2]
        node = inj.fault.target.encode()
        gpu = [e for t, m in msgs if m.event_type == "node_samples" and m.key == node
               and inj.injected_at + 1.0 < t < inj.ended_at for s in decode(m.value).events
               if s.event_type == "gpu_samples" for e in s.telemetry() if e.source.gpu == inj.fault.gpu]
        assert gpu and all(g.throttle_reasons == 0x20 for g in gpu)


def test_the_same_seed_gives_the_same_cluster_and_faults():
    def run():
        gen = LoadGenerator(800, T0, seed=9, faults_per_kind=2, faults_from=5.0, step_s=(0.3, 0.5),
                            fail_slow_history=10)
        play(gen, 60.0)
        return ([(j.spec.nodes, j.spec.dp, j.spec.pp, j.spec.iteration_s) for j in gen.jobs.values()],
                [(i.kind, i.fault.target, round(i.injected_at, 6)) for i in gen.injections])
    assert run() == run()
