"""Scoring of change points against annotations, and the intervals every headline carries.

The two metrics of the change-point literature, as defined by van den Burg &
Williams (2020), "An Evaluation of Change Point Detection Algorithms"
(arXiv:2003.06222, section 4; the TCPDBench benchmark), implemented from
their definitions:

**F1 with a margin** (:func:`f_measure`). Change points are 0-based indices
of the first value of a new segment; the start of the series, index 0,
counts as a change point in every annotation and in the prediction. A true
positive of an annotation set ``T`` is a point ``tau`` of ``T`` with a
prediction within ``margin`` points that is not already used: the points of
``T`` are taken in increasing order and each takes the closest unused
prediction, so one prediction matches at most one annotated point.
Precision is the number of true positives of the union of all annotators'
points divided by the number of predictions; recall is the mean over
annotators of each annotator's true positives divided by the size of their
set; ``F1 = 2PR / (P + R)``.

**Covering** (:func:`covering`). A change-point set splits ``0..n-1`` into
segments. The covering of a segmentation ``S`` by ``S'`` is
``(1/n) * sum over A in S of |A| * max over A' in S' of J(A, A')`` with
``J`` the Jaccard index (Arbelaez et al. 2011); the score of a prediction
is the mean over annotators of the covering of the annotator's
segmentation by the predicted one.

Both are averaged over annotators for one series; a benchmark averages the
series' scores.

Intervals: :func:`wilson` for proportions, :func:`bootstrap_mean` for means.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["true_positives", "f_measure", "segments", "cover_single", "covering", "wilson", "bootstrap_mean"]


def true_positives(truth: Iterable[int], predictions: Iterable[int], margin: int = 5) -> set[int]:
    """Points of ``truth`` matched by a distinct prediction within ``margin`` (closest first, truth in order).

    >>> sorted(true_positives({1, 10, 20, 23}, {3, 8, 20}))
    [1, 10, 20]
    >>> sorted(true_positives({10, 12}, {11}))  # one prediction matches one point
    [10]
    """
    free = set(predictions)
    tp: set[int] = set()
    for tau in sorted(set(truth)):
        best = None
        for x in free:
            d = abs(tau - x)
            if d <= margin and (best is None or (d, x) < best):
                best = (d, x)
        if best is not None:
            tp.add(tau)
            free.remove(best[1])
    return tp


def f_measure(annotations: Mapping[int, Iterable[int]], predictions: Iterable[int],
              margin: int = 5) -> tuple[float, float, float]:
    """``(F1, precision, recall)`` of ``predictions`` against every annotator's set (index 0 added to all).

    >>> f_measure({0: [10, 20], 1: [11, 20], 2: [10], 3: [0, 5]}, [10, 20])[0]
    1.0
    >>> round(f_measure({0: [], 1: [10], 2: [50]}, [])[0], 4)
    0.8
    """
    if not annotations:
        raise ValueError("at least one annotator is needed")
    sets = [set(int(v) for v in a) | {0} for a in annotations.values()]
    x = set(int(v) for v in predictions) | {0}
    union = set().union(*sets)
    p = len(true_positives(union, x, margin)) / len(x)
    r = sum(len(true_positives(t, x, margin)) / len(t) for t in sets) / len(sets)
    f = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return f, p, r


def segments(points: Iterable[int], n: int) -> list[tuple[int, int]]:
    """Half-open segments ``[a, b)`` of ``0..n-1`` cut at ``points`` (0 and points outside are ignored).

    >>> segments([3, 5], 8)
    [(0, 3), (3, 5), (5, 8)]
    """
    cuts = sorted({int(p) for p in points if 0 < p < n})
    bounds = [0] + cuts + [n]
    return list(zip(bounds[:-1], bounds[1:]))


def cover_single(predicted: Sequence[tuple[int, int]], truth: Sequence[tuple[int, int]]) -> float:
    """Covering of the segmentation ``truth`` by ``predicted`` (both lists of ``[a, b)`` over the same range).

    >>> cover_single([(0, 4), (4, 6)], [(0, 6)])
    0.6666666666666666
    """
    n = sum(b - a for a, b in truth)
    if n != sum(b - a for a, b in predicted) or n == 0:
        raise ValueError("both segmentations must cover the same non-empty range")
    total = 0.0
    j = 0
    for a, b in truth:
        while predicted[j][1] <= a:  # predicted segments are sorted; skip those ending before A
            j += 1
        best = 0.0
        k = j
        while k < len(predicted) and predicted[k][0] < b:
            pa, pb = predicted[k]
            inter = min(b, pb) - max(a, pa)
            best = max(best, inter / ((b - a) + (pb - pa) - inter))
            k += 1
        total += (b - a) * best
    return total / n


def covering(annotations: Mapping[int, Iterable[int]], predictions: Iterable[int], n: int) -> float:
    """Mean over annotators of the covering of their segmentation by the predicted one.

    >>> round(covering({0: [], 1: [10], 2: [40]}, [], 45), 6)
    0.81893
    """
    if not annotations:
        raise ValueError("at least one annotator is needed")
    pred = segments(predictions, n)
    return sum(cover_single(pred, segments(a, n)) for a in annotations.values()) / len(annotations)


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """95 % Wilson score interval of a proportion (``None`` when ``n == 0``).

    >>> [round(v, 4) for v in wilson(0, 100)]
    [0.0, 0.037]
    """
    if n == 0:
        return None
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def bootstrap_mean(values: Sequence[float], n_boot: int = 2000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (``None`` when empty).

    >>> bootstrap_mean([1.0, 1.0, 1.0])
    (1.0, 1.0)
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
