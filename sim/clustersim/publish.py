"""Publish a simulation's events to Kafka in accelerated time (the demo, end-to-end tests).

:class:`AcceleratedPublisher` is a tap for :func:`vigil.sim.clustersim.simulate`:
it receives every event the run produces (the probes' telemetry, alerts,
decisions, action results, job and node states) with the simulated time it
was produced at, and hands each to a :class:`vigil.producers.publisher.Publisher`
(one event per message, routed to its topic and keyed as the live producers
do) no sooner than ``(sim_time - first_sim_time) / speedup`` seconds after the
first one: a day of cluster time plays in ``86400 / speedup`` seconds.

Events keep the timestamps of the simulated clock (``t0`` of the run); a
live worker that should re-detect from the published telemetry needs ``t0``
near the wall clock and ``speedup = 1`` (it ignores events older than its
``max_event_age_s``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Protocol, Sequence

from vigil.schemas import Envelope

__all__ = ["AcceleratedPublisher"]


class _Publishes(Protocol):
    def publish(self, events: Sequence[Envelope]) -> None: ...


class AcceleratedPublisher:
    """A simulation tap that publishes at ``speedup`` x simulated time.

    Parameters
    ----------
    publisher : Publisher
        Anything with ``publish(events)`` (one event per call is used).
    speedup : float
        Simulated seconds per wall-clock second (> 0).
    kinds : set of str, optional
        Event types to publish (``None``: all).
    clock, sleep : callable
        Monotonic clock and sleep (injectable for tests).
    """

    def __init__(self, publisher: _Publishes, speedup: float = 3600.0, kinds: set[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.publisher = publisher
        self.speedup = speedup
        self.kinds = kinds
        self._clock = clock
        self._sleep = sleep
        self._origin: tuple[float, float] | None = None  # (first sim time, wall time then)
        self.published: Counter[str] = Counter()

    def __call__(self, sim_time: float, events: list[Envelope]) -> None:
        if self._origin is None:
            self._origin = (sim_time, self._clock())
        t_sim, t_wall = self._origin
        due = t_wall + (sim_time - t_sim) / self.speedup
        wait = due - self._clock()
        if wait > 0:
            self._sleep(wait)  # pacing a playback: the point is to take this long
        for e in events:
            kind = e.event_type  # type: ignore[attr-defined]
            if self.kinds is not None and kind not in self.kinds:
                continue
            self.publisher.publish([e])
            self.published[kind] += 1
