"""A node that failed its health check on (re)joining: out of capacity until it passes, and said so."""

from __future__ import annotations

from typing import Any

from vigil.detectors.base import Detector, Finding, KeyContext, register
from vigil.schemas import NodeState, to_seconds

__all__ = ["NodeHealth"]


@register
class NodeHealth(Detector):
    """Per node: ``unhealthy`` (its agent's health check failed) until it joins again healthy (sev3).

    The node runs no job and is kept out of re-planning; a human repairs it.

    Examples
    --------
    >>> from vigil.schemas import NodeState, Source, from_seconds
    >>> det = NodeHealth()
    >>> det.observe(NodeState(event_time=from_seconds(5.0), source=Source(node="n1"), state="unhealthy",
    ...                       checks={"disk:/scratch": "0.2 GiB free", "gpu": "ok"}), t=5.0)
    >>> det.finding.kind, det.finding.severity, det.finding.evidence["failed"]
    ('health_check_failed', 3, {'disk:/scratch': '0.2 GiB free'})
    >>> det.observe(NodeState(event_time=from_seconds(9.0), source=Source(node="n1"), state="joined"), t=9.0)
    >>> det.finding is None
    True
    """

    name = "node_health"
    version = "1"
    consumes = ("node_state",)
    per = "node"

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._finding: Finding | None = None

    def observe(self, item: NodeState, *, t: float, context: KeyContext | None = None) -> None:
        if item.state == "unhealthy":
            at = to_seconds(item.event_time)
            failed = {k: v for k, v in item.checks.items() if v != "ok"}
            self._finding = Finding("health_check_failed", 3, at, at, {"failed": failed, "reason": item.reason[:500]})
        elif item.state in ("joined", "healthy"):
            self._finding = None

    def update(self, item: Any, *, t: float) -> None:
        self.observe(item, t=t)

    @property
    def finding(self) -> Finding | None:
        return self._finding

    @classmethod
    def _conformance_feed(cls, seed: int):
        from vigil.schemas import Source, from_seconds

        return [("update", (NodeState(event_time=from_seconds(float(i)), source=Source(node="n"), state="joined"),),
                 {"t": float(i)}) for i in range(5)]

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 5
