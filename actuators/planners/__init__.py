"""Planners: pure functions that decide allocations and layouts (no I/O, no clock).

- :mod:`~vigil.actuators.planners.waf`: multi-job re-planning, the worker allocation
  maximising weighted achieved FLOP/s (Unicron).
- :mod:`~vigil.actuators.planners.placement`: topology-aware placement of a DP x PP
  job on minipods (Arnold), with best-fit, random-fit and packing baselines.
- :mod:`~vigil.actuators.planners.microbatch`: micro-batch rebalancing across DP
  groups (Falcon, mitigation S2).
- :mod:`~vigil.actuators.planners.topology`: straggler consolidation and congested
  link re-routing by node swaps (Falcon, mitigation S3).

Every planner validates its inputs and raises ``ValueError`` naming the
offending field; ``vigil bench planners`` measures their speed.
"""

from vigil.actuators.planners.microbatch import MicrobatchPlan, rebalance_microbatches
from vigil.actuators.planners.placement import (
    Placement,
    place_best_fit,
    place_job,
    place_packing,
    place_random_fit,
    placement_spread,
)
from vigil.actuators.planners.topology import TopologyPlan, consolidate_stragglers, reroute_congested_link
from vigil.actuators.planners.waf import WafJob, Plan, job_gains, plan_workers

__all__ = [
    "WafJob", "Plan", "job_gains", "plan_workers",
    "Placement", "place_job", "place_best_fit", "place_random_fit", "place_packing", "placement_spread",
    "MicrobatchPlan", "rebalance_microbatches",
    "TopologyPlan", "consolidate_stragglers", "reroute_congested_link",
]
