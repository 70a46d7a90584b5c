"""A cluster simulator that emits the same events as real node agents and hooks.

The simulator is pure: :meth:`ClusterSimulator.advance` takes the time up to
which to simulate and returns the events due by then, in time order. The
outer loop decides what that time is: the wall clock for a live demo
(durations are scaled down, so minutes of cluster life play in seconds), or
a simulated clock for tests.

It knows its own ground truth: every injected fault is a :class:`Fault` with
the time it took effect and the alert it should cause.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Literal

from vigil.schemas import (
    GPUS_PER_NODE, Envelope, ExceptionCategory, GpuSamples, Heartbeat, IterationStep, IterationTiming, JobState,
    NicCounters, NodeState, ProcessExit, Source, TrainingException, XidError, from_seconds,
)



@dataclass(frozen=True)
class SimJob:
    """A synchronous training job: ``dp * pp * tp`` ranks, 8 per node, in order."""

    name: str
    nodes: tuple[str, ...]
    dp: int
    pp: int
    tp: int
    iteration_s: float
    compute_fraction: float = 0.7
    jitter: float = 0.03  # relative spread of the iteration time

    def __post_init__(self) -> None:
        world = self.dp * self.pp * self.tp
        if world > len(self.nodes) * GPUS_PER_NODE:
            raise ValueError(f"job {self.name}: {world} ranks do not fit on {len(self.nodes)} nodes x {GPUS_PER_NODE} GPUs")
        if not 0 < self.compute_fraction < 1:
            raise ValueError(f"job {self.name}: compute_fraction must be in (0, 1)")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def placement(self, rank: int) -> tuple[str, int]:
        """Node and GPU of a rank."""
        return self.nodes[rank // GPUS_PER_NODE], rank % GPUS_PER_NODE

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of a rank, with tp fastest-varying (Megatron's order)."""
        tp = rank % self.tp
        pp = (rank // self.tp) % self.pp
        dp = rank // (self.tp * self.pp)
        return dp, pp, tp


FaultKind = Literal["node_loss", "hang", "xid", "process_exit", "exception", "gpu_slow", "congestion"]

#: What each injected fault should make vigil say: (alert kinds accepted, severity).
#: A slow GPU is reported by whichever GPU signal shows first (throttling, a clock
#: below its peers); both are the GPU's degradation.
EXPECTED_ALERT: dict[str, tuple[tuple[str, ...], int]] = {
    "node_loss": (("node_lost",), 1),
    "hang": (("task_hang",), 2),
    "process_exit": (("process_exit",), 2),
    "gpu_slow": (("throttle", "clock_below_peers"), 3),
    "congestion": (("congestion",), 3),
}
EXCEPTION_ALERT: dict[str, tuple[str, int]] = {
    "cuda_error": ("cuda_error", 2), "illegal_memory_access": ("illegal_memory_access", 2),
    "nccl_timeout": ("nccl_timeout", 3), "connection_reset": ("connection_reset", 3),
    "out_of_memory": ("software_error", 2), "other": ("software_error", 2),
}
XID_SEVERITY = {13: 2, 31: 2, 43: 3, 48: 1, 63: 3, 74: 1, 79: 1, 94: 2, 95: 1}


@dataclass
class Fault:
    """A scripted fault. ``at`` is seconds after the simulation's start.

    ``target`` is a node (node_loss, xid, congestion, gpu_slow) or a job (hang,
    process_exit, exception). ``rank`` picks the failing rank of a job, ``gpu``
    the GPU of a node, ``code`` the XID number, ``category`` the exception
    class, ``slowdown`` the relative slowdown of a slow GPU or link.
    ``peers_time_out`` (node_loss) makes the other ranks of the node's jobs
    raise NCCL timeouts ``peers_time_out`` seconds later.
    """

    kind: FaultKind
    target: str
    at: float
    recover_at: float | None = None
    rank: int = 0
    gpu: int = 0
    code: int = 79
    category: str = "cuda_error"
    slowdown: float = 0.5
    peers_time_out: float | None = None
    injected_at: float | None = None  # absolute time it took effect (set by the simulator)
    #: For a slowdown: when the first slowed step of the job began (the step in
    #: flight at injection still ends at its normal time). Set by the simulator.
    onset_at: float | None = None

    @property
    def expected_alert(self) -> tuple[tuple[str, ...], int]:
        if self.kind == "xid":
            return ("xid",), XID_SEVERITY.get(self.code, 2)
        if self.kind == "exception":
            kind, severity = EXCEPTION_ALERT[self.category]
            return (kind,), severity
        return EXPECTED_ALERT[self.kind]

    @property
    def expected_subject(self) -> dict[str, object]:
        """The alert's subject fields that name this fault's root cause."""
        if self.kind in ("node_loss", "xid", "gpu_slow", "congestion"):
            subject: dict[str, object] = {"node": self.target}
            if self.kind == "gpu_slow":
                subject["gpu"] = self.gpu
            return subject
        return {"job": self.target}


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    what: str = field(compare=False)
    target: str = field(compare=False)


class ClusterSimulator:
    """Heartbeats, telemetry and iterations from a cluster, with scripted faults.

    Parameters
    ----------
    nodes:
        Node names. Jobs' nodes must be among them.
    jobs:
        The jobs running from the start.
    faults:
        Scripted faults, times relative to ``start``.
    start:
        Absolute time (seconds since the epoch) of simulated time zero.
    heartbeat_interval_s:
        Agent heartbeat interval.
    telemetry_interval_s:
        Interval of GPU telemetry (one :class:`GpuSamples` per node, the GPUs in columns) and NIC
        counters per node; ``None`` sends none.
    step_batches:
        Send each job step as one columnar :class:`IterationStep` instead of
        one :class:`IterationTiming` per rank (what large jobs should do).
    node_batches:
        Send each node's heartbeat together with the GPU and NIC samples due
        by then as one message (the node-samples topic), as the node agent
        does, instead of one message per kind of sample.
    seed:
        Seed of the jitter; the same seed and the same ``advance`` times give
        the same events.
    job_states:
        Publish each job's :class:`~vigil.schemas.JobState` as a scheduler
        would: ``running`` (nodes, GPUs, dp/pp/tp) at the start, and a
        terminal state from :meth:`finish`. Without them the history knows
        jobs by their steps only (no size, no end).

    The iteration model is synchronous: each rank computes for its own time
    (a slow GPU computes longer), then the step's collectives finish when the
    slowest rank arrives plus the transfer time (a congested link makes the
    transfer longer for everyone). A rank's communication time is the rest of
    the step: the fast ranks wait, the slow one barely does.
    """

    def __init__(self, nodes: list[str], jobs: list[SimJob], faults: list[Fault], start: float,
                 heartbeat_interval_s: float = 1.0, seed: int = 0, cluster: str = "sim",
                 telemetry_interval_s: float | None = None, step_batches: bool = False,
                 node_batches: bool = False, job_states: bool = False) -> None:
        unknown = {n for j in jobs for n in j.nodes} - set(nodes)
        if unknown:
            raise ValueError(f"jobs run on unknown nodes: {sorted(unknown)}")
        job_names = {j.name for j in jobs}
        for f in faults:
            on_node = f.kind in ("node_loss", "xid", "gpu_slow", "congestion")
            if on_node and f.target not in nodes:
                raise ValueError(f"{f.kind} fault targets unknown node {f.target!r}")
            if not on_node and f.target not in job_names:
                raise ValueError(f"{f.kind} fault targets unknown job {f.target!r}")
            if f.kind in ("gpu_slow", "congestion") and telemetry_interval_s is None:
                raise ValueError(f"a {f.kind} fault needs telemetry_interval_s to show in the telemetry")
        self.nodes = list(nodes)
        self.jobs = {j.name: j for j in jobs}
        self.faults = sorted(faults, key=lambda f: f.at)
        self.start = start
        self.heartbeat_interval_s = heartbeat_interval_s
        self.telemetry_interval_s = telemetry_interval_s
        self.step_batches = step_batches
        self.node_batches = node_batches
        self.cluster = cluster
        self._rng = random.Random(seed)
        self._queue: list[_Due] = []
        self._seq = 0
        self._now = start
        self._lost_nodes: set[str] = set()
        self._hung_jobs: set[str] = set()
        self._slow_gpus: dict[tuple[str, int], float] = {}
        self._congested: dict[str, float] = {}
        self._hb_seq = {n: 0 for n in nodes}
        self._step = {j: 0 for j in self.jobs}
        self._iter_start = {j: start for j in self.jobs}
        self._plan: dict[str, tuple[float, list[float]]] = {}
        self._nic_totals = {n: {"np_cnp_sent": 0.0, "rp_cnp_handled": 0.0, "np_ecn_marked_roce_packets": 0.0,
                                "port_xmit_wait": 0.0, "link_downed": 0.0, "symbol_error": 0.0} for n in nodes}
        self._last_telemetry: dict[str, float] = {}
        self._telemetry_due: dict[str, float] = {}
        for i, node in enumerate(nodes):
            # Spread the agents' phases as real agents started at different times are.
            phase = (i / max(1, len(nodes)))
            self._push(start + phase * heartbeat_interval_s, "heartbeat", node)
            if telemetry_interval_s is not None:
                self._last_telemetry[node] = start
                if node_batches:  # sampled when a heartbeat goes out
                    self._telemetry_due[node] = start + phase * heartbeat_interval_s
                else:
                    self._push(start + phase * telemetry_interval_s + 1e-3, "telemetry", node)
        self.job_states = job_states
        self.finished_at: float | None = None
        for job in self.jobs.values():
            if job_states:  # before its first step ends, as a scheduler starts a job before it trains
                self._push(start, "job_state", job.name)
            self._schedule_iteration(job, start)
        for idx, f in enumerate(self.faults):
            self._push(start + f.at, "fault", str(idx))
            if f.recover_at is not None:
                self._push(start + f.recover_at, "recover", str(idx))
            if f.kind == "node_loss" and f.peers_time_out is not None:
                self._push(start + f.at + f.peers_time_out, "peer_timeouts", str(idx))

    @property
    def now(self) -> float:
        return self._now

    def _push(self, at: float, what: str, target: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Due(at, self._seq, what, target))

    def _schedule_iteration(self, job: SimJob, begin: float) -> None:
        """Plan the next step of ``job`` from ``begin``: per-rank compute and its end."""
        base = job.iteration_s * math.exp(self._rng.gauss(0.0, job.jitter))
        computes = []
        for rank in range(job.world_size):
            node, gpu = job.placement(rank)
            slow = 1.0 + self._slow_gpus.get((node, gpu), 0.0)
            computes.append(base * job.compute_fraction * (1 + self._rng.uniform(-0.02, 0.02)) * slow)
        congestion = max((self._congested.get(n, 0.0) for n in job.nodes), default=0.0)
        for fault in self.faults:
            if fault.onset_at is not None or fault.injected_at is None:
                continue
            slowing_gpu = fault.kind == "gpu_slow" and (fault.target, fault.gpu) in self._slow_gpus and \
                fault.target in job.nodes and fault.gpu < GPUS_PER_NODE
            slowing_link = fault.kind == "congestion" and fault.target in self._congested and fault.target in job.nodes
            if slowing_gpu or slowing_link:
                fault.onset_at = begin
        transfer = base * (1 - job.compute_fraction) * (1.0 + congestion)
        duration = max(computes) + transfer
        self._iter_start[job.name] = begin
        self._plan[job.name] = (duration, computes)
        self._push(begin + duration, "iteration", job.name)

    def _job_blocked(self, job: SimJob) -> bool:
        return job.name in self._hung_jobs or any(n in self._lost_nodes for n in job.nodes)

    def advance(self, until: float) -> list[list[Envelope]]:
        """Simulate up to ``until``; return the due events as publishable groups.

        Each group is one message's worth: a heartbeat alone (with the node's
        telemetry of one interval when ``node_batches``), every rank's record
        of one job step, or one node's GPU or NIC telemetry of one interval.
        """
        out: list[list[Envelope]] = []
        while self._queue and self._queue[0].at <= until and self.finished_at is None:
            due = heapq.heappop(self._queue)
            self._now = due.at
            if due.what == "job_state":
                out.append([self._job_state(self.jobs[due.target], "running", due.at)])
            elif due.what == "heartbeat":
                if due.target in self._lost_nodes:
                    continue
                group: list[Envelope] = [self._heartbeat(due.target, due.at)]
                if due.target in self._telemetry_due and due.at >= self._telemetry_due[due.target] - 1e-9:
                    for samples in self._telemetry(due.target, due.at):
                        group += samples
                    self._telemetry_due[due.target] = due.at + self.telemetry_interval_s  # type: ignore[operator]
                out.append(group)
                self._push(due.at + self.heartbeat_interval_s, "heartbeat", due.target)
            elif due.what == "telemetry":
                if due.target in self._lost_nodes:
                    continue
                out.extend(self._telemetry(due.target, due.at))
                self._push(due.at + self.telemetry_interval_s, "telemetry", due.target)  # type: ignore[operator]
            elif due.what == "iteration":
                job = self.jobs[due.target]
                if self._job_blocked(job):
                    continue  # a blocked job is re-armed when it recovers
                out.append(self._iteration(job, due.at))
                self._schedule_iteration(job, due.at)
            elif due.what == "fault":
                out.extend(self._inject(self.faults[int(due.target)], due.at))
            elif due.what == "recover":
                self._recover(self.faults[int(due.target)], due.at)
            elif due.what == "peer_timeouts":
                out.extend(self._peer_timeouts(self.faults[int(due.target)], due.at))
        self._now = max(self._now, until)
        return out

    def job_blocked(self, name: str) -> bool:
        """Is job ``name`` stopped (a lost node, a hang, a dead rank) as of now?"""
        return self._job_blocked(self.jobs[name])

    def finish(self, at: float) -> list[list[Envelope]]:
        """Simulate up to ``at`` and stop there: the due events, then each job's terminal state.

        A job still stopped by its fault (a lost node, a hang or a dead rank
        that never recovered) ends ``failed``, the others ``completed``: what
        a scheduler records when the allocation ends; then every node still
        up leaves cleanly (its agent stops), so the end of the run is not a
        storm of lost nodes. Only with ``job_states``; after it,
        :meth:`advance` returns nothing.
        """
        out = self.advance(at)
        self.finished_at = max(at, self._now)
        if self.job_states:
            for job in self.jobs.values():
                state = "failed" if self._job_blocked(job) else "completed"
                out.append([self._job_state(job, state, self.finished_at)])
            for node in self.nodes:
                if node not in self._lost_nodes:
                    out.append([NodeState(event_time=from_seconds(self.finished_at),
                                          source=Source(cluster=self.cluster, node=node), state="leaving",
                                          reason="the simulated cluster stopped")])
        return out

    def _job_state(self, job: SimJob, state: str, at: float) -> JobState:
        return JobState(event_time=from_seconds(at), source=Source(cluster=self.cluster, job=job.name),
                        state=state, nodes=list(job.nodes), gpus=job.world_size,  # type: ignore[arg-type]
                        dp=job.dp, pp=job.pp, tp=job.tp)

    def _inject(self, fault: Fault, at: float) -> list[list[Envelope]]:
        fault.injected_at = at
        src = Source(cluster=self.cluster)
        if fault.kind == "node_loss":
            self._lost_nodes.add(fault.target)
        elif fault.kind == "hang":
            self._hung_jobs.add(fault.target)
        elif fault.kind == "gpu_slow":
            self._slow_gpus[(fault.target, fault.gpu)] = fault.slowdown
        elif fault.kind == "congestion":
            self._congested[fault.target] = fault.slowdown
        elif fault.kind == "xid":
            bus = f"0000:{0x18 + 0x10 * fault.gpu:02x}:00"
            line = f"NVRM: Xid (PCI:{bus}): {fault.code}, pid=4242, name=python, injected by the simulator"
            return [[XidError(event_time=from_seconds(at), source=src.model_copy(update={"node": fault.target,
                              "gpu": fault.gpu}), code=fault.code, pci_bus_id=bus, pid=4242,
                              process_name="python", message="injected by the simulator", raw_line=line)]]
        elif fault.kind in ("process_exit", "exception"):
            job = self.jobs[fault.target]
            node, gpu = job.placement(fault.rank)
            self._hung_jobs.add(job.name)  # the job cannot step without the rank
            where = src.model_copy(update={"node": node, "job": job.name, "rank": fault.rank, "gpu": gpu})
            if fault.kind == "process_exit":
                return [[ProcessExit(event_time=from_seconds(at), source=where, pid=10_000 + fault.rank,
                                     signal=9, local_rank=gpu)]]
            return [[TrainingException(event_time=from_seconds(at), source=where,
                                       category=ExceptionCategory(fault.category), exc_type="RuntimeError",
                                       message=f"injected {fault.category}")]]
        return []

    def _recover(self, fault: Fault, at: float) -> None:
        if fault.kind in ("hang", "process_exit", "exception"):
            self._hung_jobs.discard(fault.target)
            job = self.jobs[fault.target]
            if not self._job_blocked(job):
                self._schedule_iteration(job, at)
        elif fault.kind == "gpu_slow":
            self._slow_gpus.pop((fault.target, fault.gpu), None)
        elif fault.kind == "congestion":
            self._congested.pop(fault.target, None)

    def _peer_timeouts(self, fault: Fault, at: float) -> list[list[Envelope]]:
        """The ranks that waited on the lost node give up with NCCL timeouts."""
        groups = []
        for job in self.jobs.values():
            if fault.target not in job.nodes:
                continue
            group = []
            for rank in range(job.world_size):
                node, gpu = job.placement(rank)
                if node == fault.target:
                    continue
                group.append(TrainingException(
                    event_time=from_seconds(at), source=Source(cluster=self.cluster, node=node, job=job.name,
                                                               rank=rank, gpu=gpu),
                    category=ExceptionCategory.nccl_timeout, exc_type="DistBackendError",
                    message="Watchdog caught collective operation timeout"))
            groups.append(group)
        return groups

    def _heartbeat(self, node: str, at: float) -> Heartbeat:
        seq = self._hb_seq[node]
        self._hb_seq[node] = seq + 1
        return Heartbeat(event_time=from_seconds(at), source=Source(cluster=self.cluster, node=node),
                         seq=seq, interval_s=self.heartbeat_interval_s)

    def _telemetry(self, node: str, at: float) -> list[list[Envelope]]:
        dt = at - self._last_telemetry[node]
        self._last_telemetry[node] = at
        when = from_seconds(at)
        clocks, temps, powers, reasons = [], [], [], []
        for gpu in range(GPUS_PER_NODE):
            slow = self._slow_gpus.get((node, gpu), 0.0)
            clock = 1980.0 * (1 + self._rng.uniform(-0.005, 0.005)) / (1 + slow)
            temps.append(round(62 + self._rng.uniform(-2, 2) + (25 if slow else 0), 1))
            clocks.append(round(clock, 1))
            powers.append(round(650 + self._rng.uniform(-20, 20), 1))
            reasons.append(0x20 if slow else 0)  # SW thermal slowdown
        n = GPUS_PER_NODE
        # the node's GPUs in one columnar event, as the node agent sends them
        gpus = [GpuSamples(
            event_time=when, source=Source(cluster=self.cluster, node=node), gpus=list(range(n)),
            utilization_pct=[97.0] * n, memory_used_bytes=[60 << 30] * n, memory_total_bytes=[80 << 30] * n,
            temperature_c=temps, sm_clock_mhz=clocks, mem_clock_mhz=[2619.0] * n, power_w=powers,
            throttle_reasons=reasons, ecc_sbe=[0] * n, ecc_dbe=[0] * n, pcie_replays=[0] * n)]
        totals = self._nic_totals[node]
        congested = node in self._congested
        for name, normal, surge in (("np_cnp_sent", 40.0, 60_000.0), ("rp_cnp_handled", 40.0, 60_000.0),
                                    ("np_ecn_marked_roce_packets", 60.0, 90_000.0),
                                    ("port_xmit_wait", 1_000.0, 2_000_000.0)):
            rate = (surge if congested else normal) * (1 + self._rng.uniform(-0.2, 0.2))
            totals[name] += rate * dt
        nic = NicCounters(event_time=when, source=Source(cluster=self.cluster, node=node), device="mlx5_0",
                          port=1, counters={k: int(v) for k, v in totals.items()}, port_state="ACTIVE")
        return [gpus, [nic]]

    def _iteration(self, job: SimJob, end: float) -> list[Envelope]:
        begin = self._iter_start[job.name]
        duration, computes = self._plan[job.name]
        step = self._step[job.name]
        self._step[job.name] = step + 1
        records: list[Envelope] = []
        start_dt, end_dt = from_seconds(begin), from_seconds(end)
        if self.step_batches:
            world = range(job.world_size)
            placement = [job.placement(r) for r in world]
            coords = [job.coordinates(r) for r in world]
            compute = [min(computes[r], duration) for r in world]
            return [IterationStep(
                event_time=end_dt, source=Source(cluster=self.cluster, job=job.name), step=step, start=start_dt,
                end=end_dt, duration_s=duration, ranks=list(world), nodes=[n for n, _ in placement],
                gpus=[g for _, g in placement], compute_s=compute, communication_s=[duration - c for c in compute],
                dp=[c[0] for c in coords], pp=[c[1] for c in coords], tp=[c[2] for c in coords])]
        for rank in range(job.world_size):
            node, gpu = job.placement(rank)
            dp, pp, tp = job.coordinates(rank)
            compute = min(computes[rank], duration)
            records.append(IterationTiming(
                event_time=end_dt, source=Source(cluster=self.cluster, node=node, job=job.name, rank=rank, gpu=gpu),
                step=step, start=start_dt, end=end_dt, duration_s=duration, compute_s=compute,
                communication_s=duration - compute, dp=dp, pp=pp, tp=tp,
            ))
        return records


def demo_scenario(start: float, seed: int = 0) -> ClusterSimulator:
    """The ``vigil demo`` cluster: 18 nodes x 8 GPUs, three jobs, four faults in ~36 s.

    - node-05 is lost at 12 s; llama-7b runs on it, stalls, and its other ranks
      give up with NCCL timeouts 1.5 s later (the node is the root cause);
    - node-12 reports XID 48 (double-bit ECC error) on GPU 3 at 16 s;
    - bert-340m hangs at 20 s and recovers at 28 s;
    - GPU 2 of node-10 slows down by 40 % at 22 s, so gpt-1b3 slows down (a
      computation fail-slow, attributed to that GPU).
    """
    nodes = [f"node-{i:02d}" for i in range(18)]
    jobs = [
        SimJob("llama-7b", tuple(nodes[0:8]), dp=4, pp=2, tp=8, iteration_s=0.5),
        SimJob("gpt-1b3", tuple(nodes[8:16]), dp=8, pp=1, tp=8, iteration_s=0.3),
        SimJob("bert-340m", tuple(nodes[16:18]), dp=2, pp=1, tp=8, iteration_s=0.25),
    ]
    faults = [
        Fault("node_loss", "node-05", at=12.0, peers_time_out=1.5),
        Fault("xid", "node-12", at=16.0, code=48, gpu=3),
        Fault("hang", "bert-340m", at=20.0, recover_at=28.0),
        Fault("gpu_slow", "node-10", at=22.0, gpu=2, slowdown=0.4),
    ]
    return ClusterSimulator(nodes, jobs, faults, start=start, heartbeat_interval_s=1.0, seed=seed, cluster="demo",
                            telemetry_interval_s=1.0, step_batches=True, node_batches=True, job_states=True)
