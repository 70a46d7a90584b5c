"""``vigil bench planners``: how fast the planners are, and how much placement gains over the baselines.

Every timing is the median wall time (``time.perf_counter``, one core, the
whole public function including input validation) of ``repeats`` calls on
the same seeded instance, with its ``n`` and its distribution-free 95 %
interval from the order statistics (``ms_ci95``; None below 6 calls: see
:func:`vigil.bench.intervals.median_interval`) and every call's time.

Instances
---------
- **Micro-batch rebalancing** (Falcon S2): ``n`` DP groups with per
  micro-batch times uniform in [0.9, 1.1] s, 2 % of them stragglers slowed
  1.5-3x, ``M = 8 n`` micro-batches. Headline: ``n = 512``.
- **Multi-job re-planning** (Unicron): ``m`` jobs on a cluster of ``G`` GPUs
  planned in nodes of 8 GPUs (``G / 8`` workers). Each job's largest useful
  size is log-uniform in [1, 128] nodes (up to 1,024 GPUs), its minimum a
  random fraction of it, its throughput table ``x^0.9`` with a 15 % penalty
  on sizes that are not a multiple of its pipeline depth and 5 % noise
  (non-linear, non-monotonic); current sizes fill ~95 % of the cluster and 3 %
  of the jobs lost a worker. ``D_running = 3600 s``, ``D_transition = 300 s``.
  Headline: 100 jobs on 10,000 GPUs (1,250 nodes). The same instance planned
  in GPUs (10,000 workers, tables up to 1,024) is timed in ``detail``.
- **Placement** (Arnold): a cluster of ``C`` nodes in minipods of 32 whose
  free nodes are a random subset of 8 to 32 nodes each (a fragmented
  cluster, ~62 % free); a job of ``dp x pp`` nodes. Headline: 512 nodes
  (``dp = 64``, ``pp = 8``) in a 1,024-node cluster. Quality: for several
  seeded clusters, the objective ``dp_spread + pp_splits`` (see
  :mod:`vigil.actuators.planners.placement`) of best-fit, random-fit and packing
  against the exact placement; ``placement_spread_vs_best_baseline`` is the
  median over seeds of (the best baseline's objective / ours).

Result keys: ``microbatch_512_ms``, ``waf_100jobs_10k_ms``,
``placement_512of1024_ms``, ``placement_spread_vs_best_baseline``,
``intervals`` (each headline timing's ``n``, ``ms_ci95`` and coverage),
``targets_met`` (the medians against :data:`TARGETS_MS`) and
``targets_met_over_interval`` (the interval's upper end against them),
``command`` (what reproduces the result: the ``vigil bench planners`` line, or
the Python call when an argument the command does not take was changed) and
``detail`` (the sweeps, per-seed quality, targets, and the machine with its
load average before and after the run). The headline keys keep their names
when the headline instances are made smaller (as the unit test does);
``detail.headline`` says what was measured.
"""

from __future__ import annotations

from vigil.schemas import GPUS_PER_NODE

import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from vigil.actuators.planners import (
    WafJob,
    place_best_fit,
    place_job,
    place_packing,
    place_random_fit,
    plan_workers,
    rebalance_microbatches,
)
from vigil.actuators.planners.placement import Placement
from vigil.bench.command import reproducing_command
from vigil.bench.intervals import median_interval
from vigil.bench.machine import measured

__all__ = ["run", "microbatch_instance", "waf_instance", "fragmented_cluster", "format_table", "quality_row",
           "quality_summary"]

#: Targets from the issue, in milliseconds.
TARGETS_MS = {"microbatch_512_ms": 10.0, "waf_100jobs_10k_ms": 100.0, "placement_512of1024_ms": 1000.0}
MINIPOD_NODES = 32
#: ``run`` arguments that ``vigil bench planners`` takes, and its options.
CLI_OPTIONS = {"repeats": "--repeats", "seed": "--seed", "quality_seeds": "--quality-seeds"}


