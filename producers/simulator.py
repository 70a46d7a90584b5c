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

from schemas import Envelope, Heartbeat, IterationTiming, Source, from_seconds

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class JobSpec:
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


FaultKind = Literal["node_loss", "hang"]

#: What each injected fault should make vigil say: (alert kind, severity).
EXPECTED_ALERT: dict[str, tuple[str, int]] = {"node_loss": ("node_lost", 1), "hang": ("task_hang", 2)}


@dataclass
class Fault:
    """A scripted fault. ``at`` is seconds after the simulation's start."""

    kind: FaultKind
    target: str  # node name for node_loss, job name for hang
    at: float
    recover_at: float | None = None  # hang only: the job makes progress again
    injected_at: float | None = None  # absolute time it took effect (set by the simulator)

    @property
    def expected_alert(self) -> tuple[str, int]:
        return EXPECTED_ALERT[self.kind]


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    what: str = field(compare=False)
    target: str = field(compare=False)


class ClusterSimulator:
    """Heartbeats from every node and iterations from every job, with faults.

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
    seed:
        Seed of the jitter; the same seed and the same ``advance`` times give
        the same events.
    batch_ranks:
        Emit a job's per-rank iteration records of one step together (the
        caller publishes them as one message).
    """

    def __init__(self, nodes: list[str], jobs: list[JobSpec], faults: list[Fault], start: float,
                 heartbeat_interval_s: float = 1.0, seed: int = 0, cluster: str = "sim") -> None:
        unknown = {n for j in jobs for n in j.nodes} - set(nodes)
        if unknown:
            raise ValueError(f"jobs run on unknown nodes: {sorted(unknown)}")
        for f in faults:
            if f.kind == "node_loss" and f.target not in nodes:
                raise ValueError(f"node_loss fault targets unknown node {f.target!r}")
            if f.kind == "hang" and f.target not in {j.name for j in jobs}:
                raise ValueError(f"hang fault targets unknown job {f.target!r}")
        self.nodes = list(nodes)
        self.jobs = {j.name: j for j in jobs}
        self.faults = sorted(faults, key=lambda f: f.at)
        self.start = start
        self.heartbeat_interval_s = heartbeat_interval_s
        self.cluster = cluster
        self._rng = random.Random(seed)
        self._queue: list[_Due] = []
        self._seq = 0
        self._now = start
        self._lost_nodes: set[str] = set()
        self._hung_jobs: set[str] = set()
        self._hb_seq = {n: 0 for n in nodes}
        self._step = {j: 0 for j in self.jobs}
        self._iter_start = {j: start for j in self.jobs}
        for i, node in enumerate(nodes):
            # Spread the agents' phases as real agents started at different times are.
            self._push(start + (i / max(1, len(nodes))) * heartbeat_interval_s, "heartbeat", node)
        for job in self.jobs.values():
            self._push(start + self._iteration_time(job), "iteration", job.name)
        for idx, f in enumerate(self.faults):
            self._push(start + f.at, "fault", str(idx))
            if f.recover_at is not None:
                self._push(start + f.recover_at, "recover", str(idx))

    @property
    def now(self) -> float:
        return self._now

    def _push(self, at: float, what: str, target: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Due(at, self._seq, what, target))

    def _iteration_time(self, job: JobSpec) -> float:
        # Log-normal jitter: iteration times are right-skewed in practice.
        return job.iteration_s * math.exp(self._rng.gauss(0.0, job.jitter))

    def _job_blocked(self, job: JobSpec) -> bool:
        return job.name in self._hung_jobs or any(n in self._lost_nodes for n in job.nodes)

    def advance(self, until: float) -> list[list[Envelope]]:
        """Simulate up to ``until``; return the due events as publishable groups.

        Each group is one message's worth: a heartbeat alone, or every rank's
        record of one job step together.
        """
        out: list[list[Envelope]] = []
        while self._queue and self._queue[0].at <= until:
            due = heapq.heappop(self._queue)
            self._now = due.at
            if due.what == "heartbeat":
                if due.target in self._lost_nodes:
                    continue
                out.append([self._heartbeat(due.target, due.at)])
                self._push(due.at + self.heartbeat_interval_s, "heartbeat", due.target)
            elif due.what == "iteration":
                job = self.jobs[due.target]
                if self._job_blocked(job):
                    continue  # a blocked job is re-armed when it recovers
                out.append(self._iteration(job, due.at))
                self._push(due.at + self._iteration_time(job), "iteration", job.name)
            elif due.what == "fault":
                self._inject(self.faults[int(due.target)], due.at)
            elif due.what == "recover":
                fault = self.faults[int(due.target)]
                self._hung_jobs.discard(fault.target)
                job = self.jobs[fault.target]
                if not self._job_blocked(job):
                    self._iter_start[job.name] = due.at
                    self._push(due.at + self._iteration_time(job), "iteration", job.name)
        self._now = max(self._now, until)
        return out

    def _inject(self, fault: Fault, at: float) -> None:
        fault.injected_at = at
        if fault.kind == "node_loss":
            self._lost_nodes.add(fault.target)
        else:
            self._hung_jobs.add(fault.target)

    def _heartbeat(self, node: str, at: float) -> Heartbeat:
        seq = self._hb_seq[node]
        self._hb_seq[node] = seq + 1
        return Heartbeat(event_time=from_seconds(at), source=Source(cluster=self.cluster, node=node),
                         seq=seq, interval_s=self.heartbeat_interval_s)

    def _iteration(self, job: JobSpec, end: float) -> list[Envelope]:
        begin = self._iter_start[job.name]
        self._iter_start[job.name] = end
        step = self._step[job.name]
        self._step[job.name] = step + 1
        duration = end - begin
        records: list[Envelope] = []
        start_dt, end_dt = from_seconds(begin), from_seconds(end)
        for rank in range(job.world_size):
            node, gpu = job.placement(rank)
            dp, pp, tp = job.coordinates(rank)
            # Synchronous training: every rank ends together; a rank that computes
            # a little longer waits a little less in the collectives.
            compute = duration * job.compute_fraction * (1 + self._rng.uniform(-0.02, 0.02))
            compute = min(compute, duration)
            records.append(IterationTiming(
                event_time=end_dt, source=Source(cluster=self.cluster, node=node, job=job.name, rank=rank, gpu=gpu),
                step=step, start=start_dt, end=end_dt, duration_s=duration, compute_s=compute,
                communication_s=duration - compute, dp=dp, pp=pp, tp=tp,
            ))
        return records


def demo_scenario(start: float, seed: int = 0) -> ClusterSimulator:
    """The ``vigil demo`` cluster: 18 nodes, two jobs, three faults in ~30 s.

    - node-05 is lost at 10 s (it runs part of llama-7b, which therefore stalls);
    - node-17, a spare, is lost at 14 s;
    - gpt-1b3 hangs at 18 s and recovers at 26 s.
    """
    nodes = [f"node-{i:02d}" for i in range(18)]
    jobs = [
        JobSpec("llama-7b", tuple(nodes[0:8]), dp=4, pp=2, tp=8, iteration_s=0.5),
        JobSpec("gpt-1b3", tuple(nodes[8:16]), dp=8, pp=1, tp=8, iteration_s=0.3),
    ]
    faults = [
        Fault("node_loss", "node-05", at=10.0),
        Fault("node_loss", "node-17", at=14.0),
        Fault("hang", "gpt-1b3", at=18.0, recover_at=26.0),
    ]
    return ClusterSimulator(nodes, jobs, faults, start=start, heartbeat_interval_s=1.0, seed=seed, cluster="demo")
