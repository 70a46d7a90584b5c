"""A large cluster's steady telemetry at real rates and sizes, with faults, as the bytes its agents send.

:class:`LoadGenerator` is the simulator's cluster (:class:`~vigil.sim.simulator.SimJob`
jobs, its synchronous step model, its :class:`~vigil.sim.simulator.Fault` ground
truth) at the scale of a real one, written straight to message bytes so that one
core can produce what tens of thousands of GPUs send:

* **nodes of 8 GPUs**; about 90 % of them run jobs, the rest idle;
* **jobs of realistic sizes and layouts**: 8 to a few thousand GPUs, many small
  ones and a few large (:data:`~vigil.sim.job_mix.JOB_SIZES`), tensor parallelism
  inside a node (tp = 8), pipeline stages growing with the size, data parallelism for
  the rest;
  each job steps every 1 to 3 s (its own mean, 3 % jitter);
* **one message per node per second** on the node-samples topic, as the node agent
  sends it: the heartbeat, a sample of each of the 8 GPUs and the NIC's counters
  (10 records);
* **one ``iteration_step`` message per job step** with every rank's timings in
  columns (one record per rank);
* each job's state (``running``; ``failed`` and ``running`` again when it is
  requeued after a fault).

Messages are formatted from templates (:mod:`vigil.sim.wire`: the same JSON that
:func:`vigil.schemas.encode` writes for the same events, checked by the tests), not
built as pydantic models: building 30,000 models a second would cost the generator
more than the worker it loads. Faults are rare and built as models.

Faults are injected at random times into random jobs and nodes while the load runs
(:data:`KINDS`), each kind spread evenly over the fault window; a planned fault
waits (1 s at a time) until a target is free. What a fault does and how it ends:

==============  =====================================================================================
``exception``   a rank of a running job raises (``cuda_error``); the job stops stepping; after
                ``remedy_s`` its scheduler marks it failed and requeues it (same nodes)
``process_exit``a rank is killed (SIGKILL); as above
``hang``        the job stops stepping; requeued ``3 x D_iter + remedy_s`` later
``xid``         XID 79 (the GPU fell off the bus) on a GPU of a node; the rank using it exits (code
                1) and its job stops, to be requeued as above; the node is broken from then on
                (nothing repairs it here): it takes no other XID or loss (the detector holds an
                XID's incident, one per node, for minutes)
``node_lost``   the node stops sending (heartbeats, samples) for ``node_down_s``; its job stops and
                is requeued once the node is back; one node at a time, ``node_loss_gap_s`` apart
                (the correlator makes many nodes silent together one ``nodes_silent`` incident); a
                node back from a loss is not lost again before it has been heard for ``node_down_s``
``fail_slow``   one GPU of a running job computes ``1 + slowdown`` times longer (its samples show a
                throttled, hot, slow GPU) for ``slow_steps`` steps; the job is then requeued
==============  =====================================================================================

A job is busy (takes no other fault) from a fault until ``warm_steps`` steps after its
requeue (:data:`WARM_STEPS`: the hang detector's warm-up and learning), and takes a fail-slow only after
``fail_slow_history`` steps since it (re)started (the change-point detector's history).

Pure like the simulator: :meth:`LoadGenerator.advance` takes the time to generate up
to and returns the messages due, in time order; the caller's clock decides what time
it is (the wall clock for a live benchmark, a simulated one for tests).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import NamedTuple

from vigil.detectors import HangDetector
from vigil.schemas import (
    GPUS_PER_NODE, ExceptionCategory, JobState, NodeState, ProcessExit, Source, TrainingException, XidError, encode,
    from_seconds,
)
from vigil.sim.job_mix import JOB_SIZES, plan_jobs
from vigil.sim.simulator import Fault, SimJob
from vigil.sim.wire import NODE_RECORDS, StepColumns, Wire

#: Steps after a (re)start before a hang can be told from a start: the hang detector's warm-up and the step
#: times it learns from (its defaults are the one home), and one more.
WARM_STEPS = HangDetector().warmup + HangDetector().min_steps + 1

__all__ = ["JOB_SIZES", "KINDS", "NODE_RECORDS", "Injection", "LoadGenerator", "Message", "plan_jobs"]

#: The fault kinds, as the benchmark names them, and the simulator's fault kind for each.
KINDS: dict[str, str] = {"exception": "exception", "process_exit": "process_exit", "xid": "xid",
                         "node_lost": "node_loss", "hang": "hang", "fail_slow": "gpu_slow"}


class Message(NamedTuple):
    """One Kafka message: the topic's event type, its key, its value and how many records it holds."""

    event_type: str
    key: bytes
    value: bytes
    records: int


