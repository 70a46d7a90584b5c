"""Bayesian online change-point detection (Adams & MacKay 2007), bounded and fast.

The model: observations are Gaussian with unknown mean and variance under a
Normal-Gamma prior, so each run-length hypothesis predicts the next value with
a Student-t; the hazard of a change is constant. Everything is computed in log
space, and the run-length posterior is truncated to the ``max_run_length``
most recent hypotheses, so one update costs a fixed number of vectorised numpy
operations on an array of at most ``max_run_length`` entries. Truncation
merges the probability of the longest run into the next longest one (they
have seen the same last ``max_run_length - 1`` values), so a long stable
regime keeps its mass: the last hypothesis stands for "``max_run_length - 1``
or more", a sliding-window model of the current regime.

Layout trick: hypotheses are stored by the index at which their run started,
oldest first, so a new run is an *append* and pruning is ``start += 1``; the
quantities that depend only on the run length (kappa, alpha and the
normalising constants of the Student-t) are precomputed once and sliced, never
recomputed. Only the mean and the scale of each hypothesis move with the data.

This module also holds :class:`ChangePointDetector`, the small shared base of
every change-point detector (BOCD, BOCD + verification and the baselines): it
keeps the recent values and timestamps, turns a detected change into a
:class:`~vigil.detectors.base.Finding` of kind ``"fail_slow"`` (the level went up) or
``"recovery"`` (it went down), and tracks whether the job is currently slowed.
"""

from __future__ import annotations

import math
import random
from typing import Any, ClassVar

import numpy as np
from scipy.special import gammaln

from vigil.detectors.base import Detector, DetectorError, Finding, _check_time, register
from vigil.detectors.segfit import median as _median

__all__ = ["BOCD", "ChangePointDetector"]

_LOG_2PI = math.log(2.0 * math.pi)


def _check_int(value: Any, what: str, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise DetectorError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_float(value: Any, what: str, low: float | None = None, high: float | None = None,
                 low_open: bool = True, high_open: bool = True) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        brackets = ("(" if low_open else "[") + f"{lo}, {hi}" + (")" if high_open else "]")
        raise DetectorError(f"{what} must be a finite number in {brackets}, got {value!r}")
    return float(value)


def _check_value(value: Any, what: str = "x") -> float:
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool) \
            or not math.isfinite(value):
        raise DetectorError(f"{what} must be a finite number, got {value!r}")
    return float(value)


