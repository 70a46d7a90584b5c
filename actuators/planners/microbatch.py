"""Micro-batch rebalancing across data-parallel groups (Falcon's mitigation S2).

A data-parallel (DP) group that holds a straggler takes longer per
micro-batch; since all groups synchronise on the gradient all-reduce, the
iteration lasts as long as the slowest group. Falcon's second mitigation
level moves micro-batches from slow groups to fast ones while the global
batch (``M`` micro-batches in total) stays the same:

    minimise   max_i  m_i * t_i
    subject to sum_i m_i = M,  m_i >= 1 integer

where ``t_i > 0`` is group ``i``'s time per micro-batch. Falcon hands this
to a generic solver (35.9 s at 512 groups in its evaluation); it is solved
exactly here in ``O(n log n)``.

Exactness
---------
*Greedy.* Start from ``m_i = 1`` and add the remaining ``M - n``
micro-batches one at a time, each to the group whose finish time after the
addition, ``(m_i + 1) * t_i``, is smallest. Let ``T*`` be the optimum and
``cap_i = max {k : k * t_i <= T*}`` (``>= 1`` because ``T* >= t_i``: every
group gets a micro-batch); an optimal plan has ``sum_i cap_i >= M``.
Invariant: ``m_i <= cap_i`` for all ``i``. It holds at the start. While
``sum m < M``, some ``m_i < cap_i`` (else ``sum m = sum cap >= M``), so the
smallest ``(m_i + 1) * t_i`` is ``<= T*``, and adding there keeps the
invariant. At the end every ``m_i * t_i <= cap_i * t_i <= T*``: optimal.

*Fast start.* The greedy takes the values ``k * t_i`` (``k >= 2``) in
increasing order, so its result is ``m_i = 1 + #{k >= 2 : k * t_i among the
M - n smallest such values}``. Any threshold ``theta`` below the last value
taken gives a prefix of that sequence: ``m_i = max(1, #{k >= 1 : k * t_i <=
theta})``. We take ``theta`` from the continuous relaxation (water-filling
``sum_i max(1, theta / t_i) = M``), for which the prefix holds at most
``M`` micro-batches and at least ``M - n``, shrink it until the prefix fits
(floating point), count the multiples with the same float products the
objective uses, and finish with at most ~``n`` heap steps. Ties go to the
lower group index, exactly as the plain greedy would. The result is
therefore the greedy's, hence optimal, and deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from numbers import Integral
from typing import Sequence

import numpy as np

__all__ = ["MicrobatchPlan", "rebalance_microbatches"]


@dataclass(frozen=True)
class MicrobatchPlan:
    """The result of :func:`rebalance_microbatches`.

    Attributes
    ----------
    counts : tuple of int
        Micro-batches per DP group (``>= 1``, summing to the total).
    makespan : float
        ``max_i counts[i] * times[i]``, the minimum possible.
    bottleneck : int
        Index of a group that attains the makespan (the lowest such index).
    """

    counts: tuple[int, ...]
    makespan: float
    bottleneck: int


def _validate(times: Sequence[float], total: int) -> np.ndarray:
    try:
        t = np.array(times, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"times must be a sequence of numbers, got {times!r}") from None
    if t.ndim != 1 or t.size == 0:
        raise ValueError("times must be a non-empty 1-D sequence (one time per micro-batch per DP group)")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        bad = int(np.flatnonzero(~(np.isfinite(t) & (t > 0)))[0])
        raise ValueError(f"times must be finite and > 0, got times[{bad}]={t[bad]!r}")
    if not isinstance(total, Integral) or isinstance(total, bool):
        raise ValueError(f"total must be an integer, got {total!r}")
    if total < t.size:
        raise ValueError(f"total={total} micro-batches is fewer than the {t.size} DP groups: "
                         "every group needs at least one (total >= len(times))")
    return t


def _threshold(t: np.ndarray, total: int) -> float:
    """The continuous water level ``theta``: ``sum_i max(1, theta / t_i) = total``."""
    order = np.sort(t)[::-1]  # slowest first: those are the groups clamped at one micro-batch
    inv_suffix = np.cumsum((1.0 / order)[::-1])[::-1]  # inv_suffix[j] = sum_{i >= j} 1 / order[i]
    j = np.arange(t.size)
    theta = (total - j) / inv_suffix  # level when the j slowest groups are clamped
    # The right j: clamped groups are not below the level, the others are at or below it.
    ok = (theta <= np.concatenate(([np.inf], order[:-1]))) & (theta >= order)
    return float(theta[np.flatnonzero(ok)[0]] if ok.any() else theta[0])


def _prefix(t: np.ndarray, theta: float) -> np.ndarray:
    """``max(1, #{k >= 1 : fl(k * t_i) <= theta})`` per group, using the objective's float products."""
    k = np.floor(theta / t)
    k -= (k * t > theta)            # floor of a quotient is off by at most one either way
    k += ((k + 1) * t <= theta)
    return np.maximum(k, 1).astype(np.int64)


def rebalance_microbatches(times: Sequence[float], total: int) -> MicrobatchPlan:
    """Split ``total`` micro-batches over DP groups to minimise the slowest group's time (Falcon S2).

    Exact (see the module docstring for the proof) in ``O(n log n)`` for
    ``n`` groups, whatever ``total``.

    Parameters
    ----------
    times : sequence of float
        ``t_i > 0``, each DP group's time per micro-batch.
    total : int
        ``M >= len(times)``, the micro-batches per iteration (the global batch).

    Returns
    -------
    MicrobatchPlan

    Raises
    ------
    ValueError
        When a time is not a finite positive number, or ``total`` is not an
        integer or is smaller than the number of groups.

    References
    ----------
    Falcon: Pinpointing and Mitigating Stragglers for Large-Scale Hybrid-Parallel Training,
    USENIX ATC'24 (arXiv:2410.12588), the micro-batch redistribution mitigation (S2).

    Examples
    --------
    Four groups, the third one 2x slower, 16 micro-batches:

    >>> plan = rebalance_microbatches([1.0, 1.0, 2.0, 1.0], 16)
    >>> plan.counts, plan.makespan
    ((5, 5, 2, 4), 5.0)
    """
    t = _validate(times, total)
    n = t.size
    level = _threshold(t, total)
    shrink = 1e-12
    m = _prefix(t, level * (1.0 - shrink))
    while int(m.sum()) > total:  # floating-point edge cases only: lower the level, faster each time
        shrink = min(1.0, shrink * 16)  # at level 0 every group has one micro-batch: sum = n <= total
        m = _prefix(t, level * (1.0 - shrink))
    rest = total - int(m.sum())
    if rest:
        tl = t.tolist()
        ml = m.tolist()
        heap = [((ml[i] + 1) * tl[i], i) for i in range(n)]
        heapq.heapify(heap)
        for _ in range(rest):
            _, i = heapq.heappop(heap)
            ml[i] += 1
            heapq.heappush(heap, ((ml[i] + 1) * tl[i], i))
        m = np.array(ml, dtype=np.int64)
    finish = m * t
    b = int(np.argmax(finish))
    return MicrobatchPlan(counts=tuple(int(v) for v in m), makespan=float(finish[b]), bottleneck=b)