def microbatch_instance(groups: int, seed: int = 0) -> tuple[list[float], int]:
    """Per-group micro-batch times (2 % stragglers) and ``M = 8 * groups``."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.9, 1.1, groups)
    slow = rng.choice(groups, max(1, groups // 50), replace=False)
    t[slow] *= rng.uniform(1.5, 3.0, slow.size)
    return t.tolist(), 8 * groups


def waf_instance(jobs: int, workers: int, max_size: int, seed: int = 0, scale: int = 1) -> list[WafJob]:
    """``jobs`` jobs for a cluster of ``workers`` workers (see the module docstring).

    ``scale`` multiplies every size (8 turns a node-level instance into the
    same instance in GPUs).
    """
    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, np.rint(np.exp(rng.uniform(0, math.log(max_size), jobs)))).astype(int)
    depth = rng.choice([1, 2, 4, 8], jobs)
    # current sizes: each job's largest size scaled so that the cluster is ~95 % used
    cur = np.maximum(1, np.floor(sizes * min(1.0, 0.95 * workers / scale / sizes.sum()))).astype(int)
    out = []
    for i in range(jobs):
        top = int(sizes[i]) * scale
        x = np.arange(top + 1, dtype=np.float64)
        t = (x / scale) ** 0.9 * rng.uniform(0.95, 1.05, top + 1)
        t[(np.arange(top + 1) // scale) % depth[i] != 0] *= 0.85
        t[0] = 0.0
        low = max(1, int(sizes[i] * rng.uniform(0.0, 0.5))) * scale
        current = max(low, int(cur[i]) * scale)
        out.append(WafJob(name=f"job-{i}", weight=float(rng.uniform(0.5, 2.0)), min_workers=low,
                           throughput=t.tolist(), current_workers=current, failed=bool(rng.random() < 0.03)))
    return out


def fragmented_cluster(nodes: int, seed: int = 0, need: int = 0) -> list[list[int]]:
    """Free nodes per minipod of 32: a random subset of 8 to 32 nodes each (at least ``need`` in all)."""
    rng = np.random.default_rng(seed)
    pods = max(1, nodes // MINIPOD_NODES)
    while True:
        out = []
        for k in range(pods):
            f = int(rng.integers(8, MINIPOD_NODES + 1))
            idx = np.sort(rng.choice(MINIPOD_NODES, f, replace=False))
            out.append([k * MINIPOD_NODES + int(i) for i in idx])
        if sum(map(len, out)) >= need:
            return out


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[dict[str, Any], Any]:
    """``({"ms", "n", "ms_ci95", "ci_coverage", "runs_ms"}, the last result)`` of ``repeats`` calls.

    ``ms`` is the median; ``ms_ci95`` its distribution-free interval from the
    order statistics (:func:`vigil.bench.intervals.median_interval`), None
    below 6 calls.
    """
    times = []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    ci = median_interval(times)
    return {"ms": statistics.median(times), "n": len(times),
            "ms_ci95": None if ci is None else [ci["lo"], ci["hi"]],
            "ci_coverage": None if ci is None else ci["coverage"], "runs_ms": times}, result


def _layout(job_nodes: int, pp: int) -> tuple[int, int]:
    pp = min(pp, job_nodes)
    return job_nodes // pp, pp


def run(json_path: str | None = None, *, repeats: int = 7, seed: int = 0,
        microbatch_groups: Sequence[int] = (64, 128, 256, 512, 1024), microbatch_headline: int = 512,
        waf_sizes: Sequence[tuple[int, int]] = ((10, 1000), (50, 5000), (100, 10000), (200, 20000)),
        waf_headline: tuple[int, int] = (100, 10000), waf_max_size_nodes: int = 128, waf_gpu_units: bool = True,
        placement_sizes: Sequence[tuple[int, int, int]] = ((128, 1024, 8), (256, 1024, 8), (512, 1024, 4),
                                                          (512, 1024, 8), (512, 1024, 16), (1024, 2048, 8)),
        placement_headline: tuple[int, int, int] = (512, 1024, 8), quality_seeds: int = 10,
        progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Run the benchmark; write JSON to ``json_path`` (when given) and return the result.

    ``waf_sizes`` are ``(jobs, GPUs)``, planned in nodes of 8 GPUs;
    ``placement_sizes`` are ``(job nodes, cluster nodes, pp)``. The headline
    instances are measured even when they are not in the sweeps.
    """
    command = reproducing_command(run, dict(locals()), "vigil bench planners", CLI_OPTIONS)
    machine = _machine()
    with measured(machine):
        result = _measure(repeats=repeats, seed=seed, microbatch_groups=microbatch_groups,
                          microbatch_headline=microbatch_headline, waf_sizes=waf_sizes, waf_headline=waf_headline,
                          waf_max_size_nodes=waf_max_size_nodes, waf_gpu_units=waf_gpu_units,
                          placement_sizes=placement_sizes, placement_headline=placement_headline,
                          quality_seeds=quality_seeds, say=progress or (lambda _m: None))
    result["detail"]["machine"] = machine
    result = _clean_json({**result, "command": command})
    if json_path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


