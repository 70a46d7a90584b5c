"""Iteration period and iteration time from a process's collective calls (Falcon's tracking).

Training is iterative, so the sequence of collective calls a process issues
(``all_gather`` on the tp group, ``send`` on the pp group, ``reduce_scatter``
on the dp group, ...) repeats once per iteration, whatever the framework.
Falcon finds that period with the autocorrelation function of the call
sequence: the first lag whose ACF reaches 0.95. The iteration time follows
from the timestamps: a call and the call one period later are the same call
of consecutive iterations.

The ACF of a sequence of symbols is computed on its one-hot encoding (the
Pearson autocorrelation summed over symbols), normalised per lag by the
number of pairs, so an exactly periodic sequence has ACF 1 at its period
whatever the lag. FFTs keep it O(n log n) per symbol.

A refinement over the plain first-lag rule (``refine=True``, the default):
per-layer collectives repeat inside an iteration, so a *sub-period* (e.g. the
two tp collectives of one layer) can reach 0.95 before the true period, which
reaches ~1.0. Among the lags at or above the threshold we take the smallest
one within ``tol`` of the best. ``refine=False`` is Falcon's rule verbatim.

Occasional extra calls (a logging all-reduce every N iterations) shift the
sequence by one call and lower the ACF at the true period while they are in
the window; the detector then keeps its last period and iteration time, and
reports ``iteration_period_lost`` only when no period has been found for
``lost_after`` calls.

References
----------
Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for Large-Scale
Hybrid-Parallel Training" (2024), framework-agnostic iteration tracking
(ACF >= 0.95; 0.1-1.2 % iteration-time error).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Hashable, Iterable, Sequence

import numpy as np

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.detectors.inputs import Progress
from vigil.schemas import CollectiveCall, to_seconds

__all__ = ["acf", "acf_period", "iteration_time_from_period", "IterationPeriod"]


def _codes(symbols: Sequence[Hashable]) -> np.ndarray:
    ids: dict[Hashable, int] = {}
    return np.fromiter((ids.setdefault(s, len(ids)) for s in symbols), dtype=np.int64, count=len(symbols))


def acf(symbols: Sequence[Hashable] | np.ndarray, max_lag: int | None = None) -> np.ndarray:
    """ACF of a symbol sequence at lags ``0..max_lag`` (one-hot Pearson, per-lag normalised).

    >>> a = acf(list("abcabcabcabc"), 4)
    >>> [round(float(v), 2) for v in a]
    [1.0, -0.5, -0.5, 1.0, -0.5]
    """
    codes = symbols if isinstance(symbols, np.ndarray) and symbols.dtype.kind in "iu" else _codes(list(symbols))
    n = len(codes)
    if n < 2:
        raise DetectorError("the ACF needs at least two symbols")
    if max_lag is None:
        max_lag = n // 2
    max_lag = int(min(max_lag, n - 1))
    nsym = int(codes.max()) + 1
    size = 1 << int(np.ceil(np.log2(2 * n)))
    num = np.zeros(max_lag + 1)
    var = 0.0
    for j in range(nsym):
        x = (codes == j).astype(float)
        x -= x.mean()
        var += float(x @ x) / n
        f = np.fft.rfft(x, size)
        num += np.fft.irfft(f * np.conj(f), size)[: max_lag + 1]
    if var <= 0:
        return np.ones(max_lag + 1)  # one symbol repeated: every lag is a period
    pairs = n - np.arange(max_lag + 1)
    return (num / pairs) / var


def acf_period(
    symbols: Sequence[Hashable] | np.ndarray,
    threshold: float = 0.95,
    refine: bool = True,
    tol: float = 0.01,
    max_lag: int | None = None,
    min_lag: int = 1,
) -> int | None:
    """The recurring period (in calls) of a symbol sequence, or None.

    ``refine=False``: Falcon's rule, the first lag with ACF >= ``threshold``.
    ``refine=True``: among lags at or above ``threshold``, the smallest within
    ``tol`` of the best (skips sub-periods of the iteration).

    >>> it = ["ag|tp", "rs|tp"] * 6 + ["send|pp", "rs|dp", "rs|dp", "ar|world"]
    >>> acf_period(it * 6)
    16
    >>> acf_period(list("abcd" * 3 + "xyz"))  # fewer than two periods: none
    """
    codes = symbols if isinstance(symbols, np.ndarray) and symbols.dtype.kind in "iu" else _codes(list(symbols))
    n = len(codes)
    if n < 4:
        return None
    a = acf(codes, max_lag if max_lag is not None else n // 2)
    lags = np.flatnonzero(a[min_lag:] >= threshold) + min_lag
    lags = lags[lags >= 1]
    if lags.size == 0:
        return None
    if not refine:
        return int(lags[0])
    best = float(a[lags].max())
    return int(lags[np.flatnonzero(a[lags] >= best - tol)[0]])


def iteration_time_from_period(codes: Sequence[int] | np.ndarray, times: Sequence[float] | np.ndarray, period: int) -> float | None:
    """Median of ``t[i + P] - t[i]`` over the positions where the same call recurs one period later.

    >>> iteration_time_from_period([0, 1, 2] * 4, [0, .1, .5, 1, 1.1, 1.5, 2, 2.1, 2.5, 3, 3.1, 3.5], 3)
    1.0
    """
    c = np.asarray(codes)
    t = np.asarray(times, dtype=float)
    if period < 1 or len(c) <= period:
        return None
    same = c[period:] == c[:-period]
    if not same.any():
        return None
    return float(np.median((t[period:] - t[:-period])[same]))


@register
class IterationPeriod(Detector):
    """Online iteration tracking from ``(op, group, t)`` collective-call records.

    Buffers the last ``max_calls`` calls; every ``recompute_every`` calls
    (once ``min_calls`` are buffered) finds the period with :func:`acf_period`
    and the iteration time with :func:`iteration_time_from_period`.

    Parameters
    ----------
    max_calls : int, default 4096
        Calls kept in the buffer (must hold at least two iterations).
    min_calls : int, default 64
        Calls before the first estimate.
    recompute_every : int, default 256
        Calls between estimates.
    threshold : float, default 0.95
        ACF threshold (Falcon).
    refine : bool, default True
        Skip sub-periods (see :func:`acf_period`).
    lost_after : int, default 16384
        Calls without a period, once one was found, before the finding.

    Update signature: ``update(op, group, *, t)``.

    Attributes
    ----------
    period : int or None
        Calls per iteration.
    iteration_time : float or None
        Median iteration time (seconds) over the window of the last estimate.
    iteration_times : list of float
        Per-iteration durations over that window (newest last).
    window_span : tuple of float or None
        First and last timestamp of that window.
    finding : Finding or None
        ``iteration_period_lost`` (sev3) when a period was established and
        none has been found for ``lost_after`` calls (the job stopped
        iterating the same way: a hang, an evaluation phase, a restart);
        evidence ``last_period, last_iteration_time, calls_since``.

    References
    ----------
    Falcon (Wu et al., 2024), iteration tracking by ACF.

    Examples
    --------
    Thirty 2-second iterations of nine calls each (four tensor-parallel
    pairs, one data-parallel all-reduce):

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> one = [("all_gather", "tp"), ("reduce_scatter", "tp")] * 4 + [("all_reduce", "dp")]
    >>> det = IterationPeriod()
    >>> start = 0.0
    >>> for _ in range(30):
    ...     for k, (op, group) in enumerate(one):
    ...         det.update(op, group, t=start + 2.0 * k / len(one))
    ...     start += 2.0 * (1 + 0.02 * rng.standard_normal())
    >>> det.period, abs(det.iteration_time - 2.0) / 2.0 < 0.05
    (9, True)
    """

    name = "iteration_period"
    version = "1"
    consumes = ("collective",)
    per = "job"

    def __init__(
        self,
        max_calls: int = 4096,
        min_calls: int = 64,
        recompute_every: int = 256,
        threshold: float = 0.95,
        refine: bool = True,
        lost_after: int = 16384,
    ):
        _check_positive_ints(max_calls=max_calls, min_calls=min_calls, recompute_every=recompute_every, lost_after=lost_after)
        if min_calls < 4 or min_calls > max_calls:
            raise DetectorError(f"min_calls must be in [4, max_calls={max_calls}], got {min_calls}")
        self.max_calls = max_calls
        self.min_calls = min_calls
        self.recompute_every = recompute_every
        self.lost_after = lost_after
        self.threshold = _check_positive(threshold, "threshold")
        if self.threshold > 1:
            raise DetectorError(f"threshold must be in (0, 1], got {threshold!r}")
        if not isinstance(refine, bool):
            raise DetectorError(f"refine must be a bool, got {refine!r}")
        self.refine = refine
        self._reset()

    def _reset(self) -> None:
        self._symbols: dict[tuple[str, str], int] = {}
        self._codes: deque = deque(maxlen=self.max_calls)
        self._times: deque = deque(maxlen=self.max_calls)
        self._since = 0
        self._calls = 0
        self._last_found_call: int | None = None
        self._period: int | None = None
        self._iter_time: float | None = None
        self._iter_times: list[float] = []
        self._span: tuple[float, float] | None = None
        self._last_t: float | None = None
        self._emitted: list[Progress] = []
        self._last_emit: float | None = None

    def observe(self, item: CollectiveCall, *, t: float, context: KeyContext | None = None) -> None:
        """Rank 0's calls (every rank makes the same sequence); once the period is known, a
        :class:`~vigil.detectors.inputs.Progress` per iteration time for jobs that report no steps."""
        if item.source.rank not in (None, 0):
            return
        end = to_seconds(item.end)
        self.update(item.op.value, item.group, t=end)
        it = self._iter_time
        if it is not None and it > 0 and (self._last_emit is None or end - self._last_emit >= it):
            self._last_emit = end
            self._emitted.append(Progress(step=-1, end=end, duration_s=it))

    def emitted(self) -> list[Progress]:
        out, self._emitted = self._emitted, []
        return out

    def update(self, op: str, group: str, *, t: float) -> None:
        t = _check_time(t, "t")
        if not isinstance(op, str) or not isinstance(group, str):
            raise DetectorError(f"op and group must be str, got {op!r}, {group!r}")
        if self._last_t is not None and t < self._last_t:
            raise DetectorError(f"call at t={t} is older than the previous one at t={self._last_t}")
        self._last_t = t
        code = self._symbols.setdefault((op, group), len(self._symbols))
        self._codes.append(code)
        self._times.append(t)
        self._calls += 1
        self._since += 1
        if len(self._codes) >= self.min_calls and (self._since >= self.recompute_every or self._period is None and self._since >= self.min_calls // 2):
            self._since = 0
            self._estimate()

    def _estimate(self) -> None:
        codes = np.fromiter(self._codes, dtype=np.int64, count=len(self._codes))
        times = np.fromiter(self._times, dtype=float, count=len(self._times))
        p = acf_period(codes, threshold=self.threshold, refine=self.refine)
        if p is None:
            return
        it = iteration_time_from_period(codes, times, p)
        if it is None or it <= 0:
            return
        self._period, self._iter_time = p, it
        self._span = (float(times[0]), float(times[-1]))
        # per-iteration durations along the chain of calls one period apart, from the newest back
        idx = [len(codes) - 1]
        while idx[-1] - p >= 0 and codes[idx[-1] - p] == codes[idx[-1]]:
            idx.append(idx[-1] - p)
        chain = times[np.array(idx[::-1])]
        self._iter_times = [float(x) for x in np.diff(chain)]
        self._last_found_call = self._calls

    def tick(self, now: float) -> None:
        _check_time(now, "now")

    @property
    def period(self) -> int | None:
        return self._period

    @property
    def iteration_time(self) -> float | None:
        return self._iter_time

    @property
    def iteration_times(self) -> list[float]:
        return list(self._iter_times)

    @property
    def window_span(self) -> tuple[float, float] | None:
        return self._span

    @property
    def finding(self) -> Finding | None:
        if self._last_found_call is None:
            return None
        since = self._calls - self._last_found_call
        if since < self.lost_after:
            return None
        return Finding(
            "iteration_period_lost",
            3,
            self._span[1],
            float(self._times[-1]),
            {"last_period": self._period, "last_iteration_time": self._iter_time, "calls_since": since},
        )

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"max_calls": 1024, "recompute_every": 64}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        rng = np.random.default_rng(seed)
        pattern = [("all_gather", "tp"), ("reduce_scatter", "tp")] * 8 + [("send", "pp"), ("reduce_scatter", "dp"), ("all_reduce", "world")]
        calls = []
        t = 0.0
        for _ in range(40):
            dur = 1.0 * float(np.exp(rng.normal(0, 0.02)))
            for k, (op, grp) in enumerate(pattern):
                calls.append(("update", (op, grp), {"t": t + dur * k / len(pattern)}))
            t += dur
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 100
