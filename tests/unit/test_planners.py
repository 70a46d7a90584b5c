"""The planners against brute force on small instances, their edge cases and input validation.

Every expected value is computed here, by exhaustive search over the
instance written from the problem's definition, never taken from a
recorded run of the planner.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.actuators.planners import (
    WafJob,
    consolidate_stragglers,
    place_best_fit,
    place_job,
    place_packing,
    place_random_fit,
    plan_workers,
    rebalance_microbatches,
    reroute_congested_link,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- WAF (Unicron)

def _waf(job: WafJob, x: int) -> float:
    """F(t, x) from the definition."""
    if x <= 0 or x < job.min_workers or x >= len(job.throughput):
        return 0.0
    return job.weight * job.throughput[x]


def _gain(job: WafJob, x_new: int, d_run: float, d_tr: float) -> float:
    moved = x_new != job.current_workers or job.failed
    return _waf(job, x_new) * d_run - (_waf(job, job.current_workers) * d_tr if moved else 0.0)


def _brute_waf(jobs, n, d_run, d_tr):
    """Best objective and, among the best plans, the most jobs kept at their size."""
    options = [[0] + list(range(j.min_workers, min(len(j.throughput) - 1, n) + 1)) for j in jobs]
    best, kept = -math.inf, -1
    for alloc in itertools.product(*options):
        if sum(alloc) > n:
            continue
        value = 0.0
        for j, x in zip(jobs, alloc):
            value += _gain(j, x, d_run, d_tr)
        k = sum(x == j.current_workers for j, x in zip(jobs, alloc))
        if value > best or (value == best and k > kept):
            best, kept = value, k
    return best, kept


@st.composite
def waf_instances(draw):
    m = draw(st.integers(1, 4))
    n = draw(st.integers(0, 8))
    jobs = []
    for i in range(m):
        length = draw(st.integers(1, 6))
        table = [0] + draw(st.lists(st.integers(0, 9), min_size=length - 1, max_size=length - 1))
        min_workers = draw(st.integers(1, 4))
        valid_current = [0] + list(range(min_workers, length))
        jobs.append(WafJob(name=f"j{i}", weight=draw(st.integers(0, 3)), min_workers=min_workers,
                            throughput=table, current_workers=draw(st.sampled_from(valid_current)),
                            failed=draw(st.booleans())))
    return jobs, n, draw(st.integers(0, 5)), draw(st.integers(0, 5))


@FAST
@given(waf_instances())
def test_waf_equals_brute_force(instance):
    jobs, n, d_run, d_tr = instance
    plan = plan_workers(jobs, n, d_run, d_tr)
    best, kept = _brute_waf(jobs, n, d_run, d_tr)
    assert plan.objective == best
    assert plan.kept == kept
    assert sum(plan.workers) <= n
    for j, x, g in zip(jobs, plan.workers, plan.gains):
        assert x == 0 or j.min_workers <= x < len(j.throughput)
        assert g == _gain(j, x, d_run, d_tr)
    assert sum(_gain(j, x, d_run, d_tr) for j, x in zip(jobs, plan.workers)) == best


def test_waf_job_that_cannot_reach_its_minimum_gets_zero():
    big = WafJob("big", weight=5.0, min_workers=6, throughput=[0, 1, 2, 3, 4, 5, 100, 100], current_workers=0)
    small = WafJob("small", weight=1.0, min_workers=1, throughput=[0, 1, 2, 3, 4], current_workers=2)
    plan = plan_workers([big, small], available=5, d_running=10, d_transition=1)
    assert plan.allocation == {"big": 0, "small": 4}
    # a minimum beyond the job's own table: never runs, whatever the cluster
    odd = WafJob("odd", weight=1.0, min_workers=4, throughput=[0, 1, 2], current_workers=0)
    assert plan_workers([odd], available=100, d_running=10, d_transition=1).workers == (0,)


def test_waf_failed_worker_forces_the_transition_cost():
    table = [0, 0, 4, 6]
    healthy = WafJob("a", weight=1.0, min_workers=2, throughput=table, current_workers=3)
    failed = WafJob("a", weight=1.0, min_workers=2, throughput=table, current_workers=3, failed=True)
    keep = plan_workers([healthy], available=3, d_running=10, d_transition=2)
    assert keep.workers == (3,) and keep.objective == 60.0
    restart = plan_workers([failed], available=3, d_running=10, d_transition=2)
    assert restart.workers == (3,) and restart.objective == 60.0 - 6.0 * 2


def test_waf_ties_keep_the_current_allocation():
    # sizes 2 and 3 give the same throughput: keeping 2 avoids a transition; with D_transition = 0
    # the gains are equal, and the tie rule still keeps the current size
    job = WafJob("a", weight=1.0, min_workers=1, throughput=[0, 1, 5, 5], current_workers=2)
    assert plan_workers([job], available=3, d_running=1, d_transition=0).workers == (2,)
    other = WafJob("b", weight=1.0, min_workers=1, throughput=[0, 5, 5], current_workers=1)
    plan = plan_workers([job, other], available=3, d_running=1, d_transition=0)
    assert plan.allocation == {"a": 2, "b": 1} and plan.kept == 2


@pytest.mark.parametrize("kwargs, field", [
    (dict(weight=-1.0), "weight"),
    (dict(min_workers=0), "min_workers"),
    (dict(throughput=[1, 2, 3]), "throughput[0]"),
    (dict(throughput=[0, -1.0]), "throughput"),
    (dict(throughput=[]), "throughput"),
    (dict(current_workers=-1), "current_workers"),
    (dict(current_workers=5), "current_workers"),
    (dict(min_workers=2, current_workers=1), "current_workers"),
])
def test_waf_jobspec_validation_names_the_field(kwargs, field):
    args = dict(name="j", weight=1.0, min_workers=1, throughput=[0, 1, 2], current_workers=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        WafJob(**args)


@pytest.mark.parametrize("args, field", [
    (dict(available=-1), "available"),
    (dict(available=2.5), "available"),
    (dict(d_running=-1.0), "d_running"),
    (dict(d_transition=math.inf), "d_transition"),
])
def test_waf_plan_validation_names_the_field(args, field):
    job = WafJob("j", weight=1.0, min_workers=1, throughput=[0, 1, 2])
    kw = dict(available=2, d_running=1.0, d_transition=1.0)
    kw.update(args)
    with pytest.raises(ValueError, match=field):
        plan_workers([job], **kw)
    with pytest.raises(ValueError, match="duplicate"):
        plan_workers([job, job], available=2, d_running=1.0, d_transition=1.0)


# --------------------------------------------------------------------------- placement (Arnold)

def _spread(rank_pods, dp, pp, alpha, beta):
    stages = [len({rank_pods[d * pp + s] for d in range(dp)}) for s in range(pp)]
    splits = sum(len({rank_pods[d * pp + s] for s in range(pp)}) > 1 for d in range(dp))
    return alpha * max(stages) + beta * splits


def _brute_placement(free, dp, pp, alpha, beta):
    best = math.inf
    for assign in itertools.product(range(len(free)), repeat=dp * pp):
        if any(assign.count(k) > f for k, f in enumerate(free)):
            continue
        best = min(best, _spread(assign, dp, pp, alpha, beta))
    return best


def _check_layout(p, pods, dp, pp, alpha, beta):
    assert len(p.rank_nodes) == dp * pp and len(set(p.rank_nodes)) == dp * pp
    for node, k in zip(p.rank_nodes, p.rank_minipods):
        assert node in pods[k]
    for k, pod in enumerate(pods):  # consecutive ranks take a minipod's nodes in its order
        mine = [node for node, kk in zip(p.rank_nodes, p.rank_minipods) if kk == k]
        assert mine == pod[:len(mine)]
    assert p.objective == _spread(p.rank_minipods, dp, pp, alpha, beta)
    for d in range(dp):
        assert set(p.pp_group_minipods[d]) == set(p.rank_minipods[d * pp:(d + 1) * pp])


@st.composite
def placement_instances(draw):
    dp = draw(st.integers(1, 3))
    pp = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    free = draw(st.lists(st.integers(0, 4), min_size=k, max_size=k))
    if sum(free) < dp * pp:
        free[0] += dp * pp - sum(free)
    return dp, pp, free, draw(st.integers(0, 3)), draw(st.integers(0, 3))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placement_instances())
def test_placement_equals_brute_force(instance):
    dp, pp, free, alpha, beta = instance
    pods = [[f"m{k}n{i}" for i in range(f)] for k, f in enumerate(free)]
    p = place_job(pods, dp, pp, alpha=alpha, beta=beta)
    assert p.optimal is True
    _check_layout(p, pods, dp, pp, alpha, beta)
    assert p.objective == _brute_placement(free, dp, pp, alpha, beta)
    for baseline in (place_best_fit(pods, dp, pp, alpha=alpha, beta=beta),
                     place_random_fit(pods, dp, pp, seed=3, alpha=alpha, beta=beta),
                     place_packing(pods, dp, pp, alpha=alpha, beta=beta)):
        _check_layout(baseline, pods, dp, pp, alpha, beta)
        assert baseline.objective >= p.objective


def test_placement_prefers_whole_pipelines_when_they_fit():
    pods = [[f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]]
    p = place_job(pods, dp=4, pp=4)
    assert (p.dp_spread, p.pp_splits) == (2, 0)
    assert p.pp_group_minipods == ((0,), (0,), (1,), (1,))


@pytest.mark.parametrize("call, field", [
    (lambda: place_job([["a", "b"]], dp=0, pp=1), "dp"),
    (lambda: place_job([["a", "b"]], dp=1, pp=True), "pp"),
    (lambda: place_job([["a", "b"]], dp=2, pp=2), "free_nodes"),
    (lambda: place_job([["a"], ["a"]], dp=1, pp=1), "free_nodes"),
    (lambda: place_job("ab", dp=1, pp=1), "free_nodes"),
    (lambda: place_job([["a", "b"]], dp=1, pp=1, alpha=-1), "alpha"),
    (lambda: place_job([["a", "b"]], dp=1, pp=1, beta=math.nan), "beta"),
    (lambda: place_best_fit([["a"]], dp=2, pp=1), "free_nodes"),
])
def test_placement_validation_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


# --------------------------------------------------------------------------- micro-batches (Falcon S2)

def _compositions(total, parts):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def _greedy_from_ones(times, total):
    m = [1] * len(times)
    heap = [(2 * t, i) for i, t in enumerate(times)]
    heapq.heapify(heap)
    for _ in range(total - len(times)):
        _, i = heapq.heappop(heap)
        m[i] += 1
        heapq.heappush(heap, ((m[i] + 1) * times[i], i))
    return tuple(m)


times_st = st.floats(min_value=0.01, max_value=100.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@FAST
@given(st.lists(times_st, min_size=1, max_size=4), st.integers(0, 8))
def test_microbatch_equals_brute_force(times, extra):
    total = len(times) + extra
    plan = rebalance_microbatches(times, total)
    best = min(max(m * t for m, t in zip(c, times)) for c in _compositions(total, len(times)))
    assert plan.makespan == best
    assert sum(plan.counts) == total and min(plan.counts) >= 1
    assert plan.makespan == max(m * t for m, t in zip(plan.counts, times))
    assert plan.counts[plan.bottleneck] * times[plan.bottleneck] == plan.makespan


@FAST
@given(st.lists(times_st, min_size=1, max_size=60), st.integers(0, 3000))
def test_microbatch_fast_start_is_the_plain_greedy(times, extra):
    """The water-level start followed by the heap gives exactly the greedy from all-ones."""
    total = len(times) + extra
    assert rebalance_microbatches(times, total).counts == _greedy_from_ones(times, total)


def test_microbatch_slow_group_and_extreme_spread():
    plan = rebalance_microbatches([1.0, 1.0, 1.0, 100.0], 40)
    assert plan.makespan == 100.0 and plan.counts[3] == 1 and sum(plan.counts) == 40
    plan = rebalance_microbatches([1e-6, 1.0], 2)
    assert plan.counts == (1, 1)
    rng = np.random.default_rng(0)
    t = rng.uniform(0.5, 2.0, 512)
    plan = rebalance_microbatches(t, 10**7)
    assert sum(plan.counts) == 10**7
    # optimal: removing the bottleneck's last micro-batch cannot be absorbed anywhere below the makespan
    assert sum(math.floor(plan.makespan / x) for x in t) >= 10**7


@pytest.mark.parametrize("times, total, field", [
    ([1.0, 2.0], 1, "total"),
    ([1.0, 2.0], 2.0, "total"),
    ([1.0, 0.0], 4, r"times\[1\]"),
    ([1.0, math.nan], 4, "times"),
    ([], 4, "times"),
])
def test_microbatch_validation_names_the_field(times, total, field):
    with pytest.raises(ValueError, match=field):
        rebalance_microbatches(times, total)


def test_microbatch_fewer_than_groups_says_so():
    with pytest.raises(ValueError, match="fewer than the 3 DP groups"):
        rebalance_microbatches([1.0, 1.0, 1.0], 2)


# --------------------------------------------------------------------------- topology (Falcon S3)

def _boundary(s, pp):
    return pp > 2 and s in (0, pp - 1)


def _brute_consolidation(dp, pp, slow_positions):
    """Fewest swaps to put the stragglers into ceil(k / dp) stages; and the fewest boundary stages then."""
    k = len(slow_positions)
    need = math.ceil(k / dp)
    cells = [(d, s) for d in range(dp) for s in range(pp)]
    start = frozenset(slow_positions)
    dist = {start: 0}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        for a in state:
            for b in cells:
                if b in state:
                    continue
                nxt = (state - {a}) | {b}
                if nxt not in dist:
                    dist[nxt] = dist[state] + 1
                    queue.append(nxt)
    goals = [(dist[s], sum(_boundary(t, pp) for t in {c[1] for c in s}))
             for s in dist if len({c[1] for c in s}) == need]
    return min(goals)


@st.composite
def grids_with_stragglers(draw):
    dp = draw(st.integers(1, 3))
    pp = draw(st.integers(1, 4))
    cells = [(d, s) for d in range(dp) for s in range(pp)]
    slow = draw(st.sets(st.sampled_from(cells), max_size=len(cells)))
    return dp, pp, slow


@FAST
@given(grids_with_stragglers())
def test_consolidation_equals_brute_force(instance):
    dp, pp, slow_pos = instance
    grid = [[f"n{d}.{s}" for s in range(pp)] for d in range(dp)]
    slow = {grid[d][s] for d, s in slow_pos}
    plan = consolidate_stragglers(grid, slow)
    # the swaps, replayed on the original grid, give the new grid
    replay = [row[:] for row in grid]
    for a, b in plan.swaps:
        (da, sa), (db, sb) = [next((d, s) for d in range(dp) for s in range(pp) if replay[d][s] == x) for x in (a, b)]
        replay[da][sa], replay[db][sb] = b, a
    assert tuple(map(tuple, replay)) == plan.grid
    if not slow:
        assert plan.swaps == () and plan.stages == ()
        return
    used = {s for d in range(dp) for s in range(pp) if plan.grid[d][s] in slow}
    assert used <= set(plan.stages) and len(plan.stages) == math.ceil(len(slow) / dp)
    swaps, boundary = _brute_consolidation(dp, pp, slow_pos)
    assert len(plan.swaps) == swaps
    assert sum(_boundary(s, pp) for s in plan.stages) == boundary


def test_consolidation_prefers_interior_stages_and_the_own_replica():
    grid = [["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]
    plan = consolidate_stragglers(grid, {"a3", "b2"})
    assert plan.stages == (2,) and plan.swaps == (("a3", "a2"),)
    plan = consolidate_stragglers(grid, {"a0", "b0"})  # already together in one stage: no swap
    assert plan.stages == (0,) and plan.swaps == ()


@FAST
@given(st.integers(1, 3), st.integers(2, 4), st.data())
def test_congested_dp_link_becomes_a_pp_link(dp, pp, data):
    grid = [[f"n{d}.{s}" for s in range(pp)] for d in range(dp)]
    nodes = [n for row in grid for n in row]
    a = data.draw(st.sampled_from(nodes))
    b = data.draw(st.sampled_from([n for n in nodes if n != a]))
    plan = reroute_congested_link(grid, (a, b))
    pos = {n: (d, s) for d, row in enumerate(plan.grid) for s, n in enumerate(row)}
    old = {n: (d, s) for d, row in enumerate(grid) for s, n in enumerate(row)}
    assert sorted(pos) == sorted(old)
    if old[a][1] == old[b][1]:  # DP traffic: one swap (the minimum) turns it into a PP link
        assert len(plan.swaps) == 1
        (da, sa), (db, sb) = pos[a], pos[b]
        assert da == db and abs(sa - sb) == 1
        assert sum(pos[n] != old[n] for n in nodes) == 2
    else:
        assert plan.swaps == () and plan.grid == tuple(map(tuple, grid))


@pytest.mark.parametrize("call, field", [
    (lambda: consolidate_stragglers([["a", "b"], ["c"]], set()), "rectangular"),
    (lambda: consolidate_stragglers([["a", "b"], ["c", "a"]], set()), "twice"),
    (lambda: consolidate_stragglers([], set()), "grid"),
    (lambda: consolidate_stragglers([["a", "b"]], {"z"}), "stragglers"),
    (lambda: consolidate_stragglers([["a", "b"]], "a"), "stragglers"),
    (lambda: reroute_congested_link([["a", "b"]], ("a", "z")), "link"),
    (lambda: reroute_congested_link([["a", "b"]], ("a", "a")), "link"),
    (lambda: reroute_congested_link([["a"], ["b"]], ("a", "b")), "pp == 1"),
    (lambda: reroute_congested_link([["a", "b"]], "a"), "link"),
])
def test_topology_validation_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


# --------------------------------------------------------------------------- the benchmark

def test_bench_planners_tiny(tmp_path):
    import json

    from vigil.bench.planners import format_table, run

    path = tmp_path / "planners.json"
    result = run(str(path), repeats=1, microbatch_groups=(8,), microbatch_headline=16,
                 waf_sizes=((3, 80),), waf_headline=(4, 160), waf_max_size_nodes=6,
                 placement_sizes=((8, 64, 2),), placement_headline=(16, 64, 4), quality_seeds=2)
    written = json.loads(path.read_text())
    for key in ("microbatch_512_ms", "waf_100jobs_10k_ms", "placement_512of1024_ms",
                "placement_spread_vs_best_baseline", "detail"):
        assert key in written and written[key] is not None
    assert written["placement_spread_vs_best_baseline"] >= 1.0  # the exact placement is never worse
    d = written["detail"]
    for key in ("microbatch", "waf", "waf_gpu_units", "placement", "placement_quality", "machine"):
        assert key in d
    assert d["machine"]["cpus"] and d["machine"]["python"]
    assert all(len(d["machine"][k]) == 3 for k in ("load_before", "load_after"))  # 1, 5, 15 min
    # smaller instances than `vigil bench planners` can ask for: the command is the Python call
    assert written["command"].startswith("python -c 'from vigil.bench.planners import run; run(")
    assert "microbatch_headline=16" in written["command"]
    assert len(format_table(result)) == 4
    # one call per timing: its n, and no 95 % interval (6 calls at least)
    assert {k: v["n"] for k, v in written["intervals"].items()} == {
        "microbatch_512_ms": 1, "waf_100jobs_10k_ms": 1, "placement_512of1024_ms": 1}
    assert all(v["ms_ci95"] is None for v in written["intervals"].values())
    assert all(v is None for v in written["targets_met_over_interval"].values())
    assert all(r["n"] == 1 and len(r["runs_ms"]) == 1 for r in d["microbatch"] + d["waf"] + d["placement"])


def test_bench_planners_timings_have_their_interval():
    from vigil.bench.planners import run

    result = run(None, repeats=6, microbatch_groups=(8,), microbatch_headline=8, waf_sizes=((3, 80),),
                 waf_headline=(3, 80), waf_max_size_nodes=6, waf_gpu_units=False, placement_sizes=((8, 64, 2),),
                 placement_headline=(8, 64, 2), quality_seeds=1)
    d = result["detail"]
    for row in d["microbatch"] + d["waf"] + d["placement"]:
        runs = row["runs_ms"]
        assert row["n"] == len(runs) == 6 and row["ci_coverage"] == 0.9688  # 6 runs: [min, max]
        assert row["ms_ci95"] == [min(runs), max(runs)]
    for key, iv in result["intervals"].items():
        lo, hi = iv["ms_ci95"]
        assert iv["n"] == 6 and lo <= result[key] <= hi
        assert result["targets_met_over_interval"][key] == (hi <= result["detail"]["targets_ms"][key])
