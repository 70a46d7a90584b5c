"""``vigil tail`` prints what came off a topic as the characters it is: markup an attacker writes styles nothing."""

from __future__ import annotations

import io
import uuid

from rich.console import Console

from vigil.schemas import ActionResult, Alert, Decision, Subject, from_seconds
from vigil.tail import Follower, format_record

T = from_seconds(0)
HOSTILE = "[bold red]all clear[/bold red] [link=http://evil.example]x[/link] [/]"


def _printed(markup: str) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(markup, highlight=False)
    return out.getvalue()


def test_markup_in_an_alert_prints_literally():
    a = Alert(event_time=T, incident_id=uuid.UUID(int=1), incident_version=1, status="open", severity=1,
              kind="node_lost", subject=Subject(node="n3"), onset_time=T, detection_time=T, detector="d",
              detector_version="1", summary=HOSTILE)
    shown = _printed(format_record(a, Follower()))
    assert HOSTILE in shown and "node=n3" in shown and shown.startswith("sev1 open")


def test_markup_in_a_decision_and_an_action_prints_literally():
    d = Decision(event_time=T, decision_id=uuid.UUID(int=2), idempotency_key="k", action="reconfigure",
                 target=Subject(job="llama"), reason=HOSTILE)
    r = ActionResult(event_time=T, decision_id=uuid.UUID(int=2), state="failed", backend="slurm", detail=HOSTILE)
    follower = Follower()
    follower.learn(d)
    assert HOSTILE in _printed(format_record(d, follower))
    shown = _printed(format_record(r, follower))
    assert shown.startswith("action   failed") and HOSTILE in shown and "reconfigure job=llama" in shown