@dataclass
class Injection:
    """One injected fault and what the benchmark needs to score it (the ground truth)."""

    kind: str  #: one of :data:`KINDS`
    fault: Fault  #: the simulator's record: target, rank/GPU, injected_at, onset_at (a fail-slow)
    job: str | None = None  #: the job it stops or slows (None: an idle node's loss, an XID)
    iteration_s: float | None = None  #: that job's mean step time (before the fault)
    slowed_iteration_s: float | None = None  #: a fail-slow's step time while it lasts
    ended_at: float | None = None  #: when it ended: the job requeued, the node back

    @property
    def injected_at(self) -> float:
        assert self.fault.injected_at is not None
        return self.fault.injected_at


@dataclass
class _Job:
    spec: SimJob
    columns: StepColumns
    key: bytes
    state: str = "running"  # running | stopped (a fault stopped it) | down (between failed and running)
    step: int = 0
    steps_since_start: int = 0
    busy: bool = False  #: takes no new fault
    restarts: int = 0
    epoch: int = 0  #: bumped when it stops: a step planned before is never delivered
    begin: float = 0.0  #: start of the step in flight
    duration: float = 0.0  #: its planned length
    computes: list[float] = field(default_factory=list)  #: its ranks' planned compute times
    slow: dict[int, float] = field(default_factory=dict)  #: rank -> slowdown of its GPU
    onset_of: "Injection | None" = None  #: a fail-slow whose first slowed step is not planned yet


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    what: str = field(compare=False)
    target: object = field(compare=False)


