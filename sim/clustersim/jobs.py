"""What the simulator keeps of each job (:class:`JobRun`: phase, speed, checkpoints, the accounting of
:mod:`vigil.sim.clustersim.engine`) and what each step of a recovery costs (:class:`Costs`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vigil.sim.clustersim.model import JobConfig
from vigil.sim.clustersim.traces import FailStop

__all__ = ["Costs", "JobRun"]


@dataclass(frozen=True)
class Costs:
    """What each step of a recovery costs, in seconds."""

    checkpoint_interval_s: float = 1800.0
    # restart-only (Megatron-like, by hand): the figures
    collective_timeout_s: float = 1800.0
    resubmit_s: float = 540.0
    setup_s: float = 840.0
    #: restart-only: an operator shrinks a job that waits for nodes after this long (None: it waits for repair).
    manual_shrink_s: float | None = None
    # in-band policies (per-job, vigil)
    retry_s: float = 30.0  # retry in place: rebuild the communicator, redo the step
    restart_s: float = 300.0  # relaunch the processes on allocated nodes, load the checkpoint
    restart_fail_s: float = 60.0  # a relaunch on an unreachable node fails after this long
    transition_s: float = 300.0  # a re-planned job stops, re-shards and starts on its new nodes
    recur_s: float = 30.0  # a failure that a retry did not cure comes back after this long
    health_check_s: float = 7200.0  # a node excluded but found healthy returns after this long
    operator_s: float = 4 * 3600.0  # a human answers notify_human after this long
    rebalance_s: float = 5.0  # micro-batch rebalancing (Falcon S2)
    topology_s: float = 60.0  # node swaps (Falcon S3)
    checkpoint_save_s: float = 60.0  # checkpoint before a checkpoint-restart (Falcon S4)


@dataclass
class JobRun:
    cfg: JobConfig
    table: list[float]
    grid: list[list[str]] = field(default_factory=list)
    phase: str = "off"
    down_reason: str = ""
    version: int = 0
    t_last: float = 0.0
    incarnation: int = 0
    # speed
    iter_s: float = math.inf
    healthy_iter_s: float = math.inf
    rate: float = 0.0  # useful FLOP/s while running
    contrib: float = 0.0  # weight x rate counted in the cluster's WAF now
    # checkpoints and rollback
    ckpt_run_s: float = 0.0
    work_since_ckpt: float = 0.0
    pending_loss: float = 0.0
    redo: float = 0.0
    # faults and mitigations
    faults: list[FailStop] = field(default_factory=list)
    s2: bool = False  # micro-batch rebalancing active
    s3: bool = False  # stage rebalancing around consolidated stragglers active
    # accounting
    productive_s: float = 0.0
    recompute_s: float = 0.0
    down_s: float = 0.0
    down_by: dict[str, float] = field(default_factory=dict)  # down time by reason
    off_s: float = 0.0
    useful_flops: float = 0.0
    waf: float = 0.0
    slow_lost_s: float = 0.0
    slow_exposed_s: float = 0.0
    slow_overhead_s: float = 0.0
    # the fail-slows that hit this job at their onset, and what they would have cost it unmitigated
    episodes: dict[int, float] = field(default_factory=dict)  # fail-slow index -> slowdown ratio at onset
    episode_running_s: float = 0.0
    episode_unmitigated_lost_s: float = 0.0
    #: healthy FLOP/s before a checkpoint-restart left a straggler behind (0: none): until the episodes end,
    #: what the job then runs short of it (fewer nodes, none at all) is the fail-slow's cost too
    rate_before_leaving: float = 0.0
    open_failures: list[tuple[FailStop, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def nodes(self) -> list[str]:
        return [n for row in self.grid for n in row]

    @property
    def size(self) -> int:
        return len(self.grid) * (len(self.grid[0]) if self.grid else 0)

    @property
    def dp(self) -> int:
        return len(self.grid)

    @property
    def blocked(self) -> bool:
        return bool(self.faults)
