"""Where the simulated policies put jobs: the WAF-optimal, topology-aware placement they all start from.

All policies start from :func:`initial_placement` and differ only in how
they recover; :func:`place` and :func:`fit` are the placement steps they share.
"""

from __future__ import annotations

import math

from vigil.actuators.planners import WafJob, place_best_fit, place_job, plan_workers
from vigil.sim.clustersim.engine import JobRun
from vigil.sim.clustersim.model import JobConfig, Topology, throughput_table

__all__ = ["initial_placement", "place", "fit", "iteration_of"]


def place(topology: Topology, free: list[str], size: int, pp: int, prefer: list[str], method: str) -> list[list[str]]:
    """A ``size // pp`` x ``pp`` grid from ``free`` nodes; ``prefer`` nodes come first in their minipods."""
    first = [n for n in prefer if n in set(free)]
    rest = [n for n in free if n not in set(first)]
    pods = [p for p in topology.by_minipod(first + rest) if p]
    # by_minipod keeps the order given: preferred nodes first inside each minipod
    dp = size // pp
    if method == "milp":
        placed = place_job(pods, dp, pp, time_limit=10.0)
    else:
        placed = place_best_fit(pods, dp, pp)
    nodes = list(placed.rank_nodes)
    return [nodes[d * pp:(d + 1) * pp] for d in range(dp)]


def initial_placement(jobs: list[JobConfig], topology: Topology, d_running: float = 86400.0,
                      d_transition: float = 300.0) -> dict[str, list[list[str]]]:
    """The WAF-optimal sizes on the whole cluster (Unicron), placed topology-aware (Arnold), largest first."""
    specs = [WafJob(j.name, j.weight, j.minimum, throughput_table(j.model, j.size)) for j in jobs]
    plan = plan_workers(specs, len(topology.nodes), d_running, d_transition)
    alloc = plan.allocation
    free = list(topology.nodes)
    out: dict[str, list[list[str]]] = {}
    for j in sorted(jobs, key=lambda j: (-alloc[j.name], j.name)):
        size = alloc[j.name] // j.model.pp * j.model.pp
        if size <= 0:
            out[j.name] = []
            continue
        grid = place(topology, free, size, j.model.pp, [], "milp")
        used = {n for r in grid for n in r}
        free = [n for n in free if n not in used]
        out[j.name] = grid
    return {j.name: out[j.name] for j in jobs}


def fit(job: JobRun, available: int, want: int) -> int:
    """Largest usable size <= min(want, available): a multiple of pp, at least the minimum; else 0."""
    pp = job.cfg.model.pp
    size = min(want, available, job.cfg.size) // pp * pp
    return size if size >= job.cfg.minimum else 0


def iteration_of(job: JobRun) -> float:
    return job.healthy_iter_s if math.isfinite(job.healthy_iter_s) else 10.0


# -- vigil -----------------------------------------------------------------------------
