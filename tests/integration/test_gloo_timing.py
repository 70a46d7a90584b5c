"""The hooks' figures on real multi-process torch jobs (gloo, CPU, 4 processes) against injected delays.

No broker: each rank's sink keeps its events (see :mod:`tests.integration.gloo_ranks`).
Every delay is a sleep inside one rank's compute, so the truth is: that rank's
compute rises by the delay, and the ranks that wait for it wait that much
longer (in a collective: communication; in a point-to-point receive: wait).
Figures are medians over the delayed steps; the tolerance (a quarter of the
delay) absorbs the scheduling noise of four processes on two shared cores.
"""

from __future__ import annotations

import statistics

import pytest

from tests.integration.gloo_ranks import run_scenario
from vigil.detectors.flight_recorder import FlightRecorderAnalyzer, analyze_dumps
from vigil.detectors.straggler import localize_window

D = 0.12  # injected delay, seconds
TOL = 0.25 * D


def iterations(per_rank, steps):
    out = {}
    for rank, events in enumerate(per_rank):
        for e in events:
            if e.get("event_type") == "iteration" and e["step"] in steps:
                out.setdefault(rank, []).append(e)
    return out


def med(its, rank, key):
    return statistics.median(e[key] for e in its[rank])


def test_ddp_with_the_shipped_comm_hook_times_every_bucket_and_the_slow_rank():
    per_rank = run_scenario("ddp", steps=12, delay={"rank": 2, "seconds": D, "from_step": 4})
    calls = [e for e in per_rank[0] if e.get("event_type") == "collective" and e["group"] == "dp"]
    assert all(c["op"] == "all_reduce" and c["nbytes"] > 0 for c in calls)
    its0 = [e for e in per_rank[0] if e.get("event_type") == "iteration"]
    per_step = [sum(1 for c in calls if it["start"] <= c["start"] <= it["end"]) for it in its0]
    # every step's buckets went through the hook (DDP rebuilds its buckets after the first step)
    assert per_step[0] >= 1 and len(set(per_step[1:])) == 1 and per_step[1] >= 2, per_step
    healthy, slow = iterations(per_rank, range(1, 4)), iterations(per_rank, range(5, 12))
    others = [0, 1, 3]
    for r in range(4):
        assert med(healthy, r, "communication_s") < D / 3
        assert slow[r][0]["measured"] == {"compute_s": "cpu_wall", "communication_s": "cpu_wall", "wait_s": "cpu_wall"}
    extra_compute = med(slow, 2, "compute_s") - statistics.median(med(slow, r, "compute_s") for r in others)
    assert extra_compute == pytest.approx(D, abs=TOL)
    for r in others:  # they wait in the bucket all-reduces for rank 2: communication, not compute
        assert med(slow, r, "communication_s") - med(slow, 2, "communication_s") == pytest.approx(D, abs=TOL)
        assert med(slow, r, "compute_s") - med(healthy, r, "compute_s") < TOL
    recs = [[{"rank": r, "dp": r, "pp": 0, "tp": 0, "compute": e["compute_s"], "comm": e["communication_s"]}
             for r in range(4) for e in slow[r] if e["step"] == s] for s in range(5, 12)]
    loc = localize_window(recs, z=1.0)
    assert (loc.culprit, loc.location) == ("worker", ("rank", 2)), loc


def test_fsdp2_collectives_are_seen_and_timed():
    per_rank = run_scenario("fsdp2", steps=10, delay={"rank": 1, "seconds": D, "from_step": 4})
    ops = {(e["op"], e["group"]) for e in per_rank[0] if e.get("event_type") == "collective"}
    assert {"all_gather", "reduce_scatter"} <= {op for op, _ in ops}, ops
    healthy, slow = iterations(per_rank, range(1, 4)), iterations(per_rank, range(5, 10))
    others = [0, 2, 3]
    extra = med(slow, 1, "compute_s") - statistics.median(med(slow, r, "compute_s") for r in others)
    assert extra == pytest.approx(D, abs=TOL)
    for r in others:  # they wait for rank 1 in the all-gathers of the backward
        assert med(slow, r, "communication_s") - med(slow, 1, "communication_s") == pytest.approx(D, abs=TOL)
        assert med(slow, r, "compute_s") - med(healthy, r, "compute_s") < TOL


