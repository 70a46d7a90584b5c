"""What every collector is, and how a failing one is reported: once, as a health event.

A collector has a ``name`` and an ``interval_s`` and turns ``collect(now)``
into events; ``now`` is an aware UTC datetime given by the runner (the only
place that reads the clock). A collector that cannot work at all raises (e.g.
:class:`CollectorUnavailable` when NVML is not there); one that works in part
(one counter file unreadable) calls :meth:`Collector.problem` and returns
what it could read. :class:`HealthTracker` turns both into
:class:`~vigil.schemas.events.AgentHealth` events: ``failed`` the first time a
problem is seen, nothing while it persists (only counted), ``recovered``
once it is gone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vigil.schemas import Envelope, Source
from vigil.schemas.events import AgentHealth

__all__ = ["Collector", "CollectorUnavailable", "HealthTracker"]


class CollectorUnavailable(RuntimeError):
    """The collector cannot run here (no NVML, no such path, no permission); the message says why."""


class Collector:
    """Base class: subclasses set ``name`` and implement :meth:`collect`."""

    name: str = "collector"

    def __init__(self, interval_s: float, source: Source) -> None:
        if not interval_s > 0:
            raise ValueError(f"{self.name}: interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.source = source
        self._problems: dict[str, str] = {}

    def problem(self, key: str, detail: str) -> None:
        """Report a partial failure of this run (reported once until it goes away)."""
        self._problems[key] = detail

    def take_problems(self) -> dict[str, str]:
        out, self._problems = self._problems, {}
        return out

    def collect(self, now: datetime) -> list[Envelope]:
        raise NotImplementedError

    def pause(self, delay_s: float, stop: threading.Event) -> bool:
        """Wait until the next run is due (``delay_s``) or ``stop`` is set; True when stopped.

        A collector that can tell when it has news may return early (the runner then runs it at once).
        """
        return stop.wait(delay_s)

    def close(self) -> None:
        pass


@dataclass
class _Open:
    detail: str
    count: int = 1


@dataclass
class HealthTracker:
    """Per collector, the open problems; turns each run's problems into health events."""

    source: Source
    _open: dict[tuple[str, str], _Open] = field(default_factory=dict)

    def update(self, collector: str, problems: dict[str, str], now: datetime) -> list[AgentHealth]:
        out: list[AgentHealth] = []
        for key, detail in problems.items():
            k = (collector, key)
            if k in self._open:
                self._open[k].count += 1
            else:
                self._open[k] = _Open(detail)
                out.append(AgentHealth(event_time=now, source=self.source, collector=collector, status="failed",
                                       problem=key, detail=detail[:2000]))
        for (c, key) in [k for k in self._open if k[0] == collector and k[1] not in problems]:
            o = self._open.pop((c, key))
            out.append(AgentHealth(event_time=now, source=self.source, collector=collector, status="recovered",
                                   problem=key, detail=f"recovered after {o.count} failed run(s): {o.detail}"[:2000],
                                   occurrences=o.count))
        return out

    def open_problems(self) -> dict[tuple[str, str], Any]:
        return {k: v.detail for k, v in self._open.items()}
