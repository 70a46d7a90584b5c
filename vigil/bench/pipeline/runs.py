"""One capacity point from several shorter runs (pure): how the faults are split and how the runs combine.

Why: the embedded broker (tansu) keeps its log in memory and its fetch cost
grows with the log, so one 11-minute run ends up measuring the broker, not the
worker; a real Kafka's fetch cost does not grow so. Each run is a full
:func:`~vigil.bench.pipeline.live.live` on a fresh broker and fresh workers
with its share of the faults and a seed of its own (:func:`split_faults`,
:func:`run_seed`); :func:`combine_runs` makes the point: latency over every
run's faults, the lag histograms pooled, the worst memory, the rates over the
total measured time. What it cannot show: a worker's state older than one run.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from vigil.bench.pipeline.procs import lag_quantiles
from vigil.bench.pipeline.scoring import percentile, summarize, targets_met
from vigil.sim.load import KINDS

__all__ = ["RUN_SEED_STRIDE", "combine_runs", "run_seed", "split_faults"]

#: Run ``r`` of a point uses ``seed + RUN_SEED_STRIDE * r`` (run 0 the point's seed): a different cluster
#: layout and fault schedule each run, and no run's seed is another point's (seeds are small integers).
RUN_SEED_STRIDE = 1000


def split_faults(total: int, runs: int) -> list[int]:
    """Faults per kind of each run: ``ceil(total / runs)`` each, the last the remainder (the sum is ``total``).

    >>> split_faults(100, 3)
    [34, 34, 32]
    >>> split_faults(100, 1)
    [100]
    """
    if runs < 1 or total < 1:
        raise ValueError(f"runs per point and faults per kind must be at least 1, got {runs} and {total}")
    each = math.ceil(total / runs)
    out = [each] * (runs - 1) + [total - each * (runs - 1)]
    if out[-1] < 1:
        raise ValueError(f"{total} faults per kind in {runs} runs of ceil({total}/{runs}) = {each} leaves "
                         f"{out[-1]} for the last run: choose fewer runs per point")
    return out


def run_seed(seed: int, run: int) -> int:
    """The seed of run ``run`` (from 0) of a point seeded ``seed``."""
    return seed + RUN_SEED_STRIDE * run


def combine_runs(points: list[dict[str, Any]]) -> dict[str, Any]:
    """One capacity point from the points of its runs, in run order.

    Each run's point is :func:`~vigil.bench.pipeline.live.live`'s, with the
    ``seed`` and ``faults_per_kind`` it ran with added. Latency is
    :func:`~vigil.bench.pipeline.scoring.summarize` over every run's faults
    (so a p99 needs 100 faults of a kind over all runs, and a miss in any run
    is a miss of the point); the consumer lag is pooled from the runs'
    histograms (``lag_ms``, per worker) when every run kept them, else the
    largest of the runs' p99s (``lag_pooled`` false); RSS and the broker's RSS
    the largest; records/s the total over the total measured seconds; cores
    and busy shares weighted by measured seconds; the targets judged again,
    unmet if any run stopped early. ``runs`` keeps each run's figures and
    timeline, ``faults`` every run's rows tagged with their ``run``.
    """
    if not points:
        raise ValueError("no runs to combine")
    first = points[0]
    for key in ("gpus_per_worker", "gpus", "workers"):
        if any(p.get(key) != first.get(key) for p in points):
            raise ValueError(f"runs of one point differ in {key}: {[p.get(key) for p in points]}")
    faults = [{**row, "run": r} for r, p in enumerate(points) for row in p["faults"]]
    latency = summarize({"faults": faults})
    secs = [float(p.get("measured_s") or 0.0) for p in points]
    total_s = sum(secs)
    records = sum(float(p.get("records_per_s") or 0.0) * s for p, s in zip(points, secs))
    rss = _max(p.get("rss_mb") for p in points)
    stopped = [(r, p["stopped_early"]) for r, p in enumerate(points) if p.get("stopped_early")]
    point: dict[str, Any] = {
        "gpus_per_worker": first.get("gpus_per_worker"), "gpus": first.get("gpus"), "workers": first.get("workers"),
        "runs_per_point": len(points),
        "runs_note": "each run a fresh broker and fresh workers (worker state older than one run is not exercised); "
                     "latency over every run's faults; lag pooled from the runs' histograms (else the largest "
                     "run's p99: lag_pooled false); RSS the largest; records/s the total over the total measured "
                     "seconds; cores and busy shares weighted by measured seconds",
    }
    machines = [p.get("machine") or {} for p in points]
    point["machine"] = {**machines[0], "load_before": machines[0].get("load_before"),
                        "load_after": machines[-1].get("load_after")}
    point.update({
        "records_per_s": round(records / total_s) if total_s > 0 else None,
        "measured_s": round(total_s, 1),
        "latency": latency,
        **_lag(points),
        "rss_mb": rss,
        "rss_mb_per_worker": _per_slot([p.get("rss_mb_per_worker") for p in points], lambda v, _w: _max(v)),
        "cpu_cores": _cores(points, secs),
        "worker_cpu_us_per_record": _us_per_record(points, secs),
        "worker_busy_share": _per_slot([p.get("worker_busy_share") for p in points], _weighted, secs),
        "gc": _gc(points),
        "generator_late_s": {"max": _max((p.get("generator_late_s") or {}).get("max") for p in points),
                             "p99_max_over_runs": _max((p.get("generator_late_s") or {}).get("p99") for p in points)},
        "broker_rss_mb": _max(p.get("broker_rss_mb") for p in points),
        "unexplained_incidents": dict(sum((Counter(p.get("unexplained_incidents") or {}) for p in points),
                                          Counter())),
        "unexplained": [dict(u, run=i) for i, p in enumerate(points) for u in p.get("unexplained") or []],
        "faults_injected": {k: sum((p.get("faults_injected") or {}).get(k, 0) for p in points) for k in KINDS},
    })
    if stopped:
        point["stopped_early"] = "; ".join(f"run {r}: {why}" for r, why in stopped)
    met = targets_met(latency, rss)
    point["targets"] = met
    point["targets_met"] = all(met.values()) and not stopped
    point["runs"] = [_run_summary(r, p) for r, p in enumerate(points)]
    point["faults"] = faults
    if any("alerts" in p for p in points):
        point["alerts"] = [{**a, "run": r} for r, p in enumerate(points) for a in p.get("alerts") or []]
    return point


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _weighted(values: list[float | None], weights: list[float]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights) if v is not None]
    total = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / total, 3) if total > 0 else None


def _per_slot(lists: list[Any], fold: Any, weights: list[float] | None = None) -> list[Any] | None:
    """Fold the runs' per-worker lists slot by slot (worker i of every run); None when no run has one."""
    if all(x is None for x in lists):
        return None
    width = max(len(x or []) for x in lists)
    ws = weights or [1.0] * len(lists)
    out = []
    for i in range(width):
        vals = [(x[i] if x is not None and i < len(x) else None) for x in lists]
        out.append(fold(vals, ws))
    return out


