"""Workers and memory for large clusters (:func:`project`), from the points measured.

Two projections, each from its own measurement:

* **from the CPU per record** (always, given a point): a cluster sends
  ``records_per_gpu_s`` records a second per GPU (measured: the generator's
  node messages, 10 records per node a second, and one record per rank per
  step), a worker's CPU is fitted as ``a + b x records/s`` over the points
  (``a``: its fixed cost, polling and timers; ``b``: the cost of a record);
  a worker is given GPUs until it is ``max_busy`` busy (the head room that
  keeps its alerts prompt), and memory follows the RSS fit;
* **from the latency capacity** (only when a point met every target): the
  cluster divided by the largest load that held them all.

What scales with what is said in the result (``scales_with``): records with
GPUs (nodes x 10 and ranks / step time), a worker's RSS with the GPUs it
carries (per-node detectors, per-job state O(ranks)); a job's steps all go to
one worker (keyed by job), so its ranks bound what one worker must take; the
correlation of findings into incidents runs on one worker for the cluster
(one partition), and scales with incidents, not records.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_BUSY", "project"]

#: The share of its core a worker may be kept busy in the CPU projection.
MAX_BUSY = 0.5

_SCALES_WITH = {
    "records": "GPUs: 10 node records a second per node (nodes = GPUs / 8: heartbeat, 8 GPU samples, NIC) and "
               "one record per rank per step (ranks = GPUs, a step every 1-3 s)",
    "worker_cpu": "records (the fitted cost per record) plus a fixed cost per worker (polling, timers)",
    "worker_rss": "GPUs carried: per-node detectors (nodes) and per-job state O(ranks) (ranks), plus a fixed "
                  "base per worker (interpreter, libraries, client buffers); jobs add one state each",
    "one_job": "a job's steps are keyed by job, so one worker takes all of them: its ranks / D_iter records a "
               "second must fit one worker",
    "incidents": "findings are correlated on one worker (one partition) for the whole cluster: its load scales "
                 "with findings and incidents (failures), not with records",
}


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``; one point (or no spread in x): through the origin."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if n < 2 or sxx <= 0:
        return 0.0, my / mx if mx else 0.0
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def project(capacity: list[dict[str, Any]], max_gpus: int | None, sizes: tuple[int, ...] = (100_000, 1_000_000),
            throughput: dict[str, Any] | None = None, max_busy: float = MAX_BUSY) -> dict[str, Any]:
    """Workers and memory for clusters of ``sizes`` GPUs (see the module docstring).

    ``capacity``: the live points (``gpus_per_worker``, ``workers``, ``records_per_s``, ``rss_mb``, the
    worker's ``cpu_cores``); ``max_gpus``: the largest load per worker that met every target (None: none
    did); ``throughput``: records/s per worker on a backlog (by worker count), kept as the cost of a record
    at full use when no point measured the worker's CPU.
    """
    if not 0 < max_busy <= 1:
        raise ValueError(f"max_busy must be in (0, 1], got {max_busy}")
    pts = [p for p in capacity if p.get("gpus_per_worker") and p.get("records_per_s")]
    out: dict[str, Any] = {}
    if not pts:
        return out
    per_gpu = sum(p["records_per_s"] / (p["gpus_per_worker"] * p.get("workers", 1)) for p in pts) / len(pts)
    # a worker's cores against the records it took (each point: records/s per worker, cores per worker)
    cpu_pts = [(p["records_per_s"] / p.get("workers", 1),
                sum(v for k, v in p["cpu_cores"].items() if k.startswith("worker")) / p.get("workers", 1))
               for p in pts if p.get("cpu_cores")]
    model: dict[str, Any] = {"records_per_gpu_s": round(per_gpu, 3), "max_busy": max_busy,
                             "capacity_gpus_per_worker": max_gpus, "scales_with": dict(_SCALES_WITH)}
    fixed, per_record = None, None
    if cpu_pts:
        fixed, per_record = _fit(cpu_pts)
        fixed = max(0.0, fixed)
        model["worker_cpu"] = {"fixed_cores": round(fixed, 3), "us_per_record": round(per_record * 1e6, 2),
                               "from": f"least squares over {len(cpu_pts)} point(s): cores = fixed + cost x records/s"}
    backlog = [v / int(w) for w, v in (throughput or {}).items() if v]
    if backlog:
        model["backlog_us_per_record"] = round(1e6 / max(backlog), 2)
        # no live CPU figure, or a fit whose fixed cost alone leaves no room under max_busy (a few noisy
        # points say little): the backlog's cost of a record, a worker at full use
        if per_record is None or (fixed or 0.0) >= max_busy:
            if per_record is not None:
                model["worker_cpu_live_fit"] = model.pop("worker_cpu")
            fixed, per_record = 0.0, 1.0 / max(backlog)
            model["worker_cpu"] = {"fixed_cores": 0.0, "us_per_record": round(per_record * 1e6, 2),
                                   "from": "throughput on a backlog (a worker at full use)"}
    rss_pts = [(p["gpus_per_worker"], p["rss_mb"]) for p in pts if p.get("rss_mb")]
    base, slope = _fit(rss_pts) if rss_pts else (None, None)
    if rss_pts:
        how = f"least squares over {len(rss_pts)} point(s): RSS = base + per GPU x GPUs carried"
        if slope < 0:  # less memory for more GPUs is noise, not a model: the largest RSS measured, per worker
            base, slope = max(r for _, r in rss_pts), 0.0
            how = "the largest RSS measured (the fit's slope was negative)"
        model["rss_mb"] = {"base": round(base, 1), "per_1000_gpus": round(slope * 1000, 2), "from": how}
    out["model"] = model

    def memory(workers: int, size: int) -> dict[str, Any]:
        if base is None:
            return {}
        each = base + slope * size / workers  # type: ignore[operator]
        return {"rss_gb_per_worker": round(each / 1024.0, 3), "rss_gb": round(workers * each / 1024.0, 2)}

    cpu_gpus = None
    if per_record:
        cpu_gpus = max(0, math.floor((max_busy - (fixed or 0.0)) / (per_record * per_gpu) + 1e-6))
        model["cpu_gpus_per_worker"] = cpu_gpus
    for size in sizes:
        row: dict[str, Any] = {"records_per_s": round(size * per_gpu)}
        if per_record:
            row["worker_cores_at_full_use"] = round(size * per_gpu * per_record, 1)
        if cpu_gpus:
            w = math.ceil(size / cpu_gpus)
            row["from_cpu"] = {"workers": w, **memory(w, size)}
        if max_gpus:
            w = math.ceil(size / max_gpus)
            row["from_latency"] = {"workers": w, **memory(w, size)}
        chosen = row.get("from_latency") or row.get("from_cpu")
        if chosen:
            row.update(workers=chosen["workers"], rss_gb=chosen.get("rss_gb"),
                       basis="latency capacity" if "from_latency" in row else
                       f"CPU per record at {max_busy:.0%} busy (no point met every latency target)")
        out[str(size)] = row
    return out
