"""Baseline change-point detectors, behind the same contract as BOCD.

- :class:`SlidingWindow` (``sliding_window``): Falcon's straightforward
  baseline, a move of more than 10 % away from the median of a sliding window;
- :class:`ADWINDetector` (``adwin``): river's ``drift.ADWIN``;
- :class:`PageHinkleyDetector` (``page_hinkley``): river's
  ``drift.PageHinkley``, one test for increases and one for decreases.

All three report change points as :class:`vigil.detectors.bocd.ChangePointDetector`
does (``change_detected``, ``last_change`` of kind ``"fail_slow"`` or
``"recovery"`` by the direction of the change, ``finding`` while slowed), are
silent for their first ``warmup`` updates, and snapshot through the base
class (river's detectors deep-copy and pickle).
"""

from __future__ import annotations

from typing import Any

from river import drift, stats

from vigil.detectors.base import DetectorError, _check_time, register
from vigil.detectors.bocd import ChangePointDetector, _check_float, _check_int, _check_value

__all__ = ["SlidingWindow", "ADWINDetector", "PageHinkleyDetector"]


def _check_warmup(warmup: Any) -> int:
    return _check_int(warmup, "warmup", 0)


@register
class SlidingWindow(ChangePointDetector):
    """A change when ``persistence`` consecutive values sit more than ``min_rel_change`` off the window median.

    The reference is the running median of the last ``window`` values
    (river's ``RollingQuantile``). A value above ``median * (1 + min_rel_change)``
    (or below ``median / (1 + min_rel_change)``) is a move; ``persistence``
    consecutive moves in the same direction are a change point whose onset is
    the first of them. The window then restarts from those values (the new
    regime) and is used again once it holds ``min_window`` values.

    Parameters
    ----------
    window : int
        Values in the reference median.
    min_rel_change : float
        Relative move that counts (Falcon: 10 %), > 0.
    persistence : int
        Consecutive moves needed (1: Falcon's literal rule, which fires on any spike).
    min_window : int
        Values the window must hold before it is used, 1 <= min_window <= window.
    warmup : int
        Updates during which nothing is reported.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = np.r_[rng.normal(1.0, 0.01, 200), rng.normal(1.25, 0.01, 100)]
    >>> det = SlidingWindow()
    >>> for i, v in enumerate(x):
    ...     det.update(v, t=float(i))
    ...     if det.change_detected:
    ...         print(i, det.onset_index, det.last_change.kind)
    202 200 fail_slow

    References
    ----------
    T. Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for
    Large-Scale Hybrid-Parallel Training", 2024 (the sliding-window baseline).
    """

    name = "sliding_window"
    version = "1"

    def __init__(self, window: int = 50, min_rel_change: float = 0.10, persistence: int = 3,
                 min_window: int = 10, warmup: int = 30) -> None:
        self.window = _check_int(window, "window", 1)
        self.min_rel_change = _check_float(min_rel_change, "min_rel_change", 0.0)
        self.persistence = _check_int(persistence, "persistence", 1)
        self.min_window = _check_int(min_window, "min_window", 1)
        if self.min_window > self.window:
            raise DetectorError(f"min_window must be <= window ({window}), got {min_window!r}")
        self.warmup = _check_warmup(warmup)
        self.recover_rel = self.min_rel_change
        self._reset()

    def _reset(self) -> None:
        self._cp_reset()
        self._median = stats.RollingQuantile(q=0.5, window_size=self.window)
        self._filled = 0
        self._run = 0  # signed count of consecutive moves (+ up, - down)

    def update(self, x: float, *, t: float) -> None:
        """Add the value ``x`` observed at time ``t`` (seconds)."""
        x = _check_value(x)
        t = _check_time(t, "t")
        self._record(x, t)
        if self._filled >= self.min_window:
            ref = self._median.get()
            hi = ref * (1.0 + self.min_rel_change) if ref >= 0 else ref / (1.0 + self.min_rel_change)
            lo = ref / (1.0 + self.min_rel_change) if ref >= 0 else ref * (1.0 + self.min_rel_change)
            if x > hi:
                self._run = self._run + 1 if self._run > 0 else 1
            elif x < lo:
                self._run = self._run - 1 if self._run < 0 else -1
            else:
                self._run = 0
            if abs(self._run) >= self.persistence:
                onset = self._n - abs(self._run)
                self._run = 0
                if self._n > self.warmup:
                    after = float(sorted(self._window(onset, self._n))[self.persistence // 2])
                    self._emit(onset, t, ref, after)
                # The new regime becomes the reference.
                self._median = stats.RollingQuantile(q=0.5, window_size=self.window)
                self._filled = 0
                for v in self._window(onset, self._n):
                    self._median.update(float(v))
                    self._filled += 1
                return
        self._median.update(x)
        self._filled += 1

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"warmup": 30}

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 30


@register
class ADWINDetector(ChangePointDetector):
    """River's ADWIN (adaptive windowing) as a change-point detector.

    ADWIN keeps a window of recent values and drops its older part when the
    means of the two parts differ by more than a Hoeffding-style bound at
    confidence ``delta``; the onset is the start of the window it keeps
    (``index - width + 1``). Values are fed as they are (ADWIN's bound uses the
    observed variance, so the scale does not matter).

    Parameters
    ----------
    delta : float
        Confidence of the cut, in (0, 1) (river default 0.002).
    clock : int
        How often (updates) ADWIN checks for a cut.
    warmup : int
        Updates during which nothing is reported.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = np.r_[rng.normal(1.0, 0.01, 200), rng.normal(1.25, 0.01, 100)]
    >>> det = ADWINDetector()
    >>> for i, v in enumerate(x):
    ...     det.update(v, t=float(i))
    ...     if det.change_detected:
    ...         print(i, det.onset_index, det.last_change.kind)
    255 96 fail_slow

    References
    ----------
    A. Bifet and R. Gavaldà, "Learning from Time-Changing Data with Adaptive
    Windowing", SDM 2007. river ``drift.ADWIN``.
    """

    name = "adwin"
    version = "1"

    def __init__(self, delta: float = 0.002, clock: int = 32, warmup: int = 30) -> None:
        self.delta = _check_float(delta, "delta", 0.0, 1.0)
        self.clock = _check_int(clock, "clock", 1)
        self.warmup = _check_warmup(warmup)
        self._reset()

    def _reset(self) -> None:
        self._cp_reset()
        self._adwin = drift.ADWIN(delta=self.delta, clock=self.clock)

    def update(self, x: float, *, t: float) -> None:
        """Add the value ``x`` observed at time ``t`` (seconds)."""
        x = _check_value(x)
        t = _check_time(t, "t")
        self._record(x, t)
        self._adwin.update(x)
        if self._adwin.drift_detected and self._n > self.warmup:
            onset = self._n - int(self._adwin.width)
            b, a = self._levels(onset)
            self._emit(onset, t, b, a, width=int(self._adwin.width))

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"warmup": 30}

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 30


