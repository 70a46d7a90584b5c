from __future__ import annotations

from detectors.base import Finding
from schemas import Subject
from streams.incidents import MAX_EVIDENCE, IncidentBook


def finding(severity=2, onset=10.0, at=12.0, **ev):
    return Finding("task_hang", severity, onset, at, ev)


def test_one_incident_many_pieces_of_evidence():
    book = IncidentBook()
    subject = Subject(job="j")
    first = book.raise_finding(finding(rank=0), subject, "hang", "1", "hung")
    later = [book.raise_finding(finding(rank=r), subject, "hang", "1", "hung") for r in range(1, 1000)]
    assert first.status == "open" and all(a is None for a in later)
    [incident] = book.open_incidents()
    assert incident.evidence_count == 1000 and len(incident.evidence) == MAX_EVIDENCE


def test_worse_severity_updates_the_incident():
    book = IncidentBook()
    s = Subject(node="n")
    a1 = book.raise_finding(finding(severity=3), s, "d", "1", "x")
    a2 = book.raise_finding(finding(severity=1), s, "d", "1", "x")
    assert (a2.status, a2.severity, a2.incident_version) == ("update", 1, 2)
    assert a1.incident_id == a2.incident_id and a1.event_id != a2.event_id


def test_resolve_closes_and_ids_are_deterministic():
    b1, b2 = IncidentBook(), IncidentBook()
    s = Subject(job="j")
    o1 = b1.raise_finding(finding(), s, "hang", "1", "x")
    o2 = b2.raise_finding(finding(), s, "hang", "1", "x")
    assert o1.event_id == o2.event_id
    r = b1.resolve("task_hang", s, 20.0, "progress")
    assert r.status == "resolved" and r.incident_version == 2 and not b1.open_incidents()
    assert b1.resolve("task_hang", s, 21.0, "again") is None
