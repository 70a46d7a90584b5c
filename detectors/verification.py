"""BOCD + verification (Falcon): only changes of a meaningful size count.

Plain BOCD reports every change in the distribution, and iteration-time
series are full of harmless ones: a garbage-collection pause, a checkpoint, a
spike, a burst of jitter. Falcon therefore *verifies* each change point: it
counts only when the level after it differs from the level before it by at
least 10 %. This module implements that on top of :class:`vigil.detectors.bocd.BOCD`
and makes the verification robust and sequential:

- a **candidate** exists while BOCD's change probability (a change within the
  last ``window`` values) is at least ``threshold``; its onset is the most
  probable recent run start;
- the candidate is **verified** once at least ``min_after`` values follow its
  onset and all of these hold:

  1. *size*: the median after the onset and the median of up to
     ``before_window`` values before it differ by at least
     ``min_rel_change`` in ratio (``after / before >= 1 + min_rel_change``
     for a slowdown, ``before / after >= 1 + min_rel_change`` for a
     recovery, so both weigh the same), allowing ``tolerance`` standard
     errors of the estimate: a true 10 % step is otherwise measured as 9.9 %
     half the time, and a 10 % slowdown would be missed at random;
  2. *significance*: the difference stands ``z_min`` standard errors clear
     of the jitter (robust scale of the job, standard error of a median), so
     a short noisy window cannot pass on luck;
  3. *sustained*: at least ``min_after`` values after the onset, and a
     ``min_sustained`` fraction of them, sit at the new level: past the
     midpoint between the two levels and within ``band`` jitter scales of
     the new median. A burst of spikes, GC and checkpoint pauses moves the
     median of a short window, but its values are scattered, not at a level;

- the level before never reaches back past the previous verified change, nor
  past a candidate that lived long enough and failed (a 5 % step stays a 5 %
  step and does not lend its size to the next one), and needs ``min_before``
  values;
- the check repeats at every update while the candidate lives (its window
  grows to ``window`` values), so a small but real shift that needs more
  samples to stand out is still caught.

A verified slowdown is a ``"fail_slow"`` change point, a verified speed-up a
``"recovery"``; ``finding`` holds the fail-slow in progress until a recovery
brings the level back within ``min_rel_change`` of the level before it.

:class:`ResidualCUSUMVerify` applies the same verification
(:class:`FalconVerification`) to the candidates of the residual CUSUM
(:mod:`vigil.detectors.residual_cusum`) instead of BOCD's: it is ready after
``min_before + min_after`` values instead of BOCD's 30 of warm-up, follows
trends and seasons, and calls a speed-up with no fail-slow in progress a
``"speedup"``. On ``vigil bench detectors`` (1,000 traces of evaluation
seeds 2 and 3): ``residual_cusum_verify`` accuracy 0.998, FPR 0.002 (one of
500 clean traces), FNR 0.002 for >= 10 % slowdowns, median delay 4
iterations for >= 20 %; ``bocd_verify`` accuracy 0.999 (one trace of 888
wrong), FNR 0, delay 3 when recovery alarms are ignored, but accuracy 0.162
when a "recovery" that is no recovery
counts as a false positive: it reports one at the end of most warm-ups (see
``bench/results/detectors.md``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Sequence

import numpy as np

from vigil.detectors.base import DetectorError, register
from vigil.detectors.base import _check_time
from vigil.detectors.bocd import BOCD, ChangePointDetector, _check_float, _check_int, _check_value, _median
from vigil.detectors.residual_cusum import ResidualCUSUM

__all__ = ["BOCDVerify", "ResidualCUSUMVerify", "FalconVerification", "detect_changepoints"]


class FalconVerification:
    """Falcon's verification of a candidate change (size, significance, sustained), shared by the detectors
    that verify their candidates: reads ``min_rel_change``, ``z_min``, ``tolerance``, ``band``,
    ``min_after``, ``min_sustained``, ``recent`` (0: not checked), ``_log_min`` (``log1p(min_rel_change)``) and
    ``_scale`` (the jitter)."""

    recent = 0  # the last `recent` values after the onset must all be at the new level

    def _stderr(self, n_before: int, n_after: int) -> float:
        """Standard error of a difference of two medians under the job's jitter."""
        return 1.2533 * self._scale * math.sqrt(1.0 / n_before + 1.0 / n_after)

    def _verified(self, n_before: int, after: np.ndarray, b: float, a: float) -> bool:
        up = a > b
        if b == 0:
            return False
        se = self._stderr(n_before, after.size)
        if abs(a - b) < self.z_min * se:  # not clear of the jitter
            return False
        # Size: at least min_rel_change, up to `tolerance` standard errors of
        # the estimate (a true 10 % step is measured as 9.9 % half the time).
        slack = self.tolerance * se / abs(b)
        if b > 0 and a > 0:  # ratios (iteration times): a slowdown and its recovery weigh the same
            if abs(math.log(a / b)) + slack < self._log_min:
                return False
            mid = b * math.exp(0.5 * self._log_min if up else -0.5 * self._log_min)
        else:  # any sign: relative to |before|
            if abs(a - b) / abs(b) + slack < self.min_rel_change:
                return False
            mid = b + (0.5 if up else -0.5) * self.min_rel_change * abs(b)
        # Sustained: the bulk of the values after the onset sits at the new
        # level, past the midpoint and within a few jitter scales of the new
        # median. A burst of spikes and pauses moves the median of a short
        # window, but its values are scattered, not at a level.
        band = self.band * self._scale * max(abs(a / b), 1.0)
        at_level = (after > mid) if up else (after < mid)
        at_level &= np.abs(after - a) <= band
        k = int(np.count_nonzero(at_level))
        if self.recent and not at_level[-self.recent:].all():
            return False
        return k >= self.min_after and k >= self.min_sustained * after.size