def _cores(points: list[dict[str, Any]], secs: list[float]) -> dict[str, float | None] | None:
    names = list(dict.fromkeys(k for p in points for k in (p.get("cpu_cores") or {})))
    if not names:
        return None
    return {k: _weighted([(p.get("cpu_cores") or {}).get(k) for p in points], secs) for k in names}


def _us_per_record(points: list[dict[str, Any]], secs: list[float]) -> float | None:
    """The workers' CPU over the records they processed, all runs together (each run's processed records
    recovered from its CPU seconds and its cost per record)."""
    cpu_s = processed = 0.0
    for p, s in zip(points, secs):
        us = p.get("worker_cpu_us_per_record")
        worker = sum(v for k, v in (p.get("cpu_cores") or {}).items() if k.startswith("worker")) * s
        if us and worker > 0:
            cpu_s += worker
            processed += worker * 1e6 / us
    return round(1e6 * cpu_s / processed, 2) if processed else None


def _lag(points: list[dict[str, Any]]) -> dict[str, Any]:
    if all(p.get("lag_ms") is not None for p in points):
        width = max(len(p["lag_ms"]) for p in points)
        pooled = []
        for i in range(width):
            hist: Counter[int] = Counter()
            for p in points:
                if i < len(p["lag_ms"]):
                    hist.update({int(k): v for k, v in p["lag_ms"][i].items()})
            pooled.append(lag_quantiles(dict(hist)))
        return {"lag_p99_s": _max(x["p99_s"] for x in pooled), "lag_max_s": _max(x["max_s"] for x in pooled),
                "lag_pooled": True, "lag": pooled}
    return {"lag_p99_s": _max(p.get("lag_p99_s") for p in points), "lag_max_s": _max(p.get("lag_max_s") for p in points),
            "lag_pooled": False}


def _gc(points: list[dict[str, Any]]) -> list[dict[str, Any] | None] | None:
    def fold(vals: list[dict[str, Any] | None], _w: list[float]) -> dict[str, Any] | None:
        present = [v for v in vals if v]
        if not present:
            return None
        return {"collections": sum(v.get("collections", 0) for v in present),
                "total_s": round(sum(v.get("total_s", 0.0) for v in present), 6),
                "max_s": max(v.get("max_s", 0.0) for v in present)}
    return _per_slot([p.get("gc") for p in points], fold)


def _run_summary(r: int, p: dict[str, Any]) -> dict[str, Any]:
    latency = {}
    for kind in KINDS:
        mine = [row for row in p["faults"] if row["kind"] == kind]
        if not mine:
            continue
        delays = [row["delay_s"] for row in mine if row["delay_s"] is not None]
        missed = len(mine) - len(delays)
        latency[kind] = {"n": len(mine), "p50": percentile(delays + [math.inf] * missed, 0.5),
                         "max": round(max(delays), 4) if delays else None, "missed": missed}
    machine = p.get("machine") or {}
    return {"run": r, "seed": p.get("seed"), "faults_per_kind": p.get("faults_per_kind"),
            "cluster": p.get("cluster"), "measured_s": p.get("measured_s"), "records_per_s": p.get("records_per_s"),
            "lag_p99_s": p.get("lag_p99_s"), "lag_max_s": p.get("lag_max_s"), "rss_mb": p.get("rss_mb"),
            "broker_rss_mb": p.get("broker_rss_mb"), "cpu_cores": p.get("cpu_cores"),
            "worker_busy_share": p.get("worker_busy_share"),
            "generator_late_max_s": (p.get("generator_late_s") or {}).get("max"),
            "load": [machine.get("load_before"), machine.get("load_after")], "latency": latency,
            "unexplained_incidents": p.get("unexplained_incidents"), "stopped_early": p.get("stopped_early"),
            "timeline": p.get("timeline")}
