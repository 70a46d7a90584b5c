"""Intervals for the benchmarks' timings: the median of repeated runs, and a rate sustained over a long run.

- :func:`median_interval`: the distribution-free interval of a median from
  the order statistics of ``n`` runs. It assumes nothing about how the
  times are distributed (they are skewed: a run is never faster than the
  code allows, often slower when the machine is busy); its coverage is at
  least the level asked for and is returned with it. Below 6 runs no 95 %
  interval exists (``None``).
- :func:`window_rates`: a cumulative counter sampled during a long run (rows
  stored so far), cut into consecutive windows of at least ``window_s``;
  the rate of each. Their spread, not one figure over the whole run, says
  whether the rate was sustained; a bootstrap over them
  (:func:`vigil.bench.cpscore.bootstrap_mean`) gives its interval.
"""

from __future__ import annotations

from math import comb
from typing import Any, Sequence

__all__ = ["median_interval", "window_rates"]


def median_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any] | None:
    """``{"n", "median", "lo", "hi", "coverage"}`` of ``values``; None when too few for ``level``.

    The interval is ``[x(k), x(n - k + 1)]`` of the sorted values (1-based
    ranks) with the largest ``k`` for which ``P(B < k) <= (1 - level) / 2``,
    ``B ~ Binomial(n, 1/2)``; ``coverage = 1 - 2 P(B < k)``.

    >>> median_interval([5, 1, 4, 2, 3, 9, 8, 7, 6, 10])
    {'n': 10, 'median': 5.5, 'lo': 2, 'hi': 9, 'coverage': 0.9785}
    >>> median_interval([1, 2, 3, 4, 5]) is None  # 5 runs: at best 93.75 %
    True
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    x = sorted(values)
    n = len(x)
    tail = (1 - level) / 2
    k, below = 0, 0.0  # below: P(B < k)
    for j in range(n):
        p = below + comb(n, j) / 2 ** n  # P(B <= j) = P(B < j + 1)
        if p > tail:
            break
        k, below = j + 1, p
    if k == 0:
        return None
    mid = n // 2
    median = x[mid] if n % 2 else (x[mid - 1] + x[mid]) / 2
    return {"n": n, "median": median, "lo": x[k - 1], "hi": x[n - k], "coverage": round(1 - 2 * below, 4)}


def window_rates(samples: Sequence[tuple[float, float]], window_s: float) -> list[tuple[float, float]]:
    """``(seconds, rate)`` of consecutive windows of ``samples`` ``(time, cumulative count)``, in time order.

    A window runs from one sample to the first sample at least ``window_s``
    later (so it may be a little longer); the samples left after the last
    whole window make no window (a short tail would weigh as much as a full
    window).

    >>> window_rates([(0.0, 0), (1.0, 100), (2.0, 200), (3.5, 250), (4.0, 300), (4.5, 310)], 2.0)
    [(2.0, 100.0), (2.0, 50.0)]
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    out: list[tuple[float, float]] = []
    if not samples:
        return out
    t0, c0 = samples[0]
    for t, c in samples[1:]:
        if t < t0:
            raise ValueError(f"samples must be in time order: {t} after {t0}")
        if t - t0 >= window_s:
            out.append((t - t0, (c - c0) / (t - t0)))
            t0, c0 = t, c
    return out
