"""Feed a running stack with a simulated cluster: ``vigil sim``.

:class:`Feed` builds a :class:`~vigil.sim.simulator.ClusterSimulator` from a
few numbers (nodes, jobs, seed) and a small fault vocabulary, then plays it
on the wall clock into whatever publishes events (the stack's broker, through
:class:`~vigil.producers.publisher.Publisher`), reporting each fault as it is
injected.

Time. The cluster lives in *cluster seconds*: fault times, iteration times,
the agents' heartbeat interval. ``speed`` plays ``speed`` cluster seconds per
wall second by compressing the cluster's durations: a 0.5 s step becomes
0.05 s at ``speed=10`` and a fault at 30 s happens 3 s after the start. Every
event is stamped with the wall clock, so a live worker detects on it exactly
as on a real cluster (it drops events stamped far in the past or future).
The agents sample no faster than every :data:`MIN_SAMPLE_S` wall seconds, as
real ones would not: at high speed, heartbeat loss (k missed heartbeats) then
takes proportionally longer in cluster time. Steps shorter than
:data:`SHORT_STEP_S` wall seconds are close to a worker's delivery lag and
tick; :meth:`Feed.warnings` says so.

Fault vocabulary (``KIND@TIME[:TARGET][,key=value...]``; TIME like ``30s``,
``2m``, ``1.5h`` or plain seconds, in cluster time)::

    node_loss@30s:node-03                   the node stops (heartbeats, its jobs' steps)
    node_loss@30s:node-03,timeout=5s        ... and its jobs' other ranks raise NCCL timeouts 5 s later
    xid@20s:node-02,code=79,gpu=3           an XID on a GPU (79: fell off the bus)
    gpu_slow@40s:node-04,gpu=2,slowdown=0.4 a GPU computes 40 % slower (a fail-slow of its job)
    congestion@40s:node-05,slowdown=1.0     the node's link is congested (CNP surge, slower collectives)
    hang@25s:job-1,for=10s                  the job stops stepping, for 10 s (default: for good)
    process_exit@25s:job-0,rank=3           a rank dies (SIGKILL)
    exception@25s:job-0,category=cuda_error a rank raises (cuda_error, nccl_timeout, out_of_memory, ...)

``for=`` ends any fault (a node back, a GPU healthy again). Without a target,
the seed picks one (a node of a job for node faults, a job otherwise).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from vigil.schemas import GPUS_PER_NODE, Envelope
from vigil.sim.simulator import EXCEPTION_ALERT, ClusterSimulator, Fault, SimJob

__all__ = ["FAULT_KINDS", "Feed", "FeedError", "FeedInjection", "build_cluster", "parse_duration", "parse_fault"]

#: Fault kinds and whether they target a node (else a job).
FAULT_KINDS: dict[str, bool] = {
    "node_loss": True, "xid": True, "gpu_slow": True, "congestion": True,
    "hang": False, "process_exit": False, "exception": False,
}
#: The agents' sampling interval in cluster seconds (heartbeat, GPU and NIC samples), as ``vigil agent``'s default.
SAMPLE_INTERVAL_S = 1.0
#: Fastest wall-clock sampling of the simulated agents.
MIN_SAMPLE_S = 0.5
#: Wall-clock steps shorter than this come close to a worker's delivery lag and tick.
SHORT_STEP_S = 0.2
#: Iteration times of the jobs, in cluster seconds, cycled through (seeded jitter on top).
ITERATION_S = (0.5, 0.3, 0.4, 0.25, 0.6)

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "h": 3600.0}


class FeedError(ValueError):
    """A fault or cluster that cannot be built; the message says what was expected."""


def parse_duration(text: str, what: str = "time") -> float:
    """``30s``, ``2m``, ``1.5h``, ``250ms`` or plain seconds -> seconds (>= 0).

    >>> parse_duration("2m"), parse_duration("1.5"), parse_duration("250ms")
    (120.0, 1.5, 0.25)
    """
    m = _DURATION.fullmatch(text)
    if m is None:
        raise FeedError(f"{what} {text!r} is not a duration: use e.g. 30s, 2m, 1.5h or 45")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def build_cluster(n_nodes: int, n_jobs: int, seed: int = 0) -> tuple[list[str], list[SimJob]]:
    """``n_nodes`` nodes of 8 GPUs (``node-00``...) shared by ``n_jobs`` jobs (``job-0``...).

    The nodes are split as evenly as they go, in order; each job runs data
    parallel over its nodes (dp = nodes, tp = 8), with an iteration time from
    :data:`ITERATION_S` (in cluster seconds, jittered by the seed).

    >>> nodes, jobs = build_cluster(5, 2)
    >>> [(j.name, j.nodes, j.dp * j.tp) for j in jobs]
    [('job-0', ('node-00', 'node-01', 'node-02'), 24), ('job-1', ('node-03', 'node-04'), 16)]
    """
    if n_nodes < 1:
        raise FeedError(f"--nodes must be at least 1, got {n_nodes}")
    if not 1 <= n_jobs <= n_nodes:
        raise FeedError(f"--jobs must be between 1 and the number of nodes ({n_nodes}), got {n_jobs}")
    rng = random.Random(seed)
    nodes = [f"node-{i:02d}" for i in range(n_nodes)]
    jobs, first = [], 0
    for k in range(n_jobs):
        size = n_nodes // n_jobs + (1 if k < n_nodes % n_jobs else 0)
        mine = tuple(nodes[first:first + size])
        first += size
        iteration = round(ITERATION_S[k % len(ITERATION_S)] * rng.uniform(0.9, 1.1), 3)
        jobs.append(SimJob(f"job-{k}", mine, dp=len(mine), pp=1, tp=GPUS_PER_NODE, iteration_s=iteration))
    return nodes, jobs


def parse_fault(text: str, nodes: Sequence[str], jobs: Sequence[SimJob], rng: random.Random | None = None) -> Fault:
    """One ``KIND@TIME[:TARGET][,key=value...]`` (see the module docstring) -> a :class:`Fault` in cluster time.

    >>> nodes, jobs = build_cluster(4, 2)
    >>> f = parse_fault("node_loss@30s:node-03,timeout=5s", nodes, jobs)
    >>> f.kind, f.target, f.at, f.peers_time_out
    ('node_loss', 'node-03', 30.0, 5.0)
    >>> parse_fault("hang@1m:job-1,for=10s", nodes, jobs).recover_at
    70.0
    """
    rng = rng or random.Random(0)
    head, _, rest = text.strip().partition(",")
    m = re.fullmatch(r"([a-z_]+)@([^:]+)(?::(.+))?", head.strip())
    if m is None:
        raise FeedError(f"fault {text!r}: expected KIND@TIME[:TARGET][,key=value...], e.g. node_loss@30s:node-03")
    kind, when, target = m.group(1), m.group(2), m.group(3)
    if kind not in FAULT_KINDS:
        raise FeedError(f"fault {text!r}: unknown kind {kind!r}; kinds: {', '.join(FAULT_KINDS)}")
    at = parse_duration(when, f"fault {text!r}: time")
    on_node = FAULT_KINDS[kind]
    if target is None:
        if on_node:
            job = rng.choice(list(jobs))
            target = rng.choice(list(job.nodes))
        else:
            target = rng.choice(list(jobs)).name
    names = list(nodes) if on_node else [j.name for j in jobs]
    if target not in names:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise FeedError(f"fault {text!r}: {kind} targets a {'node' if on_node else 'job'}; "
                        f"{target!r} is none of {shown}")
    fault = Fault(kind, target, at=at)  # type: ignore[arg-type]
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise FeedError(f"fault {text!r}: {item!r} is not key=value")
        try:
            if key == "for":
                fault = replace(fault, recover_at=at + parse_duration(value, f"fault {text!r}: for"))
            elif key == "timeout" and kind == "node_loss":
                fault = replace(fault, peers_time_out=parse_duration(value, f"fault {text!r}: timeout"))
            elif key == "gpu" and kind in ("xid", "gpu_slow"):
                fault = replace(fault, gpu=int(value))
            elif key == "code" and kind == "xid":
                fault = replace(fault, code=int(value))
            elif key == "slowdown" and kind in ("gpu_slow", "congestion"):
                fault = replace(fault, slowdown=float(value))
            elif key == "rank" and kind in ("process_exit", "exception"):
                fault = replace(fault, rank=int(value))
            elif key == "category" and kind == "exception":
                if value not in EXCEPTION_ALERT:
                    raise FeedError(f"fault {text!r}: category {value!r} is none of {', '.join(EXCEPTION_ALERT)}")
                fault = replace(fault, category=value)
            else:
                raise FeedError(f"fault {text!r}: {kind} takes no {key!r}")
        except ValueError as exc:
            if isinstance(exc, FeedError):
                raise
            raise FeedError(f"fault {text!r}: {key}={value!r} is not a number") from None
    if fault.kind in ("xid", "gpu_slow") and not 0 <= fault.gpu < GPUS_PER_NODE:
        raise FeedError(f"fault {text!r}: gpu must be 0..{GPUS_PER_NODE - 1}")
    if fault.kind in ("process_exit", "exception"):
        world = next(j for j in jobs if j.name == fault.target).world_size
        if not 0 <= fault.rank < world:
            raise FeedError(f"fault {text!r}: rank must be 0..{world - 1}")
    if fault.kind in ("gpu_slow", "congestion") and not fault.slowdown > 0:
        raise FeedError(f"fault {text!r}: slowdown must be > 0 (0.4 = 40 % slower)")
    return fault


@dataclass(frozen=True)
class FeedInjection:
    """A fault the feed injected: what, where, when (cluster seconds and the wall clock), and what vigil should say."""

    fault: Fault
    cluster_s: float
    wall: float
    expected_kinds: tuple[str, ...]
    expected_severity: int

    def describe(self) -> str:
        f = self.fault
        what = {"xid": f"XID {f.code} on GPU {f.gpu}", "gpu_slow": f"GPU {f.gpu} {100 * f.slowdown:.0f} % slower",
                "congestion": f"link {100 * f.slowdown:.0f} % slower", "process_exit": f"rank {f.rank} killed",
                "exception": f"rank {f.rank} raises {f.category}"}.get(f.kind, "")
        until = "" if f.recover_at is None else f", for {f.recover_at - f.at:g} s"
        return (f"{f.kind} {f.target}{(' (' + what + ')') if what else ''}{until}: "
                f"expect sev{self.expected_severity} {' or '.join(self.expected_kinds)}")


class Feed:
    """A simulated cluster played on the wall clock at ``speed`` cluster seconds per second.

    Parameters
    ----------
    nodes, jobs, faults :
        The cluster and its faults, in cluster seconds (:func:`build_cluster`, :func:`parse_fault`).
    duration_s :
        Cluster seconds to play; then every job ends (completed, or failed when its fault stopped it).
    speed :
        Cluster seconds per wall second (> 0).
    seed, cluster :
        Jitter seed; the ``cluster`` name in every event's source.
    """

    def __init__(self, nodes: Sequence[str], jobs: Sequence[SimJob], faults: Sequence[Fault], duration_s: float,
                 speed: float = 1.0, seed: int = 0, cluster: str = "sim") -> None:
        if not speed > 0:
            raise FeedError(f"--speed must be > 0, got {speed}")
        if not duration_s > 0:
            raise FeedError(f"--duration must be > 0, got {duration_s}")
        late = [f for f in faults if f.at >= duration_s]
        if late:
            raise FeedError(f"fault {late[0].kind}@{late[0].at:g}s comes after the end of the run ({duration_s:g} s)")
        # in time order, as the simulator keeps them (so the two lists pair up)
        self.nodes, self.jobs, self.faults = list(nodes), list(jobs), sorted(faults, key=lambda f: f.at)
        self.duration_s, self.speed, self.seed, self.cluster = duration_s, speed, seed, cluster
        self.sample_s = max(SAMPLE_INTERVAL_S / speed, MIN_SAMPLE_S)
        self.sim: ClusterSimulator | None = None
        self.start: float | None = None
        self.injections: list[FeedInjection] = []
        self.published = 0

    def warnings(self) -> list[str]:
        out = []
        fastest = min(j.iteration_s for j in self.jobs) / self.speed
        if fastest < SHORT_STEP_S:
            out.append(f"at --speed {self.speed:g} the fastest job steps every {fastest:.3f} s of wall time: close "
                       "to a worker's delivery lag and tick, so a healthy job may be taken for hung")
        if self.sample_s > SAMPLE_INTERVAL_S / self.speed:
            out.append(f"agents sample every {self.sample_s:g} s of wall time ({self.sample_s * self.speed:g} "
                       f"cluster seconds at --speed {self.speed:g}): heartbeat loss and GPU/NIC faults take "
                       "that much longer to show in cluster time")
        return out

    def cluster_time(self, wall: float) -> float:
        assert self.start is not None
        return (wall - self.start) * self.speed

    def begin(self, now: float) -> ClusterSimulator:
        """Build the (wall-clock, compressed) simulator starting at ``now``."""
        s = self.speed
        jobs = [replace(j, iteration_s=j.iteration_s / s) for j in self.jobs]
        faults = [replace(f, at=f.at / s, recover_at=None if f.recover_at is None else f.recover_at / s,
                          peers_time_out=None if f.peers_time_out is None else f.peers_time_out / s,
                          injected_at=None, onset_at=None)
                  for f in self.faults]
        self.start = now
        self.sim = ClusterSimulator(self.nodes, jobs, faults, start=now, heartbeat_interval_s=self.sample_s,
                                    seed=self.seed, cluster=self.cluster, telemetry_interval_s=self.sample_s,
                                    step_batches=True, node_batches=True, job_states=True)
        return self.sim

    @property
    def end(self) -> float:
        assert self.start is not None
        return self.start + self.duration_s / self.speed

    def step(self, now: float, publish: Callable[[list[Envelope]], None], stop: bool = False) -> list[FeedInjection]:
        """Publish what is due by ``now``; return the faults injected since the last call.

        At the end of the run, or with ``stop`` (interrupted), the cluster
        stops there and every job's terminal state is published too.
        """
        assert self.sim is not None
        done = stop or now >= self.end
        groups = self.sim.finish(min(now, self.end)) if done else self.sim.advance(now)
        for group in groups:
            publish(group)
            self.published += len(group)
        new = []
        for cluster_fault, fault in zip(self.faults, self.sim.faults):
            if fault.injected_at is not None and all(i.fault is not cluster_fault for i in self.injections):
                kinds, severity = cluster_fault.expected_alert
                inj = FeedInjection(cluster_fault, self.cluster_time(fault.injected_at), fault.injected_at, kinds,
                                severity)
                self.injections.append(inj)
                new.append(inj)
        return new

    @property
    def finished(self) -> bool:
        return self.sim is not None and self.sim.finished_at is not None
