"""Plans the decision engine attaches: re-planning, micro-batches, topology, from job layouts it was told."""

from __future__ import annotations

import uuid

from vigil.schemas import Alert, Decision, JobState, NodeState, Source, Subject, from_seconds, Slowdown
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.planning import replan
from vigil.streams.engine.skirental import FailSlowMitigation

T0 = from_seconds(1_700_000_000)


def job(name: str, nodes: list[str], dp: int, pp: int, **kw) -> JobState:
    return JobState(event_time=T0, source=Source(job=name), state="running", nodes=nodes, gpus=8 * len(nodes),
                    dp=dp, pp=pp, tp=8, **kw)


def slow_alert(name: str, node: str, kind: str, cls: str) -> Alert:
    """A fail-slow of ``name`` attributed to ``node`` (root: a GPU or link cause on that node)."""
    return Alert(event_time=T0, source=Source(), incident_id=uuid.uuid4(), incident_version=1, status="open", severity=3,
                 kind=kind, subject=Subject(node=node, gpu=0), onset_time=T0, detection_time=T0,
                 evidence=[{"kind": kind, "subject": {"node": node, "gpu": 0}},
                           {"kind": "fail_slow", "subject": {"job": name}}],
                 jobs={name: []}, slowdowns=[Slowdown(job=name, before_s=1.0, after_s=2.0, slowdown_class=cls)],
                 detector="gpu", detector_version="1")


def bought(eng: DecisionEngine, until: int) -> list[Decision]:
    return [d for t in range(until) for d in eng.tick(float(t)) if isinstance(d, Decision)]


def test_a_slow_gpu_gets_fewer_microbatches_then_a_topology_step():
    nodes = [f"n{i}" for i in range(12)]  # dp=3 replicas x pp=4 stages, rank order
    eng = DecisionEngine(mitigation=FailSlowMitigation(
        {"rebalance_microbatches": 1, "adjust_topology": 10, "checkpoint_restart": 1000}))
    eng.on_state(job("gpt", nodes, dp=3, pp=4), 0)
    eng.on_alert(slow_alert("gpt", "n4", "throttle", "computation"), 0)  # replica 1, stage 0
    s2, s3 = bought(eng, 30)
    assert s2.action == "rebalance_microbatches" and s2.target.job == "gpt"
    # 24 micro-batches; the slow replica takes twice as long per micro-batch. The best step time is
    # 10 (healthy) micro-batch times: 5 for the slow replica, 10 + 9 for the others.
    counts = s2.plan["microbatches"]
    assert sum(counts) == 24 and counts[1] == 5 and max(counts[0] * 1.0, counts[1] * 2.0, counts[2] * 1.0) == 10
    # one slow node already sits in the fewest stages (one): consolidation has nothing to swap
    assert s3.action == "adjust_topology" and s3.plan == {"swaps": []}


def test_a_congested_link_is_moved_out_of_the_data_parallel_ring_and_not_rebalanced():
    nodes = [f"n{i}" for i in range(4)]  # dp=2 x pp=2
    eng = DecisionEngine(mitigation=FailSlowMitigation(
        {"rebalance_microbatches": 1, "adjust_topology": 10, "checkpoint_restart": 1000}))
    eng.on_state(job("bert", nodes, dp=2, pp=2), 0)
    eng.on_alert(slow_alert("bert", "n0", "congestion", "communication"), 0)
    (s3,) = bought(eng, 30)
    assert s3.action == "adjust_topology" and len(s3.plan["swaps"]) == 1


def test_replanning_gives_the_healthy_nodes_to_the_jobs_that_gain_most():
    t = T0
    a = job("a", ["n1", "n2"], dp=2, pp=1, weight=2.0)
    b = JobState(event_time=t, source=Source(job="b"), state="pending", gpus=16, dp=2, weight=1.0)
    plan = replan({"a": a, "b": b}, {"n1", "n2", "n3", "n4"})
    assert plan["allocations"] == {"a": ["n1", "n2"], "b": ["n3", "n4"]}
    # n2 is lost: a keeps n1 and may take a free node; nothing is given twice
    plan = replan({"a": a, "b": b}, {"n1", "n3", "n4"})
    given = [n for nodes in plan["allocations"].values() for n in nodes]
    assert len(given) == len(set(given)) and set(given) <= {"n1", "n3", "n4"} and "n2" not in given


def test_a_node_coming_back_replans_with_the_planner():
    eng = DecisionEngine(replan=replan)
    for n in ("n1", "n2", "n3"):
        eng.on_state(NodeState(event_time=T0, source=Source(node=n), state="healthy"), 0)
    eng.on_state(NodeState(event_time=T0, source=Source(node="n3"), state="lost"), 1)
    eng.on_state(job("a", ["n1", "n2"], dp=2, pp=1), 2)
    (d,) = eng.on_state(NodeState(event_time=T0, source=Source(node="n3"), state="joined"), 3)  # passed its check
    assert d.action == "replan" and d.plan["allocations"]["a"][:2] == ["n1", "n2"]
