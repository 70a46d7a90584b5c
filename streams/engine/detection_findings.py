"""The detection engine's findings: each detector's current findings diffed against what was last
reported, as ``raised`` and ``cleared`` :class:`~vigil.schemas.DetectorFinding` events.

:class:`_FindingDiff` is a part of :class:`~vigil.streams.engine.detection.DetectionEngine` (its
methods use the engine's keys and what it reported); :func:`detector_finding` makes the event.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import numpy as np

from vigil.detectors import Detector, Finding
from vigil.schemas import DetectorFinding, Source, Subject, from_seconds, to_seconds
from vigil.streams.engine.attribution import subject_key
from vigil.streams.engine.detection_keys import _Key

__all__ = ["detector_finding"]

#: The node detector whose timeout says when a node counts as quiet (:meth:`_FindingDiff._quiet_nodes`).
_HEARTBEAT = "heartbeat_loss"
_FINDING_NS = uuid.UUID("9d1f4f0e-7c1b-4a57-8a3e-2b7f7a1c5e33")


class _FindingDiff:
    """The diffing part of :class:`~vigil.streams.engine.detection.DetectionEngine`."""

    # -- diffing -----------------------------------------------------------
    def _diff(self, key: _Key, det: Detector, now: float) -> list[DetectorFinding]:
        findings = getattr(det, "findings", None)
        current: list[Finding] = list(findings) if findings is not None else \
            ([det.finding] if det.finding is not None else [])
        owner = key.owner
        if det.transient:
            return [self._raised(key, det, f) for f in current]
        reported = self._reported.get((owner, det.name))
        if not current and not reported:
            return []
        if reported is None:
            reported = self._reported[(owner, det.name)] = {}
        out: list[DetectorFinding] = []
        seen: set[str] = set()
        for f in current:
            subject = self._subject(key, f)
            fkey = f"{f.kind}|{subject_key(subject)}|{f.onset:.6f}"
            seen.add(fkey)
            if fkey in reported:
                continue
            if det.silence:  # who else is quiet right now: many at once share a cause
                told: dict[str, Any] = {"silent_peers": self._silent_peers(key, det, now)}
                if key.per == "job" and key.nodes:
                    told["quiet_nodes"] = self._quiet_nodes(key, now)
                f = dataclasses.replace(f, evidence={**f.evidence, **told})
            df = reported[fkey] = self._raised(key, det, f, subject)
            out.append(df)
        for fkey in [k for k in reported if k not in seen]:
            out.append(self._cleared(reported.pop(fkey), key.cluster, now))
        return out

    def _quiet_nodes(self, key: _Key, now: float, limit: int = 64) -> list[str]:
        """The job's nodes that do not talk: not heard here for over half their heartbeat timeout, not heard a
        heartbeat interval after the job's last sign of life (a stalled path or a partition stops both within a
        beat), or never heard here (another worker's, no node agent: nothing says they talk). A silence of theirs
        might explain the job's. None of them: its nodes talk on while it is silent."""
        out = []
        nodes = self.nodes
        job_heard = key.last_arrival
        for name in sorted(key.nodes):
            node = nodes.get(name)
            beat = node.detectors.get(_HEARTBEAT) if node is not None else None
            if beat is None:
                out.append(name)
            else:
                interval = beat.timeout_s / beat.missed_intervals  # type: ignore[attr-defined]
                if _unheard(node, beat, now) or node.last_arrival < job_heard + interval:  # type: ignore[union-attr]
                    out.append(name)
            if len(out) >= limit:
                break
        return out

    def _silent_peers(self, key: _Key, det: Detector, now: float, limit: int = 64) -> list[str]:
        """The other jobs or nodes whose same detector has heard nothing for over half its timeout."""
        out = []
        for name, other in self._keys(key.per).items():
            peer = other.detectors.get(det.name)
            if name != key.name and peer is not None and _unheard(other, peer, now):
                out.append(name)
                if len(out) >= limit:
                    break
        return sorted(out)

    @staticmethod
    def _subject(key: _Key, f: Finding) -> Subject:
        if f.subject is not None:  # narrowed by the detector, within its key
            return Subject(**{key.per: key.name, **{k: v for k, v in f.subject.items() if v is not None}})
        if key.per == "job":
            return Subject(job=key.name)
        ev = f.evidence
        gpu, port = ev.get("gpu"), ev.get("port")
        # GPU detectors name a GPU by index (maybe as text); XIDs by PCI bus id.
        index = int(gpu) if isinstance(gpu, int) or (isinstance(gpu, str) and gpu.isdigit()) else None
        return Subject(node=key.name, gpu=index, link=f"{key.name}/{port}" if port is not None else None)

    def _raised(self, key: _Key, det: Detector, f: Finding, subject: Subject | None = None) -> DetectorFinding:
        subject = subject or self._subject(key, f)
        job = self.jobs.get(subject.job) if subject.job else None
        node = subject.node if key.per == "node" and subject.job is None else None
        # What a node's failure takes down: the decision engine acts on these jobs.
        affected = sorted(j for j, s in self.jobs.items() if node in s.nodes) if node else []
        return self._finding("raised", f.kind, f.severity, subject, f.onset, det.name, det.version, f.evidence,
                             key.cluster, sorted(job.nodes) if job else [], f.detected_at, affected,
                             _with_job(f.slowdown, subject.job))

    def _cleared(self, raised: DetectorFinding, cluster: str, now: float) -> DetectorFinding:
        return self._finding("cleared", raised.kind, raised.severity, raised.subject, to_seconds(raised.onset_time),
                             raised.detector, raised.detector_version, raised.evidence, cluster, raised.job_nodes, now,
                             raised.affected_jobs, raised.slowdown)

    _finding = staticmethod(lambda *a, **k: detector_finding(*a, **k))  # defined below


def _unheard(key: _Key, det: Detector, now: float) -> bool:
    """Has ``key`` been silent for over half of ``det``'s timeout (quiet, whether or not lost yet)?"""
    return now - key.last_arrival > 0.5 * det.timeout_s  # type: ignore[attr-defined]


def detector_finding(status: str, kind: str, severity: int, subject: Subject, onset: float, detector: str,
                     version: str, evidence: dict, cluster: str, job_nodes: list[str], detected_at: float | None,
                     affected_jobs: list[str], slowdown: Any) -> DetectorFinding:
    """A finding event; its id is the same wherever and however often it is made (consumers dedupe by it)."""
    at = onset if detected_at is None else detected_at
    return DetectorFinding(
        event_id=uuid.uuid5(_FINDING_NS, f"{status}|{kind}|{subject_key(subject)}|{onset:.6f}"),
        event_time=from_seconds(at), source=Source(cluster=cluster), status=status, kind=kind,  # type: ignore[arg-type]
        severity=severity, subject=subject, onset_time=from_seconds(onset), detector=detector,
        detector_version=version, job_nodes=job_nodes, affected_jobs=affected_jobs, slowdown=slowdown,
        evidence=_plain(evidence),
    )


def _with_job(slowdown: Any, job: str | None) -> Any:
    if slowdown is None or job is None or slowdown.job is not None:
        return slowdown
    return slowdown.model_copy(update={"job": job})


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
