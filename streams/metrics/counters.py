"""Counters of what a component publishes (findings, alerts, decisions, action results, dead letters)."""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter

from vigil.streams.metrics.names import NOT_DECODE_ERRORS


class PublishCounters:
    """Counters of what a component publishes, each label child made once and kept.

    A component that publishes holds one as its ``metrics`` attribute (None: not counted) and calls
    :meth:`count` with what it published.
    """

    def __init__(self, registry: CollectorRegistry, kinds: Iterable[str]) -> None:
        kinds = set(kinds)
        self._metrics: dict[str, Counter] = {}
        docs = {
            "finding": ("vigil_findings", "Detector findings published, by detector and status (raised, cleared).",
                        ("detector", "status")),
            "alert": ("vigil_alerts", "Alert versions published, by incident kind, severity (1 worst) and status "
                      "(open, update, resolved).", ("kind", "severity", "status")),
            "decision": ("vigil_decisions", "Decisions published by the decision engine, by action.", ("action",)),
            "action_result": ("vigil_actions", "Action results published by an actuator, by the decision's action, "
                              "the state reached (succeeded, failed, timed_out, ...) and backend.",
                              ("action", "state", "backend")),
            "dead_letter": ("vigil_dead_letters", "Messages dead-lettered (kept whole with the reason), by reason "
                            "and the topic they were read from.", ("reason", "topic")),
        }
        for kind in kinds:
            name, doc, labels = docs[kind]
            self._metrics[kind] = Counter(name, doc, labels, registry=registry)
        if "dead_letter" in kinds:
            self._metrics["decode_error"] = Counter(
                "vigil_decode_errors", "Messages (or items of a batch) that did not decode into a valid event of "
                "their topic, by reason and topic (each is also a dead letter).", ("reason", "topic"),
                registry=registry)
        self._children: dict[tuple, Any] = {}

    def _inc(self, kind: str, *labels: str) -> None:
        key = (kind, *labels)
        child = self._children.get(key)
        if child is None:
            metric = self._metrics.get(kind)
            if metric is None:
                return
            child = self._children[key] = metric.labels(*labels)
        child.inc()

    def count(self, events: Iterable[Any], action: str | None = None) -> None:
        for ev in events:
            etype = getattr(ev, "event_type", None)
            if etype == "alert":
                self._inc("alert", ev.kind, str(ev.severity), ev.status)
            elif etype == "finding":
                self._inc("finding", ev.detector, ev.status)
            elif etype == "decision":
                self._inc("decision", ev.action)
            elif etype == "action_result":
                self._inc("action_result", action or "unknown", ev.state, ev.backend)
            elif etype == "dead_letter":
                self._inc("dead_letter", ev.reason, ev.source_topic)
                if ev.reason not in NOT_DECODE_ERRORS:
                    self._inc("decode_error", ev.reason, ev.source_topic)
