"""The detection engine: telemetry in, findings out, no Kafka.

Per job (timings are keyed by job): hang, BOCD + verification on the job's
iteration-time series, straggler localization over each step's per-rank
records, and the iteration period from collective calls for jobs that send
no iteration events. Per node (node data is keyed by node): heartbeat loss,
XID classes, NIC congestion and link flaps, GPU degradation, process exits
and training exceptions.

Each detector's current findings are diffed against what was last reported,
so the engine emits a ``raised`` finding when a condition begins and a
``cleared`` one when it ends. Events that are failures in themselves
(a process exit, an exception) are raised once and never cleared; the
correlator expires them. The faust worker (``vigil.streams.worker``) feeds the
engine and ticks it; tests and replays drive it directly on simulated time.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from vigil.detectors import Detector, Finding, HangDetector, HeartbeatLoss
from vigil.detectors.gpu import GpuDegradation
from vigil.detectors.nic import NicCongestion
from vigil.detectors.period import IterationPeriod
from vigil.detectors.straggler import StragglerLocalizer
from vigil.detectors.verification import BOCDVerify
from vigil.detectors.xid import XidDetector
from vigil.schemas import (
    CollectiveCall, DetectorFinding, Envelope, GpuTelemetry, Heartbeat, IterationStep, IterationTiming, NicCounters,
    ProcessExit, Source, Subject, TrainingException, XidError, from_seconds, to_seconds,
)
from vigil.streams.engine.incidents import subject_key

_FINDING_NS = uuid.UUID("9d1f4f0e-7c1b-4a57-8a3e-2b7f7a1c5e33")

#: Unicron's severity table for training exceptions: (finding kind, severity).
EXCEPTION_KINDS: dict[str, tuple[str, int]] = {
    "cuda_error": ("cuda_error", 2),
    "illegal_memory_access": ("illegal_memory_access", 2),
    "out_of_memory": ("software_error", 2),
    "other": ("software_error", 2),
    "nccl_timeout": ("nccl_timeout", 3),
    "connection_reset": ("connection_reset", 3),
    "connection_refused": ("connection_refused", 3),
    "nccl_error": ("network_error", 3),
}

#: Kinds of findings that are single events: raised once, expired by the correlator.
TRANSIENT_KINDS = {"process_exit", *(k for k, _ in EXCEPTION_KINDS.values())}


@dataclass(frozen=True)
class EngineParams:
    hang_k: float = 3.0
    hang_warmup: int = 5
    #: Floor of the hang timeout: transport jitter (batching, a loaded node) must not look like a hang
    #: when iterations are far shorter than a second.
    hang_min_timeout_s: float = 0.0
    #: How often the windows of the sample-driven node detectors (XID, NIC, GPU) are aged.
    window_tick_s: float = 1.0
    #: Hearing nothing at all (no data, no broker answer) for this long means the worker, not the
    #: cluster, went deaf: silences then count from when it hears again.
    deaf_after_s: float = 2.0
    heartbeat_missed_intervals: float = 2.5
    #: Events older than this (against the worker's clock) do not start tracking a
    #: subject: a new consumer group reading an old log must not report every node
    #: that left the cluster long ago as lost.
    max_event_age_s: float = 300.0
    #: Events stamped further ahead of the worker's clock than this are refused
    #: (a node with a broken clock must not hold a subject "alive" for hours).
    max_future_s: float = 60.0
    #: Detector plugins (see :mod:`vigil.streams.plugins`): fed the events they consume.
    plugins: tuple[type[Detector], ...] = ()


@dataclass
class _JobState:
    hang: HangDetector
    failslow: BOCDVerify
    straggler: StragglerLocalizer
    period: IterationPeriod
    nodes: set[str] = field(default_factory=set)
    last_step: tuple[int, float] | None = None
    step_records: list[IterationTiming] = field(default_factory=list)
    # per step: (end, max compute over ranks, min communication over ranks)
    split: list[tuple[float, float, float]] = field(default_factory=list)
    cluster: str = "default"
    last_arrival: float = float("-inf")
    steps_closed: int = 0


@dataclass
class _NodeState:
    heartbeat: HeartbeatLoss | None = None
    xid: XidDetector | None = None
    nic: NicCongestion | None = None
    gpu: GpuDegradation | None = None
    cluster: str = "default"
    last_arrival: float = float("-inf")


class DetectionEngine:
    """All detectors of the jobs and nodes this worker owns."""

    def __init__(self, params: EngineParams = EngineParams()) -> None:
        self.params = params
        self._windows_ticked_at: float | None = None
        # The feed's own pulse: when the worker last heard anything, and when it heard again
        # after hearing nothing for deaf_after_s (its broker or its link was down, or it was
        # rebalancing: that silence was the worker's, not the cluster's).
        self._last_heard = float("-inf")
        self._feed_back_at = float("-inf")
        self.jobs: dict[str, _JobState] = {}
        self.nodes: dict[str, _NodeState] = {}
        # (owner, detector name) -> {finding key: DetectorFinding} currently raised
        self._reported: dict[tuple[str, str], dict[str, DetectorFinding]] = {}
        # plugin instances: (plugin name, "job"|"node", key) -> detector
        self.plugin_instances: dict[tuple[str, str, str], Detector] = {}
        # Recently seen event ids: a duplicated event is processed once.
        self._seen_ids: OrderedDict[uuid.UUID, None] = OrderedDict()
        self._plugins_for: dict[str, list[type[Detector]]] = {}
        for cls in params.plugins:
            for event_type in cls.consumes:  # type: ignore[attr-defined]
                self._plugins_for.setdefault(event_type, []).append(cls)

    # -- inputs ------------------------------------------------------------
    def future(self, event: Envelope, now: float) -> bool:
        """Is the event stamped implausibly far ahead of ``now``? (The caller dead-letters it.)"""
        return to_seconds(event.event_time) > now + self.params.max_future_s

    def heard(self, now: float) -> None:
        """Data, or the broker's answer, reached the worker at ``now``.

        The worker calls it for its broker contact too: one whose partitions
        carry few subjects may hear no data while they are all silent, and
        its broker contact says the silence is theirs (counted only while it
        consumes, not during a rebalance). After hearing nothing for
        ``deaf_after_s`` the worker was deaf: its subjects' silences count
        from now.
        """
        if now - self._last_heard > self.params.deaf_after_s and self._last_heard > float("-inf"):
            self._feed_back_at = now
        self._last_heard = max(self._last_heard, now)

    def resumed(self, now: float) -> None:
        """The worker consumes again (after a rebalance): its subjects' silences count from ``now``."""
        self._feed_back_at = max(self._feed_back_at, now)
        self._last_heard = max(self._last_heard, now)

    def _silent(self, last_arrival: float, timeout_s: float, now: float, alone: bool) -> bool:
        """Has this subject been silent past its timeout, as far as the worker can tell?

        Only once the worker has heard something (data, or its broker) after
        the subject's timeout ran out: a worker that cannot hear (its broker is
        down) does not yet know it, so its own recent silence is no evidence.
        Unless it tracks this subject alone (then it cannot tell), and not
        counting the time before its feed came back.
        """
        since = max(last_arrival, self._feed_back_at)
        if now - since <= timeout_s:
            return False
        return alone or self._last_heard - since > timeout_s

    def on_events(self, events: Iterable[Envelope], now: float) -> list[DetectorFinding]:
        """Feed one message's events; return the findings they raise or clear.

        Duplicated event ids and events from the future are skipped here.
        """
        events = events if isinstance(events, list) else list(events)
        if events:
            self.heard(now)
        out: list[DetectorFinding] = []
        gpu_samples: dict[str, list[GpuTelemetry]] = {}
        for event in events:
            if event.event_id in self._seen_ids or self.future(event, now):
                continue
            self._seen_ids[event.event_id] = None
            if len(self._seen_ids) > 200_000:
                self._seen_ids.popitem(last=False)
            if self._plugins_for:
                out += self._on_plugins(event, now)
            if isinstance(event, GpuTelemetry):
                if event.source.node:
                    gpu_samples.setdefault(event.source.node, []).append(event)
            else:
                out += self.on_event(event, now)
        for node, samples in gpu_samples.items():
            out += self._on_gpu(node, samples, now)
        return out

    def _on_plugins(self, event: Envelope, now: float) -> list[DetectorFinding]:
        out: list[DetectorFinding] = []
        for cls in self._plugins_for.get(event.event_type, ()):  # type: ignore[attr-defined]
            per = cls.per  # type: ignore[attr-defined]
            key = getattr(event.source, per)
            if key is None:
                continue
            det = self.plugin_instances.get((cls.name, per, key))
            if det is None:
                det = self.plugin_instances[(cls.name, per, key)] = cls()
            det.update(event, t=to_seconds(event.event_time))
            out += self._diff_plugin(per, key, det, event.source.cluster, now)
        return out

    def _diff_plugin(self, per: str, key: str, det: Detector, cluster: str, now: float) -> list[DetectorFinding]:
        if per == "node":
            self._node(key, cluster)
            return self._diff_node(key, det, now)
        return self._diff_job(key, self._job(key, cluster), det, now)

    def on_event(self, event: Envelope, now: float) -> list[DetectorFinding]:
        if isinstance(event, Heartbeat):
            return self._on_heartbeat(event, now)
        if isinstance(event, IterationStep):
            return self._on_step(event, now)
        if isinstance(event, IterationTiming):
            return self._on_iteration(event, now)
        if isinstance(event, CollectiveCall):
            return self._on_collective(event, now)
        if isinstance(event, XidError):
            return self._on_xid(event, now)
        if isinstance(event, NicCounters):
            return self._on_nic(event, now)
        if isinstance(event, GpuTelemetry) and event.source.node:
            return self._on_gpu(event.source.node, [event], now)
        if isinstance(event, ProcessExit):
            return self._on_exit(event)
        if isinstance(event, TrainingException):
            return self._on_exception(event)
        return []

    def _stale(self, event_time: float, now: float) -> bool:
        return now - event_time > self.params.max_event_age_s

    def _node(self, node: str, cluster: str) -> _NodeState:
        state = self.nodes.get(node)
        if state is None:
            state = self.nodes[node] = _NodeState(cluster=cluster)
        return state

    def _on_heartbeat(self, hb: Heartbeat, now: float) -> list[DetectorFinding]:
        node = hb.source.node
        if node is None:
            return []
        t = to_seconds(hb.event_time)
        state = self.nodes.get(node)
        if state is None or state.heartbeat is None:
            if self._stale(t, now):
                return []
            state = self._node(node, hb.source.cluster)
            state.heartbeat = HeartbeatLoss(missed_intervals=self.params.heartbeat_missed_intervals,
                                            interval_s=hb.interval_s)
        state.last_arrival = now
        state.heartbeat.update(t=t, interval_s=hb.interval_s, seq=hb.seq)
        return self._diff_node(node, state.heartbeat, now)

    def _on_xid(self, ev: XidError, now: float) -> list[DetectorFinding]:
        node = ev.source.node
        if node is None:
            return []
        state = self._node(node, ev.source.cluster)
        if state.xid is None:
            state.xid = XidDetector(node=node)
        gpu: str | int | None = ev.pci_bus_id if ev.pci_bus_id else ev.source.gpu
        state.xid.update(ev.code, gpu, t=to_seconds(ev.event_time), message=ev.message)
        return self._diff_node(node, state.xid, now)

    def _on_nic(self, ev: NicCounters, now: float) -> list[DetectorFinding]:
        node = ev.source.node
        if node is None:
            return []
        state = self._node(node, ev.source.cluster)
        if state.nic is None:
            state.nic = NicCongestion(node=node)
        state.nic.update(ev.counters, t=to_seconds(ev.event_time), port=f"{ev.device}:{ev.port}")
        return self._diff_node(node, state.nic, now)

    def _on_gpu(self, node: str, samples: list[GpuTelemetry], now: float) -> list[DetectorFinding]:
        state = self._node(node, samples[0].source.cluster)
        if state.gpu is None:
            state.gpu = GpuDegradation(node=node)
        readings: dict[Any, dict[str, Any]] = {}
        for s in samples:
            if s.source.gpu is None:
                continue
            readings[s.source.gpu] = {
                k: v for k, v in (("sm_clock", s.sm_clock_mhz), ("temperature", s.temperature_c),
                                  ("power", s.power_w), ("utilization", s.utilization_pct),
                                  ("throttle_reasons", s.throttle_reasons), ("ecc_sbe", s.ecc_sbe),
                                  ("ecc_dbe", s.ecc_dbe)) if v is not None
            }
            if s.nvlink_errors:
                readings[s.source.gpu]["nvlink_errors"] = sum(s.nvlink_errors.values())
        if readings:
            state.gpu.update(readings, t=max(to_seconds(s.event_time) for s in samples))
        return self._diff_node(node, state.gpu, now)

    def _on_exit(self, ev: ProcessExit) -> list[DetectorFinding]:
        if ev.signal is None and ev.exit_code == 0:
            return []  # a clean exit is the end of a job, not a failure
        subject = Subject(job=ev.source.job, node=ev.source.node, rank=ev.source.rank)
        evidence = {"pid": ev.pid, "exit_code": ev.exit_code, "signal": ev.signal, "local_rank": ev.local_rank}
        return [self._finding("raised", "process_exit", 2, subject, to_seconds(ev.event_time), "process_exit", "1",
                              evidence, ev.source.cluster, self._job_nodes(ev.source.job))]

    def _on_exception(self, ev: TrainingException) -> list[DetectorFinding]:
        kind, severity = EXCEPTION_KINDS[ev.category.value]
        subject = Subject(job=ev.source.job, node=ev.source.node, rank=ev.source.rank)
        evidence = {"category": ev.category.value, "exc_type": ev.exc_type, "message": ev.message[:500]}
        return [self._finding("raised", kind, severity, subject, to_seconds(ev.event_time), "exception_classifier",
                              "1", evidence, ev.source.cluster, self._job_nodes(ev.source.job))]

    def _job_nodes(self, job: str | None) -> list[str]:
        state = self.jobs.get(job) if job else None
        return sorted(state.nodes) if state else []

    def _job(self, job: str, cluster: str) -> _JobState:
        state = self.jobs.get(job)
        if state is None:
            state = self.jobs[job] = _JobState(
                hang=HangDetector(k=self.params.hang_k, warmup=self.params.hang_warmup,
                                  min_timeout_s=self.params.hang_min_timeout_s),
                failslow=BOCDVerify(), straggler=StragglerLocalizer(), period=IterationPeriod(), cluster=cluster)
        return state

    def _on_iteration(self, it: IterationTiming, now: float) -> list[DetectorFinding]:
        """One rank's record of a step; the step is localized once a later one begins."""
        job = it.source.job
        if job is None:
            return []
        state = self._job_for(job, it.source.cluster, to_seconds(it.end), now)
        if state is None:
            return []
        if it.source.node:
            state.nodes.add(it.source.node)
        if state.last_step is not None and it.step == state.last_step[0]:
            state.step_records.append(it)
            return []
        closing = state.step_records
        out = self._progress(job, state, it.step, to_seconds(it.end), it.duration_s, now)
        if out is None:
            return []
        state.step_records = [it]
        ranks = [r for r in closing if r.compute_s is not None and r.communication_s is not None]
        if ranks:
            out += self._localize(
                job, state, to_seconds(ranks[0].end),
                [r.source.rank if r.source.rank is not None else i for i, r in enumerate(ranks)],
                [r.compute_s for r in ranks], [r.communication_s for r in ranks],  # type: ignore[misc]
                [r.dp or 0 for r in ranks], [r.pp or 0 for r in ranks], [r.tp or 0 for r in ranks],
                {r.source.rank: (r.source.node, r.source.gpu) for r in ranks}, now)
        return out

    def _on_step(self, st: IterationStep, now: float) -> list[DetectorFinding]:
        """A whole step in columns: progress and localization at once."""
        job = st.source.job
        if job is None:
            return []
        end = to_seconds(st.end)
        state = self._job_for(job, st.source.cluster, end, now)
        if state is None:
            return []
        state.nodes.update(st.nodes)
        out = self._progress(job, state, st.step, end, st.duration_s, now)
        if out is None:
            return []
        where = lambda: {r: (n, g) for r, n, g in zip(st.ranks, st.nodes, st.gpus)}
        return out + self._localize(job, state, end, st.ranks, st.compute_s, st.communication_s, st.dp, st.pp,
                                    st.tp, where, now)

    def _job_for(self, job: str, cluster: str, end: float, now: float) -> _JobState | None:
        state = self.jobs.get(job)
        if state is None and self._stale(end, now):
            return None
        state = self._job(job, cluster)
        state.last_arrival = now
        return state

    def _progress(self, job: str, state: _JobState, step: int, end: float, duration: float,
                  now: float) -> list[DetectorFinding] | None:
        """A new step ended: feed hang and fail-slow. None when it is not new.

        The job progressed when another step ends later than the last one did.
        Step numbers may go back (a restart from a checkpoint); old events
        (redelivered, late ranks) end earlier.
        """
        last = state.last_step
        if last is not None and (step == last[0] or end <= last[1]):
            return None
        state.last_step = (step, end)
        if duration > 0:
            state.hang.update(duration, t=end)
            state.failslow.update(duration, t=end)
        out = self._diff_job(job, state, state.hang, now)
        out += self._diff_job(job, state, state.failslow, now,
                              enrich=lambda f, e: self._failslow_class(state, f, e))
        return out

    def _localize(self, job: str, state: _JobState, end: float, ranks: list[int], compute: list[float],
                  comm: list[float], dp: list[int], pp: list[int], tp: list[int],
                  where: Any, now: float) -> list[DetectorFinding]:
        """Record the step's compute/communication split; localize the straggler when it pays."""
        state.split.append((end, max(compute), min(comm)))
        del state.split[:-512]
        # Localizing costs far more than detecting: do it on every step while the
        # job is slow, and on every 16th otherwise (persistent stragglers).
        state.steps_closed += 1
        if state.failslow.finding is None and state.straggler.finding is None and state.steps_closed % 16:
            return []
        per_rank = [{"rank": r, "dp": d, "pp": p, "tp": t, "compute": c, "comm": m}
                    for r, c, m, d, p, t in zip(ranks, compute, comm, dp, pp, tp)]
        state.straggler.update(per_rank, t=end)
        placement = where() if callable(where) else where

        def enrich(finding: Finding, evidence: dict) -> None:
            loc = finding.evidence.get("location")
            if isinstance(loc, (list, tuple)) and len(loc) == 2 and loc[0] == "rank" and loc[1] in placement:
                evidence["node"], evidence["gpu"] = placement[loc[1]]
        return self._diff_job(job, state, state.straggler, now, enrich=enrich)

    @staticmethod
    def _failslow_class(state: _JobState, finding: Finding, evidence: dict) -> None:
        """Computation or communication: which part of the step grew.

        In a synchronous job a slow GPU makes its rank compute longer (the
        slowest rank's compute grows); a slow link makes every rank's
        communication longer, even the one that waits least.
        """
        state_split = state.split
        onset = finding.onset
        before = [x for x in state_split if x[0] < onset][-50:]
        after = [x for x in state_split if x[0] >= onset]
        if len(before) < 3 or len(after) < 2:
            return
        d_compute = float(np.median([a[1] for a in after]) - np.median([b[1] for b in before]))
        d_comm = float(np.median([a[2] for a in after]) - np.median([b[2] for b in before]))
        evidence["slowdown_class"] = "computation" if d_compute >= d_comm else "communication"
        evidence["delta_compute_s"] = round(d_compute, 6)
        evidence["delta_communication_s"] = round(d_comm, 6)

    def _on_collective(self, call: CollectiveCall, now: float) -> list[DetectorFinding]:
        job = call.source.job
        if job is None:
            return []
        state = self._job(job, call.source.cluster)
        state.last_arrival = now
        if call.source.node:
            state.nodes.add(call.source.node)
        # Only rank 0's calls: every rank makes the same sequence.
        if call.source.rank not in (None, 0):
            return []
        t = to_seconds(call.end)
        state.period.update(call.op.value, call.group, t=t)
        if state.last_step is None or state.last_step[0] < 0:
            # No iteration events from this job: the ACF period is its heartbeat.
            iteration_s = state.period.iteration_time
            if iteration_s is not None and iteration_s > 0:
                last_t = state.last_step[1] if state.last_step else None
                if last_t is None or t - last_t >= iteration_s:
                    state.last_step = (-1, t)
                    state.hang.update(iteration_s, t=t)
                    state.failslow.update(iteration_s, t=t)
        return self._diff_job(job, state, state.period, now)

    # -- timers ------------------------------------------------------------
    def tick(self, now: float) -> list[DetectorFinding]:
        """Advance every timer to ``now``; return what that raises or clears.

        ``now`` is the clock that event arrivals are stamped with. A silence
        detector may only fire once its timeout has passed with nothing
        arriving from its subject: a worker reading a backlog (after a
        takeover, or while lagging) sees old timestamps that are not silence
        in the cluster. Onsets stay in event time.
        """
        out: list[DetectorFinding] = []
        # XID, NIC and GPU findings change on their samples; a tick only ages their windows
        # (holds of minutes), so once a second is enough: at 10 Hz over thousands of nodes it
        # would cost more than the telemetry itself.
        windows = self._windows_ticked_at is None or now - self._windows_ticked_at >= self.params.window_tick_s
        if windows:
            self._windows_ticked_at = now
        alone = len(self.nodes) + len(self.jobs) <= 1
        for node, state in self.nodes.items():
            for det in (state.heartbeat, state.xid, state.nic, state.gpu) if windows else (state.heartbeat,):
                if det is None:
                    continue
                if det is state.heartbeat and not self._silent(state.last_arrival, det.timeout_s, now, alone):
                    continue
                det.tick(now)
                out += self._diff_node(node, det, now)
        for job, state in self.jobs.items():
            if not self._silent(state.last_arrival, state.hang.timeout_s, now, alone):
                continue
            state.hang.tick(now)
            out += self._diff_job(job, state, state.hang, now)
        for (_name, per, key), det in self.plugin_instances.items():
            det.tick(now)
            cluster = (self.nodes[key].cluster if per == "node" and key in self.nodes else
                       self.jobs[key].cluster if per == "job" and key in self.jobs else "default")
            out += self._diff_plugin(per, key, det, cluster, now)
        return out

    def forget(self, nodes: Iterable[str] = (), jobs: Iterable[str] = ()) -> None:
        """Drop the state of subjects whose partitions moved to another worker."""
        for node in nodes:
            self.nodes.pop(node, None)
            for k in [k for k in self.plugin_instances if k[1:] == ("node", node)]:
                del self.plugin_instances[k]
            for key in [k for k in self._reported if k[0] == f"node:{node}"]:
                del self._reported[key]
        for job in jobs:
            self.jobs.pop(job, None)
            for k in [k for k in self.plugin_instances if k[1:] == ("job", job)]:
                del self.plugin_instances[k]
            for key in [k for k in self._reported if k[0] == f"job:{job}"]:
                del self._reported[key]

    # -- diffing -----------------------------------------------------------
    def _diff_node(self, node: str, det: Detector, now: float) -> list[DetectorFinding]:
        state = self.nodes[node]

        def subject(f: Finding) -> Subject:
            ev = f.evidence
            gpu = ev.get("gpu")
            port = ev.get("port")
            # GPU detectors name a GPU by index (maybe as text); XIDs by PCI bus id.
            index = int(gpu) if isinstance(gpu, int) or (isinstance(gpu, str) and gpu.isdigit()) else None
            return Subject(node=node, gpu=index, link=f"{node}/{port}" if port is not None else None)

        def jobs_here(f: Finding, evidence: dict) -> None:
            # What a node's failure takes down: the decision engine acts on these jobs.
            jobs = sorted(j for j, s in self.jobs.items() if node in s.nodes)
            if jobs:
                evidence["jobs"] = jobs

        return self._diff(f"node:{node}", det, subject, state.cluster, [], now, jobs_here)

    def _diff_job(self, job: str, state: _JobState, det: Detector, now: float,
                  enrich: Callable[[Finding, dict], None] | None = None) -> list[DetectorFinding]:
        return self._diff(f"job:{job}", det, lambda f: Subject(job=job), state.cluster, sorted(state.nodes), now,
                          enrich)

    def _diff(self, owner: str, det: Detector, subject_of: Callable[[Finding], Subject], cluster: str,
              job_nodes: list[str], now: float, enrich: Callable[[Finding, dict], None] | None) -> list[DetectorFinding]:
        current = list(getattr(det, "findings", None) or ([det.finding] if det.finding is not None else []))
        reported = self._reported.setdefault((owner, det.name), {})
        out: list[DetectorFinding] = []
        seen: set[str] = set()
        for f in current:
            subject = subject_of(f)
            key = f"{f.kind}|{subject_key(subject)}|{f.onset:.6f}"
            seen.add(key)
            if key in reported:
                continue
            evidence = dict(f.evidence)
            if enrich is not None:
                enrich(f, evidence)
            df = self._finding("raised", f.kind, f.severity, subject, f.onset, det.name, det.version, evidence,
                               cluster, job_nodes, detected_at=f.detected_at)
            reported[key] = df
            out.append(df)
        for key in [k for k in reported if k not in seen]:
            raised = reported.pop(key)
            out.append(self._finding("cleared", raised.kind, raised.severity, raised.subject,
                                     to_seconds(raised.onset_time), raised.detector, raised.detector_version,
                                     raised.evidence, cluster, raised.job_nodes, detected_at=now))
        return out

    @staticmethod
    def _finding(status: str, kind: str, severity: int, subject: Subject, onset: float, detector: str,
                 version: str, evidence: dict, cluster: str, job_nodes: list[str],
                 detected_at: float | None = None) -> DetectorFinding:
        at = onset if detected_at is None else detected_at
        return DetectorFinding(
            event_id=uuid.uuid5(_FINDING_NS, f"{status}|{kind}|{subject_key(subject)}|{onset:.6f}"),
            event_time=from_seconds(at), source=Source(cluster=cluster), status=status, kind=kind,  # type: ignore[arg-type]
            severity=severity, subject=subject, onset_time=from_seconds(onset), detector=detector,
            detector_version=version, job_nodes=job_nodes, evidence=_plain(evidence),
        )


def _plain(value: Any) -> Any:
    """Evidence as JSON-ready values (tuples to lists, numpy scalars to Python)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
