"""The discrete-event cluster simulator: weeks of cluster time in minutes.

Modelling choice
----------------
Nothing happens to a job between two *events* (a failure, a repair, the end
of a restart or of a recomputation, an action, the start or end of a
fail-slow, a placement change), so the simulator advances each job from
event to event and computes its progress analytically: in a segment of
``dt`` seconds at ``t`` seconds per iteration the job does ``dt / t``
iterations, i.e. ``flops_per_iteration * dt / t`` FLOPs. The iteration time
comes from the model (:mod:`vigil.sim.clustersim.model`: per-node compute,
all-reduce and pipeline traffic, fail-slow factors, mitigations, placement).
The event queue is ordered by (time, sequence number), so a run is a pure
function of its inputs and seed.

Real detection and real decisions run only where they matter (see
:mod:`vigil.sim.clustersim.probes` and :mod:`vigil.sim.clustersim.policies`):
fail-stops go through the live detectors on a short window around them,
fail-slows through BOCD + verification on windows of sampled iteration times
around each change of a job's speed, and the vigil policy drives the live
:class:`vigil.streams.engine.decisions.DecisionEngine` with the alerts that come out and
with the results of a simulated actuator, on simulated time.

Accounting (per job)
--------------------
* *phases*: ``running`` (new progress), ``recompute`` (re-doing the work
  since the last checkpoint, at the current speed), ``down`` (failed,
  restarting, waiting for nodes, paused by an action), ``off`` (no nodes);
* checkpoints every ``checkpoint_interval_s`` of running time; a failure
  loses the work since the last one when the job rolls back;
* **WAF** (Unicron's weighted achieved FLOP/s) = ``sum_jobs weight x``
  useful FLOP/s; its integral over time is the accumulated WAF (weighted
  FLOPs; recomputation is not useful work);
* **ETTR** (Meta) = running time / wall-clock time of the run;
* **fail-slow cost** = the time lost to fail-slows: while a job runs slower
  than it would on the same nodes without them, ``dt * (1 - t_healthy / t)``
  seconds of every ``dt`` are lost, plus the pauses of the mitigations
  themselves.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from typing import Any, Callable, Protocol

import numpy as np

from vigil.actuators.planners import placement_spread, rebalance_microbatches
from vigil.sim.clustersim.jobs import Costs, JobRun
from vigil.sim.clustersim.model import (
    HardwareSpec, JobConfig, StepFactors, Topology, iteration_time, link_role, throughput_table,
)
from vigil.sim.clustersim.traces import FailSlowFault, FailStop, FailureTrace

__all__ = ["T0", "Costs", "JobRun", "Simulation", "Policy"]

#: Simulated time 0 on the streams' clock (2026-01-01T00:00:00Z).
T0 = 1_767_225_600.0


class Policy(Protocol):
    name: str

    def setup(self, sim: "Simulation") -> None: ...
    def on_failstop(self, sim: "Simulation", fault: FailStop, job: "JobRun | None") -> None: ...
    def on_node_up(self, sim: "Simulation", node: str) -> None: ...
    def on_level(self, sim: "Simulation", job: "JobRun") -> None: ...
    def finish(self, sim: "Simulation") -> dict[str, Any]: ...


class Simulation:
    """One policy on one trace: the event loop, the cluster's state and the accounting."""

    def __init__(self, jobs: list[JobConfig], topology: Topology, trace: FailureTrace, policy: Policy,
                 costs: Costs = Costs(), hw: HardwareSpec = HardwareSpec(), seed: int = 0,
                 initial: dict[str, list[list[str]]] | None = None,
                 progress: Callable[[str], None] | None = None, log_limit: int = 50_000, t0: float = T0,
                 tap: Callable[[float, list[Any]], None] | None = None) -> None:
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        if set(trace.nodes) - set(topology.nodes):
            raise ValueError("the trace names nodes that are not in the topology")
        self.topology = topology
        self.trace = trace
        self.policy = policy
        self.costs = costs
        self.hw = hw
        self.seed = seed
        self.rng = np.random.default_rng([seed, 11])
        self.progress = progress
        self.log_limit = log_limit
        self.now = 0.0
        self.t0 = t0
        self.tap = tap
        self.end = trace.duration_s
        self._queue: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.status: dict[str, str] = {n: "up" for n in topology.nodes}
        self.owner: dict[str, str | None] = {n: None for n in topology.nodes}
        self.repair_at: dict[str, float] = {}
        self.jobs: dict[str, JobRun] = {j.name: JobRun(j, throughput_table(j.model, j.size, hw)) for j in jobs}
        self.slow_on: dict[str, list[int]] = {}  # node -> active fail-slow indices
        self.slows: dict[int, tuple[FailSlowFault, str | None]] = {}  # index -> (fail-slow, link partner)
        self.episode_jobs: dict[int, str] = {}  # fail-slow index -> the job it hit at its onset
        self.total_rate = 0.0
        self.series: list[tuple[float, float]] = [(0.0, 0.0)]
        self.log: list[dict[str, Any]] = []
        self.log_dropped = 0
        self.detections: dict[str, list[float]] = {}
        self.recoveries: dict[str, list[float]] = {}
        self.initial = initial
        self.events_processed = 0
        self._started = False

    # -- time ----------------------------------------------------------------
    def abs(self, t: float | None = None) -> float:
        """Absolute seconds (the streams' clock, ``t0`` at simulated time 0) of simulated time ``t`` (default: now)."""
        return self.t0 + (self.now if t is None else t)

    def emit(self, events: list[Any]) -> None:
        """Hand events the run produced (telemetry of its probes, alerts, decisions...) to the tap, if any."""
        if self.tap is not None and events:
            self.tap(self.now, list(events))

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(t, self.now), self._seq, fn, args))

    def record(self, event: str, /, **what: Any) -> None:
        """Append to the run's log (time, event, details)."""
        if len(self.log) < self.log_limit:
            self.log.append({"t": round(self.now, 3), "event": event, **what})
        else:
            self.log_dropped += 1

    # -- nodes -----------------------------------------------------------------
    def usable(self, node: str) -> bool:
        return self.status[node] == "up"

    def free_nodes(self) -> list[str]:
        return [n for n in self.topology.nodes if self.status[n] == "up" and self.owner[n] is None]

    def healthy_nodes(self) -> list[str]:
        return [n for n in self.topology.nodes if self.status[n] == "up"]

    def drain(self, node: str, until: float | None, why: str) -> None:
        """Take an up node out of service (an exclusion); back at ``until`` (None: when told)."""
        if self.status[node] != "up":
            return
        self.status[node] = "drained"
        self.record("node_drained", node=node, why=why)
        if until is not None:
            self.at(until, self._undrain, node)

    def undrain(self, node: str) -> None:
        self._undrain(node)

    def _undrain(self, node: str) -> None:
        if self.status[node] == "drained":
            self.status[node] = "up"
            self.record("node_back", node=node)
            self.policy.on_node_up(self, node)

    # -- jobs: placement -------------------------------------------------------
    def assign(self, job: JobRun, grid: list[list[str]]) -> None:
        """Give ``job`` the nodes of ``grid`` (it must hold none; they must be free)."""
        for n in (x for row in grid for x in row):
            if self.owner[n] is not None:
                raise RuntimeError(f"node {n} is held by {self.owner[n]}, cannot give it to {job.name}")
            self.owner[n] = job.name
        self.accrue(job)
        job.grid = [list(r) for r in grid]
        job.incarnation += 1
        job.s2 = job.s3 = False

    def release(self, job: JobRun) -> list[str]:
        self.accrue(job)
        nodes = job.nodes
        for n in nodes:
            if self.owner[n] == job.name:
                self.owner[n] = None
        job.grid = []
        return nodes

    def swap_grid(self, job: JobRun, grid: list[list[str]]) -> None:
        """Same nodes, new roles (a topology adjustment)."""
        if sorted(n for r in grid for n in r) != sorted(job.nodes):
            raise RuntimeError(f"{job.name}: a swap must keep the job's nodes")
        self.accrue(job)
        job.grid = [list(r) for r in grid]

    def spread(self, grid: list[list[str]]) -> tuple[int, float]:
        dp, pp = len(grid), len(grid[0])
        pods = [self.topology.minipod[n] for row in grid for n in row]
        dmax, _, splits = placement_spread(pods, dp, pp)
        return dmax, splits / dp

    # -- jobs: speed -------------------------------------------------------------
    def factors(self, job: JobRun, with_faults: bool = True, only: int | None = None,
                mitigated: bool = True) -> StepFactors:
        """The job's step factors now: placement, fail-slows (all, or only fail-slow ``only``), mitigations."""
        dp, pp = len(job.grid), len(job.grid[0])
        spread, split = self.spread(job.grid)
        f = StepFactors.healthy(dp, pp, spread, split)
        if not with_faults:
            return f
        for d, row in enumerate(job.grid):
            for s, node in enumerate(row):
                for idx in self.slow_on.get(node, ()):
                    if only is not None and idx != only:
                        continue
                    fs, partner = self.slows[idx]
                    if fs.cause == "computation":
                        f.compute[d, s] = max(f.compute[d, s], fs.factor)
                    elif partner is not None:
                        role = link_role(job.grid, node, partner)
                        if role == "dp":
                            f.dp_comm = max(f.dp_comm, fs.factor)
                        elif role == "pp":
                            f.pp_comm = max(f.pp_comm, fs.factor)
        model = job.cfg.model
        if not mitigated:
            return f
        if job.s3 and pp > 1:
            worst = f.compute.max(axis=0)
            share = 1.0 / worst
            f.share = share / share.sum()
        if job.s2 and dp > 1 and model.global_batch >= dp:
            base = model.stage_base()
            share = f.share if f.share is not None else np.full(pp, 1.0 / pp)
            per_replica = (base[None, :] * share[None, :] * f.compute).max(axis=1)
            plan = rebalance_microbatches(per_replica.tolist(), model.global_batch)
            f.microbatches = np.array(plan.counts, dtype=float)
        return f

    def slow_gpus(self, job: JobRun) -> dict[str, int]:
        out = {}
        for node in job.nodes:
            for idx in self.slow_on.get(node, ()):
                fs, _ = self.slows[idx]
                if fs.cause == "computation":
                    out[node] = fs.gpu
        return out

    def refresh(self, job: JobRun) -> None:
        """Recompute the job's speed (after any change to its nodes, faults or mitigations)."""
        self.accrue(job)
        if job.grid:
            model = job.cfg.model
            dp = job.dp
            job.healthy_iter_s = iteration_time(model, dp, self.factors(job, with_faults=False), self.hw)
            job.iter_s = iteration_time(model, dp, self.factors(job), self.hw)
            job.rate = model.flops_per_iteration / job.iter_s
        else:
            job.iter_s = job.healthy_iter_s = math.inf
            job.rate = 0.0
        if job.phase == "recompute":
            self._schedule_recompute_end(job)
        self._set_contrib(job)
        if job.phase in ("running", "recompute") and self._started:
            self.policy.on_level(self, job)

    def _set_contrib(self, job: JobRun) -> None:
        new = job.cfg.weight * job.rate if job.phase == "running" else 0.0
        if new != job.contrib:
            self.total_rate += new - job.contrib
            job.contrib = new
            if self.series and self.series[-1][0] == self.now:
                self.series[-1] = (self.now, self.total_rate)
            else:
                self.series.append((self.now, self.total_rate))

    def accrue(self, job: JobRun) -> None:
        dt = self.now - job.t_last
        job.t_last = self.now
        if dt <= 0:
            return
        left = job.rate_before_leaving if job.episodes else 0.0
        if job.phase in ("running", "recompute"):
            if left:
                lost_share = 1.0 - job.rate / left if job.rate < left * (1 - 1e-9) else 0.0
            else:
                lost_share = 1.0 - job.healthy_iter_s / job.iter_s if job.iter_s > job.healthy_iter_s * (1 + 1e-9) \
                    else 0.0
            self._charge_failslow(job, dt, lost_share)
        if job.phase == "running":
            work = job.rate * dt
            job.productive_s += dt
            job.useful_flops += work
            job.waf += job.cfg.weight * work
            interval = self.costs.checkpoint_interval_s
            c = job.ckpt_run_s + dt
            if c >= interval:
                job.ckpt_run_s = c % interval
                job.work_since_ckpt = job.rate * job.ckpt_run_s
            else:
                job.ckpt_run_s = c
                job.work_since_ckpt += work
        elif job.phase == "recompute":
            job.recompute_s += dt
            job.redo = max(0.0, job.redo - job.rate * dt)
        elif job.phase == "down":
            job.down_s += dt
            job.down_by[job.down_reason] = job.down_by.get(job.down_reason, 0.0) + dt
            if job.down_reason == "failslow":
                job.slow_overhead_s += dt
        else:
            job.off_s += dt
            job.down_by["off:" + job.down_reason] = job.down_by.get("off:" + job.down_reason, 0.0) + dt
            if left:  # the restart that left the straggler found no nodes for the job: all of it is lost
                self._charge_failslow(job, dt, 1.0)

    @staticmethod
    def _charge_failslow(job: JobRun, dt: float, lost_share: float) -> None:
        """``dt`` seconds of ``job`` of which ``lost_share`` went to a slowdown, and, while fail-slow episodes
        are open, what the same seconds would have lost unmitigated."""
        if lost_share > 0:
            job.slow_lost_s += dt * lost_share
            job.slow_exposed_s += dt
        if job.episodes:
            job.episode_running_s += dt
            job.episode_unmitigated_lost_s += dt * (1.0 - 1.0 / max(job.episodes.values()))

    def _enter(self, job: JobRun, phase: str, reason: str = "") -> None:
        self.accrue(job)
        job.phase = phase
        job.down_reason = reason
        job.version += 1
        self._set_contrib(job)

    # -- jobs: lifecycle -----------------------------------------------------------
    def fail(self, job: JobRun, fault: FailStop) -> None:
        """A fail-stop hits ``job``: it stops making progress until a remedy cures it."""
        self.accrue(job)
        job.faults.append(fault)
        job.open_failures.append((fault, self.now))
        if job.phase in ("running", "recompute"):
            job.pending_loss = job.work_since_ckpt
        if job.phase != "off":
            self._enter(job, "down", "failure")

    def cure(self, job: JobRun, remedy: str) -> list[FailStop]:
        """Drop the faults that ``remedy`` (retry, restart, exclude) cures; return those that remain."""
        rank = {"retry": 0, "restart": 1, "exclude": 2}
        job.faults = [f for f in job.faults if rank[f.cure] > rank[remedy]]
        return list(job.faults)

    def has_dead_node(self, job: JobRun) -> bool:
        return any(not self.usable(n) for n in job.nodes)

    def resume(self, job: JobRun, after_s: float, rollback: bool, reason: str = "restart") -> None:
        """Restart ``job`` on its nodes after ``after_s``; with ``rollback`` it redoes the work since its checkpoint."""
        if not job.grid:
            self._enter(job, "off", reason)
            return
        self._enter(job, "down", reason)
        self.at(self.now + after_s, self._resumed, job, job.version, rollback)

    def pause(self, job: JobRun, secs: float, reason: str) -> None:
        """A planned stop (a checkpoint first, so nothing is lost): the job runs again after ``secs``."""
        if job.phase in ("running", "recompute"):
            self.accrue(job)
            job.pending_loss = 0.0
            if job.phase == "running":
                job.work_since_ckpt = 0.0
                job.ckpt_run_s = 0.0
        self.resume(job, secs, rollback=False, reason=reason)

    def _resumed(self, job: JobRun, version: int, rollback: bool) -> None:
        if job.version != version:
            return
        if job.blocked or self.has_dead_node(job) or not job.grid:
            # A failure that the remedy did not cure: the job stays down (the policy heard of it).
            self._enter(job, "down" if job.grid else "off", "failure")
            return
        if rollback:
            job.redo += job.pending_loss
            job.work_since_ckpt = 0.0
            job.ckpt_run_s = 0.0
        job.pending_loss = 0.0
        if job.redo > 0:
            self._enter(job, "recompute")
            self.refresh(job)
        else:
            self._start_running(job)

    def _schedule_recompute_end(self, job: JobRun) -> None:
        job.version += 1
        if job.rate > 0:
            self.at(self.now + job.redo / job.rate, self._recomputed, job, job.version)

    def _recomputed(self, job: JobRun, version: int) -> None:
        if job.version != version:
            return
        self.accrue(job)
        job.redo = 0.0
        self._start_running(job)

    def _start_running(self, job: JobRun) -> None:
        self._enter(job, "running")
        for fault, t in job.open_failures:
            self.recoveries.setdefault(fault.label, []).append(self.now - t)
        job.open_failures = []
        self.refresh(job)

    def set_off(self, job: JobRun, reason: str) -> None:
        self._enter(job, "off", reason)

    def detected(self, fault: FailStop, latency: float | None) -> None:
        self.detections.setdefault(fault.label, []).append(math.nan if latency is None else latency)

    # -- the trace -------------------------------------------------------------------
    def inject(self, fault: FailStop) -> None:
        """A fail-stop now (the trace's, or one that comes back)."""
        self._failstop(fault)

    def _failstop(self, fault: FailStop) -> None:
        node = fault.node
        if self.status[node] == "down":
            return  # under repair already: nothing runs there
        if fault.severity == 1:
            self.status[node] = "down"
            self.repair_at[node] = self.now + fault.repair_s
            self.at(self.now + fault.repair_s, self._repaired, node)
        name = self.owner[node]
        job = self.jobs[name] if name is not None else None
        self.record("failstop", node=node, severity=fault.severity, fault=fault.label, job=name)
        if job is not None and job.phase != "off":
            self.fail(job, fault)
        self.policy.on_failstop(self, fault, job)

    def _repaired(self, node: str) -> None:
        if self.status[node] != "down":
            return
        self.status[node] = "up"
        self.repair_at.pop(node, None)
        self.record("node_repaired", node=node)
        self.policy.on_node_up(self, node)

    def _slow_start(self, idx: int, fs: FailSlowFault) -> None:
        if self.status[fs.node] == "down":
            return
        partner = None
        name = self.owner[fs.node]
        if fs.cause == "communication" and name is not None:
            grid = self.jobs[name].grid
            where = {n: (d, s) for d, row in enumerate(grid) for s, n in enumerate(row)}
            d, s = where[fs.node]
            if len(grid) > 1:
                partner = grid[(d + 1) % len(grid)][s]
            elif len(grid[0]) > 1:
                partner = grid[d][s + 1 if s + 1 < len(grid[0]) else s - 1]
        self.slows[idx] = (fs, partner)
        self.slow_on.setdefault(fs.node, []).append(idx)
        self.at(fs.end, self._slow_end, idx)
        ratio = 1.0
        if name is not None:
            job = self.jobs[name]
            ratio = iteration_time(job.cfg.model, job.dp, self.factors(job, only=idx, mitigated=False), self.hw) / \
                job.healthy_iter_s
            if ratio > 1.0 + 1e-9:
                self.accrue(job)
                job.episodes[idx] = ratio
                self.episode_jobs[idx] = name
        self.record("failslow_start", node=fs.node, cause=fs.cause, factor=round(fs.factor, 3), job=name,
                    partner=partner, job_slowdown=round(ratio, 4), duration_s=round(fs.duration_s, 1))
        self._refresh_nodes([fs.node])

    def _slow_end(self, idx: int) -> None:
        if idx not in self.slows:
            return
        fs, _ = self.slows.pop(idx)
        self.slow_on[fs.node].remove(idx)
        name = self.episode_jobs.pop(idx, None)
        if name is not None:
            job = self.jobs[name]
            self.accrue(job)
            job.episodes.pop(idx, None)
            if not job.episodes:
                job.rate_before_leaving = 0.0
        self.record("failslow_end", node=fs.node, cause=fs.cause)
        if self.status[fs.node] == "drained" and not self.slow_on[fs.node] and fs.node not in self.repair_at:
            self._undrain(fs.node)
        self._refresh_nodes([fs.node])

    def leave_stragglers(self, job: JobRun) -> None:
        """A checkpoint-restart is about to leave the job's stragglers behind: from now until its episodes end,
        its fail-slow cost is what it runs short of its healthy speed on the nodes it has now."""
        if job.episodes and job.grid and not job.rate_before_leaving:
            self.accrue(job)
            job.rate_before_leaving = job.cfg.model.flops_per_iteration / job.healthy_iter_s

    def active_slows(self, job: JobRun) -> list[tuple[FailSlowFault, str | None]]:
        return [self.slows[i] for n in job.nodes for i in self.slow_on.get(n, ())]

    def _refresh_nodes(self, nodes: list[str]) -> None:
        done = set()
        for n in nodes:
            name = self.owner.get(n)
            if name is not None and name not in done:
                done.add(name)
                self.refresh(self.jobs[name])

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        wall = time.perf_counter()
        cpu = time.process_time()
        for f in self.trace.fail_stops:
            self.at(f.t, self._failstop, f)
        for i, s in enumerate(self.trace.fail_slows):
            self.at(s.t, self._slow_start, i, s)
        if self.initial is None:
            raise ValueError("an initial placement is needed (see vigil.sim.clustersim.initial_placement)")
        for name, grid in self.initial.items():
            job = self.jobs[name]
            if grid:
                self.assign(job, grid)
                self._start_running(job)
        self.policy.setup(self)
        self._started = True
        next_report = wall + 5.0
        while self._queue and self._queue[0][0] <= self.end:
            t, _, fn, args = heapq.heappop(self._queue)
            self.now = t
            fn(*args)
            self.events_processed += 1
            if self.progress is not None and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + 5.0
                self.progress(f"{self.policy.name}: day {self.now / 86400:.1f} of {self.end / 86400:.0f}")
        self.now = self.end
        for job in self.jobs.values():
            self.accrue(job)
        extra = self.policy.finish(self)
        extra["cpu_s"] = time.process_time() - cpu
        return self._result(time.perf_counter() - wall, extra)

    def _result(self, wall_s: float, extra: dict[str, Any]) -> dict[str, Any]:
        jobs = {}
        for name, j in self.jobs.items():
            jobs[name] = {
                "weight": j.cfg.weight, "model": j.cfg.model.name, "size": j.cfg.size,
                "ettr": j.productive_s / self.end, "useful_pflops": j.useful_flops / 1e15,
                "recompute_s": j.recompute_s, "down_s": j.down_s, "off_s": j.off_s,
                "failslow_lost_s": j.slow_lost_s, "failslow_exposed_s": j.slow_exposed_s,
                "failslow_overhead_s": j.slow_overhead_s,
                "failslow_unmitigated_lost_s": j.episode_unmitigated_lost_s,
            }
        lost = sum(j.slow_lost_s + j.slow_overhead_s for j in self.jobs.values())
        episode_s = sum(j.episode_running_s + j.slow_overhead_s for j in self.jobs.values())
        unmitigated = sum(j.episode_unmitigated_lost_s for j in self.jobs.values())
        def stretch(lost_s: float) -> float | None:
            """How much longer the affected jobs took, in %; None when they made no progress at all."""
            if episode_s > lost_s:
                return 100.0 * lost_s / (episode_s - lost_s)
            return None if lost_s > 0 else 0.0

        fin = lambda xs: [x for x in xs if not math.isnan(x)]  # noqa: E731
        detection = {k: {"n": len(v), "missed": sum(math.isnan(x) for x in v),
                         "mean_s": float(np.mean(fin(v))) if fin(v) else None,
                         "p50_s": float(np.median(fin(v))) if fin(v) else None} for k, v in sorted(self.detections.items())}
        recovery = {k: {"n": len(v), "mean_s": float(np.mean(v)), "p50_s": float(np.median(v))}
                    for k, v in sorted(self.recoveries.items())}
        ettr = [j["ettr"] for j in jobs.values()]
        down_by: dict[str, float] = {}
        for j in self.jobs.values():
            for k, v in j.down_by.items():
                down_by[k] = down_by.get(k, 0.0) + v
        recompute = sum(j.recompute_s for j in self.jobs.values())
        return {
            "policy": self.policy.name,
            "accumulated_waf": sum(j.waf for j in self.jobs.values()) / 1e18,
            "accumulated_waf_unit": "weighted EFLOP (sum over jobs of weight x useful FLOPs / 1e18)",
            "ettr_mean": float(np.mean(ettr)),
            "ettr_min": float(np.min(ettr)),
            "failslow_lost_s": lost,
            "failslow_slowdown_pct": stretch(lost),
            "failslow_episode_running_s": episode_s,
            "failslow_unmitigated_lost_s": unmitigated,
            "failslow_unmitigated_slowdown_pct": stretch(unmitigated),
            "failslow_mitigated_pct": 100.0 * (1.0 - lost / unmitigated) if unmitigated > 0 else None,
            "job_hours_lost": {**{k: round(v / 3600, 2) for k, v in sorted(down_by.items())},
                               "recompute": round(recompute / 3600, 2)},
            "detection": detection,
            "recovery": recovery,
            "jobs": jobs,
            "series": self.series,
            "events": self.events_processed,
            "wall_s": wall_s,
            **extra,
        }


def log_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
