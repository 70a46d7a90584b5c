"""The jobs a large simulated cluster runs: their sizes (:data:`JOB_SIZES`, the shape of published
cluster traces) and layouts (:func:`plan_jobs`), for the load generator (:mod:`vigil.sim.load`)."""

from __future__ import annotations

import random

from vigil.schemas import GPUS_PER_NODE
from vigil.sim.simulator import SimJob

__all__ = ["JOB_SIZES", "plan_jobs"]

#: Job sizes in GPUs and how common each is (by count): most jobs are small, most GPUs are in large
#: ones (the shape of the published cluster traces: Meta's research clusters, Alibaba PAI, Acme).
JOB_SIZES: tuple[tuple[int, float], ...] = ((8, 0.22), (16, 0.16), (32, 0.15), (64, 0.14), (128, 0.11),
                                           (256, 0.09), (512, 0.06), (1024, 0.04), (2048, 0.02), (4096, 0.01))


def plan_jobs(nodes: list[str], rng: random.Random, busy_fraction: float = 0.9, max_job_fraction: float = 1 / 16,
              step_s: tuple[float, float] = (1.0, 3.0)) -> list[SimJob]:
    """Jobs over the first ``busy_fraction`` of ``nodes``: sizes drawn from :data:`JOB_SIZES` (none
    above ``max_job_fraction`` of the cluster), tp 8, pp by size, step times uniform in ``step_s``."""
    gpus = len(nodes) * GPUS_PER_NODE
    cap = max(GPUS_PER_NODE, max((s for s, _ in JOB_SIZES if s <= gpus * max_job_fraction), default=GPUS_PER_NODE))
    sizes = [s for s, _ in JOB_SIZES if s <= cap]
    weights = [w for s, w in JOB_SIZES if s <= cap]
    target = int(len(nodes) * busy_fraction)
    jobs: list[SimJob] = []
    used = 0
    while used < target:
        size = rng.choices(sizes, weights)[0]
        n = min(size // GPUS_PER_NODE, target - used)
        size = n * GPUS_PER_NODE
        pp_choices = [1] if size <= 8 else [1, 2] if size <= 32 else [1, 2, 4] if size <= 256 else [4, 8]
        pp = rng.choice([p for p in pp_choices if size % (8 * p) == 0] or [1])
        jobs.append(SimJob(f"job-{len(jobs):04d}", tuple(nodes[used:used + n]), dp=size // (8 * pp), pp=pp, tp=8,
                           iteration_s=round(rng.uniform(*step_s), 3)))
        used += n
    return jobs
