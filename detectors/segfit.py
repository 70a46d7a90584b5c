"""Least-squares fits on a bounded window, for streaming detectors that look back when they must.

Stateless and vectorised over every split of the window (cumulative sums), so
one call costs O(window) numpy work:

- :func:`step_split`: the split that two independent lines fit best (a shift,
  possibly with a change of slope);
- :func:`hinge_split`: the best continuous line that bends once (a kink);
- :func:`seasonal_offsets`: a period that stands out in the autocorrelation
  of a window of deviations, and the per-phase offsets.

:class:`~vigil.detectors.residual_cusum.ResidualCUSUM` calls the first two
when it places the onset of a change, the third every few dozen values.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["step_split", "hinge_split", "seasonal_offsets", "median"]

_MAD = 1.4826  # sigma / median |e| of a normal


def median(a: np.ndarray) -> float:
    """Median of a non-empty 1-d array (``np.median`` without its overhead)."""
    n = a.shape[0]
    k = n // 2
    if n % 2:
        return float(np.partition(a, k)[k])
    p = np.partition(a, (k - 1, k))
    return 0.5 * float(p[k - 1] + p[k])


def _line_sse(cs: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SSE of the least-squares line through values ``a .. b-1`` from cumulative sums of 1, t, t^2, y, t y, y^2."""
    n, st, stt, sy, sty, syy = (c[b] - c[a] for c in cs)
    vt = stt - st * st / n
    vy = syy - sy * sy / n
    cty = sty - st * sy / n
    return vy - np.where(vt > 0, cty * cty / np.where(vt > 0, vt, 1.0), 0.0)


def step_split(y: np.ndarray, lo: int = 3, side: int = 3) -> tuple[int, float]:
    """The index ``k >= lo`` where two least-squares lines (through ``y[:k]`` and ``y[k:]``) fit ``y`` best.

    Both parts keep at least ``side`` values. Returns ``(k, SSE)``; ``(-1, inf)`` when no split fits.

    >>> y = np.r_[np.zeros(10), np.ones(10)]
    >>> step_split(y)
    (10, 0.0)
    """
    L = y.shape[0]
    ks = np.arange(max(lo, side), L - side + 1)
    if ks.size == 0:
        return -1, math.inf
    t = np.arange(L, dtype=float)
    cs = [np.concatenate(([0.0], np.cumsum(v))) for v in (np.ones(L), t, t * t, y, t * y, y * y)]
    cost = _line_sse(cs, np.zeros_like(ks), ks) + _line_sse(cs, ks, np.full_like(ks, L))
    j = int(np.argmin(cost))
    return int(ks[j]), max(float(cost[j]), 0.0)


def hinge_split(y: np.ndarray, side: int = 6) -> tuple[int, float, float]:
    """The best continuous line through ``y`` that bends once: the first index on the new slope, SSE, that slope.

    Fits ``a + b t + d max(t - c, 0)`` for every ``c`` with ``side`` values on either side; the
    hinge's regressor is made orthogonal to the line (Frisch-Waugh), so each ``c`` costs O(1).
    Returns ``(-1, inf, nan)`` when the window is too short.

    >>> t = np.arange(40.0)
    >>> c, sse, slope = hinge_split(np.where(t < 25, 0.0, 0.5 * (t - 25)))
    >>> c, round(sse, 9), round(slope, 6)
    (25, 0.0, 0.5)
    """
    L = y.shape[0]
    if L < 2 * side + 2:
        return -1, math.inf, math.nan
    t = np.arange(L, dtype=float)
    tc = t - t.mean()
    btt = float(tc @ tc)
    yc = y - y.mean()
    ry = yc - tc * (float(tc @ yc) / btt)  # y orthogonal to the line
    cs = np.arange(side, L - side)
    rev = ry[::-1]
    s1 = np.cumsum(rev)[::-1]  # sum over t >= j of ry_t
    s2 = np.cumsum(rev * t[::-1])[::-1]  # sum over t >= j of t ry_t
    hy = s2[cs] - cs * s1[cs]  # <max(t - c, 0), ry>
    k = (L - cs) - 1.0  # h = t - c runs 0 .. k from c on
    sh = k * (k + 1) / 2.0
    shh = k * (k + 1) * (2 * k + 1) / 6.0
    sht = shh + (cs - (L - 1) / 2.0) * sh  # sum of h (t - mean t)
    hh = shh - sh * sh / L - sht * sht / btt
    gain = hy * hy / hh
    j = int(np.argmax(gain))
    c = int(cs[j])
    ta = t[c:] - t[c:].mean()
    return c, max(float(ry @ ry) - float(gain[j]), 0.0), float(ta @ y[c:]) / float(ta @ ta)


def seasonal_offsets(v: np.ndarray, max_period: int, min_acf: float, first: int = 0,
                     known: int = 0) -> tuple[int, list[float]] | None:
    """A period of the deviations ``v`` (their index ``j`` is ``first + j``) and its per-phase offsets.

    The period is a lag whose autocorrelation (clipped deviations, by FFT) is at least ``min_acf``
    (and 4 standard errors of a white-noise ACF), a local maximum, and rises by ``min_acf`` above the
    lowest autocorrelation at a shorter lag: a seasonal curve or a spike every ``p`` values swings, a
    random walk's or an AR(1)'s autocorrelation only decays. Of the best peaks the shortest wins (not
    a multiple). The offsets, indexed by ``index % p``, are the per-phase medians over the last whole
    cycles, centred (not computed, an empty list, when the period is ``known``). ``None`` when no
    period stands out.

    >>> i = np.arange(200)
    >>> p, off = seasonal_offsets(np.sin(2 * np.pi * i / 10), 40, 0.35)
    >>> p, round(off[2], 2), round(off[7], 2)
    (10, 0.95, -0.95)
    """
    m = v.shape[0]
    med = median(v)
    mad = _MAD * median(np.abs(v - med)) + 1e-300
    d = np.clip(v - med, -3 * mad, 3 * mad)
    d -= d.mean()
    pmax = min(max_period, m // 3)
    if pmax < 3:
        return None
    size = 1 << int(2 * m - 1).bit_length()
    f = np.fft.rfft(d, size)
    ac = np.fft.irfft(f * np.conj(f), size)[: pmax + 2]
    if not ac[0] > 0:
        return None
    ac = ac / ac[0] * m / (m - np.arange(pmax + 2))
    thr = max(min_acf, 4.0 / math.sqrt(m - pmax))
    peaks = [p for p in range(3, pmax + 1)
             if ac[p] >= thr and ac[p] >= ac[p - 1] and ac[p] >= ac[p + 1]
             and ac[p] - float(ac[1:p].min()) >= min_acf]
    if not peaks:
        return None
    best = max(float(ac[p]) for p in peaks)
    p = next(q for q in peaks if ac[q] >= best - 0.05)
    if p == known:
        return p, []
    k = (m // p) * p
    idx = np.arange(first + m - k, first + m)
    r = v[m - k:]
    season = [0.0] * p
    for j in range(p):
        season[int(idx[j]) % p] = median(r[j::p])
    mean = sum(season) / p
    return p, [x - mean for x in season]