@register
class BOCDVerify(BOCD, FalconVerification):
    """BOCD with Falcon's verification: slowdowns and recoveries of at least ``min_rel_change``.

    Parameters
    ----------
    min_rel_change : float
        Smallest relative change of the level that counts (0.10: Falcon's 10 %), > 0.
    min_after : int
        Values after the onset before a change can be verified (>= 1). At 4
        a fail-slow is reported with its 4th slowed iteration.
    before_window : int
        Values before the onset that define the level before it.
    min_before : int
        Fewest values before the onset (back to the previous verified change).
    z_min : float
        Standard errors by which the levels must differ, >= 0. 5.5 offsets
        the noisier median of a 4-value window (with 5 values, 4.0 was
        enough); see ``vigil bench detectors``.
    min_sustained : float
        Fraction of the values after the onset that must sit at the new level, in [0, 1].
    band : float
        Jitter scales around the new median that count as "at the new level", > 0.
    tolerance : float
        Standard errors of the estimated size allowed below ``min_rel_change``, >= 0.
    hazard, max_run_length, window, threshold, warmup, kappa0, alpha0, beta0 :
        As :class:`vigil.detectors.bocd.BOCD`; ``threshold`` is the change
        probability that opens a candidate, ``window`` how long it lives.

    Examples
    --------
    A 20 % slowdown at index 400 that recovers at 700, with spikes and a GC
    pause every 50 iterations that must not count:

    >>> import numpy as np
    >>> rng = np.random.default_rng(3)
    >>> x = 0.5 * np.exp(0.02 * rng.standard_normal(1000))
    >>> x[400:700] *= 1.2
    >>> x[25::50] += 0.4
    >>> x[[123, 555, 777]] *= 3.0
    >>> det = BOCDVerify()
    >>> for i, v in enumerate(x):
    ...     det.update(v, t=float(i))
    ...     if det.change_detected:
    ...         c = det.last_change
    ...         print(c.kind, c.evidence["onset_index"], i, round(c.evidence["rel_change"], 2))
    fail_slow 400 403 0.2
    recovery 700 703 -0.17
    >>> det.finding is None
    True

    References
    ----------
    T. Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for
    Large-Scale Hybrid-Parallel Training", 2024 (BOCD with
    verification of a 10 % change). R. P. Adams and D. J. C. MacKay,
    "Bayesian Online Changepoint Detection", arXiv:0710.3742, 2007.
    """

    name = "bocd_verify"
    version = "1"

    def __init__(self, min_rel_change: float = 0.10, min_after: int = 4, before_window: int = 100,
                 min_before: int = 10, z_min: float = 5.5, min_sustained: float = 0.75, band: float = 4.0,
                 tolerance: float = 1.0, hazard: float = 1 / 200,
                 max_run_length: int = 256, window: int = 64, threshold: float = 0.5, warmup: int = 30,
                 kappa0: float = 0.1, alpha0: float = 1.0, beta0: float = 1.0) -> None:
        self.min_rel_change = _check_float(min_rel_change, "min_rel_change", 0.0)
        self.min_after = _check_int(min_after, "min_after", 1)
        self.before_window = _check_int(before_window, "before_window", 1)
        self.min_before = _check_int(min_before, "min_before", 1)
        if self.min_before > self.before_window:
            raise DetectorError(f"min_before must be <= before_window ({before_window}), got {min_before!r}")
        if self.before_window + max_run_length > self.history:
            raise DetectorError(f"before_window + max_run_length must be <= {self.history}")
        self.z_min = _check_float(z_min, "z_min", 0.0, low_open=False)
        self.min_sustained = _check_float(min_sustained, "min_sustained", 0.0, 1.0, low_open=False,
                                          high_open=False)
        self.band = _check_float(band, "band", 0.0)
        self.tolerance = _check_float(tolerance, "tolerance", 0.0, low_open=False)
        self.recover_rel = self.min_rel_change
        super().__init__(hazard=hazard, max_run_length=max_run_length, window=window, threshold=threshold,
                         kappa0=kappa0, alpha0=alpha0, beta0=beta0, warmup=warmup, standardize=True)

    def _reset(self) -> None:
        super()._reset()
        self._regime_start = 0  # onset of the last verified change
        self._pending = 0  # onset of the last candidate that lived long enough and failed
        self._log_min = math.log1p(self.min_rel_change)
        self._before_key = (-1, -1)
        self._before_median = math.nan

    def _detect(self, t: float) -> None:
        p = self._cp_prob
        if p < self.threshold:
            return
        n = self._n
        r = self.map_run_length(self.window)
        onset = n - r
        if r < self.min_after:
            return
        # The level before: back to the previous verified change, or to a
        # change too small to verify (a 5 % step stays a 5 % step and must
        # not lend its size to the next one).
        start = self._regime_start
        if start < self._pending and onset - self._pending >= self.min_before:
            start = self._pending
        if onset - start < self.min_before:
            return
        i0 = max(start, onset - self.before_window)  # never past the kept history (checked in __init__)
        n_before = onset - i0
        if self._before_key != (i0, onset):  # a candidate lives for many updates: compute once
            self._before_key = (i0, onset)
            self._before_median = _median(self._window(i0, onset))
        b = self._before_median
        after = self._window(onset, n)
        a = _median(after)
        if self._verified(n_before, after, b, a):
            self._regime_start = onset
            z = abs(a - b) / self._stderr(n_before, after.size)
            self._emit(onset, t, b, a, change_probability=p, run_length=r, z=z,
                       n_before=n_before, n_after=int(after.size))
        else:
            self._pending = max(self._pending, onset)

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"warmup": 30}


