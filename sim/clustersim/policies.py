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
  simulated actuator (:mod:`vigil.sim.clustersim.actuator`: a backend behind
  the real executor) whose results (running, then succeeded or failed) go
  back to the engine, as the action results of the real actuators do. Re-planning is multi-job and WAF-optimal
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
from collections import Counter
from typing import Any

import numpy as np

from vigil.actuators.planners import WafJob, plan_workers
from vigil.schemas import GPUS_PER_NODE, Alert, Decision, JobState, NodeState, Source, from_seconds
from vigil.sim.clustersim.actuator import SimActuator
from vigil.sim.clustersim.baselines import PerJob, RestartOnly
from vigil.sim.clustersim.engine import JobRun, Simulation
from vigil.sim.clustersim.placement import fit, initial_placement, iteration_of, place
from vigil.sim.clustersim.probes import FailSlowProbe, FailStopProbe
from vigil.sim.clustersim.traces import FailStop
from vigil.streams.engine.decisions import DEGRADATIONS, DecisionEngine
from vigil.streams.engine.escalation import Escalation
from vigil.streams.engine.incidents import Correlator
from vigil.streams.engine.skirental import STRATEGIES, FailSlowMitigation

__all__ = ["initial_placement", "RestartOnly", "PerJob", "Vigil", "POLICIES"]


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
        found = self.stops.detect(fault, job.name, job.nodes, iteration_of(job), sim.abs(), sim.emit)
        if not found:  # missed in-band: the collective timeout raises an NCCL timeout
            late = FailStop(fault.t, fault.node, 3, "exception", "nccl_timeout", fault.cure)
            timeout = sim.costs.collective_timeout_s
            found = [(latency + timeout, alerts) for latency, alerts in
                     self.stops.detect(late, job.name, job.nodes, iteration_of(job), sim.abs() + timeout, sim.emit)]
        sim.detected(fault, found[0][0] if found else None)
        for latency, alerts in found:
            sim.at(sim.now + latency, self.deliver, alerts)

    def on_node_up(self, sim: Simulation, node: str) -> None:
        self.node_state(node, "joined", "repaired, passed its health check, back in service")
        # Live, the node's heartbeats resume and its XID holds run out, which clears the findings
        # of its incidents; the probes stop at detection and never see that. An incident left
        # open would swallow every later failure of a job placed on the node (no alert, no remedy).
        rooted = [i for i, inc in self.correlator.incidents.items()
                  if inc.root.subject.node == node and inc.root.subject.job is None]
        if rooted:
            self.deliver(self.correlator.recovered(rooted, None, sim.abs(), f"{node} back in service"))

    # -- re-planning (Unicron) and placement (Arnold) ---------------------------------
    def _replan_decision(self, jobs: dict[str, JobState], healthy: set[str]) -> dict[str, Any]:
        return {"workers": self.allocate(failed=None)}

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
            size = fit(j, len(sim.free_nodes()), alloc.get(name, 0))
            if size > 0:
                sim.assign(j, place(sim.topology, sim.free_nodes(), size, j.cfg.model.pp, previous[name], "milp"))
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
        self.actuator.close()
        refused = self.actuator.refused
        return {
            "actions_refused": dict(sorted(refused.items())),
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
