"""Detection and correlation chained in one process, on any clock.

The live system runs the two stages in the worker, connected by the
findings topic; this runs the same code directly, for tests, replays and the
simulator's in-process mode.
"""

from __future__ import annotations

from typing import Iterable

from vigil.schemas import Alert, DetectorFinding, Envelope
from vigil.streams.engine.detection import DetectionEngine, EngineParams
from vigil.streams.engine.incidents import Correlator


class InProcessPipeline:
    def __init__(self, params: EngineParams = EngineParams(), correlator: Correlator | None = None) -> None:
        self.engine = DetectionEngine(params)
        self.correlator = correlator or Correlator()
        self.findings: list[DetectorFinding] = []

    def feed(self, events: Iterable[Envelope], now: float) -> list[Alert]:
        """One message's events; the alerts they cause."""
        return self._correlate(self.engine.on_events(list(events), now), now)

    def tick(self, now: float) -> list[Alert]:
        alerts = self._correlate(self.engine.tick(now), now)
        return alerts + self.correlator.tick(now)

    def _correlate(self, findings: list[DetectorFinding], now: float) -> list[Alert]:
        self.findings += findings
        alerts: list[Alert] = []
        for f in findings:
            alerts += self.correlator.on_finding(f, now)
        return alerts
