"""Multi-job re-planning: the worker allocation that maximises weighted achieved FLOP/s (Unicron).

When a failure takes workers away (or returns them), every job in the
cluster may be resized. Unicron (SOSP'23, its plan generation) picks, for every job
``t_i``, a new worker count ``x'_i`` that maximises the total *gain*

    sum_i G(t_i, x'_i),   subject to   sum_i x'_i <= n (available workers)

with

    G(t, x') = F(t, x') * D_running - F(t, x) * 1[x' != x or a worker of t failed] * D_transition
    F(t, x)  = w(t) * T(t, x)   if x >= min_workers(t) and x > 0, else 0

``T(t, x)`` is the job's throughput with ``x`` workers (a measured or
modelled table, non-linear and often non-monotonic: tensor/pipeline layouts
fit some sizes badly), ``w(t)`` its weight (priority), ``x`` the current
allocation, ``D_running`` how long the new plan is expected to run and
``D_transition`` how long a reconfiguration stalls a job. A job that keeps its
allocation and lost no worker pays nothing; a job that is resized, or whose
worker failed, loses ``D_transition`` seconds of its *current* WAF.

The unit of a "worker" is whatever the caller plans in: GPUs, or nodes of 8
GPUs (planning 10,000 GPUs as 1,250 nodes is what makes 100 jobs fit in
~100 ms; see ``vigil bench planners``).

Feasible sizes
--------------
A job's throughput table ``throughput[x]`` (``throughput[0] == 0``) defines its
*largest useful size*: ``x'`` beyond ``len(throughput) - 1`` is forbidden
(not extrapolated), so a caller bounds the search by the size a job can use.
Sizes ``0 < x' < min_workers`` are forbidden too (they would hold workers
for no throughput), so every job gets ``0`` or a size in
``[min_workers, len(throughput) - 1]``; a job whose minimum exceeds its table
or the available workers gets ``0``. The current allocation must itself be
``0`` or a size in that range (else ``ValueError``).

Algorithm
---------
Dynamic programming over jobs, ``best_i[c]`` = the largest total gain of the
first ``i`` jobs using at most ``c`` workers::

    best_0[c] = 0
    best_i[c] = max over feasible x <= c of  best_{i-1}[c - x] + G_i[x]

a max-plus convolution of the previous row with the job's one-step table
``G_i``, which is precomputed once per job. This is ``O(m * n * L)`` for
tables of length ``L`` (``O(m * n^2)`` when tables span the cluster), done
as one numpy operation per job over an ``(L, n + 1)`` window of the previous
row (laid out with one contiguous row per total ``c``, so the step is one
add and one argmax); the argmax of every row is kept, and backtracking from
``c = n`` recovers the allocation.

Ties: among allocations of equal gain the plan keeps the most jobs at their
current size (fewest reconfigurations). The DP carries the pair (gain,
kept jobs) and compares it lexicographically, which is exact because both
add up along the DP; gains are compared as computed floats, so "equal" means
bit-equal sums (exact for integer-valued inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["WafJob", "Plan", "job_gains", "plan_workers"]


def _is_int(v: object) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


@dataclass(frozen=True)
class WafJob:
    """One job of the re-planning problem (see the module docstring).

    Parameters
    ----------
    name : str
        Unique job name.
    weight : float
        ``w(t) >= 0``, the job's priority in weighted achieved FLOP/s.
    min_workers : int
        Smallest size at which the job can run (``>= 1``).
    throughput : sequence of float
        ``throughput[x]`` is the job's throughput on ``x`` workers;
        ``throughput[0]`` must be ``0``. Its length bounds the job's size.
    current_workers : int
        ``x``, the job's allocation now: ``0`` or within
        ``[min_workers, len(throughput) - 1]``.
    failed : bool
        Whether a worker of the job failed (the job pays the transition cost
        whatever its new size).
    """

    name: str
    weight: float
    min_workers: int
    throughput: Sequence[float]
    current_workers: int = 0
    failed: bool = False
    _table: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        who = f"WafJob {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"WafJob name must be a non-empty string, got {self.name!r}")
        if not _is_real(self.weight) or not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"{who}: weight must be a finite number >= 0, got {self.weight!r}")
        if not _is_int(self.min_workers) or self.min_workers < 1:
            raise ValueError(f"{who}: min_workers must be an integer >= 1, got {self.min_workers!r}")
        try:
            table = np.array(self.throughput, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{who}: throughput must be a sequence of numbers, got {self.throughput!r}") from None
        if table.ndim != 1 or table.size < 1:
            raise ValueError(f"{who}: throughput must be a non-empty 1-D sequence (index = workers)")
        if not np.all(np.isfinite(table)) or np.any(table < 0):
            raise ValueError(f"{who}: throughput values must be finite and >= 0")
        if table[0] != 0:
            raise ValueError(f"{who}: throughput[0] must be 0 (no workers, no throughput), got {table[0]!r}")
        if not _is_int(self.current_workers) or self.current_workers < 0:
            raise ValueError(f"{who}: current_workers must be an integer >= 0, got {self.current_workers!r}")
        if self.current_workers >= table.size:
            raise ValueError(f"{who}: current_workers={self.current_workers} is beyond the throughput table "
                             f"(len {table.size}, largest size {table.size - 1})")
        if 0 < self.current_workers < self.min_workers:
            raise ValueError(f"{who}: current_workers={self.current_workers} is below min_workers="
                             f"{self.min_workers} (a running job has at least its minimum)")
        if not isinstance(self.failed, bool):
            raise ValueError(f"{who}: failed must be a bool, got {self.failed!r}")
        table.setflags(write=False)
        object.__setattr__(self, "throughput", tuple(table.tolist()))
        object.__setattr__(self, "_table", table)

    def waf(self, workers: int) -> float:
        """``F(t, x)``: weighted throughput on ``workers`` (0 below the minimum or beyond the table)."""
        if workers <= 0 or workers < self.min_workers or workers >= len(self.throughput):
            return 0.0
        return self.weight * self.throughput[workers]


@dataclass(frozen=True)
class Plan:
    """The result of :func:`plan_workers`.

    Attributes
    ----------
    names : tuple of str
        Job names, in input order.
    workers : tuple of int
        New worker count per job, in input order.
    gains : tuple of float
        ``G(t_i, x'_i)`` per job.
    objective : float
        ``sum_i G(t_i, x'_i)``, the maximum.
    kept : int
        Jobs whose worker count did not change.
    """

    names: tuple[str, ...]
    workers: tuple[int, ...]
    gains: tuple[float, ...]
    objective: float
    kept: int

    @property
    def allocation(self) -> dict[str, int]:
        """``{job name: workers}``."""
        return dict(zip(self.names, self.workers))

    @property
    def used(self) -> int:
        """Workers allocated in total."""
        return sum(self.workers)


def job_gains(job: WafJob, d_running: float, d_transition: float, limit: int | None = None) -> np.ndarray:
    """``G(t, x')`` for ``x' = 0 .. len(throughput) - 1`` (``-inf`` where ``x'`` is forbidden).

    Parameters
    ----------
    job : WafJob
    d_running, d_transition : float
        Expected running time of the plan and the stall of a reconfiguration.
    limit : int, optional
        Truncate the table at ``limit`` workers.

    Returns
    -------
    numpy.ndarray
        One float per size; forbidden sizes (``0 < x' < min_workers``) are ``-inf``.

    References
    ----------
    Unicron, SOSP'23 (the reward of a reconfiguration plan).

    Examples
    --------
    >>> job = WafJob("a", weight=1.0, min_workers=2, throughput=[0, 1, 3, 4], current_workers=2)
    >>> job_gains(job, d_running=10, d_transition=1).tolist()
    [-3.0, -inf, 30.0, 37.0]
    """
    table = job._table
    size = table.size if limit is None else min(table.size, limit + 1)
    f = job.weight * table[:size]
    g = f * d_running
    g[1:job.min_workers] = -np.inf
    penalty = job.waf(job.current_workers) * d_transition
    if penalty != 0.0:
        keep = job.current_workers
        if job.failed or keep >= size:
            g -= penalty
        else:
            cur = g[keep]
            g -= penalty
            g[keep] = cur
    return g


def plan_workers(jobs: Sequence[WafJob], available: int, d_running: float, d_transition: float) -> Plan:
    """Choose every job's worker count to maximise the total gain (Unicron's re-planning).

    Exact dynamic programming, ``O(m * n * L)`` (``L`` = longest throughput
    table, at most ``n + 1``) in vectorised numpy; see the module docstring for
    the model, the feasible sizes and the tie rule (keep current sizes).

    Parameters
    ----------
    jobs : sequence of WafJob
        The jobs, names unique.
    available : int
        ``n``, the healthy workers that can be allocated (``>= 0``).
    d_running : float
        ``D_running >= 0``: how long the new plan is expected to run.
    d_transition : float
        ``D_transition >= 0``: how long a reconfiguration stalls a job.

    Returns
    -------
    Plan

    Raises
    ------
    ValueError
        On a duplicate job name or an invalid ``available``, ``d_running`` or
        ``d_transition`` (the field is named in the message).

    References
    ----------
    Unicron: Economizing Self-Healing LLM Training at Scale, SOSP'23 (arXiv:2401.00134),
    the re-planning (plan generation) step.

    Examples
    --------
    Job ``b`` lost one of its 3 workers and 6 workers remain: shrinking ``a``
    from 4 to 3 (it pays the transition) so that ``b`` restarts on 3 beats
    restarting ``b`` on 2:

    >>> a = WafJob("a", weight=1.0, min_workers=2, throughput=[0, 0, 2, 3, 4, 4.5, 4.6], current_workers=4)
    >>> b = WafJob("b", weight=2.0, min_workers=2, throughput=[0, 0, 2, 3], current_workers=3, failed=True)
    >>> plan = plan_workers([a, b], available=6, d_running=100, d_transition=5)
    >>> plan.allocation, plan.objective
    ({'a': 3, 'b': 3}, 850.0)
    """
    if not _is_int(available) or available < 0:
        raise ValueError(f"available must be an integer >= 0, got {available!r}")
    for nm, v in (("d_running", d_running), ("d_transition", d_transition)):
        if not _is_real(v) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{nm} must be a finite number >= 0, got {v!r}")
    jobs = list(jobs)
    seen: set[str] = set()
    for j in jobs:
        if not isinstance(j, WafJob):
            raise ValueError(f"jobs must be WafJob instances, got {type(j).__name__}")
        if j.name in seen:
            raise ValueError(f"jobs: duplicate job name {j.name!r}")
        seen.add(j.name)

    n = int(available)
    best = np.zeros(n + 1)
    kept = np.zeros(n + 1, dtype=np.int64)
    choices: list[np.ndarray] = []
    tables: list[np.ndarray] = []
    rows = np.arange(n + 1)
    for job in jobs:
        g = job_gains(job, d_running, d_transition, limit=n)
        tables.append(g)
        pad = g.size - 1  # the largest size considered
        # window[c, j] = best[c + j - pad] = best[c - x] for x = pad - j (-inf where x > c);
        # one contiguous row per total c, so the max-plus step is one add and one argmax.
        g_rev = g[::-1]
        window = sliding_window_view(np.concatenate((np.full(pad, -np.inf), best)), pad + 1)
        cand = window + g_rev
        j = cand.argmax(axis=1)
        top = cand[rows, j]
        if pad > 0:
            # Ties in gain: prefer the most jobs kept at their current size (exact, rarely many rows).
            eq = cand == top[:, None]
            tied = np.flatnonzero(np.count_nonzero(eq, axis=1) > 1)
            if tied.size:
                keep_rev = np.zeros(pad + 1, dtype=np.int64)
                if job.current_workers <= pad:
                    keep_rev[pad - job.current_workers] = 1
                kwin = sliding_window_view(np.concatenate((np.zeros(pad, dtype=np.int64), kept)), pad + 1)[tied]
                j[tied] = np.where(eq[tied], kwin + keep_rev, -1).argmax(axis=1)
        x = pad - j
        new_kept = kept[rows - x] + (x == job.current_workers)
        choices.append(x)
        best = top
        kept = new_kept

    workers = [0] * len(jobs)
    c = n
    for i in range(len(jobs) - 1, -1, -1):
        x = int(choices[i][c])
        workers[i] = x
        c -= x
    gains = tuple(float(tables[i][x]) for i, x in enumerate(workers))
    return Plan(
        names=tuple(j.name for j in jobs),
        workers=tuple(workers),
        gains=gains,
        objective=float(best[n]),
        kept=int(kept[n]),
    )
