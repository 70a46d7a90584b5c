"""The scenario suite's scoring (``Verdict.judge``) on recorded events of known meaning."""

from __future__ import annotations

import uuid

from vigil.bench.scenarios import Verdict
from vigil.schemas import Alert, Decision, Source, Subject, from_seconds


class _Rec:
    """What a Recorder offers the judge: the events, the pages (sev1/sev2 at any version) and the decisions."""

    def __init__(self, alerts: list[Alert], decisions: list[Decision]) -> None:
        self.events = [(1.0, e) for e in [*alerts, *decisions]]
        self.decisions = [(1.0, d) for d in decisions]
        self._alerts = alerts

    def pages(self) -> list[Alert]:
        worst: dict = {}
        for a in self._alerts:
            if a.status != "resolved" and (a.incident_id not in worst or a.severity < worst[a.incident_id].severity):
                worst[a.incident_id] = a
        return [a for a in worst.values() if a.severity <= 2]


def _alert(kind: str, severity: int, incident: uuid.UUID, status: str = "open") -> Alert:
    t = from_seconds(100.0)
    return Alert(event_time=t, source=Source(), incident_id=incident, incident_version=1, status=status,
                 severity=severity, kind=kind, subject=Subject(job="j"), onset_time=t, detection_time=t,
                 summary=kind, detector="test", detector_version="1")


def _decision(action: str) -> Decision:
    return Decision(event_time=from_seconds(101.0), source=Source(), decision_id=uuid.uuid4(),
                    idempotency_key=f"k-{action}", action=action, target=Subject(job="j"), reason="test")


def test_a_clean_run_passes():
    v = Verdict()
    v.require("exit_code", True, 0)
    out = v.judge(_Rec([], []), t0=0.0)
    assert (out["passed"], out["false_pages"], out["missed"]) == (True, 0, 0)


def test_a_page_or_decision_not_allowed_is_a_false_page_and_sev3_is_not():
    v = Verdict()
    alerts = [_alert("task_hang", 2, uuid.uuid4()), _alert("xid", 3, uuid.uuid4())]
    out = v.judge(_Rec(alerts, [_decision("restart_process")]), t0=0.0)
    assert (out["passed"], out["false_pages"]) == (False, 2)  # the sev2 page and the decision; sev3 pages no one


def test_allowed_pages_and_decisions_are_not_counted_and_a_missed_requirement_is():
    v = Verdict()
    v.pages_allowed, v.decisions_allowed = {"task_hang"}, {"restart_process"}
    v.require("hang_alert_in_time", False, 2.7)
    v.require("restart", True)
    out = v.judge(_Rec([_alert("task_hang", 2, uuid.uuid4())], [_decision("restart_process")]), t0=0.0)
    assert (out["passed"], out["false_pages"], out["missed"]) == (False, 0, 1)
    assert out["observed"]["hang_alert_in_time"] == 2.7


def test_an_incident_counts_once_at_its_worst_severity_and_a_resolved_version_does_not_page():
    v = Verdict()
    inc = uuid.uuid4()
    alerts = [_alert("node_lost", 3, inc), _alert("node_lost", 1, inc, "update"), _alert("node_lost", 1, inc, "resolved")]
    out = v.judge(_Rec(alerts, []), t0=0.0)
    assert out["false_pages"] == 1