def test_two_stage_pipeline_p2p_waits_are_wait_never_compute():
    """dp 2 x pp 2; rank 0 (stage 0 of replica 0) computes D longer from step 4.

    Its stage-1 partner (rank 2) waits D longer for the activations (plain
    recv); its data-parallel peer (rank 1) waits D longer in the all-reduce.
    Replica 1 receives with ``batch_isend_irecv`` and a marked
    ``pipeline_wait``. Stage 1's compute does not move: the bubble is wait.
    """
    work = 0.02
    per_rank = run_scenario("pipeline", steps=12, work_s=work, delay={"rank": 0, "seconds": D, "from_step": 4})
    healthy, slow = iterations(per_rank, range(1, 4)), iterations(per_rank, range(5, 12))
    # healthy, steady state: stage 0 waits for stage 1's forward + backward (2 work); stage 1, from sending its
    # gradients to the next activations, waits for stage 0's backward and next forward (also 2 work)
    for r in (2, 3):
        assert med(healthy, r, "compute_s") == pytest.approx(2 * work, abs=TOL)
    for r in range(4):
        assert med(healthy, r, "wait_s") == pytest.approx(2 * work, abs=TOL)
    assert med(slow, 0, "compute_s") - med(slow, 1, "compute_s") == pytest.approx(D, abs=TOL)
    assert med(slow, 2, "wait_s") - med(slow, 3, "wait_s") == pytest.approx(D, abs=TOL)
    assert abs(med(slow, 2, "compute_s") - med(slow, 3, "compute_s")) < TOL  # the bubble is not compute
    assert med(slow, 1, "communication_s") - med(slow, 0, "communication_s") == pytest.approx(D, abs=TOL)
    for r in range(3):
        assert set(slow[r][0]["communication_by_kind"]) == {"dp", "pp"}
    assert set(slow[3][0]["communication_by_kind"]) == {"dp", "pp", "bubble"}  # its marked receive is a bubble
    def calls(rank):
        return {(e["op"], e["group"]) for e in per_rank[rank] if e.get("event_type") == "collective"}

    assert ("recv", "world") in calls(1) and ("send", "world") in calls(3)  # batch_isend_irecv's ops
    assert ("recv", "world") in calls(3)  # the receive inside pipeline_wait is recorded (its time is the block's)
    recs = [[{"rank": r, "dp": r % 2, "pp": r // 2, "tp": 0, "compute": e["compute_s"],
              "comm": e["communication_s"], "wait": e["wait_s"]} for r in range(4) for e in slow[r] if e["step"] == s]
            for s in range(5, 12)]
    loc = localize_window(recs, z=1.0)
    assert (loc.culprit, loc.location) == ("worker", ("rank", 0)), loc


def test_flight_recorder_from_a_real_hang_names_the_rank_that_skipped_the_collective():
    """Rank 2 never enters the third world all-reduce; every rank's hang watchdog dumps torch's recorder."""
    per_rank = run_scenario("hang", skip=2, stall_s=4.0, timeout_s=60,
                            env={"TORCH_FR_BUFFER_SIZE": "200"})
    dumps = [e for events in per_rank for e in events if e.get("event_type") == "flight_recorder_dump"]
    assert sorted(d["source"]["rank"] for d in dumps) == [0, 1, 2, 3]
    assert all(d["available"] and d["trigger"] == "hang" and d["backend"] == "gloo" for d in dumps)
    records = [dict(d, rank=d["source"]["rank"], node=d["source"]["node"]) for d in dumps]
    a = analyze_dumps(records, now=max(d["entries"][-1]["created_ns"] for d in dumps) / 1e9 + 5)
    world = next(g["name"] for g in dumps[0]["groups"] if g["desc"] == "default_pg")
    # the barrier, then one all-reduce per step: rank 2 skipped the one of step 2
    assert (a.verdict, a.group, a.culprit_ranks, a.waiting_ranks) == ("missing", world, (2,), (0, 1, 3))
    assert a.seq == 4 and a.op == "gloo:all_reduce"
    det = FlightRecorderAnalyzer(settle_s=10)
    for d in sorted(records, key=lambda d: d["event_time"]):
        det.update(d, t=float(d["entries"][-1]["created_ns"]) / 1e9)
    f = det.finding
    assert f.kind == "collective_stuck" and f.evidence["rank"] == 2 and f.evidence["node"] == "node1"
    assert f.evidence["group"] == world and f.evidence["seq"] == 4 and f.evidence["missing_ranks"] == [2]