class ChangePointDetector(Detector):
    """Shared results and history of the univariate change-point detectors.

    Subclasses call :meth:`_cp_reset` from ``_reset`` and :meth:`_record`
    at the top of ``update``, and :meth:`_emit` when they detect a change.

    Results (read-only):

    ``change_detected``
        ``True`` on the update at which a change point was detected (as
        river's ``drift_detected``).
    ``last_change``
        The :class:`Finding` of the most recent change point: ``kind`` is
        ``"fail_slow"`` when the level after the onset is above the level
        before, ``"recovery"`` when it is below; ``onset`` is the timestamp of
        the first sample of the new regime, ``detected_at`` the timestamp of
        the update that detected it; the evidence holds ``onset_index`` (0-based
        count of updates), ``index`` (the detecting update), ``before`` and
        ``after`` (robust levels), ``rel_change`` (``after / before - 1``).
    ``finding``
        The fail-slow in progress: the first ``"fail_slow"`` change point not
        yet followed by a ``"recovery"`` that brought the level back within
        ``recover_rel`` of the level before the slowdown; ``None`` when the job
        runs at its normal speed.
    ``onset`` / ``onset_index``
        Shortcuts to the last change point's onset (``None`` before any).
    """

    #: Values and timestamps kept for onsets and before/after levels.
    history: ClassVar[int] = 1024
    #: Samples before an onset that define the level "before" a change.
    level_window: ClassVar[int] = 100
    #: A recovery clears the fail-slow when the level is back within this of the baseline.
    recover_rel: float = 0.10
    #: Values in the robust scale estimate (:meth:`_fit_scale`).
    scale_window: ClassVar[int] = 256

    def _cp_reset(self) -> None:
        self._n = 0
        self._vals = np.zeros(self.history)
        self._times = np.zeros(self.history)
        self._change: Finding | None = None
        self._last: Finding | None = None
        self._slow: Finding | None = None
        self._baseline: float | None = None

    # -- history -----------------------------------------------------------
    def _record(self, x: float, t: float) -> None:
        """Store the value and time of the update about to be processed."""
        j = self._n % self.history
        self._vals[j] = x
        self._times[j] = t
        self._n += 1
        self._change = None

    def _window(self, i0: int, i1: int) -> np.ndarray:
        """Values of updates ``i0 .. i1 - 1`` (clipped to what is kept)."""
        i0 = max(i0, self._n - self.history, 0)
        i1 = min(i1, self._n)
        if i1 <= i0:
            return np.empty(0)
        return self._vals[np.arange(i0, i1) % self.history]

    def _time_at(self, index: int) -> float:
        index = min(max(index, self._n - self.history, 0), self._n - 1)
        return float(self._times[index % self.history])

    def _levels(self, onset_index: int, start: int = 0) -> tuple[float, float]:
        """Robust levels (medians) before and after ``onset_index``."""
        before = self._window(max(start, onset_index - self.level_window), onset_index)
        after = self._window(onset_index, self._n)
        b = _median(before) if before.size else math.nan
        a = _median(after) if after.size else math.nan
        return b, a

    def _fit_scale(self) -> tuple[float, float]:
        """Robust location and scale of the last ``scale_window`` values.

        Location: the median. Scale: 1.4826 x the median absolute first
        difference / sqrt 2, which a level shift (one large difference) or a
        spike (two) barely moves; the mean absolute difference when over half
        the differences are 0; never below 1e-6 of the location.
        """
        v = self._window(self._n - self.scale_window, self._n)
        c = _median(v)
        d = np.abs(np.diff(v))
        s = 1.4826 * float(np.median(d)) / math.sqrt(2.0) if d.size else 0.0
        if not s > 0 and d.size:
            s = 1.2533 * float(np.mean(d)) / math.sqrt(2.0)
        s = max(s, 1e-6 * abs(c), 1e-12)
        return c, s

    def _emit(self, onset_index: int, t: float, before: float, after: float, *, up: bool | None = None,
              **evidence: Any) -> Finding:
        """Record a change point whose new regime starts at ``onset_index``.

        ``up``: the direction when the detector knows it, else ``after > before``.
        """
        if up is None:
            up = after > before
        rel = after / before - 1.0 if before != 0 and math.isfinite(before) and math.isfinite(after) else math.nan
        ev = {"onset_index": int(onset_index), "index": self._n - 1, "before": before, "after": after,
              "rel_change": rel}
        ev.update(evidence)
        f = Finding(kind="fail_slow" if up else "recovery", severity=3, onset=self._time_at(onset_index),
                    detected_at=t, evidence=ev)
        self._change = f
        self._last = f
        if up:
            if self._slow is None:
                self._slow = f
                self._baseline = before
        elif self._slow is not None and self._baseline is not None and \
                after <= self._baseline * (1.0 + self.recover_rel):
            self._slow = None
            self._baseline = None
        return f

    # -- results -----------------------------------------------------------
    @property
    def n_updates(self) -> int:
        return self._n

    @property
    def change_detected(self) -> bool:
        return self._change is not None

    @property
    def last_change(self) -> Finding | None:
        return self._last

    @property
    def onset(self) -> float | None:
        return None if self._last is None else self._last.onset

    @property
    def onset_index(self) -> int | None:
        return None if self._last is None else int(self._last.evidence["onset_index"])

    @property
    def finding(self) -> Finding | None:
        return self._slow

    # -- conformance -------------------------------------------------------
    @classmethod
    def _conformance_feed(cls, seed: int):
        """Healthy iteration times: 1 s +- 2 % Gaussian jitter, 400 updates."""
        rng = random.Random(seed)
        t = 0.0
        calls = []
        for _ in range(400):
            d = 1.0 * (1.0 + 0.02 * rng.gauss(0.0, 1.0))
            t += d
            calls.append(("update", (d,), {"t": t}))
        return calls


