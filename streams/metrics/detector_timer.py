"""Detector cost: updates and ticks timed on a sample of the detector instances, as histograms."""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from typing import Any, Iterator

from prometheus_client.core import HistogramMetricFamily, Metric

#: Bucket bounds of the detector cost histograms, in seconds (1 µs to 1 s).
DETECTOR_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)


class _Histogram:
    """A histogram kept in plain Python (one list increment per observation, no lock)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DETECTOR_BUCKETS) + 1)
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(DETECTOR_BUCKETS, seconds)] += 1
        self.sum += seconds

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.sum
        out, running = [], 0
        for bound, n in zip(DETECTOR_BUCKETS, counts):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", running + counts[-1]))
        return out, total


class DetectorTimer:
    """Times detector updates and ticks on a sample of the detector instances.

    The detection engine calls it on each detector class it runs
    (:attr:`vigil.streams.engine.detection.EngineParams.instrument`); it
    returns a subclass whose ``for_key`` makes one instance in ``every`` (the
    first one always) a timed one and the others plain instances of the
    detector itself, which cost nothing more. A timed instance measures each
    ``observe`` (or its own ``observe_batch``) and ``tick`` with
    ``time.perf_counter`` into plain counters that Prometheus reads when it
    scrapes (``vigil_detector_update_seconds``, ``vigil_detector_tick_seconds``).
    The detectors know nothing of it and stay pure.
    """

    def __init__(self, every: int = 8) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.update: dict[str, _Histogram] = {}
        self.tick: dict[str, _Histogram] = {}
        self._made: dict[type, type] = {}

    def __call__(self, cls: type) -> type:
        made = self._made.get(cls)
        if made is None:
            made = self._made[cls] = self._timed(cls)
        return made

    def _timed(self, base: Any) -> type:
        from vigil.detectors import Detector  # (only where a worker runs detectors)

        update = self.update.setdefault(base.name, _Histogram())
        tick = self.tick.setdefault(base.name, _Histogram())
        every, serial = self.every, itertools.count()
        clock = time.perf_counter
        busy = [False]  # inside a timed call (an observe_batch calling observe is timed once)
        base_for_key = base.for_key.__func__
        base_observe, base_batch, base_tick = base.observe, base.observe_batch, base.tick

        def for_key(cls: type, key: str, **params: Any) -> Any:
            if next(serial) % every:
                return base.for_key(key, **params)  # a plain instance: no cost at all
            return base_for_key(cls, key, **params)

        def observe(self: Any, item: Any, *, t: float, context: Any = None) -> None:
            if busy[0]:
                return base_observe(self, item, t=t, context=context)
            busy[0] = True
            start = clock()
            try:
                base_observe(self, item, t=t, context=context)
            finally:
                update.add(clock() - start)
                busy[0] = False

        def observe_batch(self: Any, items: list[Any], *, t: float, context: Any = None) -> None:
            busy[0] = True
            start = clock()
            try:
                base_batch(self, items, t=t, context=context)
            finally:
                update.add(clock() - start)
                busy[0] = False

        def timed_tick(self: Any, now: float) -> None:
            start = clock()
            try:
                base_tick(self, now)
            finally:
                tick.add(clock() - start)

        namespace: dict[str, Any] = {"for_key": classmethod(for_key), "observe": observe,
                                     "__module__": __name__, "__doc__": base.__doc__}
        if base.observe_batch is not Detector.observe_batch:  # (the default one calls observe: timed there)
            namespace["observe_batch"] = observe_batch
        if base.tick is not Detector.tick:  # (the engine skips classes that keep the base tick)
            namespace["tick"] = timed_tick
        return type(f"Timed{base.__name__}", (base,), namespace)

    def families(self) -> Iterator[Metric]:
        for name, doc, hists in (
                ("vigil_detector_update_seconds", "Seconds a detector takes to take one input (or one message's "
                 "inputs for a key), on a sample of its instances.", self.update),
                ("vigil_detector_tick_seconds", "Seconds a detector's timer tick takes, on a sample of its "
                 "instances.", self.tick)):
            fam = HistogramMetricFamily(name, doc, labels=["detector"])
            for detector, hist in list(hists.items()):
                buckets, total = hist.buckets()
                if buckets[-1][1]:
                    fam.add_metric([detector], buckets, sum_value=total)
            yield fam
