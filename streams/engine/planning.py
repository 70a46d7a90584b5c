"""The plans the decision engine attaches to its decisions, from the planners in :mod:`vigil.actuators.planners`.

The decision engine knows jobs by their :class:`~vigil.schemas.JobState` (nodes in
rank order, dp x pp x tp, weight, minimum GPUs) and failures by their alerts;
this module turns that into planner inputs and the planners' answers into the
plan contract the actuators validate:

* re-planning (Unicron): ``{"allocations": {job: [nodes]}, "objective": ..}``
  over the healthy nodes, keeping each job's healthy nodes where it keeps its
  size;
* micro-batch rebalancing (Falcon S2): ``{"microbatches": [per DP group]}``;
* topology adjustment (Falcon S3): ``{"swaps": [[a, b], ..]}``.

A job's throughput table T(t, x) is not in its JobState; until a job reports
one, :func:`default_throughput` models it (sub-linear scaling, Amdahl-like),
the same shape for every job, scaled by its weight in the objective.

Pure functions, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from vigil.actuators.planners import WafJob, consolidate_stragglers, plan_workers, rebalance_microbatches, \
    reroute_congested_link
from vigil.schemas import GPUS_PER_NODE, JobState



def default_throughput(max_nodes: int, serial_fraction: float = 0.02) -> list[float]:
    """Amdahl-scaled throughput on 0..max_nodes nodes (1.0 per node with no serial part).

    >>> [round(t, 2) for t in default_throughput(4)]
    [0.0, 1.0, 1.96, 2.88, 3.77]
    """
    return [0.0] + [x / (1 + serial_fraction * (x - 1)) for x in range(1, max_nodes + 1)]


def replan(jobs: Mapping[str, JobState], healthy_nodes: set[str], d_running: float = 3600.0,
           d_transition: float = 600.0) -> dict[str, Any]:
    """A WAF-optimal number of nodes per job on the healthy nodes, and which nodes.

    ``d_running``: how long the plan is expected to run; ``d_transition``:
    what a job pays to change size (checkpoint, restart, warm-up).

    >>> from vigil.schemas import JobState, Source, from_seconds
    >>> t = from_seconds(0)
    >>> a = JobState(event_time=t, source=Source(job="a"), state="running", nodes=["n1", "n2"], gpus=16, weight=2.0)
    >>> b = JobState(event_time=t, source=Source(job="b"), state="pending", gpus=16, weight=1.0, min_gpus=16)
    >>> replan({"a": a, "b": b}, {"n1", "n2", "n3"})["allocations"]
    {'a': ['n1', 'n2'], 'b': []}
    """
    specs, current = [], {}
    for name, js in sorted(jobs.items()):
        healthy_now = [n for n in js.nodes if n in healthy_nodes]
        wanted = max(1, math.ceil(js.gpus / GPUS_PER_NODE)) if js.gpus else max(1, len(js.nodes))
        minimum = max(1, math.ceil(js.min_gpus / GPUS_PER_NODE)) if js.min_gpus else 1
        minimum = min(minimum, wanted)
        size = len(healthy_now) if minimum <= len(healthy_now) <= wanted else 0
        current[name] = healthy_now
        specs.append(WafJob(name=name, weight=js.weight, min_workers=minimum, throughput=default_throughput(wanted),
                             current_workers=size, failed=len(healthy_now) < len(js.nodes)))
    plan = plan_workers(specs, len(healthy_nodes), d_running, d_transition)
    free = sorted(healthy_nodes - {n for nodes in current.values() for n in nodes})
    allocations: dict[str, list[str]] = {}
    # Jobs that shrink give nodes back before jobs that grow take them.
    for name in sorted(plan.allocation, key=lambda j: plan.allocation[j] - len(current[j])):
        n = plan.allocation[name]
        keep = current[name][:n]
        free += current[name][n:]
        take, free = free[:n - len(keep)], free[n - len(keep):]
        allocations[name] = keep + take
    return {"allocations": dict(sorted(allocations.items())), "objective": round(float(plan.objective), 6)}


def grid_of(job: JobState) -> list[list[str]] | None:
    """``grid[d][s]``: the job's nodes by replica and stage (nodes listed in rank order), if it fits."""
    if len(job.nodes) != job.dp * job.pp or not job.nodes:
        return None
    return [list(job.nodes[d * job.pp:(d + 1) * job.pp]) for d in range(job.dp)]


def microbatch_plan(job: JobState, slow_node: str | None, t_healthy: float, t_slow: float,
                    per_group: int = 8) -> dict[str, Any]:
    """Falcon S2: fewer micro-batches for the slow node's DP group, the same global batch."""
    grid = grid_of(job)
    if grid is None or slow_node is None or job.dp < 2:
        return {}
    times = [t_slow if slow_node in replica else t_healthy for replica in grid]
    return {"microbatches": list(rebalance_microbatches(times, per_group * job.dp).counts)}


def topology_plan(job: JobState, slow_node: str | None, slowdown_class: str) -> dict[str, Any]:
    """Falcon S3: gather a slow GPU's node into an interior stage, or move a congested link out of DP."""
    grid = grid_of(job)
    if grid is None or slow_node is None or not any(slow_node in r for r in grid):
        return {}
    if slowdown_class == "communication" and job.dp > 1 and job.pp > 1:
        d, s = next((d, r.index(slow_node)) for d, r in enumerate(grid) if slow_node in r)
        peer = grid[(d + 1) % job.dp][s]  # its neighbour in the stage's DP all-reduce ring
        result = reroute_congested_link(grid, (slow_node, peer))
    else:
        result = consolidate_stragglers(grid, [slow_node])
    return {"swaps": [list(pair) for pair in result.swaps]}


def failslow_plan(strategy: str, job: JobState | None, slow_node: str | None, t_healthy: float, t_slow: float,
                  slowdown_class: str, nodes: Sequence[str]) -> dict[str, Any]:
    """The plan of a ski-rental step for ``job`` (empty when the job's layout is unknown)."""
    if strategy == "checkpoint_restart":
        plan: dict[str, Any] = {"nodes": sorted(nodes)} if nodes else {}
        return plan
    if job is None:
        return {}
    if strategy == "rebalance_microbatches":
        return microbatch_plan(job, slow_node, t_healthy, t_slow)
    return topology_plan(job, slow_node, slowdown_class)