def _measure(*, repeats: int, seed: int, microbatch_groups: Sequence[int], microbatch_headline: int,
             waf_sizes: Sequence[tuple[int, int]], waf_headline: tuple[int, int], waf_max_size_nodes: int,
             waf_gpu_units: bool, placement_sizes: Sequence[tuple[int, int, int]],
             placement_headline: tuple[int, int, int], quality_seeds: int,
             say: Callable[[str], Any]) -> dict[str, Any]:
    t_start = time.perf_counter()
    detail: dict[str, Any] = {}

    say("micro-batch rebalancing")
    mb_rows = []
    for n in sorted(set(microbatch_groups) | {microbatch_headline}):
        times, total = microbatch_instance(n, seed)
        timed, plan = _median_ms(lambda t=times, m=total: rebalance_microbatches(t, m), repeats)
        mb_rows.append({"groups": n, "total": total, **timed, "makespan_s": plan.makespan,
                        "even_split_makespan_s": max(times) * (total // n)})
    detail["microbatch"] = mb_rows
    mb_head = next(r for r in mb_rows if r["groups"] == microbatch_headline)

    say("multi-job re-planning")
    waf_rows = []
    for jobs, gpus in sorted(set(waf_sizes) | {tuple(waf_headline)}):
        nodes = gpus // GPUS_PER_NODE
        inst = waf_instance(jobs, nodes, waf_max_size_nodes, seed)
        timed, plan = _median_ms(lambda j=inst, n=nodes: plan_workers(j, n, 3600.0, 300.0), repeats)
        waf_rows.append({"jobs": jobs, "gpus": gpus, "unit": "node", "workers": nodes,
                         "max_table": waf_max_size_nodes, **timed, "used": plan.used, "kept": plan.kept})
    detail["waf"] = waf_rows
    waf_head = next(r for r in waf_rows if (r["jobs"], r["gpus"]) == tuple(waf_headline))
    if waf_gpu_units:
        say("multi-job re-planning in GPU units")
        jobs, gpus = waf_headline
        inst_gpu = waf_instance(jobs, gpus // GPUS_PER_NODE, waf_max_size_nodes, seed, scale=GPUS_PER_NODE)
        timed, plan = _median_ms(lambda: plan_workers(inst_gpu, gpus, 3600.0, 300.0), repeats)
        detail["waf_gpu_units"] = {"jobs": jobs, "gpus": gpus, "unit": "gpu", "workers": gpus,
                                   "max_table": waf_max_size_nodes * GPUS_PER_NODE, **timed, "used": plan.used}

    say("placement")
    pl_rows = []
    for job_nodes, cluster_nodes, pp in list(dict.fromkeys([*placement_sizes, tuple(placement_headline)])):
        dp, pp = _layout(job_nodes, pp)
        pods = fragmented_cluster(cluster_nodes, seed, need=dp * pp)
        timed, p = _median_ms(lambda f=pods, a=dp, b=pp: place_job(f, a, b), repeats)
        pl_rows.append({"job_nodes": dp * pp, "cluster_nodes": cluster_nodes, "dp": dp, "pp": pp,
                        "minipods": len(pods), "free_nodes": sum(map(len, pods)), **timed,
                        "optimal": p.optimal, "dp_spread": p.dp_spread, "pp_splits": p.pp_splits})
    detail["placement"] = pl_rows
    hj, hc, hpp = placement_headline
    hdp, hpp = _layout(hj, hpp)
    pl_head = next(r for r in pl_rows if (r["job_nodes"], r["cluster_nodes"], r["pp"]) == (hdp * hpp, hc, hpp))

    say("placement quality")
    quality = []
    for s in range(seed, seed + quality_seeds):
        pods = fragmented_cluster(hc, s, need=hdp * hpp)
        base = {"best_fit": place_best_fit(pods, hdp, hpp), "random_fit": place_random_fit(pods, hdp, hpp, seed=s),
                "packing": place_packing(pods, hdp, hpp)}
        quality.append(quality_row(s, sum(map(len, pods)), place_job(pods, hdp, hpp), base))
    detail["placement_quality"] = {
        "job": {"dp": hdp, "pp": hpp, "cluster_nodes": hc, "minipod_nodes": MINIPOD_NODES},
        "objective": "dp_spread + pp_splits (alpha = beta = 1)",
        **quality_summary(quality),
    }

    detail["headline"] = {
        "microbatch": {"groups": microbatch_headline, "total": 8 * microbatch_headline},
        "waf": {"jobs": waf_headline[0], "gpus": waf_headline[1], "planned_in": "nodes of 8 GPUs",
                "workers": waf_headline[1] // GPUS_PER_NODE},
        "placement": {"job_nodes": hdp * hpp, "cluster_nodes": hc, "dp": hdp, "pp": hpp},
    }
    detail["targets_ms"] = TARGETS_MS
    detail["repeats"] = repeats
    detail["seed"] = seed
    heads = {"microbatch_512_ms": mb_head, "waf_100jobs_10k_ms": waf_head, "placement_512of1024_ms": pl_head}
    result = {
        **{k: r["ms"] for k, r in heads.items()},
        "placement_spread_vs_best_baseline": detail["placement_quality"]["ratio_median"],
        "intervals": {k: {"n": r["n"], "ms_ci95": r["ms_ci95"], "ci_coverage": r["ci_coverage"]}
                      for k, r in heads.items()},
        "targets_met": {k: r["ms"] <= TARGETS_MS[k] for k, r in heads.items()},
        "targets_met_over_interval": {k: None if r["ms_ci95"] is None else r["ms_ci95"][1] <= TARGETS_MS[k]
                                      for k, r in heads.items()},
        "detail": detail,
    }
    detail["elapsed_s"] = time.perf_counter() - t_start
    return result


def quality_row(seed: int, free_nodes: int, ours: Placement, baselines: dict[str, Placement]) -> dict[str, Any]:
    """One cluster of the quality comparison: the exact placement against the best of the baselines.

    The best baseline is the one of lowest objective (the first named on a
    tie); ``ratio`` is its objective over ours (above 1: ours is better),
    ``dp_spread_ratio`` the same for the max DP spread alone; each None when
    ours is 0, which no placement reaches with the default weights since
    every DP group spans at least one minipod.
    """
    best_name = min(baselines, key=lambda k: baselines[k].objective)
    best = baselines[best_name]
    return {"seed": seed, "free_nodes": free_nodes,
            "ours": {"dp_spread": ours.dp_spread, "pp_splits": ours.pp_splits, "objective": ours.objective,
                     "optimal": ours.optimal},
            **{k: {"dp_spread": b.dp_spread, "pp_splits": b.pp_splits, "objective": b.objective}
               for k, b in baselines.items()},
            "best_baseline": best_name,
            "ratio": best.objective / ours.objective if ours.objective > 0 else None,
            "dp_spread_ratio": best.dp_spread / ours.dp_spread if ours.dp_spread > 0 else None}


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def quality_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and the range of ``ratio``) over the clusters of :func:`quality_row`; a None ratio is left out."""
    ratios = [q["ratio"] for q in rows if q["ratio"] is not None]
    return {
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        # the max DP spread alone (best baseline's / ours): below 1 when the exact placement trades a
        # wider DP group for whole pipelines
        "dp_spread_ratio_median": _median_or_none([q["dp_spread_ratio"] for q in rows]),
        "pp_splits_median": {"ours": statistics.median(q["ours"]["pp_splits"] for q in rows),
                             "best_baseline": statistics.median(q[q["best_baseline"]]["pp_splits"] for q in rows)},
        "per_seed": list(rows),
    }


def _machine() -> dict[str, Any]:
    import scipy

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    return {"cpus": os.cpu_count(), "cpus_usable": usable, "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "processor": platform.machine(), "numpy": np.__version__, "scipy": scipy.__version__}


def _clean_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean_json(obj.item())
    if isinstance(obj, float):
        return None if not math.isfinite(obj) else round(obj, 4)
    return obj


def format_table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(measure, value, target) rows of the headline figures."""
    d = result["detail"]
    h = d["headline"]

    def fmt(v: float | None, unit: str = "ms") -> str:
        return "-" if v is None else f"{v:,.2f} {unit}"

    def timing(key: str) -> str:
        iv = (result.get("intervals") or {}).get(key) or {}
        ci = iv.get("ms_ci95")
        return fmt(result[key]) + (f" [{ci[0]:,.2f}, {ci[1]:,.2f}]" if ci else "") + \
            (f", n {iv['n']}" if iv.get("n") is not None else "")

    return [
        (f"micro-batch rebalancing, {h['microbatch']['groups']} DP groups", timing("microbatch_512_ms"),
         "<= 10 ms"),
        (f"re-planning, {h['waf']['jobs']} jobs on {h['waf']['gpus']:,} GPUs ({h['waf']['workers']:,} nodes)",
         timing("waf_100jobs_10k_ms"), "<= 100 ms"),
        ((f"placement, {h['placement']['job_nodes']} of {h['placement']['cluster_nodes']} nodes "
          f"(dp {h['placement']['dp']} x pp {h['placement']['pp']})"), timing("placement_512of1024_ms"), "<= 1 s"),
        ("placement: best baseline objective / ours (median)", fmt(result["placement_spread_vs_best_baseline"], "x"),
         "Arnold: up to 1.67x"),
    ]
