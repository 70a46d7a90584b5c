"""`vigil sim`'s feed: the fault vocabulary, the cluster it builds, and the playback at real or accelerated time."""

from __future__ import annotations

import re

import pytest

from vigil.schemas import Heartbeat, IterationStep, JobState, to_seconds
from vigil.sim.feed import MIN_SAMPLE_S, Feed, FeedError, build_cluster, parse_duration, parse_fault
from vigil.streams.engine.pipeline import InProcessPipeline

NODES, JOBS = build_cluster(6, 2, seed=3)


def test_the_nodes_are_shared_evenly_by_data_parallel_jobs():
    nodes, jobs = build_cluster(7, 3)
    assert nodes == [f"node-{i:02d}" for i in range(7)]
    assert [j.nodes for j in jobs] == [tuple(nodes[0:3]), tuple(nodes[3:5]), tuple(nodes[5:7])]
    assert all(j.dp == len(j.nodes) and j.pp == 1 and j.tp == 8 for j in jobs)
    with pytest.raises(FeedError, match="--jobs"):
        build_cluster(2, 3)


@pytest.mark.parametrize("text, fields", [
    ("node_loss@30s:node-03", {"kind": "node_loss", "target": "node-03", "at": 30.0, "recover_at": None}),
    ("node_loss@1m:node-01,timeout=5s,for=20s", {"at": 60.0, "peers_time_out": 5.0, "recover_at": 80.0}),
    ("xid@20:node-02,code=48,gpu=3", {"kind": "xid", "code": 48, "gpu": 3, "at": 20.0}),
    ("gpu_slow@1.5m:node-04,gpu=2,slowdown=0.4", {"at": 90.0, "gpu": 2, "slowdown": 0.4}),
    ("congestion@500ms:node-05", {"at": 0.5, "slowdown": 0.5}),
    ("hang@25s:job-1,for=10s", {"kind": "hang", "target": "job-1", "recover_at": 35.0}),
    ("process_exit@25s:job-0,rank=3", {"rank": 3}),
    ("exception@25s:job-0,category=nccl_timeout", {"category": "nccl_timeout"}),
])
def test_the_fault_vocabulary(text, fields):
    fault = parse_fault(text, NODES, JOBS)
    assert {k: getattr(fault, k) for k in fields} == fields


@pytest.mark.parametrize("text, says", [
    ("meteor@3s:node-01", "unknown kind 'meteor'"),
    ("node_loss@3s:node-99", "'node-99' is none of node-00"),
    ("hang@3s:node-01", "hang targets a job"),
    ("xid@soon:node-01", "is not a duration"),
    ("xid@3s:node-01,gpu=9", "gpu must be 0..7"),
    ("hang@3s:job-0,code=4", "hang takes no 'code'"),
    ("exception@3s:job-0,category=bad", "category 'bad' is none of"),
    ("process_exit@3s:job-0,rank=x", "rank='x' is not a number"),
    ("node_loss", "expected KIND@TIME"),
])
def test_a_bad_fault_says_what_was_expected(text, says):
    with pytest.raises(FeedError, match=re.escape(says)):
        parse_fault(text, NODES, JOBS)


def test_a_fault_without_target_gets_one_from_the_seed():
    import random

    picks = {parse_fault("node_loss@3s", NODES, JOBS, random.Random(s)).target for s in range(20)}
    assert picks <= set(NODES) and len(picks) > 1
    assert parse_fault("hang@3s", NODES, JOBS, random.Random(1)).target in {j.name for j in JOBS}


def test_durations():
    assert [parse_duration(t) for t in ("30s", "2m", "1.5h", "250ms", "7")] == [30.0, 120.0, 5400.0, 0.25, 7.0]


def _play(feed: Feed, start: float, tick: float = 0.05, pipe: InProcessPipeline | None = None):
    feed.begin(start)
    events, injections, alerts = [], [], []
    t = start
    while not feed.finished:
        t += tick
        batch: list = []
        injections += feed.step(t, batch.append)
        for group in batch:
            events += group
            if pipe is not None:
                alerts += pipe.feed(group, t)
        if pipe is not None:
            alerts += pipe.tick(t)
    return events, injections, alerts


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_playback_compresses_cluster_time_by_the_speed_and_ends_every_job(speed):
    faults = [parse_fault("node_loss@12s:node-04", NODES, JOBS)]
    feed = Feed(NODES, JOBS, faults, duration_s=20.0, speed=speed, seed=1)
    events, injections, _ = _play(feed, start=50_000.0)
    # the fault happens at 12 cluster seconds: 12 / speed wall seconds after the start
    assert [(i.fault.kind, i.fault.target, i.cluster_s) for i in injections] == [("node_loss", "node-04",
                                                                                  pytest.approx(12.0))]
    assert injections[0].wall == pytest.approx(50_000.0 + 12.0 / speed)
    assert (injections[0].expected_kinds, injections[0].expected_severity) == (("node_lost",), 1)
    # steps are the cluster's, compressed; the agents sample every second of cluster time, at most every 0.5 s
    steps = [e for e in events if isinstance(e, IterationStep) and e.source.job == "job-0"]
    assert sum(s.duration_s for s in steps) / len(steps) == pytest.approx(JOBS[0].iteration_s / speed, rel=0.1)
    beats = [to_seconds(e.event_time) for e in events if isinstance(e, Heartbeat) and e.source.node == "node-00"]
    assert beats[1] - beats[0] == pytest.approx(max(1.0 / speed, MIN_SAMPLE_S))
    assert max(to_seconds(e.event_time) for e in events) <= 50_000.0 + 20.0 / speed + 1e-6
    # every job starts running with its size and ends: job-1 lost node-04 for good
    states = [(e.source.job, e.state, e.gpus) for e in events if isinstance(e, JobState)]
    assert states[:2] == [("job-0", "running", 24), ("job-1", "running", 24)]
    assert sorted(states[2:]) == [("job-0", "completed", 24), ("job-1", "failed", 24)]


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_what_the_feed_injects_is_what_the_detectors_find(speed):
    faults = [parse_fault("node_loss@10s:node-01", NODES, JOBS), parse_fault("xid@14s:node-05,code=79", NODES, JOBS)]
    feed = Feed(NODES, JOBS, faults, duration_s=24.0, speed=speed, seed=2)
    _, injections, alerts = _play(feed, start=80_000.0, pipe=InProcessPipeline())
    for inj in injections:
        hit = [a for a in alerts if a.kind in inj.expected_kinds and a.subject.node == inj.fault.target
               and to_seconds(a.detection_time) >= inj.wall]
        assert hit and hit[0].severity == inj.expected_severity, inj.describe()
    # nothing about job-1's nodes (node-03..05) but the XID on node-05: no false page on the healthy job
    assert {a.kind for a in alerts if a.subject.node in ("node-03", "node-04") or a.subject.job == "job-1"} == set()


def test_a_fault_after_the_end_or_a_bad_speed_is_refused():
    with pytest.raises(FeedError, match="after the end"):
        Feed(NODES, JOBS, [parse_fault("hang@30s:job-0", NODES, JOBS)], duration_s=20.0)
    with pytest.raises(FeedError, match="--speed"):
        Feed(NODES, JOBS, [], duration_s=20.0, speed=0)