@register
class PageHinkleyDetector(ChangePointDetector):
    """River's Page-Hinkley test as a change-point detector.

    Two one-sided tests (``mode="up"`` and ``"down"``) run on the values
    standardised by the robust location and scale learnt during ``warmup``
    (then fixed: moving them would look like a change to the test), so ``threshold`` and ``delta`` are in units of the
    job's jitter rather than seconds (river's defaults assume unit-scale data).
    Page-Hinkley says *when* it is sure, not where the change began: the onset
    reported is the detecting update.

    Parameters
    ----------
    threshold : float
        Detection threshold (lambda) in jitter units, > 0.
    delta : float
        Magnitude of changes tolerated, in jitter units, >= 0.
    alpha : float
        Forgetting factor of the running mean, in (0, 1].
    min_instances : int
        Values before a test may fire (after each detection, too).
    warmup : int
        Updates that learn the scale; nothing is reported meanwhile (>= 2).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = np.r_[rng.normal(1.0, 0.01, 200), rng.normal(1.25, 0.01, 100)]
    >>> det = PageHinkleyDetector()
    >>> for i, v in enumerate(x):
    ...     det.update(v, t=float(i))
    ...     if det.change_detected:
    ...         print(i, det.onset_index, det.last_change.kind)
    200 200 fail_slow

    References
    ----------
    E. S. Page, "Continuous Inspection Schemes", Biometrika 41, 1954.
    river ``drift.PageHinkley``.
    """

    name = "page_hinkley"
    version = "1"

    def __init__(self, threshold: float = 50.0, delta: float = 0.005, alpha: float = 1 - 0.0001,
                 min_instances: int = 30, warmup: int = 30) -> None:
        self.threshold = _check_float(threshold, "threshold", 0.0)
        self.delta = _check_float(delta, "delta", 0.0, low_open=False)
        self.alpha = _check_float(alpha, "alpha", 0.0, 1.0, high_open=False)
        self.min_instances = _check_int(min_instances, "min_instances", 1)
        self.warmup = _check_int(warmup, "warmup", 2)
        self._reset()

    def _new_tests(self) -> None:
        kw = dict(min_instances=self.min_instances, delta=self.delta, threshold=self.threshold, alpha=self.alpha)
        self._up = drift.PageHinkley(mode="up", **kw)
        self._down = drift.PageHinkley(mode="down", **kw)

    def _reset(self) -> None:
        self._cp_reset()
        self._new_tests()
        self._center = 0.0
        self._scale = 1.0

    def update(self, x: float, *, t: float) -> None:
        """Add the value ``x`` observed at time ``t`` (seconds)."""
        x = _check_value(x)
        t = _check_time(t, "t")
        self._record(x, t)
        n = self._n
        if n < self.warmup:
            return
        if n == self.warmup:
            self._center, self._scale = self._fit_scale()
        y = (x - self._center) / self._scale
        self._up.update(y)
        self._down.update(y)
        up, down = self._up.drift_detected, self._down.drift_detected
        if up or down:
            onset = n - 1
            b, _ = self._levels(onset)
            self._emit(onset, t, b, x, up=up)
            self._new_tests()

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"warmup": 30}

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 30
