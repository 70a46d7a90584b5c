"""The simulated cluster's actuator: a backend behind the real executor.

Decisions go through :class:`vigil.actuators.executor.Executor`, as they do
in a live deployment: the plan contract (:func:`vigil.actuators.plans.parse_action`),
the inventory, the idempotency ledger and the safety checks all apply, so
the simulator cannot drift from what the actuators accept. The differences
are stated: the safety limits are wide open (the blast-radius breaker hands
a burst of drains to a human, whom the simulation does not model) and
decisions are never stale (they wait in the per-job queue below, not in
Kafka).

* :class:`SimActuator` — the shell: one action at a time per job (later ones
  wait), results to the decision engine and the event tap.
* :class:`SimBackend` — the effects: an action starts at once (the job
  stops, is re-planned, resumes after the action's duration) and ends later
  in simulated time (``asynchronous``: the executor hears the end through
  :meth:`~vigil.actuators.executor.Executor.complete`). The verdict:
  ``failed`` when the job cannot run (a node is unreachable) or failed again
  while the action ran, else ``succeeded``. A re-plan and the isolation of
  an idle node take effect at once. ``notify_human`` runs nothing (the
  executor answers it); an operator looks at the job ``Costs.operator_s``
  later and restarts it on healthy nodes if it is still broken.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vigil.actuators.backends.base import Outcome
from vigil.actuators.executor import Executor
from vigil.actuators.inventory import Inventory
from vigil.actuators.ledger import Ledger
from vigil.actuators.plans import Action
from vigil.actuators.safety import Safety, SafetyLimits
from vigil.actuators.state import ActionState
from vigil.actuators.planners import consolidate_stragglers, reroute_congested_link
from vigil.schemas import ActionResult, Decision, Source, from_seconds
from vigil.schemas.signing import Keyring
from vigil.sim.clustersim.engine import JobRun
from vigil.sim.clustersim.traces import FailStop

if TYPE_CHECKING:
    from vigil.sim.clustersim.policies import Vigil

__all__ = ["SimActuator", "SimBackend", "SIM_LIMITS"]

#: The simulation's safety limits: wide open (see the module docstring).
SIM_LIMITS = SafetyLimits(max_drained_nodes=10**9, max_drained_fraction=1.0, max_restarts_without_progress=10**9,
                          rate_limit=10**9)


class SimBackend:
    """The simulated cluster's effects of an action (see the module docstring)."""

    name = "sim"
    supports = frozenset({"retry_in_place", "restart_process", "reconfigure", "isolate_node",
                          "rebalance_microbatches", "adjust_topology", "checkpoint_restart", "replan"})
    asynchronous = True

    def __init__(self, vigil: "Vigil") -> None:
        self.v = vigil

    def execute(self, action: Action, dry_run: bool = False) -> Outcome:
        sim = self.v.sim
        if action.job is None:
            return Outcome(ActionState.succeeded, self._global(action))
        duration = self._start(action, sim.jobs[action.job])
        sim.at(sim.now + duration, self.v.actuator.ended, action.job, action.decision)
        return Outcome(ActionState.running, f"{action.action} of {action.job}: {duration:.0f} s")

    # -- effects -------------------------------------------------------------
    def _start(self, action: Action, job: JobRun) -> float:
        """Start ``action``'s effects on ``job``; its duration in simulated seconds."""
        sim, c = self.v.sim, self.v.sim.costs
        d = action.decision
        a = action.action
        if a == "retry_in_place":
            if sim.has_dead_node(job):
                return c.retry_s
            remaining = sim.cure(job, "retry")
            if remaining:  # a retry does not cure it: it comes back once the job runs again
                self.v.recur[d.decision_id] = remaining
                sim.cure(job, "restart")
            sim.resume(job, c.retry_s, rollback=False, reason="retry")
            return c.retry_s
        if a == "restart_process":
            if sim.has_dead_node(job):
                return c.restart_fail_s
            sim.cure(job, "restart")
            sim.resume(job, c.restart_s, rollback=True, reason="restart")
            return c.restart_s
        if a == "reconfigure":
            excluded = set(action.exclude_nodes)
            dead = {n for n in job.nodes if not sim.usable(n)}
            mine = (excluded & set(job.nodes)) | dead
            if not mine and not job.faults:
                return 1.0  # nothing of this job to move (the engine remembers nodes the job has left)
            for n in sorted(mine - dead):
                sim.drain(n, sim.now + c.health_check_s, f"excluded by {d.decision_id}")
                self.v.node_state(n, "drained", "excluded by vigil")
            for n in sorted(dead):
                self.v.node_state(n, "lost", "unreachable")
            sim.cure(job, "exclude")
            self.v.replan(failed=job.name, pause_failed=c.transition_s, rollback=True)
            return c.transition_s
        if a == "rebalance_microbatches":
            if job.dp < 2 or not sim.slow_gpus(job):
                return 0.0  # a single replica (or no slow GPU): nothing to move, the job is not stopped
            job.s2 = True
            sim.pause(job, c.rebalance_s, "failslow")
            return c.rebalance_s
        if a == "adjust_topology":
            grid = [list(r) for r in job.grid]
            slow = sim.slow_gpus(job)
            staged = False
            if slow and len(grid[0]) > 1:  # gather the stragglers into the fewest stages, then give those fewer layers
                grid = [list(r) for r in consolidate_stragglers(grid, sorted(slow)).grid]
                staged = True
            for fs, partner in sim.active_slows(job):
                if fs.cause == "communication" and partner is not None and len(grid[0]) > 1:
                    nodes = {n for r in grid for n in r}
                    if fs.node in nodes and partner in nodes:
                        grid = [list(r) for r in reroute_congested_link(grid, (fs.node, partner)).grid]
            if not staged and grid == job.grid:
                return 0.0  # nothing to adjust (a single stage): the job is not stopped
            job.s3 = job.s3 or staged
            sim.swap_grid(job, grid)
            sim.pause(job, c.topology_s, "failslow")
            return c.topology_s
        if a == "checkpoint_restart":
            culprits = sorted({fs.node for fs, _ in sim.active_slows(job) if fs.node in set(job.nodes)})
            sim.leave_stragglers(job)
            for n in culprits:
                sim.drain(n, None, "straggler left by checkpoint-restart")
                self.v.node_state(n, "drained", "straggler")
            self.v.replan(failed=job.name, pause_failed=c.checkpoint_save_s + c.restart_s, rollback=False,
                          reason="failslow")
            return c.checkpoint_save_s + c.restart_s
        return 1.0

    def human(self, job: JobRun) -> None:
        """An operator looks at the job: if it is still broken, restarts it on healthy nodes."""
        sim = self.v.sim
        shell = self.v.actuator
        shell.humans += 1
        broken = job.blocked or (job.grid and sim.has_dead_node(job)) or \
            (job.phase == "down" and job.down_reason == "failure")
        if job.name in shell.busy:
            sim.record("operator", job=job.name, did="nothing: an action is under way")
            return
        if not broken:
            sim.record("operator", job=job.name, did="nothing: the job runs")
            return
        sim.record("operator", job=job.name, did="restart on healthy nodes")
        shell.human_restarts += 1
        sim.cure(job, "exclude")
        self.v.replan(failed=job.name, pause_failed=sim.costs.restart_s, rollback=True)

    def _global(self, action: Action) -> str:
        if action.action == "isolate_node" and action.node:
            return f"{action.node} runs no job: left to repair"
        if action.action == "replan" and action.workers_by_job:
            changed = self.v.apply(dict(action.workers_by_job), failed=None)
            return f"re-planned {len(changed)} job(s)"
        return f"{action.action}: nothing to do on the simulated cluster"



