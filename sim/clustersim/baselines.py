"""The policies vigil is compared with: restart-only (by hand) and per-job reconfiguration.

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
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from vigil.sim.clustersim.engine import JobRun, Simulation
from vigil.sim.clustersim.placement import fit, iteration_of, place
from vigil.sim.clustersim.probes import FailStopProbe
from vigil.sim.clustersim.traces import FailStop

__all__ = ["RestartOnly", "PerJob"]


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
            smaller = fit(job, len(self._sim.free_nodes()), self.want[job.name])
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
            grid = place(sim.topology, free, need, job.cfg.model.pp, [], "best_fit")
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
        found = self.probe.detect(fault, job.name, job.nodes, iteration_of(job), sim.abs())
        latency = found[0][0] if found else sim.costs.collective_timeout_s
        sim.detected(fault, latency)
        sim.at(sim.now + latency, self._recover, sim, job)

    def _recover(self, sim: Simulation, job: JobRun) -> None:
        if not job.faults and not sim.has_dead_node(job):
            return  # an earlier recovery already covers it
        if sim.has_dead_node(job):
            sim.release(job)
            sim.cure(job, "exclude")
            size = fit(job, len(sim.free_nodes()), job.cfg.size)
            self.actions["reconfigure"] += 1
            if size == 0:
                sim.set_off(job, "no nodes")
            else:
                sim.assign(job, place(sim.topology, sim.free_nodes(), size, job.cfg.model.pp, [], "best_fit"))
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
            size = fit(job, len(free) + job.size, job.cfg.size)
            if size <= job.size:
                continue
            was_off = job.phase == "off"
            prefer = job.nodes
            sim.release(job)
            sim.assign(job, place(sim.topology, sim.free_nodes(), size, job.cfg.model.pp, prefer, "best_fit"))
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
