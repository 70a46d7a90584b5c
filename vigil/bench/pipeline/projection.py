"""Workers and memory for large clusters (:func:`project`), from the points measured."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["project"]


def project(capacity: list[dict[str, Any]], max_gpus: int | None, sizes: tuple[int, ...] = (100_000, 1_000_000)) -> dict[str, Any]:
    """Workers and memory for large clusters, from the points measured.

    Workers: the cluster divided by the largest per-worker load that held every
    target (the measured capacity of one worker on one core). Memory: RSS per
    worker fitted linearly on the GPUs it carried (least squares over the
    points), at that load, times the workers. CPU: the worker's measured CPU
    per record times the records a GPU sends per second.
    """
    pts = [(p["gpus_per_worker"], p["rss_mb"]) for p in capacity if p.get("rss_mb")]
    out: dict[str, Any] = {}
    if not pts:
        return out
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else 0.0
    base = my - slope * mx
    per_gpu = [p["records_per_s"] / p["gpus_per_worker"] / p["workers"] for p in capacity if p.get("records_per_s")]
    costs = [p["worker_cpu_us_per_record"] for p in capacity if p.get("worker_cpu_us_per_record")]
    out["model"] = {"rss_mb": f"{base:.0f} + {slope * 1000:.2f} per 1,000 GPUs carried",
                    "records_per_gpu_s": round(sum(per_gpu) / len(per_gpu), 3) if per_gpu else None,
                    "worker_cpu_us_per_record": round(sum(costs) / len(costs), 2) if costs else None,
                    "capacity_gpus_per_worker": max_gpus}
    for size in sizes:
        row: dict[str, Any] = {}
        if max_gpus:
            w = math.ceil(size / max_gpus)
            row["workers"] = w
            row["rss_gb"] = round(w * (base + slope * size / w) / 1024.0, 2)
            row["rss_gb_per_worker"] = round((base + slope * size / w) / 1024.0, 3)
        if per_gpu and costs:
            row["worker_cores_at_full_use"] = round(size * out["model"]["records_per_gpu_s"] *
                                                    out["model"]["worker_cpu_us_per_record"] / 1e6, 1)
        out[str(size)] = row
    return out

