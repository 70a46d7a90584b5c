"""Recovery policies compared by the simulator: restart-only, per-job reconfiguration, vigil.

* :class:`RestartOnly` (Megatron-like, by hand): every fail-stop stalls the
  job until the collective timeout (30 min) kills it; it is resubmitted
  (9 min), waits for as many healthy free nodes as it had (a fixed-size job:
  after a sev1 it runs again only when the node is repaired, or when an
  operator shrinks it if ``Costs.manual_shrink_s`` is set), sets up (14 min)
  and recomputes the work since its last checkpoint (every 30 min).
  Fail-slows go unnoticed.
* :class:`PerJob` (Oobleck/Bamboo-like): the same in-band detection as
  vigil; a failed job alone re-plans: it restarts in place after a
  transient failure, or shrinks onto its own surviving nodes plus free ones
  after a sev1, and grows back when nodes return. Every recovery resumes
  from the last checkpoint (the redundancy that lets Oobleck skip that is
  not modelled). No fail-slow mitigation, no other job changes.
* :class:`Vigil`: the live :class:`vigil.streams.engine.decisions.DecisionEngine` (Unicron
  escalation ladder, Falcon ski-rental mitigation, re-planning on node
  return) fed by the live detectors and correlator through the probes
  (:mod:`vigil.sim.clustersim.probes`); its decisions are carried out by a
  simulated actuator (:class:`SimActuator`) whose results (running, then
  succeeded or failed) go back to the engine, as the action results of the
  real actuators do. Re-planning is multi-job and WAF-optimal
  (:func:`vigil.actuators.planners.plan_workers` over every job, in nodes) with
  topology-aware placement (:func:`vigil.actuators.planners.place_job`);
  mitigations use the planners too (micro-batch rebalancing, straggler
  consolidation, congested-link re-routing).

All policies start from the same WAF-optimal, topology-aware placement
(:func:`initial_placement`); they differ only in how they recover.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, deque
from typing import Any

import numpy as np

from vigil.actuators.planners import (
    WafJob, consolidate_stragglers, place_best_fit, place_job, plan_workers, reroute_congested_link,
)
from vigil.sim.clustersim.engine import JobRun, Simulation
from vigil.sim.clustersim.model import JobConfig, Topology, throughput_table
from vigil.sim.clustersim.probes import FailSlowProbe, FailStopProbe
from vigil.sim.clustersim.traces import FailStop
from vigil.schemas import GPUS_PER_NODE, ActionResult, Alert, Decision, JobState, NodeState, Source, from_seconds
from vigil.streams.engine.decisions import DEGRADATIONS, DecisionEngine
from vigil.streams.engine.escalation import Escalation
from vigil.streams.engine.incidents import Correlator
from vigil.streams.engine.skirental import STRATEGIES, FailSlowMitigation

__all__ = ["initial_placement", "RestartOnly", "PerJob", "Vigil", "SimActuator", "POLICIES"]

_RESULT_NS = uuid.UUID("3f0c9b7e-5a1d-4e2f-9c8b-7d6e5f4a3b21")


# -- shared helpers -------------------------------------------------------------


def _place(topology: Topology, free: list[str], size: int, pp: int, prefer: list[str], method: str) -> list[list[str]]:
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
        grid = _place(topology, free, size, j.model.pp, [], "milp")
        used = {n for r in grid for n in r}
        free = [n for n in free if n not in used]
        out[j.name] = grid
    return {j.name: out[j.name] for j in jobs}


def _fit(job: JobRun, available: int, want: int) -> int:
    """Largest usable size <= min(want, available): a multiple of pp, at least the minimum; else 0."""
    pp = job.cfg.model.pp
    size = min(want, available, job.cfg.size) // pp * pp
    return size if size >= job.cfg.minimum else 0


# -- restart-only ------------------------------------------------------------------


class RestartOnly:
    """Megatron-like recovery by hand (see the module docstring)."""

    name = "restart-only"

    def setup(self, sim: Simulation) -> None:
        self._sim = sim
        self.stage: dict[str, str] = {}
        self.want: dict[str, int] = {name: j.size for name, j in sim.jobs.items()}
        self.waiting: list[str] = []
        self.restarts = 0

    def on_failstop(self, sim: Simulation, fault: FailStop, job: JobRun | None) -> None:
        if job is None:
            return
        sim.detected(fault, sim.costs.collective_timeout_s)
        if self.stage.get(job.name) in ("timeout", "resubmit", "waiting"):
            return  # the restart under way will start it afresh
        self.stage[job.name] = "timeout"
        sim.at(sim.now + sim.costs.collective_timeout_s, self._timed_out, job)

    def _timed_out(self, job: JobRun) -> None:
        self.stage[job.name] = "resubmit"
        self._sim.at(self._sim.now + self._sim.costs.resubmit_s, self._resubmitted, job)

    def _resubmitted(self, job: JobRun) -> None:
        sim = self._sim
        sim.release(job)
        sim.cure(job, "exclude")  # a fresh launch on healthy nodes cures every fault
        sim.set_off(job, "queued")
        self.stage[job.name] = "waiting"
        self.waiting.append(job.name)
        if sim.costs.manual_shrink_s is not None:
            sim.at(sim.now + sim.costs.manual_shrink_s, self._operator, job)
        self._schedule()

    def _operator(self, job: JobRun) -> None:
        if self.stage.get(job.name) == "waiting":
            smaller = _fit(job, len(self._sim.free_nodes()), self.want[job.name])
            if smaller > 0:
                self.want[job.name] = smaller
                self._sim.record("operator_shrink", job=job.name, size=smaller)
                self._schedule()

    def _schedule(self) -> None:
        sim = self._sim
        for name in list(self.waiting):
            job = sim.jobs[name]
            free = sim.free_nodes()
            need = self.want[name]
            if len(free) < need:
                continue  # backfill: later, smaller jobs may still start
            grid = _place(sim.topology, free, need, job.cfg.model.pp, [], "best_fit")
            sim.assign(job, grid)
            self.waiting.remove(name)
            self.stage[name] = "setup"
            self.restarts += 1
            sim.resume(job, sim.costs.setup_s, rollback=True, reason="setup")

    def on_node_up(self, sim: Simulation, node: str) -> None:
        self._schedule()

    def on_level(self, sim: Simulation, job: JobRun) -> None:
        return None

    def finish(self, sim: Simulation) -> dict[str, Any]:
        return {"restarts": self.restarts, "still_waiting": sorted(self.waiting)}


# -- per-job reconfiguration --------------------------------------------------------


class PerJob:
    """Oobleck/Bamboo-like: in-band detection, only the failed job re-plans (see the module docstring)."""

    name = "per-job"

    def setup(self, sim: Simulation) -> None:
        self.probe = FailStopProbe(None, transport_s=0.05, seed=sim.seed)
        self.short: list[str] = []
        self.actions: Counter[str] = Counter()

    def on_failstop(self, sim: Simulation, fault: FailStop, job: JobRun | None) -> None:
        if job is None:
            return
        found = self.probe.detect(fault, job.name, job.nodes, _iter(job), sim.abs())
        latency = found[0][0] if found else sim.costs.collective_timeout_s
        sim.detected(fault, latency)
        sim.at(sim.now + latency, self._recover, sim, job)

    def _recover(self, sim: Simulation, job: JobRun) -> None:
        if not job.faults and not sim.has_dead_node(job):
            return  # an earlier recovery already covers it
        if sim.has_dead_node(job):
            sim.release(job)
            sim.cure(job, "exclude")
            size = _fit(job, len(sim.free_nodes()), job.cfg.size)
            self.actions["reconfigure"] += 1
            if size == 0:
                sim.set_off(job, "no nodes")
            else:
                sim.assign(job, _place(sim.topology, sim.free_nodes(), size, job.cfg.model.pp, [], "best_fit"))
                sim.resume(job, sim.costs.transition_s, rollback=True, reason="reconfigure")
            if size < job.cfg.size and job.name not in self.short:
                self.short.append(job.name)
        else:
            sim.cure(job, "restart")
            self.actions["restart"] += 1
            sim.resume(job, sim.costs.restart_s, rollback=True, reason="restart")

    def on_node_up(self, sim: Simulation, node: str) -> None:
        for name in list(self.short):
            job = sim.jobs[name]
            if job.blocked or job.phase == "down":
                continue  # busy recovering: it grows at its next chance
            free = sim.free_nodes()
            size = _fit(job, len(free) + job.size, job.cfg.size)
            if size <= job.size:
                continue
            was_off = job.phase == "off"
            prefer = job.nodes
            sim.release(job)
            sim.assign(job, _place(sim.topology, sim.free_nodes(), size, job.cfg.model.pp, prefer, "best_fit"))
            self.actions["grow"] += 1
            if was_off:
                sim.resume(job, sim.costs.transition_s, rollback=True, reason="reconfigure")
            else:
                sim.pause(job, sim.costs.transition_s, "transition")
            if size >= job.cfg.size:
                self.short.remove(name)

    def on_level(self, sim: Simulation, job: JobRun) -> None:
        return None

    def finish(self, sim: Simulation) -> dict[str, Any]:
        return {"actions": dict(sorted(self.actions.items())), "probes": self.probe.probes}


def _iter(job: JobRun) -> float:
    return job.healthy_iter_s if math.isfinite(job.healthy_iter_s) else 10.0


# -- vigil -----------------------------------------------------------------------------


class SimActuator:
    """Carries out vigil's decisions on the simulated cluster, one at a time per job, and reports results.

    Effects start with the action (the job stops, is re-planned, resumes
    after the action's duration); the verdict comes at its end: ``failed``
    when the job cannot run (a node is unreachable) or failed again while
    the action ran, else ``succeeded``. ``notify_human`` succeeds at once,
    as with the real executor; an operator looks at the job
    ``Costs.operator_s`` later and restarts it on healthy nodes if it is
    still broken. A reconfiguration of a job that holds none of the
    excluded nodes and has no fault is a no-op.
    """

    def __init__(self, vigil: "Vigil") -> None:
        self.v = vigil
        self.queue: dict[str, deque[Decision]] = {}
        self.seen: set[uuid.UUID] = set()
        self.busy: dict[str, tuple[Decision, float]] = {}
        self.counts: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.humans = 0
        self.human_restarts = 0

    def submit(self, d: Decision) -> None:
        if d.decision_id in self.seen:
            return  # idempotent by decision id, as the real actuators are
        self.seen.add(d.decision_id)
        job = d.target.job
        if job is None or job not in self.v.sim.jobs:
            self._report(d, "running")
            detail = self._global(d)
            self._report(d, "succeeded", detail)
            return
        self.queue.setdefault(job, deque()).append(d)
        if job not in self.busy:
            self._next(job)

    def _next(self, name: str) -> None:
        q = self.queue.get(name)
        if not q or name in self.busy:
            return
        d = q.popleft()
        sim = self.v.sim
        self.busy[name] = (d, sim.now)
        self.counts[d.action] += 1
        self._report(d, "running")
        duration = self._start(d, sim.jobs[name])
        sim.at(sim.now + duration, self._end, name, d)

    def _end(self, name: str, d: Decision) -> None:
        sim = self.v.sim
        _, started = self.busy.pop(name)
        job = sim.jobs[name]
        new_faults = [f for f in job.faults if f.t >= started]
        dead = job.grid and sim.has_dead_node(job)
        if d.action in ("retry_in_place", "restart_process", "reconfigure") and (new_faults or dead):
            why = "a node is unreachable" if dead else f"failed again during the action ({new_faults[0].label})"
            self.failed[d.action] += 1
            self._report(d, "failed", f"{d.action} of {name}: {why}")
        else:
            self._report(d, "succeeded", f"{d.action} of {name} done")
            for fault in self.v.recur.pop(d.decision_id, []):
                again = FailStop(sim.now + sim.costs.recur_s, fault.node, fault.severity, fault.kind, fault.detail,
                                 "restart")
                sim.at(again.t, sim.inject, again)
        self._next(name)

    # -- effects -------------------------------------------------------------
    def _start(self, d: Decision, job: JobRun) -> float:
        sim, c = self.v.sim, self.v.sim.costs
        a = d.action
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
            excluded = set(d.plan.get("exclude_nodes") or []) if isinstance(d.plan, dict) else set()
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
        if a == "notify_human":
            # As the real executor: nothing runs, the result is immediate; the human acts out of band.
            sim.at(sim.now + c.operator_s, self._human, job)
            return 0.0
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

    def _human(self, job: JobRun) -> None:
        """An operator looks at the job: if it is still broken, restarts it on healthy nodes."""
        sim = self.v.sim
        self.humans += 1
        broken = job.blocked or (job.grid and sim.has_dead_node(job)) or \
            (job.phase == "down" and job.down_reason == "failure")
        if job.name in self.busy:
            sim.record("operator", job=job.name, did="nothing: an action is under way")
            return
        if not broken:
            sim.record("operator", job=job.name, did="nothing: the job runs")
            return
        sim.record("operator", job=job.name, did="restart on healthy nodes")
        self.human_restarts += 1
        sim.cure(job, "exclude")
        self.v.replan(failed=job.name, pause_failed=sim.costs.restart_s, rollback=True)

    def _global(self, d: Decision) -> str:
        if d.action == "isolate_node" and d.target.node:
            return f"{d.target.node} runs no job: left to repair"
        alloc = d.plan.get("allocation") if isinstance(d.plan, dict) else None
        if not isinstance(alloc, dict):
            return "no allocation in the plan"
        changed = self.v.apply(alloc, failed=None)
        return f"re-planned {len(changed)} job(s)"

    def _report(self, d: Decision, state: str, detail: str = "") -> None:
        sim = self.v.sim
        self.counts_state = getattr(self, "counts_state", Counter())
        self.counts_state[state] += 1
        res = ActionResult(
            event_id=uuid.uuid5(_RESULT_NS, f"{d.decision_id}|{state}"), event_time=from_seconds(sim.abs()),
            source=Source(cluster="sim", job=d.target.job), decision_id=d.decision_id, state=state,  # type: ignore[arg-type]
            backend="sim", detail=detail[:500])
        sim.emit([res])
        sim.record("action_result", action=d.action, job=d.target.job, state=state, detail=detail[:120])
        self.v.handle(self.v.engine.on_action_result(res, sim.abs()))


class Vigil:
    """The live decision engine on simulated time (see the module docstring).

    ``failslow_pricing``: ``"learned"`` (the live engine: the ski rental
    learns episode durations online from what it sees end) or
    ``"clairvoyant"``, a bound for the benchmark and nothing else: the ski
    rental is told each episode's true remaining duration by the simulator
    (it still sees the slowdown only through the detector, and pays the same
    costs), which no online policy can know.
    """

    name = "vigil"

    def __init__(self, tick_s: float = 10.0, housekeeping_s: float = 60.0, pre_iterations: int = 64,
                 max_iterations: int = 160, failslow_pricing: str = "learned") -> None:
        if failslow_pricing not in ("learned", "clairvoyant"):
            raise ValueError(f"failslow_pricing must be 'learned' or 'clairvoyant', got {failslow_pricing!r}")
        self.tick_s = tick_s
        self.housekeeping_s = housekeeping_s
        self.pre_iterations = pre_iterations
        self.max_iterations = max_iterations
        self.failslow_pricing = failslow_pricing

    # -- set-up ------------------------------------------------------------------
    def setup(self, sim: Simulation) -> None:
        self.sim = sim
        self.correlator = Correlator()
        c = sim.costs
        # Ski rental priced with this cluster's costs (the live engine then keeps learning them from results).
        mitigation = FailSlowMitigation({"rebalance_microbatches": c.rebalance_s, "adjust_topology": c.topology_s,
                                         "checkpoint_restart": c.checkpoint_save_s + c.restart_s},
                                        remaining=self._true_remaining if self.failslow_pricing == "clairvoyant" else None)
        self.engine = DecisionEngine(escalation=Escalation(), mitigation=mitigation,
                                     recovered=self.correlator.recovered, replan=self._replan_decision,
                                     cluster="sim")
        self.stops = FailStopProbe(self.correlator, transport_s=0.05, seed=sim.seed)
        self.actuator = SimActuator(self)
        self.recur: dict[uuid.UUID, list[FailStop]] = {}
        self.slow_probes: dict[str, FailSlowProbe] = {}
        self.obs: dict[str, dict[str, Any]] = {}
        self.failslow_incidents: dict[uuid.UUID, str] = {}
        self.decisions: Counter[str] = Counter()
        self.failslow_steps: dict[str, Counter[str]] = {a: Counter() for a in STRATEGIES}
        self.alerts: Counter[str] = Counter()
        self.replans = 0
        self._ticking = False
        events = sim.trace.fail_stops
        span = sim.trace.duration_s
        self.d_running = span / max(1, len(events) + len(sim.trace.fail_slows))
        for n in sim.topology.nodes:
            self.node_state(n, "healthy", "in service")
        for job in sim.jobs.values():
            self.job_state(job)
            if job.grid:
                self._probe(job)
        sim.at(sim.now + self.housekeeping_s, self._housekeeping)

    def _true_remaining(self, job: str, slowdown_class: str, age_s: float) -> tuple[float, bool] | None:
        """The clairvoyant bound's oracle: how long the fail-slows that hit ``job`` will still last (ground truth)."""
        sim = self.sim
        ends = [sim.slows[i][0].end for i in sim.jobs[job].episodes if i in sim.slows] if job in sim.jobs else []
        return (max(0.0, max(ends) - sim.now), True) if ends else (0.0, True)

    def _job_state(self, job: JobRun) -> JobState:
        m = job.cfg.model
        return JobState(event_time=from_seconds(self.sim.abs()), source=Source(cluster="sim", job=job.name),
                        state="running", nodes=job.nodes, gpus=job.size * GPUS_PER_NODE, dp=max(1, job.dp),
                        pp=m.pp, tp=GPUS_PER_NODE, weight=job.cfg.weight, min_gpus=job.cfg.minimum * GPUS_PER_NODE)

    def node_state(self, node: str, state: str, reason: str) -> None:
        ev = NodeState(event_time=from_seconds(self.sim.abs()), source=Source(cluster="sim", node=node),
                       state=state, reason=reason)  # type: ignore[arg-type]
        self.sim.emit([ev])
        self.handle(self.engine.on_state(ev, self.sim.abs()))

    def job_state(self, job: JobRun) -> None:
        ev = self._job_state(job)
        self.sim.emit([ev])
        self.handle(self.engine.on_state(ev, self.sim.abs()))

    # -- the engine's inputs and outputs --------------------------------------------
    def handle(self, outs: list[Any]) -> None:
        sim = self.sim
        for e in outs:
            if isinstance(e, Decision):
                sim.emit([e])
                self.decisions[e.action] += 1
                sim.record("decision", action=e.action, job=e.target.job, node=e.target.node, reason=e.reason[:160])
                self.actuator.submit(e)
            elif isinstance(e, Alert):
                self.deliver([e])
            if isinstance(e, Decision) and e.action in STRATEGIES:
                basis = "classic" if "classic ski rental" in e.reason else "expected remaining"
                self.failslow_steps[e.action][basis] += 1

    def deliver(self, alerts: list[Alert]) -> None:
        sim = self.sim
        for a in alerts:
            sim.emit([a])
            self.alerts[f"{a.status}:{a.kind}"] += 1
            sim.record("alert", status=a.status, kind=a.kind, severity=a.severity, job=a.subject.job,
                       node=a.subject.node)
            if a.status == "resolved":
                self.failslow_incidents.pop(a.incident_id, None)
            elif a.kind in DEGRADATIONS and (a.kind == "fail_slow" or a.slowdowns):
                self.failslow_incidents[a.incident_id] = a.subject.job or ""
            elif a.severity == 1 and a.subject.node and a.kind in ("node_lost", "xid"):
                self.node_state(a.subject.node, "lost", a.kind)
            self.handle(self.engine.on_alert(a, sim.abs()))
            if a.status != "resolved" and a.severity == 3 and a.kind not in DEGRADATIONS:
                sim.at(sim.now + self.engine.settle_s + 0.01, self._tick)
        if self.failslow_incidents and not self._ticking:
            self._ticking = True
            sim.at(sim.now + self.tick_s, self._mitigation_tick)

    def _tick(self) -> None:
        self.handle(self.engine.tick(self.sim.abs()))

    def _mitigation_tick(self) -> None:
        self._tick()
        if self.failslow_incidents:
            self.sim.at(self.sim.now + self.tick_s, self._mitigation_tick)
        else:
            self._ticking = False

    def _housekeeping(self) -> None:
        self.deliver(self.correlator.tick(self.sim.abs()))
        self._tick()
        self.sim.at(self.sim.now + self.housekeeping_s, self._housekeeping)

    # -- fail-stops --------------------------------------------------------------------
    def on_failstop(self, sim: Simulation, fault: FailStop, job: JobRun | None) -> None:
        if job is None:
            if fault.severity == 1:
                self.node_state(fault.node, "lost", fault.label)
            return
        found = self.stops.detect(fault, job.name, job.nodes, _iter(job), sim.abs(), sim.emit)
        if not found:  # missed in-band: the collective timeout raises an NCCL timeout
            late = FailStop(fault.t, fault.node, 3, "exception", "nccl_timeout", fault.cure)
            timeout = sim.costs.collective_timeout_s
            found = [(latency + timeout, alerts) for latency, alerts in
                     self.stops.detect(late, job.name, job.nodes, _iter(job), sim.abs() + timeout, sim.emit)]
        sim.detected(fault, found[0][0] if found else None)
        for latency, alerts in found:
            sim.at(sim.now + latency, self.deliver, alerts)

    def on_node_up(self, sim: Simulation, node: str) -> None:
        self.node_state(node, "repaired", "back in service")
        # Live, the node's heartbeats resume and its XID holds run out, which clears the findings
        # of its incidents; the probes stop at detection and never see that. An incident left
        # open would swallow every later failure of a job placed on the node (no alert, no remedy).
        rooted = [i for i, inc in self.correlator.incidents.items()
                  if inc.root.subject.node == node and inc.root.subject.job is None]
        if rooted:
            self.deliver(self.correlator.recovered(rooted, None, sim.abs(), f"{node} back in service"))

    # -- re-planning (Unicron) and placement (Arnold) ---------------------------------
    def _replan_decision(self, jobs: dict[str, JobState], healthy: set[str]) -> dict[str, Any]:
        return {"allocation": self.allocate(failed=None)}

    def allocate(self, failed: str | None) -> dict[str, int]:
        """WAF-optimal sizes (in nodes) of the jobs that can move, on the healthy nodes they may use."""
        sim = self.sim
        self.replans += 1
        fixed = {name for name, j in sim.jobs.items()
                 if name != failed and (j.blocked or name in self.actuator.busy)}
        held = sum(sim.usable(x) for n in fixed for x in sim.jobs[n].nodes)
        available = max(0, len(sim.healthy_nodes()) - held)
        specs = []
        for name, j in sim.jobs.items():
            if name in fixed:
                continue
            size = j.size if j.size <= j.cfg.size and (j.size == 0 or j.size >= j.cfg.minimum) else 0
            specs.append(WafJob(name, j.cfg.weight, j.cfg.minimum, j.table, current_workers=size,
                                 failed=name == failed))
        plan = plan_workers(specs, available, self.d_running, sim.costs.transition_s)
        alloc = {name: sim.jobs[name].size for name in fixed}
        alloc.update(plan.allocation)
        return alloc

    def replan(self, failed: str, pause_failed: float, rollback: bool, reason: str = "reconfigure") -> None:
        alloc = self.allocate(failed=failed)
        self.apply(alloc, failed=failed, pause_failed=pause_failed, rollback=rollback, reason=reason)

    def apply(self, alloc: dict[str, int], failed: str | None, pause_failed: float = 0.0, rollback: bool = True,
              reason: str = "reconfigure") -> list[str]:
        """Resize and place the jobs whose allocation changed (and the failed one), largest first."""
        sim = self.sim
        changed = []
        for name, j in sim.jobs.items():
            if name != failed and (j.blocked or name in self.actuator.busy):
                continue
            want = alloc.get(name, j.size)
            if name == failed or want != j.size or (j.grid and sim.has_dead_node(j)):
                changed.append(name)
        previous = {name: sim.jobs[name].nodes for name in changed}
        was_off = {name: sim.jobs[name].phase == "off" for name in changed}
        for name in changed:
            sim.release(sim.jobs[name])
        for name in sorted(changed, key=lambda n: (-alloc.get(n, 0), n)):
            j = sim.jobs[name]
            size = _fit(j, len(sim.free_nodes()), alloc.get(name, 0))
            if size > 0:
                sim.assign(j, _place(sim.topology, sim.free_nodes(), size, j.cfg.model.pp, previous[name], "milp"))
        for name in changed:
            j = sim.jobs[name]
            if not j.grid:
                sim.set_off(j, "no nodes")
            elif name == failed:
                if rollback:
                    sim.resume(j, pause_failed, rollback=True, reason=reason)
                else:
                    sim.pause(j, pause_failed, reason)
            elif was_off[name]:
                sim.resume(j, sim.costs.transition_s, rollback=True, reason="transition")
            else:
                sim.pause(j, sim.costs.transition_s, "transition")
            self.job_state(j)  # the engine hears of the move first: the incidents it closes were cut short
            self._new_layout(j)
        if changed:
            sim.record("replan", jobs={n: sim.jobs[n].size for n in changed}, failed=failed)
        return changed

    # -- fail-slows (Falcon) ----------------------------------------------------------------
    def _new_layout(self, job: JobRun) -> None:
        """A job relaunched on a new layout: its detectors start afresh, its fail-slow incidents end."""
        sim = self.sim
        ids = [i for i, j in self.failslow_incidents.items() if j == job.name]
        if ids:
            self.deliver(self.correlator.recovered(ids, job.name, sim.abs(), "job relaunched on a new layout"))
        self.slow_probes.pop(job.name, None)
        self.obs.pop(job.name, None)

    def _probe(self, job: JobRun) -> FailSlowProbe:
        """The fail-slow detector of the job's current incarnation; a new one knows only the level it starts at
        (a job that starts slow on a new layout shows no change)."""
        sim = self.sim
        probe = self.slow_probes.get(job.name)
        if probe is None or getattr(probe, "incarnation", None) != job.incarnation:
            rng = np.random.default_rng([sim.seed, 13, sum(map(ord, job.name)), job.incarnation, int(sim.now)])
            probe = FailSlowProbe(job.name, job.cfg.model, self.correlator, rng, sim.hw, cluster="sim")
            probe.incarnation = job.incarnation  # type: ignore[attr-defined]
            probe.factors = sim.factors(job)  # type: ignore[attr-defined]
            probe.iter_s = job.iter_s  # type: ignore[attr-defined]
            self.slow_probes[job.name] = probe
        return probe

    def on_level(self, sim: Simulation, job: JobRun) -> None:
        if not job.grid:
            return
        fresh = getattr(self.slow_probes.get(job.name), "incarnation", None) != job.incarnation
        probe = self._probe(job)
        if fresh or abs(job.iter_s / probe.iter_s - 1.0) < 0.005:  # type: ignore[attr-defined]
            return
        grid = [list(r) for r in job.grid]
        pre = probe.feed(grid, probe.factors, self.pre_iterations, sim.abs(), sim.slow_gpus(job), sim.emit)  # type: ignore[attr-defined]
        self._consume(job, pre, None)
        slower = job.iter_s > probe.iter_s * 1.1  # type: ignore[attr-defined]
        causes = sorted({fs.cause for fs, _ in sim.active_slows(job)})
        probe.factors = sim.factors(job)  # type: ignore[attr-defined]
        probe.iter_s = job.iter_s  # type: ignore[attr-defined]
        token = object()
        self.obs[job.name] = {"token": token, "t": sim.now, "start": sim.now, "fed": 0, "after": None,
                              "watch": f"fail_slow:{causes[-1] if causes else 'other'}" if slower else None}
        sim.at(sim.now + self._chunk_s(job), self._observe, job, token)

    def _chunk_s(self, job: JobRun) -> float:
        return max(2.0, 2.0 * job.iter_s)

    def _observe(self, job: JobRun, token: object) -> None:
        sim = self.sim
        ob = self.obs.get(job.name)
        probe = self.slow_probes.get(job.name)
        if ob is None or ob["token"] is not token or probe is None:
            return
        n = 0
        if job.phase in ("running", "recompute") and math.isfinite(job.iter_s):
            n = int((sim.now - ob["t"]) / job.iter_s)
        if n > 0:
            n = min(n, self.max_iterations - ob["fed"])
            ob["t"] += n * job.iter_s
            ob["fed"] += n
            out = probe.feed([list(r) for r in job.grid], probe.factors, n, sim.abs(), sim.slow_gpus(job),  # type: ignore[attr-defined]
                             sim.emit)
            self._consume(job, out, ob)
        elif job.phase not in ("running", "recompute"):
            ob["t"] = sim.now
        done = ob["fed"] >= self.max_iterations or (ob["after"] is not None and ob["fed"] >= ob["after"] + 8)
        if done:
            if ob["watch"] is not None and ob["after"] is None:
                sim.detections.setdefault(ob["watch"], []).append(math.nan)
            del self.obs[job.name]
        else:
            sim.at(sim.now + self._chunk_s(job), self._observe, job, token)

    def _consume(self, job: JobRun, out: list[tuple[float, list[Alert], list[str]]], ob: dict[str, Any] | None) -> None:
        for t_abs, alerts, kinds in out:
            if ob is not None and kinds and ob["after"] is None:
                ob["after"] = ob["fed"]
                if ob["watch"] is not None and "raised:fail_slow" in kinds:
                    self.sim.detections.setdefault(ob["watch"], []).append(t_abs - self.sim.abs(ob["start"]))
                    ob["watch"] = None
            if alerts:
                self.deliver(alerts)

    def finish(self, sim: Simulation) -> dict[str, Any]:
        return {
            "decisions": dict(sorted(self.decisions.items())),
            "alerts": dict(sorted(self.alerts.items())),
            "actions": dict(sorted(self.actuator.counts.items())),
            "actions_failed": dict(sorted(self.actuator.failed.items())),
            "operator_visits": self.actuator.humans, "operator_restarts": self.actuator.human_restarts,
            "replans": self.replans,
            "failstop_probes": self.stops.probes,
            "learned_overhead_s": {k: round(v, 1) for k, v in self.engine.mitigation.overhead_s.items()},
            "failslow_pricing": self.failslow_pricing,
            "failslow_steps": {a: dict(sorted(c.items())) for a, c in self.failslow_steps.items()},
            "failslow_history": {cls: dict(zip(("episodes", "ended_seen"), self.engine.mitigation.durations.count(cls)))
                                 for cls in ("computation", "communication")},
        }


POLICIES = {"restart-only": RestartOnly, "per-job": PerJob, "vigil": Vigil}