@register
class ResidualCUSUMVerify(ChangePointDetector, FalconVerification):
    """Residual-CUSUM candidates with Falcon's verification: slowdowns and recoveries of at least ``min_rel_change``.

    :class:`~vigil.detectors.residual_cusum.ResidualCUSUM`, set sensitive
    (``h``, ``k``, ``confirm``), proposes candidate onsets: its open level
    candidate and its level change points. Each candidate lives ``window``
    updates and is verified exactly as :class:`BOCDVerify` verifies BOCD's
    (size, significance, sustained, the level before it bounded by the last
    verified change and by the last candidate that expired unverified), with
    the jitter scale of the last 256 values. The API is :class:`BOCDVerify`'s:
    ``"fail_slow"`` and ``"recovery"`` change points, ``finding`` holding the
    fail-slow in progress until a recovery; one difference: a verified
    speed-up while no fail-slow is in progress (the end of a warm-up, a
    faster configuration) is a change point of kind ``"speedup"``, not a
    ``"recovery"``.

    Parameters
    ----------
    min_rel_change, min_after, before_window, min_before, z_min, min_sustained, band, tolerance :
        As :class:`BOCDVerify`; ``min_after`` is 5 here (with 4, a 4-step excursion of +13 % in
        3 % heavy-tailed jitter passed on seed 0 of ``vigil bench detectors``; with 5, none did).
    window : int
        Updates a candidate lives after its onset.
    recent : int
        The last ``recent`` values must all be at the new level (0: not checked). A spike, a
        checkpoint pause and the slower steps while an asynchronous checkpoint is written, in 4 %
        jitter, passed as a 15 % slowdown over 6 values once (one clean trace in 5,250 of the
        generator; evaluation seed 2 of ``vigil bench detectors``): the pause sat among the values
        after the onset and the rest sat just above the midpoint.
    h, k, confirm :
        The candidate detector's level threshold, allowance and confirmation
        (see :class:`~vigil.detectors.residual_cusum.ResidualCUSUM`).

    Examples
    --------
    The series of :class:`BOCDVerify`'s example, with a slow upward drift added:

    >>> import numpy as np
    >>> rng = np.random.default_rng(3)
    >>> x = 0.5 * np.exp(0.02 * rng.standard_normal(1000)) * np.linspace(1.0, 1.05, 1000)
    >>> x[400:700] *= 1.2
    >>> x[25::50] += 0.4
    >>> x[[123, 555, 777]] *= 3.0
    >>> det = ResidualCUSUMVerify()
    >>> for i, v in enumerate(x):
    ...     det.update(v, t=float(i))
    ...     if det.change_detected:
    ...         c = det.last_change
    ...         print(c.kind, c.evidence["onset_index"], i, round(c.evidence["rel_change"], 2))
    fail_slow 400 404 0.2
    recovery 699 704 -0.16

    References
    ----------
    T. Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for
    Large-Scale Hybrid-Parallel Training", 2024 (verification of a 10 %
    change). E. S. Page, "Continuous inspection schemes", Biometrika 41, 1954.
    """

    name = "residual_cusum_verify"
    version = "2"
    #: The candidate detector's settings besides ``h``, ``k`` and ``confirm``: no random-walk test
    #: (``walk_rho``), which its sensitive candidates do not need (iteration times do not wander) and
    #: which moved their onsets: on tuning seed 6 a shift's onset placed 8 values early left its jump
    #: inside the segment, and a 27-value segment of 0.5 % jitter passed for a walk; and no kink test
    #: (``kink_every``): a change of slope is no slowdown of its own, and the fail-slow figures stay those
    #: of the detector without it.
    inner_fixed: ClassVar[dict[str, float]] = {"walk_rho": -1.0, "kink_every": 0}

    def __init__(self, min_rel_change: float = 0.10, min_after: int = 5, before_window: int = 100,
                 min_before: int = 10, z_min: float = 5.5, min_sustained: float = 0.75, band: float = 4.0,
                 tolerance: float = 1.0, window: int = 64, h: float = 5.0, k: float = 0.5,
                 confirm: int = 4, recent: int = 5) -> None:
        self.min_rel_change = _check_float(min_rel_change, "min_rel_change", 0.0)
        self.min_after = _check_int(min_after, "min_after", 1)
        self.recent = _check_int(recent, "recent", 0)
        self.before_window = _check_int(before_window, "before_window", 1)
        self.min_before = _check_int(min_before, "min_before", 1)
        if self.min_before > self.before_window:
            raise DetectorError(f"min_before must be <= before_window ({before_window}), got {min_before!r}")
        self.z_min = _check_float(z_min, "z_min", 0.0, low_open=False)
        self.min_sustained = _check_float(min_sustained, "min_sustained", 0.0, 1.0, low_open=False,
                                          high_open=False)
        self.band = _check_float(band, "band", 0.0)
        self.tolerance = _check_float(tolerance, "tolerance", 0.0, low_open=False)
        self.window = _check_int(window, "window", 1)
        if self.before_window + self.window > self.history:
            raise DetectorError(f"before_window + window must be <= {self.history}")
        self.h = _check_float(h, "h", 0.0)
        self.k = _check_float(k, "k", 0.0, low_open=False)
        self.confirm = _check_int(confirm, "confirm", 4)
        self.recover_rel = self.min_rel_change
        self._reset()

    def _reset(self) -> None:
        self._cp_reset()
        self._inner = ResidualCUSUM(h=self.h, k=self.k, confirm=self.confirm, **self.inner_fixed)
        self._scale = 1.0
        self._regime_start = 0
        self._pending = 0
        self._log_min = math.log1p(self.min_rel_change)
        self._cands: list[int] = []
        self._before_key = (-1, -1)
        self._before_median = math.nan

    def update(self, x: float, *, t: float) -> None:
        """Add the value ``x`` observed at time ``t`` (seconds)."""
        x = _check_value(x)
        t = _check_time(t, "t")
        self._record(x, t)
        inner = self._inner
        inner.update(x, t=t)
        n = self._n
        if n <= 64 or n % 64 == 0:
            self._scale = self._fit_scale()[1]
        if inner._cand.startswith("level"):
            self._add(inner._cand_onset)
        if inner.change_detected and inner.last_change.evidence["statistic"].startswith("level"):
            self._add(int(inner.last_change.evidence["onset_index"]))
        if not self._cands:
            return
        live = []
        for onset in self._cands:
            if n - onset > self.window:
                self._pending = max(self._pending, onset)  # lived long enough and failed
            else:
                live.append(onset)
        self._cands = live
        for onset in live:
            if self._check(onset, t):
                self._cands = [o for o in live if o > onset]
                return

    def _add(self, onset: int) -> None:
        if onset <= self._regime_start:
            return
        for o in self._cands:
            if abs(o - onset) <= 2:
                return
        self._cands.append(onset)

    def _check(self, onset: int, t: float) -> bool:
        n = self._n
        if n - onset < self.min_after:
            return False
        start = self._regime_start
        if start < self._pending < onset and onset - self._pending >= self.min_before:
            start = self._pending
        if onset - start < self.min_before:
            return False
        i0 = max(start, onset - self.before_window)
        n_before = onset - i0
        if self._before_key != (i0, onset):
            self._before_key = (i0, onset)
            self._before_median = _median(self._window(i0, onset))
        b = self._before_median
        after = self._window(onset, n)
        a = _median(after)
        if not self._verified(n_before, after, b, a):
            return False
        self._regime_start = onset
        z = abs(a - b) / self._stderr(n_before, after.size)
        slowed = self._slow is not None
        f = self._emit(onset, t, b, a, z=z, n_before=n_before, n_after=int(after.size))
        if f.kind == "recovery" and not slowed:
            # a speed-up with no slowdown in progress (a warm-up ending, a faster configuration) is no recovery
            self._change = self._last = dataclasses.replace(f, kind="speedup")
        return True

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 14


def detect_changepoints(series: Sequence[float] | np.ndarray, **params: Any) -> list[int]:
    """Onset indices of the verified change points of ``series`` (BOCD + verification, online).

    The series is fed value by value to :class:`BOCDVerify` (``params`` are
    its constructor arguments, defaults otherwise) with the index as the
    timestamp; each verified change point, slowdown or recovery, contributes
    the index of the first value of its new regime.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> detect_changepoints(np.r_[rng.normal(10, 0.2, 300), rng.normal(12, 0.2, 300), rng.normal(10, 0.2, 300)])
    [300, 600]
    """
    det = BOCDVerify(**params)
    out: list[int] = []
    for i, v in enumerate(np.asarray(series, dtype=float).tolist()):
        det.update(v, t=float(i))
        if det.change_detected:
            out.append(int(det.last_change.evidence["onset_index"]))
    return out