class LoadGenerator:
    """Telemetry of a ``gpus``-GPU cluster from ``start`` on, with faults (see the module docstring).

    Parameters
    ----------
    gpus : int
        Cluster size; ``gpus // 8`` nodes.
    start : float
        Absolute time (seconds since the epoch) the cluster starts at.
    seed : int
        Seed of the cluster's layout, jitter and faults.
    faults_per_kind : int
        Faults of each kind in :data:`KINDS` (0: none).
    faults_from : float
        Seconds after ``start`` the first faults may happen (warm-up).
    node_loss_gap_s : float
        Seconds between node losses (and the length of each kind's slot in the window).
    kinds : tuple of str
        The fault kinds to inject (default all).
    """

    def __init__(self, gpus: int, start: float, *, seed: int = 0, cluster: str = "load", faults_per_kind: int = 0,
                 faults_from: float = 30.0, node_loss_gap_s: float = 6.5, node_down_s: float = 6.0,
                 remedy_s: float = 8.0, slowdown: float = 0.5, slow_steps: int = 20, warm_steps: int | None = None,
                 fail_slow_history: int = 50, busy_fraction: float = 0.9, max_job_fraction: float = 1 / 16,
                 step_s: tuple[float, float] = (1.0, 3.0), kinds: tuple[str, ...] = tuple(KINDS)) -> None:
        if gpus < 2 * GPUS_PER_NODE:
            raise ValueError(f"gpus must be at least {2 * GPUS_PER_NODE}, got {gpus}")
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {sorted(KINDS)}")
        self.start = start
        self.cluster = cluster
        self.node_down_s = node_down_s
        self.remedy_s = remedy_s
        self.slowdown = slowdown
        self.slow_steps = slow_steps
        self.warm_steps = WARM_STEPS if warm_steps is None else warm_steps
        self.fail_slow_history = fail_slow_history
        self._rng = random.Random(seed)
        self.nodes = [f"node-{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
        specs = plan_jobs(self.nodes, self._rng, busy_fraction, max_job_fraction, step_s)
        self.jobs: dict[str, _Job] = {}
        self._job_of: dict[str, str] = {}
        for spec in specs:
            self.jobs[spec.name] = _Job(spec, StepColumns.of(spec), key=spec.name.encode())
            for n in spec.nodes:
                self._job_of[n] = spec.name
        #: the faults injected so far, in order (the ground truth)
        self.injections: list[Injection] = []
        self.records = 0
        self.messages = 0
        self._queue: list[_Due] = []
        self._seq = 0
        self._wire = Wire(cluster)
        self._hb_seq = [0] * len(self.nodes)
        self._down: set[int] = set()  # nodes lost right now
        self._back_at: dict[int, float] = {}  # node -> when it came back from its last loss
        self._broken: set[int] = set()  # nodes with a GPU that fell off the bus
        self._slow_gpus: dict[tuple[int, int], float] = {}  # (node index, gpu) -> slowdown
        self._nic = [[0.0, 0.0, 0.0, 0.0] for _ in self.nodes]
        self._last_sample = [start] * len(self.nodes)
        self._index = {n: i for i, n in enumerate(self.nodes)}
        self._finished = False
        for i in range(len(self.nodes)):
            self._push(start + i / len(self.nodes), "node", i)  # agents started at different moments
        for job in self.jobs.values():
            self._push(start, "state", (job.spec.name, "running", "scheduled"))
            self._plan_step(job, start)
        self._plan_faults(faults_per_kind, faults_from, node_loss_gap_s, kinds)

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def gpus(self) -> int:
        return len(self.nodes) * GPUS_PER_NODE

    def records_per_s(self) -> float:
        """Records a second in steady state: 10 per node, one per rank per step."""
        return len(self.nodes) * NODE_RECORDS + sum(j.spec.world_size / j.spec.iteration_s for j in self.jobs.values())

    def messages_per_s(self) -> float:
        return len(self.nodes) + sum(1 / j.spec.iteration_s for j in self.jobs.values())

    # -- the clock -----------------------------------------------------------------------------------
    def _push(self, at: float, what: str, target: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Due(at, self._seq, what, target))

    @property
    def next_due(self) -> float | None:
        return self._queue[0].at if self._queue else None

    def advance(self, until: float, now: float | None = None) -> list[Message]:
        """The messages due by ``until``, in time order.

        ``now`` (default ``until``) stamps events that happen when they are sent
        (an exception, an exit, an XID): a live caller passes its clock, so their
        injection time is when they left, even if the generator ran late.
        """
        out: list[Message] = []
        queue = self._queue
        while queue and queue[0].at <= until and not self._finished:
            due = heapq.heappop(queue)
            what, target = due.what, due.target
            if what == "node":
                sample = self._node(target, due.at)  # type: ignore[arg-type]
                if sample is not None:
                    out.append(sample)
            elif what == "step":
                name, epoch = target  # type: ignore[misc]
                job = self.jobs[name]
                if job.epoch == epoch and job.state == "running":
                    out.append(self._step(job, due.at))
            elif what == "fault":
                out += self._inject(target, due.at, now if now is not None else due.at)  # type: ignore[arg-type]
            elif what == "state":
                name, state, why = target  # type: ignore[misc]
                out.append(self._state(self.jobs[name], state, why, due.at))
            elif what == "node_back":
                self._down.discard(target)  # type: ignore[arg-type]
                self._back_at[target] = due.at  # type: ignore[index]
                self._hb_seq[target] = 0  # type: ignore[index]  # the agent restarted
            elif what == "gpu_ok":
                inj: Injection = target  # type: ignore[assignment]
                self._slow_gpus.pop((self._index[inj.fault.target], inj.fault.gpu), None)
                job = self.jobs[inj.job]  # type: ignore[index]
                job.slow.clear()
                self._stop(job)
                self._requeue(job, due.at, f"fail-slow of GPU {inj.fault.gpu} on {inj.fault.target}", inj)
        for m in out:
            self.records += m.records
        self.messages += len(out)
        return out

    def finish(self, at: float) -> list[Message]:
        """Stop at ``at``: every job completes and every node leaves cleanly (no storm of lost nodes)."""
        out = self.advance(at)
        self._finished = True
        for job in self.jobs.values():
            ev = JobState(event_time=from_seconds(at), source=Source(cluster=self.cluster, job=job.spec.name),
                          state="completed", reason="the load generator stopped", nodes=list(job.spec.nodes),
                          gpus=job.spec.world_size, dp=job.spec.dp, pp=job.spec.pp, tp=job.spec.tp)
            out.append(Message("job_state", job.key, encode(ev), 1))
        for node in self.nodes:
            ev = NodeState(event_time=from_seconds(at), source=Source(cluster=self.cluster, node=node),
                           state="leaving", reason="the load generator stopped")
            out.append(Message("node_state", node.encode(), encode(ev), 1))
        return out

    # -- telemetry -----------------------------------------------------------------------------------
    def _node(self, i: int, at: float) -> Message | None:
        self._push(at + 1.0, "node", i)
        if i in self._down:
            return None
        node = self.nodes[i]
        rnd = self._rng.random
        seq = self._hb_seq[i]
        self._hb_seq[i] = seq + 1
        busy = node in self._job_of
        gpus = []
        for g in range(GPUS_PER_NODE):
            slow = self._slow_gpus.get((i, g), 0.0)
            if busy:  # a throttled (slowed) GPU runs a lower clock, hotter
                clock = 1980.0 * (1 + 0.01 * (rnd() - 0.5)) / (1 + slow)
                temp, power = 62 + 4 * (rnd() - 0.5) + (25 if slow else 0), 650 + 40 * (rnd() - 0.5)
            else:  # an idle GPU: low clock, cool, little power
                clock = 210.0 + 10 * (rnd() - 0.5)
                temp, power = 34 + 4 * (rnd() - 0.5), 60 + 10 * (rnd() - 0.5)
            gpus.append((busy, clock, temp, power, 0x20 if slow else 0))
        dt = at - self._last_sample[i]
        self._last_sample[i] = at
        nic = self._nic[i]
        for k, rate in enumerate((40.0, 40.0, 60.0, 1000.0)):  # CNP sent/handled, ECN marked, xmit wait
            nic[k] += rate * (0.8 + 0.4 * rnd()) * dt
        return Message("node_samples", node.encode(), self._wire.node(node, at, seq, gpus, nic), NODE_RECORDS)

    def _plan_step(self, job: _Job, begin: float) -> None:
        """The job's next step from ``begin`` (the simulator's model): each rank computes for the step's
        compute time (0-4 % apart; a slowed GPU's rank ``1 + slowdown`` times longer), then the
        collectives end when the slowest arrives, plus the transfer."""
        spec = job.spec
        base = spec.iteration_s * math.exp(self._rng.gauss(0.0, spec.jitter))
        compute = base * spec.compute_fraction
        rnd = self._rng.random
        computes = [compute * (0.98 + 0.04 * rnd()) for _ in range(spec.world_size)]
        for rank, slow in job.slow.items():
            computes[rank] *= 1 + slow
        if job.onset_of is not None:  # the first step planned since its GPU slowed: the fail-slow's onset
            job.onset_of.fault.onset_at = begin
            job.onset_of = None
        job.begin = begin
        job.computes = computes
        job.duration = max(computes) + base * (1 - spec.compute_fraction)
        self._push(begin + job.duration, "step", (spec.name, job.epoch))

    def _step(self, job: _Job, end: float) -> Message:
        spec = job.spec
        begin, duration, computes = job.begin, job.duration, job.computes
        comm = [duration - c for c in computes]
        step = job.step
        job.step += 1
        job.steps_since_start += 1
        if job.busy and job.state == "running" and job.steps_since_start >= self.warm_steps and not job.slow:
            job.busy = False
        self._plan_step(job, end)
        value = self._wire.step(spec.name, step, begin, end, duration, job.columns, computes, comm)
        return Message("iteration_step", job.key, value, spec.world_size)

    def _state(self, job: _Job, state: str, why: str, at: float) -> Message:
        spec = job.spec
        if state == "running":
            job.state = "running"
            job.steps_since_start = 0
            if at > self.start:  # a requeue: it starts stepping shortly after
                job.restarts += 1
                self._plan_step(job, at + 1.0)
        else:
            job.state = "down"
        ev = JobState(event_time=from_seconds(at), source=Source(cluster=self.cluster, job=spec.name), state=state,
                      reason=why, nodes=list(spec.nodes), gpus=spec.world_size, dp=spec.dp, pp=spec.pp, tp=spec.tp,
                      restart_count=job.restarts)  # type: ignore[arg-type]
        return Message("job_state", job.key, encode(ev), 1)

    # -- faults ----------------------------------------------------------------------------------------
    def _plan_faults(self, n: int, first: float, gap: float, kinds: tuple[str, ...]) -> None:
        """Each kind's ``n`` faults, one per ``gap``-long slot of the window at a random moment of it;
        node losses at the start of their slot (so two are never closer than ``gap`` - 0.5 s)."""
        for kind in kinds:
            for k in range(n):
                offset = 0.5 * self._rng.random() if kind == "node_lost" else gap * self._rng.random()
                self._push(self.start + first + k * gap + offset, "fault", kind)

    def _stop(self, job: _Job) -> None:
        job.state = "stopped"
        job.epoch += 1

    def _requeue(self, job: _Job, at: float, why: str, inj: Injection) -> None:
        """The scheduler marks the job failed at ``at`` and starts it again (same nodes) a second later."""
        inj.ended_at = at
        self._push(at, "state", (job.spec.name, "failed", why))
        self._push(at + 1.0, "state", (job.spec.name, "running", f"requeued after: {why}"))

    def _free_jobs(self, min_steps: int) -> list[_Job]:
        return [j for j in self.jobs.values() if j.state == "running" and not j.busy
                and j.steps_since_start >= min_steps and not any(self._index[n] in self._down for n in j.spec.nodes)]

    def _inject(self, kind: str, at: float, sent: float) -> list[Message]:
        rng = self._rng
        out: list[Message] = []
        if kind in ("exception", "process_exit", "hang", "fail_slow"):
            free = self._free_jobs(self.fail_slow_history if kind == "fail_slow" else self.warm_steps)
            if not free:
                self._push(at + 1.0, "fault", kind)  # no job free: try again in a second
                return out
            job = rng.choice(free)
            spec = job.spec
            rank = rng.randrange(spec.world_size)
            node, gpu = spec.placement(rank)
            fault = Fault(KINDS[kind], spec.name if kind != "fail_slow" else node, at - self.start, rank=rank, gpu=gpu,
                          slowdown=self.slowdown)
            inj = Injection(kind, fault, job=spec.name, iteration_s=spec.iteration_s)
            job.busy = True
            if kind == "fail_slow":
                fault.injected_at = at
                # the step in flight ends at its planned time; the next one is the first slowed (its start: the onset)
                job.slow[rank] = self.slowdown
                self._slow_gpus[(self._index[node], gpu)] = self.slowdown
                slowed = spec.iteration_s * (1 + spec.compute_fraction * self.slowdown)
                inj.slowed_iteration_s = slowed
                self._push(at + spec.iteration_s * 1.5 + self.slow_steps * slowed, "gpu_ok", inj)
                job.onset_of = inj
            else:
                fault.injected_at = sent if kind != "hang" else at
                self._stop(job)
                src = Source(cluster=self.cluster, node=node, job=spec.name, rank=rank, gpu=gpu)
                if kind == "exception":
                    ev = TrainingException(event_time=from_seconds(sent), source=src,
                                           category=ExceptionCategory.cuda_error, exc_type="RuntimeError",
                                           message="CUDA error: an illegal instruction was encountered (injected)")
                    out.append(Message("training_exception", job.key, encode(ev), 1))
                elif kind == "process_exit":
                    ev2 = ProcessExit(event_time=from_seconds(sent), source=src, pid=10_000 + rank, signal=9,
                                      local_rank=gpu)
                    out.append(Message("process_exit", node.encode(), encode(ev2), 1))
                wait = self.remedy_s + (3 * spec.iteration_s if kind == "hang" else 0.0)
                self._requeue(job, at + wait, f"{kind} injected at rank {rank}", inj)
            self.injections.append(inj)
            return out
        if kind == "node_lost":
            # one node down at a time, in a job free to stop (or idle)
            if self._down:
                self._push(at + 1.0, "fault", kind)
                return out
            free_jobs = {j.spec.name for j in self._free_jobs(self.warm_steps)}
            candidates = [i for i, n in enumerate(self.nodes)
                          if (self._job_of.get(n) is None or self._job_of[n] in free_jobs) and i not in self._broken
                          and at - self._back_at.get(i, -math.inf) >= self.node_down_s]
            if not candidates:
                self._push(at + 1.0, "fault", kind)
                return out
            i = rng.choice(candidates)
            node = self.nodes[i]
            fault = Fault("node_loss", node, at - self.start, injected_at=at)
            name = self._job_of.get(node)
            inj = Injection(kind, fault, job=name, iteration_s=self.jobs[name].spec.iteration_s if name else None)
            self._down.add(i)
            back = at + self.node_down_s
            self._push(back, "node_back", i)
            if name is not None:
                job = self.jobs[name]
                job.busy = True
                self._stop(job)
                self._requeue(job, back + 0.5, f"node {node} was lost", inj)
            else:
                inj.ended_at = back
            self.injections.append(inj)
            return out
        if kind == "xid":
            # a node of a job free to stop (running, past its warm-up) or an idle one, never a broken one
            free_jobs = {j.spec.name for j in self._free_jobs(self.warm_steps)}
            candidates = [i for i, n in enumerate(self.nodes) if i not in self._down and i not in self._broken
                          and (self._job_of.get(n) is None or self._job_of[n] in free_jobs)]
            if not candidates:
                self._push(at + 1.0, "fault", kind)
                return out
            i = rng.choice(candidates)
            node, gpu = self.nodes[i], rng.randrange(GPUS_PER_NODE)
            self._broken.add(i)
            fault = Fault("xid", node, at - self.start, gpu=gpu, code=79, injected_at=sent)
            bus = f"0000:{0x18 + 0x10 * gpu:02x}:00"
            name = self._job_of.get(node)
            ev3 = XidError(event_time=from_seconds(sent), source=Source(cluster=self.cluster, node=node, gpu=gpu),
                           code=79, pci_bus_id=bus, pid=4242, process_name="python",
                           message="GPU has fallen off the bus (injected)",
                           raw_line=f"NVRM: Xid (PCI:{bus}): 79, pid=4242, name=python, GPU has fallen off the bus")
            out.append(Message("xid", node.encode(), encode(ev3), 1))
            inj = Injection(kind, fault, job=name, ended_at=sent)
            if name is not None:  # the rank on that GPU dies with it, and the job stops until requeued
                job = self.jobs[name]
                rank = job.spec.nodes.index(node) * GPUS_PER_NODE + gpu
                fault.rank = rank
                inj.iteration_s = job.spec.iteration_s
                job.busy = True
                self._stop(job)
                ev4 = ProcessExit(event_time=from_seconds(sent), source=Source(
                    cluster=self.cluster, node=node, job=name, rank=rank, gpu=gpu), pid=4242, exit_code=1, local_rank=gpu)
                out.append(Message("process_exit", node.encode(), encode(ev4), 1))
                self._requeue(job, at + self.remedy_s, f"xid 79 on {node} GPU {gpu}", inj)
            self.injections.append(inj)
            return out
        raise ValueError(f"unknown fault kind {kind!r}")

