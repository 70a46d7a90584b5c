"""A scenario's verdict: what it required and allowed, what it saw, and the judgement (false pages, misses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vigil.bench.scenario_harness import Recorder

__all__ = ["Verdict"]


@dataclass
class Verdict:
    """What a scenario required and allowed, and what it saw."""

    expected: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    pages_allowed: set[str] = field(default_factory=set)
    decisions_allowed: set[str] = field(default_factory=set)
    requirements: dict[str, bool] = field(default_factory=dict)

    def require(self, name: str, ok: bool, seen: Any = None) -> None:
        self.requirements[name] = bool(ok)
        if seen is not None:
            self.observed[name] = seen

    def judge(self, rec: Recorder, t0: float) -> dict[str, Any]:
        pages = [a for a in rec.pages() if a.kind not in self.pages_allowed]
        decisions = [d for _, d in rec.decisions if d.action not in self.decisions_allowed]
        self.observed["pages"] = sorted(f"sev{a.severity} {a.kind} {a.subject.model_dump(exclude_none=True)}"
                                        for a in rec.pages())
        self.observed["decisions"] = [f"{d.action} {d.target.model_dump(exclude_none=True)}" for _, d in rec.decisions]
        self.observed["requirements"] = dict(self.requirements)
        self.observed["timeline"] = [_line(t - t0, e) for t, e in rec.events][:200]
        false_pages = len(pages) + len(decisions)
        missed = sum(1 for ok in self.requirements.values() if not ok)
        self.expected.setdefault("pages_allowed", sorted(self.pages_allowed))
        self.expected.setdefault("decisions_allowed", sorted(self.decisions_allowed))
        return {"passed": false_pages == 0 and missed == 0, "expected": self.expected, "observed": self.observed,
                "false_pages": false_pages, "missed": missed}


def _line(t: float, e: Any) -> str:
    """One published event, for a human reading the JSON: when (s from the scenario's start) and what."""
    what = getattr(e, "state", None) or getattr(e, "action", None) or getattr(e, "status", "")
    about = getattr(e, "kind", "") or getattr(e, "reason", "") or getattr(e, "detail", "")
    return f"{t:7.2f} {e.event_type} {what} {about}"[:160]
