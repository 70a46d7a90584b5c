"""The detection engine: events in, alerts out, no Kafka.

The faust worker (``streams.worker``) feeds it decoded events and ticks it
from a timer; tests and replays drive it directly on simulated time.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Callable

from detectors import Detector, Finding, HangDetector, HeartbeatLoss
from schemas import Alert, Envelope, Heartbeat, IterationTiming, Subject, to_seconds
from streams.incidents import IncidentBook


@dataclass(frozen=True)
class EngineParams:
    hang_k: float = 3.0
    hang_warmup: int = 5
    heartbeat_missed_intervals: float = 2.5
    #: Events older than this (against the worker's clock) do not start tracking a
    #: subject: a new consumer group reading an old log must not report every node
    #: that left the cluster long ago as lost.
    max_event_age_s: float = 300.0


class DetectionEngine:
    """Per-job hang detectors and per-node heartbeat detectors, with incidents."""

    def __init__(self, params: EngineParams = EngineParams(), cluster: str = "default") -> None:
        self.params = params
        self.incidents = IncidentBook(cluster=cluster)
        self.hang: dict[str, HangDetector] = {}
        self.heartbeat: dict[str, HeartbeatLoss] = {}
        self._last_step: dict[str, tuple[int, float]] = {}

    def on_event(self, event: Envelope, now: float) -> list[Alert]:
        """Feed one event; return alerts that the event itself settles (resolutions)."""
        if isinstance(event, Heartbeat):
            return self._on_heartbeat(event, now)
        if isinstance(event, IterationTiming):
            return self._on_iteration(event, now)
        return []

    def _on_heartbeat(self, hb: Heartbeat, now: float) -> list[Alert]:
        node = hb.source.node
        if node is None:
            return []
        det = self.heartbeat.get(node)
        if det is None:
            if now - to_seconds(hb.event_time) > self.params.max_event_age_s:
                return []
            det = self.heartbeat[node] = HeartbeatLoss(missed_intervals=self.params.heartbeat_missed_intervals,
                                                       interval_s=hb.interval_s)
        was_lost = det.finding is not None
        det.update(t=to_seconds(hb.event_time), interval_s=hb.interval_s, seq=hb.seq)
        if was_lost and det.finding is None:
            alert = self.incidents.resolve("node_lost", Subject(node=node), now, f"heartbeats resumed (seq {hb.seq})")
            return [alert] if alert else []
        return []

    def _on_iteration(self, it: IterationTiming, now: float) -> list[Alert]:
        job = it.source.job
        if job is None:
            return []
        # Every rank reports each step: the job progressed when another step ends
        # later than the last one did. Step numbers may go back (a restart from a
        # checkpoint); old events (redelivered, late ranks) end earlier.
        end = to_seconds(it.end)
        last = self._last_step.get(job)
        if last is not None and (it.step == last[0] or end <= last[1]):
            return []
        det = self.hang.get(job)
        if det is None and now - end > self.params.max_event_age_s:
            return []
        self._last_step[job] = (it.step, end)
        if det is None:
            det = self.hang[job] = HangDetector(k=self.params.hang_k, warmup=self.params.hang_warmup)
        was_hung = det.finding is not None
        if it.duration_s > 0:
            det.update(it.duration_s, t=end)
        if was_hung and det.finding is None:
            alert = self.incidents.resolve("task_hang", Subject(job=job), now, f"step {it.step} completed")
            return [alert] if alert else []
        return []

    def forget(self, nodes: set[str] = frozenset(), jobs: set[str] = frozenset()) -> None:
        """Drop the state of subjects whose partitions moved to another worker.

        The new owner rebuilds it from the log; keeping it here would make a
        node whose heartbeats now go elsewhere look lost.
        """
        for node in nodes:
            self.heartbeat.pop(node, None)
            self.incidents.forget("node_lost", Subject(node=node))
        for job in jobs:
            self.hang.pop(job, None)
            self._last_step.pop(job, None)
            self.incidents.forget("task_hang", Subject(job=job))

    def tick(self, now: float) -> list[Alert]:
        """Advance every timer to ``now``; return newly opened incidents."""
        alerts = self._tick_all(
            self.heartbeat, now, lambda node: Subject(node=node),
            lambda node, f: f"node {node} lost: no heartbeat for {f.evidence['silence_s']:.1f} s")
        alerts += self._tick_all(
            self.hang, now, lambda job: Subject(job=job),
            lambda job, f: (f"job {job} hung: no iteration for {f.evidence['silence_s']:.1f} s "
                            f"(timeout {f.evidence['timeout_s']:.2f} s)"))
        return alerts

    def _tick_all(self, detectors: dict[str, Detector], now: float, subject_of: Callable[[str], Subject],
                  summary_of: Callable[[str, Finding], str]) -> list[Alert]:
        alerts: list[Alert] = []
        for key, det in detectors.items():
            det.tick(now)
            finding = det.finding
            if finding is None or self.incidents.is_open(finding.kind, subject_of(key)):
                continue
            alert = self.incidents.raise_finding(finding, subject_of(key), det.name, det.version,
                                                 summary_of(key, finding))
            if alert:
                alerts.append(alert)
        return alerts
