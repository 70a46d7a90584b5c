"""A discrete-event simulator of a GPU training cluster, for weeks of cluster time in minutes.

- :mod:`~vigil.sim.clustersim.model`: nodes, minipods, jobs, the iteration-time and throughput model;
- :mod:`~vigil.sim.clustersim.traces`: failure traces (fail-stops by severity, fail-slows), presets trace-a/trace-b;
- :mod:`~vigil.sim.clustersim.engine`: the event loop on simulated time and the accounting (WAF, ETTR, fail-slow cost);
- :mod:`~vigil.sim.clustersim.jobs`: what the engine keeps of each job (JobRun) and what recovery steps cost (Costs);
- :mod:`~vigil.sim.clustersim.probes`: the live detectors and correlator, run on windows around each fault;
- :mod:`~vigil.sim.clustersim.policies`: restart-only, per-job reconfiguration, and vigil (the live decision engine).

It differs from :mod:`vigil.sim.simulator`, which plays a few minutes of a
cluster's telemetry event by event (the demo, the Kafka benchmarks); this
one plays weeks segment by segment and uses that simulator as the event
source of its fail-stop probes. The probes and policies run the live
detection and decision code in process, so this package sits on top of
``streams`` and ``actuators``; nothing below it imports it.

>>> from vigil.sim.clustersim import scenario, simulate
>>> jobs, topo, trace = scenario("trace-a", gpus=128, seed=0)
>>> len(jobs), len(topo.nodes), trace.counts()["sev1"]
(6, 16, 10)
"""

from __future__ import annotations

from typing import Any, Callable

from vigil.sim.clustersim.engine import T0, Costs, Simulation
from vigil.schemas import GPUS_PER_NODE
from vigil.sim.clustersim.model import HardwareSpec, JobConfig, Topology, mixed_jobs, unicron_case5
from vigil.sim.clustersim.policies import POLICIES, initial_placement
from vigil.sim.clustersim.traces import PRESETS, FailureTrace, poisson_trace, preset

__all__ = ["scenario", "simulate", "Costs", "Simulation", "T0", "POLICIES", "PRESETS"]


def scenario(trace: str, gpus: int = 128, seed: int = 0, days: float | None = None,
             minipod_nodes: int | None = None) -> tuple[list[JobConfig], Topology, FailureTrace]:
    """Jobs, topology and trace of a benchmark run.

    128 GPUs: Unicron's case 5 (six jobs) on 16 nodes in 2 minipods.
    Otherwise a seeded mix of 1.3B..70B jobs filling ``gpus / 8`` nodes in
    minipods of 32 nodes. The trace is the preset (its per-node rates) over
    its own span, or over ``days`` with Poisson counts when given.
    """
    if gpus % GPUS_PER_NODE or gpus < 2 * GPUS_PER_NODE:
        raise ValueError(f"gpus must be a multiple of {GPUS_PER_NODE} and at least 16, got {gpus}")
    n_nodes = gpus // GPUS_PER_NODE
    if gpus == 128:
        jobs = unicron_case5()
        topo = Topology.build(n_nodes, minipod_nodes or 8)
    else:
        jobs = mixed_jobs(n_nodes, seed)
        topo = Topology.build(n_nodes, minipod_nodes or 32)
    tr = preset(trace, topo.nodes, seed) if days is None else poisson_trace(trace, topo.nodes, days, seed)
    return jobs, topo, tr


def simulate(policy: str, jobs: list[JobConfig], topology: Topology, trace: FailureTrace, costs: Costs = Costs(),
             seed: int = 0, initial: dict[str, list[list[str]]] | None = None,
             progress: Callable[[str], None] | None = None, hw: HardwareSpec = HardwareSpec(),
             t0: float = T0, tap: Callable[[float, list[Any]], None] | None = None,
             **policy_args: Any) -> dict[str, Any]:
    """Run one policy on one trace; the result dict of :meth:`Simulation.run`.

    ``tap(sim_time, events)`` receives every event the run produces (the
    vigil policy's probe telemetry, alerts, decisions, action results, job
    and node states), e.g. an :class:`~vigil.sim.clustersim.publish.AcceleratedPublisher`;
    ``t0`` is the absolute time of simulated time 0.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(POLICIES)}")
    if initial is None:
        initial = initial_placement(jobs, topology)
    sim = Simulation(jobs, topology, trace, POLICIES[policy](**policy_args), costs=costs, hw=hw, seed=seed,
                     initial=initial, progress=progress, t0=t0, tap=tap)
    out = sim.run()
    out["log"] = sim.log
    out["log_dropped"] = sim.log_dropped
    return out