class SimActuator:
    """One action at a time per job, through the executor; results to the engine and the tap."""

    def __init__(self, vigil: "Vigil") -> None:
        self.v = vigil
        self.backend = SimBackend(vigil)
        sim = vigil.sim
        self._dir = tempfile.TemporaryDirectory(prefix="vigil-sim-ledger-")
        self.ledger = Ledger(Path(self._dir.name) / "ledger.sqlite", now=sim.abs())
        # Signed as the worker signs and verified as an actuator verifies: the sim runs the real path.
        self.keyring = Keyring({"sim": os.urandom(32)}, signing_key="sim")
        self.executor = Executor(self.backend, self.ledger, Inventory(sim.topology.nodes, sim.jobs),
                                 Safety(SIM_LIMITS), source=Source(cluster="sim"), max_age_s=None,
                                 keyring=self.keyring)
        self.queue: dict[str, deque[Decision]] = {}
        self.busy: dict[str, tuple[Decision, float]] = {}
        self.counts: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        #: refusals by the executor (plan contract, inventory, safety), by their reason's first words
        self.refused: Counter[str] = Counter()
        self.humans = 0
        self.human_restarts = 0

    def close(self) -> None:
        self.ledger.close()
        self._dir.cleanup()

    def submit(self, d: Decision) -> None:
        d = self.keyring.sign(d)
        job = d.target.job
        if job is None or job not in self.v.sim.jobs:
            self._handle(d)
            return
        self.queue.setdefault(job, deque()).append(d)
        if job not in self.busy:
            self._next(job)

    def _next(self, name: str) -> None:
        q = self.queue.get(name)
        while q and name not in self.busy:
            d = q.popleft()
            sim = self.v.sim
            self.busy[name] = (d, sim.now)
            self.counts[d.action] += 1
            if d.action == "notify_human":  # the human acts out of band
                sim.at(sim.now + sim.costs.operator_s, self.backend.human, sim.jobs[name])
            if not self._handle(d):  # done at once (refused, a repeat, or no machine action)
                self.busy.pop(name, None)

    def _handle(self, d: Decision) -> bool:
        """Through the executor; True while the action is under way."""
        results = [r for r in self.executor.handle(d, from_seconds(self.v.sim.abs())) if isinstance(r, ActionResult)]
        self._report(results, d)
        if results and results[-1].state == "failed":  # type: ignore[attr-defined]
            self.refused[f"{d.action}: {results[-1].detail.split(':')[0][:60]}"] += 1  # type: ignore[attr-defined]
        return bool(results) and results[-1].state == "running"  # type: ignore[attr-defined]

    def ended(self, name: str, d: Decision) -> None:
        """The action's end in simulated time: its verdict to the executor, then the job's next action."""
        sim = self.v.sim
        _, started = self.busy.pop(name)
        job = sim.jobs[name]
        new_faults = [f for f in job.faults if f.t >= started]
        dead = job.grid and sim.has_dead_node(job)
        if d.action in ("retry_in_place", "restart_process", "reconfigure") and (new_faults or dead):
            why = "a node is unreachable" if dead else f"failed again during the action ({new_faults[0].label})"
            self.failed[d.action] += 1
            outcome = Outcome(ActionState.failed, f"{d.action} of {name}: {why}")
        else:
            outcome = Outcome(ActionState.succeeded, f"{d.action} of {name} done")
            for fault in self.v.recur.pop(d.decision_id, []):
                again = FailStop(sim.now + sim.costs.recur_s, fault.node, fault.severity, fault.kind, fault.detail,
                                 "restart")
                sim.at(again.t, sim.inject, again)
        self._report(self.executor.complete(d.decision_id, outcome, from_seconds(sim.abs())), d)
        self._next(name)

    def _report(self, results: list[Any], d: Decision) -> None:
        sim = self.v.sim
        for res in results:
            if not isinstance(res, ActionResult):
                continue
            sim.emit([res])
            sim.record("action_result", action=d.action, job=d.target.job, state=res.state, detail=res.detail[:120])
            self.v.handle(self.v.engine.on_action_result(res, sim.abs()))
