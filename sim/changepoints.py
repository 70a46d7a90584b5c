"""Labelled series of many kinds for the general change-point benchmark, with simulated annotators.

vigil's fail-slow traces (:mod:`vigil.sim.traces`) are stationary jitter with
level shifts. Real series are not that tidy, so this module generates series
of ten *families* built to resemble what change-point detectors meet in the
wild, each with its exact ground truth and the change points that a panel of
simulated annotators marks on it:

``level``
    Gaussian noise around a piecewise-constant mean, 1..4 shifts of 0.5..6
    noise sigmas (log-uniform), segments >= 15 points.
``variance``
    Constant mean, 1..3 changes of the noise scale by a factor 1.3..5 up or down.
``slope``
    A continuous piecewise-linear trend (1..3 kinks, segments >= 30) in
    Gaussian noise; the kink bends the line away by 0.5..8 sigmas over the
    shorter neighbouring segment. A quarter of the series are one straight
    trend with no kink.
``trend``
    A slowly varying trend (a linear rise of 2..20 sigmas plus a slow
    sinusoid or a parabola) in noise; half of the series also have one level
    shift of 3..8 sigmas, the other half no change at all.
``seasonal``
    One or two periodic components (periods 4..48 and up to 100; sinusoids
    with harmonics, or a spike every N points) in noise; half of the series
    have 1..2 level shifts of 2..6 sigmas of the whole series' variability.
``random_walk``
    A Gaussian random walk, with or without a drift: no change point.
``ar1``
    An AR(1) process with coefficient 0.7..0.97; half of the series have one
    mean shift of 1..5 marginal standard deviations.
``heavy_tail``
    Student-t noise (1.5..3 degrees of freedom) plus 1..3 % isolated
    outliers of 5..20 sigmas; half of the series have 1..2 level shifts of
    2..8 robust sigmas.
``short``
    10..60 points of Gaussian noise; 60 % have one shift of 1.5..6 sigmas at
    least 4 points from either end.
``iteration``
    Iteration times of a training job: a decaying warm-up, heavy-tailed
    multiplicative jitter, periodic evaluation blocks (1..5 slower steps
    every 40..200), checkpoint pauses, garbage-collection spikes; 65 % with
    piecewise changes: fail-slows of 5..80 % that may recover, a restart on
    other nodes that changes the level, a curriculum step in sequence length.

Every series is then put on a random scale and offset, ``a * x + b`` with
``a`` log-uniform from 1e-9 to 1e4 (nanoseconds to hours) and ``b/a`` in
[-5, 50] (``iteration`` series are times: positive, ``b = 0``).

Annotators
----------
Each true change has a *salience*: its size in units of the noise a person
sees around it, weighed by the length ``m`` of the shorter neighbouring
segment (a change between long segments is easier to see, up to a point),
``effect * min(2, sqrt(m / m0))``:

- a shift of the mean: ``|delta| / sigma`` (the noise's marginal standard
  deviation; the robust one for heavy tails; the whole series' variability
  for seasonal series), ``m0 = 8``;
- a change of scale by a factor ``rho``: ``3.5 |ln rho|``, ``m0 = 30``;
- a kink: the distance the line bends away over the shorter segment, in
  sigmas, ``m0 = 30``;
- a step of iteration time: ``|ln(after / before)| / jitter``, ``m0 = 8``.

A panel of :data:`N_ANNOTATORS` annotators with sensitivities
:data:`ANNOTATOR_THRESHOLDS` marks a change when its salience reaches the
annotator's threshold: a clear change is marked by all, an ambiguous one by
some, a change lost in the noise by none. Abrupt changes are marked where
they are (one annotator in five, drawn per change, is one point off); kinks
and the end of a warm-up, which have no exact location, are marked within
+-3 points. The end of an iteration series' warm-up is marked by the
annotators for whom the warm-up stands out (its initial excess over their
threshold times the jitter), each where the excess falls below their
threshold. Periodic evaluation and checkpoint steps, spikes and outliers are
not changes and are never marked.

Indices are 0-based; a change point is the index of the first value of the
new segment. Everything is driven by one seed and numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["FAMILIES", "N_ANNOTATORS", "ANNOTATOR_THRESHOLDS", "LabelledSeries", "generate_series",
           "generate_corpus"]

#: A long segment makes a change easier to see, up to this factor (reached at ``m = 4 m0``).
SALIENCE_CAP = 2.0
#: Salience each simulated annotator needs to mark a change (most to least sensitive).
ANNOTATOR_THRESHOLDS = (1.5, 2.0, 2.5, 3.0, 4.0)
N_ANNOTATORS = len(ANNOTATOR_THRESHOLDS)


@dataclass(frozen=True)
class LabelledSeries:
    """One series, its true change points and what each annotator marked.

    ``changes`` holds the true change points (indices), ``salience`` their
    salience (same order), ``annotations`` maps annotator id (0-based) to the
    sorted indices it marked (possibly empty).
    """

    family: str
    seed: int
    values: np.ndarray
    changes: tuple[int, ...]
    salience: tuple[float, ...]
    annotations: dict[int, list[int]] = field(repr=False)

    def __len__(self) -> int:
        return int(self.values.shape[0])


# -- helpers -------------------------------------------------------------------


def _lu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _positions(rng: np.random.Generator, n: int, k: int, min_seg: int) -> list[int]:
    """``k`` sorted change points in ``(0, n)`` with every segment >= ``min_seg`` (fewer if they do not fit)."""
    k = min(k, max(0, n // min_seg - 1))
    if k == 0:
        return []
    slack = n - (k + 1) * min_seg
    cuts = np.sort(rng.integers(0, slack + 1, size=k))
    return [int(c) + (i + 1) * min_seg for i, c in enumerate(cuts)]


def _min_seg(cps: list[int], n: int, i: int) -> int:
    bounds = [0] + list(cps) + [n]
    return min(bounds[i + 1] - bounds[i], bounds[i + 2] - bounds[i + 1])


def _salience(effect: float, m: int, m0: int) -> float:
    return float(abs(effect) * min(SALIENCE_CAP, math.sqrt(m / m0)))


@dataclass
class _Truth:
    changes: list[int] = field(default_factory=list)
    salience: list[float] = field(default_factory=list)
    gradual: list[bool] = field(default_factory=list)
    # extra marks that depend on the annotator (e.g. the end of a warm-up): (threshold -> index or None)
    per_annotator: list[Callable[[float], int | None]] = field(default_factory=list)

    def add(self, index: int, salience: float, gradual: bool = False) -> None:
        self.changes.append(int(index))
        self.salience.append(float(salience))
        self.gradual.append(gradual)


def _annotate(rng: np.random.Generator, truth: _Truth, n: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a, thr in enumerate(ANNOTATOR_THRESHOLDS):
        marks: set[int] = set()
        for cp, s, gradual in zip(truth.changes, truth.salience, truth.gradual):
            if s < thr:
                continue
            if gradual:
                off = int(rng.integers(-3, 4))
            else:
                off = int(rng.choice([-1, 1])) if rng.random() < 0.2 else 0
            marks.add(int(min(max(cp + off, 1), n - 1)))
        for mark in truth.per_annotator:
            idx = mark(thr)
            if idx is not None:
                marks.add(int(min(max(idx + int(rng.integers(-3, 4)), 1), n - 1)))
        out[a] = sorted(marks)
    return out


# -- families --------------------------------------------------------------------


def _level(rng, truth):
    n = int(rng.integers(100, 601))
    cps = _positions(rng, n, int(rng.integers(1, 5)), 15)
    mean = np.zeros(n)
    lvl = 0.0
    for i, c in enumerate(cps):
        d = _lu(rng, 0.5, 6.0) * rng.choice([-1.0, 1.0])
        lvl += d
        mean[c:] = lvl
        truth.add(c, _salience(d, _min_seg(cps, n, i), 8))
    return mean + rng.standard_normal(n)


def _variance(rng, truth):
    n = int(rng.integers(150, 601))
    cps = _positions(rng, n, int(rng.integers(1, 4)), 30)
    sd = np.ones(n)
    s = 1.0
    for i, c in enumerate(cps):
        rho = _lu(rng, 1.3, 5.0)
        if rng.random() < 0.5 and s / rho >= 0.05:
            rho = 1.0 / rho
        s *= rho
        sd[c:] = s
        truth.add(c, _salience(3.5 * math.log(rho), _min_seg(cps, n, i), 30))
    return sd * rng.standard_normal(n)


def _slope(rng, truth):
    n = int(rng.integers(150, 601))
    k = 0 if rng.random() < 0.25 else int(rng.integers(1, 4))
    cps = _positions(rng, n, k, 30)
    slopes = [float(rng.uniform(-0.05, 0.05))]
    for i, c in enumerate(cps):
        m = _min_seg(cps, n, i)
        bend = _lu(rng, 0.5, 8.0)  # sigmas the line bends away over the shorter segment
        slopes.append(slopes[-1] + rng.choice([-1.0, 1.0]) * bend / m)
        truth.add(c, _salience(bend, m, 30), gradual=True)
    bounds = [0] + cps + [n]
    trend = np.zeros(n)
    y = float(rng.uniform(-5, 5))
    for b, (i0, i1) in zip(slopes, zip(bounds[:-1], bounds[1:])):
        trend[i0:i1] = y + b * np.arange(i1 - i0)
        y += b * (i1 - i0)
    return trend + rng.standard_normal(n)


def _trend(rng, truth):
    n = int(rng.integers(150, 601))
    i = np.arange(n, dtype=float)
    rise = rng.uniform(2.0, 20.0) * rng.choice([-1.0, 1.0])
    x = rise * i / n
    if rng.random() < 0.5:
        x += rng.uniform(1.0, 5.0) * np.sin(2 * np.pi * i / rng.uniform(n / 2, 2 * n) + rng.uniform(0, 2 * np.pi))
    else:
        x += rng.uniform(-8.0, 8.0) * ((i - n / 2) / n) ** 2 * 4
    if rng.random() < 0.5:
        cps = _positions(rng, n, 1, 30)
        d = rng.uniform(3.0, 8.0) * rng.choice([-1.0, 1.0])
        x[cps[0]:] += d
        truth.add(cps[0], _salience(d, _min_seg(cps, n, 0), 8))
    return x + rng.standard_normal(n)


def _seasonal(rng, truth):
    n = int(rng.integers(150, 601))
    i = np.arange(n, dtype=float)
    x = np.zeros(n)
    p1 = int(rng.integers(4, 49))
    periods = [p1]
    if rng.random() < 0.3:
        periods.append(int(min(100, p1 * rng.integers(2, 5))))
    for p in periods:
        if rng.random() < 0.3:  # a spike every p points (an eval step, a checkpoint)
            x[int(rng.integers(0, p))::p] += rng.uniform(3.0, 10.0) * rng.choice([-1.0, 1.0])
        else:
            amp = rng.uniform(1.0, 5.0)
            ph = rng.uniform(0, 2 * np.pi)
            x += amp * np.sin(2 * np.pi * i / p + ph)
            if rng.random() < 0.5:
                x += 0.5 * amp * np.sin(4 * np.pi * i / p + rng.uniform(0, 2 * np.pi))
    x += rng.standard_normal(n)
    sd = float(np.std(x))
    if rng.random() < 0.5:
        cps = _positions(rng, n, int(rng.integers(1, 3)), 40)
        for k, c in enumerate(cps):
            d = rng.uniform(2.0, 6.0) * sd * rng.choice([-1.0, 1.0])
            x[c:] += d
            truth.add(c, _salience(d / sd, _min_seg(cps, n, k), 8))
    return x


def _random_walk(rng, truth):
    n = int(rng.integers(100, 601))
    return np.cumsum(rng.standard_normal(n) + rng.uniform(-0.2, 0.2))


def _ar1(rng, truth):
    n = int(rng.integers(150, 601))
    phi = float(rng.uniform(0.7, 0.97))
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi * phi)
    for k in range(1, n):
        x[k] = phi * x[k - 1] + e[k]
    sd = 1.0 / math.sqrt(1 - phi * phi)
    if rng.random() < 0.5:
        cps = _positions(rng, n, 1, 40)
        d = _lu(rng, 1.0, 5.0) * sd * rng.choice([-1.0, 1.0])
        x[cps[0]:] += d
        truth.add(cps[0], _salience(d / sd, _min_seg(cps, n, 0), 8))
    return x


def _heavy_tail(rng, truth):
    n = int(rng.integers(150, 601))
    nu = float(rng.uniform(1.5, 3.0))
    # robust sigma of a Student-t: IQR / 1.349
    iqr = 2.0 * float(_t_quantile(0.75, nu))
    x = rng.standard_t(nu, size=n) * (1.349 / iqr)
    m = int(round(n * rng.uniform(0.01, 0.03)))
    idx = rng.choice(n, size=m, replace=False)
    x[idx] += rng.uniform(5.0, 20.0, size=m) * rng.choice([-1.0, 1.0], size=m)
    if rng.random() < 0.5:
        cps = _positions(rng, n, int(rng.integers(1, 3)), 30)
        lvl = 0.0
        for k, c in enumerate(cps):
            d = _lu(rng, 2.0, 8.0) * rng.choice([-1.0, 1.0])
            lvl += d
            x[c:] += d
            truth.add(c, _salience(d, _min_seg(cps, n, k), 8))
    return x


def _t_quantile(q: float, nu: float) -> float:
    from scipy import stats  # scipy is a dependency of vigil; only this family needs it
    return float(stats.t.ppf(q, nu))


def _short(rng, truth):
    n = int(rng.integers(10, 61))
    x = rng.standard_normal(n)
    if rng.random() < 0.6:
        c = int(rng.integers(4, n - 3))
        d = _lu(rng, 1.5, 6.0) * rng.choice([-1.0, 1.0])
        x[c:] += d
        truth.add(c, _salience(d, min(c, n - c), 8))
    return x


def _iteration(rng, truth):
    n = int(rng.integers(200, 1201))
    i = np.arange(n, dtype=float)
    base = _lu(rng, 0.05, 5.0)
    jit = _lu(rng, 0.005, 0.04)
    nu = float(rng.uniform(3.0, 8.0))
    level = np.full(n, base)
    if rng.random() < 0.65:
        kinds = rng.choice(["failslow", "restart", "curriculum"], size=int(rng.integers(1, 3)), p=[0.6, 0.25, 0.15])
        events: list[tuple[int, float]] = []
        for kind in kinds:
            lo = 60
            if kind == "failslow":
                on = int(rng.integers(lo, n - 20))
                f = 1.0 + _lu(rng, 0.05, 0.8)
                dur = int(_lu(rng, 15, 2 * n))
                events.append((on, f))
                if on + dur < n - 10:
                    events.append((on + dur, 1.0 / f))
            elif kind == "restart":
                on = int(rng.integers(lo, n - 20))
                events.append((on, float(rng.uniform(0.85, 1.2))))
            else:
                on = int(rng.integers(lo, n - 20))
                events.append((on, float(rng.uniform(1.1, 1.6))))
        events.sort()
        kept: list[tuple[int, float]] = []
        for on, f in events:  # changes closer than 10 points merge into one
            if kept and on - kept[-1][0] < 10:
                kept[-1] = (kept[-1][0], kept[-1][1] * f)
            else:
                kept.append((on, f))
        cps = [on for on, _ in kept]
        for k, (on, f) in enumerate(kept):
            level[on:] *= f
            if abs(math.log(f)) > 1e-9:
                truth.add(on, _salience(math.log(f) / jit, _min_seg(cps, n, k), 8))
    # warm-up: a slow first step and a decaying excess
    amp = float(rng.uniform(0.0, 1.0))
    tau = float(rng.uniform(3.0, 30.0))
    warm = 1.0 + amp * np.exp(-i / tau)
    warm[0] = _lu(rng, 3.0, 20.0)

    def warmup_end(thr: float, amp=amp, tau=tau, jit=jit) -> int | None:
        if amp < thr * jit * 3:  # not a visible phase to this annotator
            return None
        return int(math.ceil(tau * math.log(amp / (thr * jit))))

    truth.per_annotator.append(warmup_end)
    x = level * warm * np.exp(jit * rng.standard_t(nu, size=n) / math.sqrt(nu / (nu - 2)))
    # periodic evaluation blocks
    if rng.random() < 0.6:
        every = int(rng.integers(40, 201))
        width = int(rng.integers(1, 6))
        f = rng.uniform(1.5, 4.0)
        for s in range(int(rng.integers(every // 2, every + 1)), n, every):
            x[s:s + width] *= f
    # checkpoints and garbage collection
    ck = int(rng.integers(100, 600))
    x[int(rng.integers(ck // 2, ck + 1))::ck] += base * rng.uniform(2.0, 20.0)
    if rng.random() < 0.5:
        gc = int(rng.integers(10, 100))
        x[int(rng.integers(0, gc))::gc] *= 1.0 + rng.uniform(0.1, 1.0)
    return x


_GENERATORS: dict[str, Callable] = {
    "level": _level, "variance": _variance, "slope": _slope, "trend": _trend, "seasonal": _seasonal,
    "random_walk": _random_walk, "ar1": _ar1, "heavy_tail": _heavy_tail, "short": _short, "iteration": _iteration,
}
#: The families, in the order of the corpus.
FAMILIES = tuple(_GENERATORS)


def generate_series(family: str, seed: int) -> LabelledSeries:
    """One labelled series of ``family`` from ``seed`` (see the module docstring)."""
    if family not in _GENERATORS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    rng = np.random.default_rng(seed)
    truth = _Truth()
    x = _GENERATORS[family](rng, truth)
    n = x.shape[0]
    order = np.argsort(truth.changes, kind="stable")
    truth = _Truth([truth.changes[k] for k in order], [truth.salience[k] for k in order],
                   [truth.gradual[k] for k in order], truth.per_annotator)
    annotations = _annotate(rng, truth, n)
    if family != "iteration":
        a = 10.0 ** rng.uniform(-9.0, 4.0)
        x = a * x + a * rng.uniform(-5.0, 50.0)
    return LabelledSeries(family=family, seed=seed, values=x.astype(float), changes=tuple(truth.changes),
                          salience=tuple(truth.salience), annotations=annotations)


def generate_corpus(n_per_family: int = 70, seed: int = 0,
                    families: tuple[str, ...] = FAMILIES) -> list[LabelledSeries]:
    """``n_per_family`` series of each family; series ``k`` of a family has a seed derived from ``(seed, family, k)``.

    >>> corpus = generate_corpus(2, seed=1)
    >>> len(corpus), sorted({s.family for s in corpus}) == sorted(FAMILIES)
    (20, True)
    >>> s = corpus[0]
    >>> s.family, len(s.annotations) == N_ANNOTATORS, all(0 < c < len(s) for c in s.changes)
    ('level', True, True)
    """
    if n_per_family < 1:
        raise ValueError(f"n_per_family must be >= 1, got {n_per_family!r}")
    out = []
    for f_idx, fam in enumerate(families):
        if fam not in _GENERATORS:
            raise ValueError(f"family must be one of {FAMILIES}, got {fam!r}")
        seeds = np.random.SeedSequence([seed, FAMILIES.index(fam)]).generate_state(n_per_family)
        out += [generate_series(fam, int(s)) for s in seeds]
    return out
