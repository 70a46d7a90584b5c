"""Topology-aware placement of a DP x PP job on minipods (Arnold).

A cluster's nodes hang off leaf switches grouped into *minipods*; traffic that
leaves a minipod crosses the spine, where bandwidth is scarcer. A training job
laid out as ``dp`` data-parallel replicas x ``pp`` pipeline stages (one node
per (replica, stage); tensor parallelism stays inside a node) has two kinds of
communication groups:

- the **PP group** of replica ``d``: its ``pp`` nodes, stage to stage
  (point-to-point activations);
- the **DP group** of stage ``s``: the ``dp`` nodes holding that stage in every
  replica (the gradient all-reduce).

Ranks are numbered ``rank = d * pp + s`` (a PP group is ``pp`` consecutive
ranks), so ``rank_nodes[d * pp + s]`` is the node of replica ``d``, stage ``s``.

Objective (lower is better)
---------------------------
- ``dp_spread`` = the **maximum** over stages of the number of distinct
  minipods spanned by the stage's DP group. The maximum, as in Arnold's
  evaluation ("maximum spread of communication groups"): the all-reduce of
  every stage runs in lock-step, so the most spread one sets the pace.
  ``dp_spread_total`` (the sum over stages) is reported too.
- ``pp_splits`` = the number of PP groups whose nodes are not all in one
  minipod.
- ``objective = alpha * dp_spread + beta * pp_splits`` (``alpha = beta = 1``
  by default).

Exact solution
--------------
Only *how many* replicas put stage ``s`` in minipod ``k`` matters,
``n[s, k]``: the DP spread of stage ``s`` is ``#{k : n[s, k] > 0}``, and the
largest number of unsplit PP groups is ``sum_k min_s n[s, k]`` (a whole
replica in minipod ``k`` uses one slot of every stage there; the leftover
slots of each stage number the same, ``dp - unsplit``, and are paired into
the split replicas in any order). Writing ``n[s, k] = u[k] + v[s, k]`` with
``u[k]`` whole replicas and ``v[s, k]`` split slots gives the integer program

    minimise  alpha * M + beta * (dp - sum_k u[k])
    s.t.      sum_k (u[k] + v[s,k]) = dp                 (every stage placed)
              pp * u[k] + sum_s v[s,k] <= free_k         (capacity)
              u[k] <= floor(free_k / pp) * w[k]          (w[k]: k holds whole replicas)
              v[s,k] <= min(dp, free_k) * (w[k] + o[s,k])
              w[k] + o[s,k] <= 1                         (o[s,k]: stage s reaches k by split slots only)
              sum_k w[k] + sum_k o[s,k] <= M             (the DP spread of stage s)
              sum_k o[s,k] >= sum_k o[s+1,k]             (stages are interchangeable: symmetry breaking)
              u, v integer >= 0, w, o binary

Every placement maps to a feasible point of equal cost (``u = min_s n``,
``w = [u > 0]``, ``o[s,k] = [v[s,k] > 0 and w[k] = 0]``, stages sorted) and
every solution's layout costs at most its objective, so the optimum is
exact. The program has ``2 * pp * K + 2 * K + 1`` variables for ``K``
minipods with free nodes, whatever ``dp``, and is solved by
``scipy.optimize.milp`` (HiGHS) with a zero relative gap. Ties between
placements of equal objective are left to the solver (deterministic for a
given input). Whole replicas are then laid out minipod by minipod
(consecutive ranks inside a minipod), the split ones after them, and inside
every minipod the free nodes go to its ranks in increasing rank order.

Baselines (topology-unaware schedulers, same rank order): :func:`place_best_fit`,
:func:`place_random_fit`, :func:`place_packing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Hashable, Sequence

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import coo_array

__all__ = [
    "Placement", "placement_spread", "place_job", "place_best_fit", "place_random_fit", "place_packing",
]


@dataclass(frozen=True)
class Placement:
    """A job placed on minipods.

    Attributes
    ----------
    dp, pp : int
        The job's layout.
    rank_nodes : tuple
        Node of every rank, ``rank = d * pp + s``.
    rank_minipods : tuple of int
        Minipod (index into the ``free_nodes`` argument) of every rank.
    pp_group_minipods : tuple of tuple of int
        For every PP group (replica) the distinct minipods it uses, in stage order.
    dp_spread : int
        Max over stages of the minipods spanned by the stage's DP group.
    dp_spread_total : int
        The same, summed over stages.
    pp_splits : int
        PP groups spanning more than one minipod.
    objective : float
        ``alpha * dp_spread + beta * pp_splits``.
    optimal : bool or None
        Whether the solver proved optimality (``None`` for the baselines).
    method : str
        ``"milp"``, ``"best_fit"``, ``"random_fit"`` or ``"packing"``.
    """

    dp: int
    pp: int
    rank_nodes: tuple[Hashable, ...]
    rank_minipods: tuple[int, ...]
    pp_group_minipods: tuple[tuple[int, ...], ...]
    dp_spread: int
    dp_spread_total: int
    pp_splits: int
    objective: float
    optimal: bool | None
    method: str


def _check_weight(name: str, v: object) -> float:
    if not isinstance(v, Real) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def _validate(free_nodes: Sequence[Sequence[Hashable]], dp: int, pp: int) -> list[list[Hashable]]:
    for name, v in (("dp", dp), ("pp", pp)):
        if not isinstance(v, Integral) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if isinstance(free_nodes, (str, bytes)) or not isinstance(free_nodes, Sequence):
        raise ValueError("free_nodes must be a sequence (one entry per minipod) of sequences of node ids")
    pods: list[list[Hashable]] = []
    seen: set[Hashable] = set()
    for k, pod in enumerate(free_nodes):
        if isinstance(pod, (str, bytes)) or not isinstance(pod, Sequence):
            raise ValueError(f"free_nodes[{k}] must be a sequence of node ids, got {pod!r}")
        for node in pod:
            if node in seen:
                raise ValueError(f"free_nodes: node {node!r} appears twice (minipod {k})")
            seen.add(node)
        pods.append(list(pod))
    need, have = dp * pp, len(seen)
    if need > have:
        raise ValueError(f"free_nodes: the job needs dp*pp = {need} nodes, only {have} are free")
    return pods


def placement_spread(rank_minipods: Sequence[int], dp: int, pp: int) -> tuple[int, int, int]:
    """``(dp_spread, dp_spread_total, pp_splits)`` of a rank-to-minipod assignment.

    Parameters
    ----------
    rank_minipods : sequence of int
        Minipod of every rank, ``rank = d * pp + s``.
    dp, pp : int

    Returns
    -------
    tuple of int
        Max and sum over stages of the minipods spanned by each DP group, and
        the number of PP groups spanning more than one minipod.

    References
    ----------
    Arnold, "Efficient Pre-Training of LLMs via Topology-Aware Communication
    Alignment on More Than 9600 GPUs" (arXiv:2509.15940): spread of DP and PP groups.

    Examples
    --------
    Two replicas of two stages; replica 1 straddles minipods 0 and 1:

    >>> placement_spread([0, 0, 0, 1], dp=2, pp=2)
    (2, 3, 1)
    """
    a = np.asarray(rank_minipods).reshape(dp, pp)
    per_stage = [len(set(a[:, s].tolist())) for s in range(pp)]
    splits = sum(len(set(row.tolist())) > 1 for row in a)
    return max(per_stage), sum(per_stage), int(splits)


def _build(pods: list[list[Hashable]], dp: int, pp: int, rank_pod: list[int], alpha: float, beta: float,
           optimal: bool | None, method: str) -> Placement:
    """Give every rank the next free node of its minipod (increasing rank order) and score it."""
    nxt = [0] * len(pods)
    nodes = []
    for k in rank_pod:
        nodes.append(pods[k][nxt[k]])
        nxt[k] += 1
    groups = tuple(tuple(dict.fromkeys(rank_pod[d * pp:(d + 1) * pp])) for d in range(dp))
    dmax, dtot, splits = placement_spread(rank_pod, dp, pp)
    return Placement(dp=dp, pp=pp, rank_nodes=tuple(nodes), rank_minipods=tuple(rank_pod),
                     pp_group_minipods=groups, dp_spread=dmax, dp_spread_total=dtot, pp_splits=splits,
                     objective=alpha * dmax + beta * splits, optimal=optimal, method=method)


def place_job(free_nodes: Sequence[Sequence[Hashable]], dp: int, pp: int, *, alpha: float = 1.0,
              beta: float = 1.0, time_limit: float | None = None) -> Placement:
    """Place a ``dp`` x ``pp`` job on minipods minimising ``alpha * dp_spread + beta * pp_splits`` (Arnold).

    Exact: an integer program over per-(stage, minipod) counts solved by
    HiGHS (see the module docstring for the model and the definitions).

    Parameters
    ----------
    free_nodes : sequence of sequence of hashable
        ``free_nodes[k]`` lists minipod ``k``'s free nodes, in the order in which
        consecutive ranks should take them (e.g. by rack position).
    dp, pp : int
        Data-parallel replicas and pipeline stages (one node each).
    alpha, beta : float
        Weights of the DP spread and of the split PP groups (``>= 0``).
    time_limit : float, optional
        Solver time limit in seconds; when it is hit the best placement found
        is returned with ``optimal=False``.

    Returns
    -------
    Placement

    Raises
    ------
    ValueError
        On an invalid ``dp``, ``pp``, weight or ``free_nodes`` (a node listed
        twice, fewer free nodes than ``dp * pp``).

    References
    ----------
    Arnold, "Efficient Pre-Training of LLMs via Topology-Aware Communication
    Alignment on More Than 9600 GPUs" (arXiv:2509.15940): the scheduling
    algorithm that minimises the spread of DP and PP groups across minipods.

    Examples
    --------
    Three minipods with 3, 4 and 5 free nodes, a job of 2 replicas x 4 stages:
    each replica gets a minipod of its own (no PP group is split, every DP
    group spans 2 minipods), where filling minipods in order splits both.

    >>> pods = [["a0", "a1", "a2"], ["b0", "b1", "b2", "b3"], ["c0", "c1", "c2", "c3", "c4"]]
    >>> p = place_job(pods, dp=2, pp=4)
    >>> p.rank_nodes, p.dp_spread, p.pp_splits, p.objective
    (('b0', 'b1', 'b2', 'b3', 'c0', 'c1', 'c2', 'c3'), 2, 0, 2.0)
    >>> q = place_packing(pods, dp=2, pp=4)
    >>> q.dp_spread, q.pp_splits, q.objective
    (2, 2, 4.0)
    """
    pods = _validate(free_nodes, dp, pp)
    alpha = _check_weight("alpha", alpha)
    beta = _check_weight("beta", beta)
    if time_limit is not None:
        _check_weight("time_limit", time_limit)
    ids = [k for k, pod in enumerate(pods) if pod]
    K = len(ids)
    free = np.array([len(pods[k]) for k in ids], dtype=np.float64)
    cap = np.minimum(free, dp)              # most nodes of one stage in a minipod
    most_whole = np.minimum(dp, np.floor(free / pp))
    # Variables: v[s,k] split slots, o[s,k] stage s reaches minipod k for split slots only,
    # u[k] whole replicas, w[k] minipod k holds whole replicas, M the max DP spread.
    V = lambda s, k: s * K + k
    O = lambda s, k: pp * K + s * K + k
    U = lambda k: 2 * pp * K + k
    W = lambda k: 2 * pp * K + K + k
    M = 2 * pp * K + 2 * K
    nv = M + 1
    c = np.zeros(nv)
    c[2 * pp * K:2 * pp * K + K] = -beta
    c[M] = alpha

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    for s in range(pp):
        # every stage placed: its whole-replica slots plus its split slots
        add([(V(s, k), 1.0) for k in range(K)] + [(U(k), 1.0) for k in range(K)], dp, dp)
        # DP spread of stage s = minipods with whole replicas + minipods reached by its split slots
        add([(W(k), 1.0) for k in range(K)] + [(O(s, k), 1.0) for k in range(K)] + [(M, -1.0)], -np.inf, 0.0)
        if s + 1 < pp:  # stages are interchangeable: order them by split reach (symmetry breaking)
            add([(O(s, k), 1.0) for k in range(K)] + [(O(s + 1, k), -1.0) for k in range(K)], 0.0, np.inf)
    for k in range(K):
        add([(V(s, k), 1.0) for s in range(pp)] + [(U(k), float(pp))], -np.inf, free[k])
        add([(U(k), 1.0), (W(k), -most_whole[k])], -np.inf, 0.0)
        for s in range(pp):
            add([(V(s, k), 1.0), (O(s, k), -cap[k]), (W(k), -cap[k])], -np.inf, 0.0)
            add([(O(s, k), 1.0), (W(k), 1.0)], -np.inf, 1.0)
    A = coo_array((vals, (rows, cols)), shape=(len(lo), nv)).tocsr()
    upper = np.concatenate((np.tile(cap, pp), np.ones(pp * K), most_whole, np.ones(K), [K]))
    options: dict[str, object] = {"mip_rel_gap": 0.0}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(nv),
               bounds=(np.zeros(nv), upper), options=options)
    if res.x is None:  # pragma: no cover - the program is always feasible when dp*pp nodes are free
        raise RuntimeError(f"placement solver found no solution: {res.message}")
    x = np.rint(res.x)
    counts = (x[:pp * K].reshape(pp, K) + x[2 * pp * K:2 * pp * K + K][None, :]).astype(np.int64)

    # Lay out: whole replicas minipod by minipod, then the split ones.
    whole = counts.min(axis=0)
    rem = counts - whole[None, :]
    rank_pod: list[int] = []
    for k in range(K):
        rank_pod.extend([ids[k]] * (pp * int(whole[k])))
    for _ in range(dp - int(whole.sum())):
        prev = -1
        for s in range(pp):
            k = prev if prev >= 0 and rem[s, prev] > 0 else int(np.argmax(rem[s]))
            rem[s, k] -= 1
            rank_pod.append(ids[k])
            prev = k
    return _build(pods, dp, pp, rank_pod, alpha, beta, bool(res.status == 0), "milp")


def _fill(pods: list[list[Hashable]], order: Sequence[int], dp: int, pp: int) -> list[int]:
    need = dp * pp
    rank_pod: list[int] = []
    for k in order:
        take = min(len(pods[k]), need - len(rank_pod))
        rank_pod.extend([k] * take)
        if len(rank_pod) == need:
            break
    return rank_pod


def place_best_fit(free_nodes: Sequence[Sequence[Hashable]], dp: int, pp: int, *, alpha: float = 1.0,
                   beta: float = 1.0) -> Placement:
    """Baseline: best-fit by minipod, blind to DP/PP groups.

    While nodes are missing, take the minipod with the fewest free nodes that
    holds all that are missing; if none does, take the largest one whole.
    Ranks follow the order in which nodes were taken.

    Parameters
    ----------
    free_nodes, dp, pp, alpha, beta
        As in :func:`place_job`.

    Returns
    -------
    Placement

    References
    ----------
    Arnold (arXiv:2509.15940), the best-fit baseline of its simulation.

    Examples
    --------
    No minipod holds all 6 nodes: the largest is taken whole, then the
    smallest that holds the last one:

    >>> pods = [["a0", "a1", "a2"], ["b0", "b1", "b2", "b3", "b4"], ["c0", "c1"]]
    >>> place_best_fit(pods, dp=2, pp=3).rank_nodes
    ('b0', 'b1', 'b2', 'b3', 'b4', 'c0')
    """
    pods = _validate(free_nodes, dp, pp)
    alpha, beta = _check_weight("alpha", alpha), _check_weight("beta", beta)
    missing = dp * pp
    unused = [k for k, pod in enumerate(pods) if pod]
    order = []
    while missing > 0:
        fits = [k for k in unused if len(pods[k]) >= missing]
        k = min(fits, key=lambda k: (len(pods[k]), k)) if fits else max(unused, key=lambda k: (len(pods[k]), -k))
        order.append(k)
        unused.remove(k)
        missing -= min(missing, len(pods[k]))
    return _build(pods, dp, pp, _fill(pods, order, dp, pp), alpha, beta, None, "best_fit")


def place_random_fit(free_nodes: Sequence[Sequence[Hashable]], dp: int, pp: int, *, seed: int = 0,
                     alpha: float = 1.0, beta: float = 1.0) -> Placement:
    """Baseline: minipods in a seeded random order, each filled before the next.

    Parameters
    ----------
    free_nodes, dp, pp, alpha, beta
        As in :func:`place_job`.
    seed : int
        Seed of the minipod order.

    Returns
    -------
    Placement

    References
    ----------
    Arnold (arXiv:2509.15940), the random baseline of its simulation.

    Examples
    --------
    >>> p = place_random_fit([["a0", "a1"], ["b0", "b1"], ["c0", "c1"]], dp=2, pp=2, seed=1)
    >>> len(set(p.rank_nodes)), p.method
    (4, 'random_fit')
    """
    pods = _validate(free_nodes, dp, pp)
    alpha, beta = _check_weight("alpha", alpha), _check_weight("beta", beta)
    order = np.random.default_rng(seed).permutation([k for k, pod in enumerate(pods) if pod]).tolist()
    return _build(pods, dp, pp, _fill(pods, order, dp, pp), alpha, beta, None, "random_fit")


def place_packing(free_nodes: Sequence[Sequence[Hashable]], dp: int, pp: int, *, alpha: float = 1.0,
                  beta: float = 1.0) -> Placement:
    """Baseline: GPU packing, minipods filled in index order.

    Parameters
    ----------
    free_nodes, dp, pp, alpha, beta
        As in :func:`place_job`.

    Returns
    -------
    Placement

    References
    ----------
    Arnold (arXiv:2509.15940), the GPU-packing baseline of its simulation.

    Examples
    --------
    >>> place_packing([["a0", "a1", "a2"], ["b0", "b1", "b2"]], dp=2, pp=2).rank_minipods
    (0, 0, 0, 1)
    """
    pods = _validate(free_nodes, dp, pp)
    alpha, beta = _check_weight("alpha", alpha), _check_weight("beta", beta)
    return _build(pods, dp, pp, _fill(pods, range(len(pods)), dp, pp), alpha, beta, None, "packing")
