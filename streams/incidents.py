"""Incidents: one per root cause, opened, updated and resolved as alerts.

Pure bookkeeping, no Kafka. An incident's id is derived from its kind, its
subject and its onset, so a worker that restarts and rebuilds the same
finding from the log produces the same incident id and the same alert event
ids: downstream consumers drop the repeats.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from detectors.base import Finding
from schemas import Alert, Source, Subject, from_seconds

_INCIDENT_NS = uuid.UUID("0b6c1a52-8f0e-4a43-9d4b-6b8f3e1f2a90")
MAX_EVIDENCE = 100


def subject_key(subject: Subject) -> str:
    return "/".join(f"{k}={v}" for k, v in subject.model_dump(exclude_none=True).items())


@dataclass
class Incident:
    incident_id: uuid.UUID
    kind: str
    severity: int
    subject: Subject
    onset: float
    detected_at: float
    detector: str
    detector_version: str
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    evidence_count: int = 0
    version: int = 0


class IncidentBook:
    """Open incidents by (kind, subject); turns findings into alert versions."""

    def __init__(self, cluster: str = "default", emitter: str = "vigil-detect") -> None:
        self.cluster = cluster
        self.emitter = emitter
        self._open: dict[tuple[str, str], Incident] = {}

    def open_incidents(self) -> list[Incident]:
        return list(self._open.values())

    def is_open(self, kind: str, subject: Subject) -> bool:
        return (kind, subject_key(subject)) in self._open

    def raise_finding(self, finding: Finding, subject: Subject, detector: str, detector_version: str,
                      summary: str) -> Alert | None:
        """Open an incident for ``finding``, or add evidence to the open one.

        Returns the alert to publish, or ``None`` when nothing changed.
        """
        key = (finding.kind, subject_key(subject))
        incident = self._open.get(key)
        if incident is None:
            incident = Incident(
                incident_id=uuid.uuid5(_INCIDENT_NS, f"{finding.kind}|{key[1]}|{finding.onset:.3f}"),
                kind=finding.kind, severity=finding.severity, subject=subject, onset=finding.onset,
                detected_at=finding.detected_at, detector=detector, detector_version=detector_version,
                summary=summary,
            )
            self._open[key] = incident
            self._add_evidence(incident, finding.evidence)
            return self._alert(incident, "open", finding.detected_at)
        changed = finding.severity < incident.severity
        incident.severity = min(incident.severity, finding.severity)
        self._add_evidence(incident, finding.evidence)
        return self._alert(incident, "update", finding.detected_at) if changed else None

    def resolve(self, kind: str, subject: Subject, now: float, why: str) -> Alert | None:
        incident = self._open.pop((kind, subject_key(subject)), None)
        if incident is None:
            return None
        incident.summary = f"{incident.summary} — resolved: {why}"
        return self._alert(incident, "resolved", now)

    def forget(self, kind: str, subject: Subject) -> None:
        """Stop tracking an incident without resolving it (another worker owns it now)."""
        self._open.pop((kind, subject_key(subject)), None)

    @staticmethod
    def _add_evidence(incident: Incident, evidence: dict[str, Any]) -> None:
        incident.evidence_count += 1
        if len(incident.evidence) < MAX_EVIDENCE:
            incident.evidence.append(evidence)

    def _alert(self, incident: Incident, status: str, now: float) -> Alert:
        incident.version += 1
        return Alert(
            event_id=uuid.uuid5(incident.incident_id, str(incident.version)),
            event_time=from_seconds(now),
            source=Source(cluster=self.cluster, node=incident.subject.node, job=incident.subject.job),
            incident_id=incident.incident_id,
            incident_version=incident.version,
            status=status,  # type: ignore[arg-type]
            severity=incident.severity,
            kind=incident.kind,
            subject=incident.subject,
            onset_time=from_seconds(incident.onset),
            detection_time=from_seconds(incident.detected_at),
            summary=incident.summary,
            evidence=list(incident.evidence),
            evidence_count=incident.evidence_count,
            detector=incident.detector,
            detector_version=incident.detector_version,
        )