@register
class BOCD(ChangePointDetector):
    """Bayesian online change-point detection with bounded run length.

    Each value is first standardised, ``y = (x - center) / scale``, by a robust
    running location and scale (median of the last 256 values and 1.4826 x the
    median absolute first difference / sqrt 2, refreshed every 64 updates and
    learnt from the first ``warmup`` values), so the default prior suits any
    iteration-time scale, from milliseconds to minutes. The posterior over run
    lengths is then updated exactly as Adams & MacKay (2007), in log space,
    truncated to ``max_run_length`` hypotheses.

    The *change probability* is the posterior mass of a change within the last
    ``window`` updates, ``P(r_t <= window)``, where the run length ``r_t``
    counts the values seen since the change (``r_t = 0``: a change right
    after the latest value). A change point is reported on the update at
    which it rises above ``threshold``; its **onset** is the first value of the
    new regime, ``index - r* + 1`` with ``r*`` the most probable run length in
    ``1..window``. No verification: every such change point is reported (see
    :class:`vigil.detectors.verification.BOCDVerify` for the Falcon-verified one).

    Parameters
    ----------
    hazard : float
        Prior probability of a change at each step (1 / expected run length), in (0, 1).
    max_run_length : int
        Run-length hypotheses kept (time and memory per update are O(this)).
    window : int
        Run lengths up to this count as a recent change, 1 <= window < max_run_length.
    threshold : float
        Change probability that reports a change point, in (0, 1).
    mu0, kappa0, alpha0, beta0 : float
        Normal-Gamma prior in standardised units (kappa0, alpha0, beta0 > 0).
    warmup : int
        Values used to learn the scale before the model starts; silent meanwhile.
    standardize : bool
        Standardise by the robust running scale (``False``: use values as they are).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> series = np.r_[rng.normal(1.0, 0.02, 300), rng.normal(1.3, 0.02, 200)]
    >>> det = BOCD()
    >>> for t, x in enumerate(series):
    ...     det.update(x, t=float(t))
    ...     if det.change_detected:
    ...         print(t, det.onset_index, det.last_change.kind)
    300 300 fail_slow
    >>> det.change_probability < 0.5, det.map_run_length()
    (True, 200)

    References
    ----------
    R. P. Adams and D. J. C. MacKay, "Bayesian Online Changepoint Detection",
    arXiv:0710.3742, 2007. K. P. Murphy, "Conjugate Bayesian analysis of the
    Gaussian distribution", 2007 (Normal-Gamma posterior and Student-t
    predictive).
    """

    name = "bocd"
    version = "1"

    #: How often (updates) the robust scale is refreshed.
    rescale_every: ClassVar[int] = 64

    def __init__(self, hazard: float = 1 / 1000, max_run_length: int = 256, window: int = 30,
                 threshold: float = 0.9, mu0: float = 0.0, kappa0: float = 0.1, alpha0: float = 1.0,
                 beta0: float = 1.0, warmup: int = 30, standardize: bool = True) -> None:
        self.hazard = _check_float(hazard, "hazard", 0.0, 1.0)
        self.max_run_length = _check_int(max_run_length, "max_run_length", 2)
        self.window = _check_int(window, "window", 1)
        if self.window >= self.max_run_length:
            raise DetectorError(f"window must be < max_run_length ({self.max_run_length}), got {window!r}")
        self.threshold = _check_float(threshold, "threshold", 0.0, 1.0)
        self.mu0 = _check_float(mu0, "mu0")
        self.kappa0 = _check_float(kappa0, "kappa0", 0.0)
        self.alpha0 = _check_float(alpha0, "alpha0", 0.0)
        self.beta0 = _check_float(beta0, "beta0", 0.0)
        self.warmup = _check_int(warmup, "warmup", 2)
        if not isinstance(standardize, bool):
            raise DetectorError(f"standardize must be a bool, got {standardize!r}")
        self.standardize = standardize
        self._reset()

    # -- state ---------------------------------------------------------------
    def _reset(self) -> None:
        self._cp_reset()
        R = self.max_run_length
        r = np.arange(R, dtype=float)
        kappa = self.kappa0 + r
        alpha = self.alpha0 + r / 2.0
        # Tables indexed by run length, stored reversed: hypotheses are kept
        # oldest (longest run) first, so a window of n runs is table[R - n:].
        self._t_kp = (kappa / (2.0 * (kappa + 1.0)))[::-1].copy()
        self._t_w = (1.0 / (kappa + 1.0))[::-1].copy()
        self._t_alpha = alpha[::-1].copy()
        self._t_aplus = (alpha + 0.5)[::-1].copy()
        self._t_c = (gammaln(alpha + 0.5) - gammaln(alpha) - 0.5 * (_LOG_2PI + np.log((kappa + 1.0) / kappa)))[::-1].copy()
        cap = 2 * R
        self._mu = np.zeros(cap)
        self._beta = np.zeros(cap)
        self._logbeta = np.zeros(cap)
        self._lr = np.zeros(cap)
        self._s = 0
        self._e = 0
        self._log_h = math.log(self.hazard)
        self._log_1mh = math.log1p(-self.hazard)
        self._center = 0.0
        self._scale = 1.0
        self._started = False
        self._cp_prob = 0.0
        self._armed = False  # armed once the change probability has been low
        self._push_prior()

    def _push_prior(self) -> None:
        if self._e == self._mu.shape[0]:  # compact: move the live window to the front
            n = self._e - self._s
            for a in (self._mu, self._beta, self._logbeta, self._lr):
                a[:n] = a[self._s:self._e]
            self._s, self._e = 0, n
        e = self._e
        self._mu[e] = self.mu0
        self._beta[e] = self.beta0
        self._logbeta[e] = math.log(self.beta0)
        # The first hypothesis ever carries all the mass; later ones the hazard.
        self._lr[e] = self._log_h if e > self._s else 0.0
        self._e = e + 1
        if self._e - self._s > self.max_run_length:
            # Truncate: the longest run joins the next longest (both have seen
            # the last max_run_length - 1 values), so its mass is kept.
            s = self._s
            a, b = self._lr[s], self._lr[s + 1]
            hi = max(a, b)
            self._lr[s + 1] = hi + math.log(math.exp(a - hi) + math.exp(b - hi))
            self._s = s + 1

    def _rescale(self) -> None:
        c, s = self._fit_scale()
        a = self._scale / s
        b = (self._center - c) / s
        sl = slice(self._s, self._e - 1)  # the newest entry is the untouched prior
        self._mu[sl] *= a
        self._mu[sl] += b
        self._beta[sl] *= a * a
        self._logbeta[sl] += 2.0 * math.log(a)
        self._center, self._scale = c, s

    # -- inputs ----------------------------------------------------------------
    def update(self, x: float, *, t: float) -> None:
        """Add the value ``x`` observed at time ``t`` (seconds)."""
        x = _check_value(x)
        t = _check_time(t, "t")
        self._record(x, t)
        n = self._n
        if not self._started:
            if n < self.warmup:
                return
            self._started = True
            if self.standardize:
                self._center, self._scale = self._fit_scale()
            for v in self._window(0, n):
                self._step(float(v))
            return
        if self.standardize and n % self.rescale_every == 0:
            self._rescale()
        self._step(x)
        self._detect(t)

    def _detect(self, t: float) -> None:
        """Report a change point when the change probability rises above ``threshold``."""
        p = self._cp_prob
        if p >= self.threshold:
            if self._armed:
                self._armed = False
                r = self.map_run_length(self.window)
                onset = self._n - r
                b, a = self._levels(onset)
                self._emit(onset, t, b, a, change_probability=p, run_length=r)
        else:
            self._armed = True

    def _step(self, x: float) -> None:
        """One Adams-MacKay update of the run-length posterior with raw value ``x``."""
        y = (x - self._center) / self._scale
        s, e = self._s, self._e
        k = self.max_run_length - (e - s)
        mu = self._mu[s:e]
        beta = self._beta[s:e]
        lb = self._logbeta[s:e]
        lr = self._lr[s:e]
        d = y - mu
        u = d * d
        u *= self._t_kp[k:]
        d *= self._t_w[k:]
        # log Student-t predictive: c + alpha log(beta) - (alpha + 1/2) log(beta + u)
        lr += self._t_c[k:]
        lr += self._t_alpha[k:] * lb
        beta += u
        np.log(beta, out=lb)
        lr -= self._t_aplus[k:] * lb
        mu += d
        m = lr.max()
        p = np.exp(lr - m)
        total = float(p.sum())
        lr -= m + math.log(total) - self._log_1mh
        self._cp_prob = self.hazard + (1.0 - self.hazard) * float(p[-self.window:].sum()) / total
        self._push_prior()

    # -- results ---------------------------------------------------------------
    @property
    def change_probability(self) -> float:
        """Posterior probability that a change happened within the last ``window`` values."""
        return self._cp_prob

    def run_length_posterior(self) -> np.ndarray:
        """``P(r_t = r)`` for ``r = 0, 1, ...`` (at most ``max_run_length`` entries)."""
        lr = self._lr[self._s:self._e][::-1]
        p = np.exp(lr - lr.max())
        return p / p.sum()

    def map_run_length(self, limit: int | None = None) -> int:
        """Most probable run length, among ``1..limit`` when ``limit`` is given."""
        lr = self._lr[self._s:self._e]
        if limit is None:
            return int(lr.shape[0] - 1 - int(np.argmax(lr)))
        tail = lr[-(limit + 1):-1]  # run lengths limit .. 1
        if tail.size == 0:
            return 0
        return int(tail.shape[0] - int(np.argmax(tail)))

    @property
    def scale(self) -> tuple[float, float]:
        """``(center, scale)`` of the current standardisation."""
        return self._center, self._scale

    # -- conformance -------------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"warmup": 30}

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 30
