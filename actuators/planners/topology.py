"""Topology adjustment for fail-slows (Falcon's mitigation S3): node swaps in the DP x PP grid.

A job runs on a ``dp`` x ``pp`` grid of nodes, ``grid[d][s]`` = the node of
data-parallel replica ``d`` at pipeline stage ``s``. A row is a PP group
(one replica's pipeline, stage to stage point-to-point traffic); a column is
a DP group (one stage in every replica, the gradient all-reduce). Swapping
two nodes exchanges their roles (the model state of their stages moves with
the role); nothing else changes.

Stragglers: consolidate into the fewest stages
----------------------------------------------
Every replica runs the same stage partition (the same layers per stage) and
all replicas wait for each other at the all-reduce, so one slow node slows
its stage in its own pipeline and, through the synchronisation, the whole
iteration. Slow nodes scattered over many stages slow many pipelines in
different places; gathered into as few stages as possible (whole columns),
the slowdown becomes a property of those stages, which the pipeline
partitioner can then rebalance (fewer layers on the slow stages, applied to
every replica alike), and the other stages run at full speed.

:func:`consolidate_stragglers` puts the ``k`` stragglers into
``ceil(k / dp)`` stages (the fewest that can hold them) with the fewest
swaps. A swap moves at most one straggler into the target stages, so the
minimum is the number of stragglers outside them; the target stages are
therefore the ``ceil(k / dp)`` stages that already hold the most stragglers.
Among equally good choices **interior stages are preferred**: the first
stage also runs the embedding and the last one the output layer and the
loss, so they are the heaviest stages of a balanced partition already and
the usual critical path of the pipeline; a slow node there adds to the
longest stage, and their extra layers cannot be moved away to compensate.
Each straggler outside the targets is swapped with a healthy node of the
target stages, in its own replica when one is there (the swap then stays
inside one PP group: the replicas keep their node sets).

Congested link: from DP traffic to PP traffic
---------------------------------------------
Model: a link is a pair of nodes ``(a, b)`` (the path between their NICs).
Nodes in the same stage (one DP group) exchange all-reduce traffic, the
largest volume of the job (every stage's gradients, every iteration); nodes
in adjacent stages of one replica exchange pipeline activations (much
smaller, point to point); other pairs exchange nothing. Following Falcon, a
congested link that carries DP traffic is turned into a PP link:
:func:`reroute_congested_link` moves one endpoint next to the other in the
other's pipeline, one swap, which is the minimum because the endpoints
start in the same stage. A link that carries no DP traffic is left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Hashable, Sequence

__all__ = ["TopologyPlan", "consolidate_stragglers", "reroute_congested_link"]

Node = Hashable


@dataclass(frozen=True)
class TopologyPlan:
    """The result of a topology adjustment.

    Attributes
    ----------
    grid : tuple of tuple
        The new grid, ``grid[d][s]``.
    swaps : tuple of (node, node)
        The swaps, in the order applied.
    stages : tuple of int
        :func:`consolidate_stragglers`: the stages that hold the stragglers;
        :func:`reroute_congested_link`: the stages of the link's endpoints afterwards.
    """

    grid: tuple[tuple[Node, ...], ...]
    swaps: tuple[tuple[Node, Node], ...]
    stages: tuple[int, ...]


def _validate_grid(grid: Sequence[Sequence[Node]]) -> tuple[list[list[Node]], dict[Node, tuple[int, int]]]:
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) == 0:
        raise ValueError("grid must be a non-empty sequence of rows (one per DP replica)")
    rows: list[list[Node]] = []
    where: dict[Node, tuple[int, int]] = {}
    for d, row in enumerate(grid):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) == 0:
            raise ValueError(f"grid[{d}] must be a non-empty sequence of nodes (one per pipeline stage)")
        if len(row) != len(grid[0]):
            raise ValueError(f"grid[{d}] has {len(row)} stages, grid[0] has {len(grid[0])}: "
                             "the grid must be rectangular")
        for s, node in enumerate(row):
            if node in where:
                raise ValueError(f"grid: node {node!r} appears twice (at {where[node]} and {(d, s)})")
            where[node] = (d, s)
        rows.append(list(row))
    return rows, where


def _freeze(rows: list[list[Node]]) -> tuple[tuple[Node, ...], ...]:
    return tuple(tuple(r) for r in rows)


def consolidate_stragglers(grid: Sequence[Sequence[Node]], stragglers: Collection[Node]) -> TopologyPlan:
    """Gather straggler nodes into the fewest pipeline stages with the fewest swaps (Falcon S3).

    Parameters
    ----------
    grid : sequence of sequence of node
        ``grid[d][s]``: node of replica ``d`` at stage ``s`` (rectangular, nodes unique).
    stragglers : collection of node
        Slow nodes, all in ``grid``.

    Returns
    -------
    TopologyPlan
        ``stages`` are the ``ceil(k / dp)`` target stages (sorted); ``swaps``
        has one entry per straggler that was outside them (the minimum).

    Raises
    ------
    ValueError
        When the grid is not rectangular, repeats a node, or a straggler is not in it.

    References
    ----------
    Falcon: Pinpointing and Mitigating Stragglers for Large-Scale Hybrid-Parallel Training,
    USENIX ATC'24 (arXiv:2410.12588), the topology-adjustment mitigation (S3).

    Examples
    --------
    Two replicas of four stages; slow nodes ``a0`` (first stage) and ``b1``
    sit in different stages. One swap gathers them in stage 1, an interior
    stage, inside replica ``a``'s pipeline:

    >>> grid = [["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]
    >>> plan = consolidate_stragglers(grid, {"a0", "b1"})
    >>> plan.stages, plan.swaps
    ((1,), (('a0', 'a1'),))
    >>> plan.grid
    (('a1', 'a0', 'a2', 'a3'), ('b0', 'b1', 'b2', 'b3'))
    """
    rows, where = _validate_grid(grid)
    dp, pp = len(rows), len(rows[0])
    if isinstance(stragglers, (str, bytes)):
        raise ValueError("stragglers must be a collection of nodes, not a string")
    slow = set(stragglers)
    for node in slow:
        if node not in where:
            raise ValueError(f"stragglers: node {node!r} is not in the grid")
    if not slow:
        return TopologyPlan(_freeze(rows), (), ())
    need = math.ceil(len(slow) / dp)
    count = [0] * pp
    for node in slow:
        count[where[node][1]] += 1

    def boundary(s: int) -> bool:
        return pp > 2 and s in (0, pp - 1)

    ranked = sorted(range(pp), key=lambda s: (-count[s], boundary(s), s))
    target = set(ranked[:need])
    outside = [(d, s) for d in range(dp) for s in range(pp) if rows[d][s] in slow and s not in target]
    healthy = [(d, s) for d in range(dp) for s in sorted(target) if rows[d][s] not in slow]
    pairs: list[tuple[tuple[int, int], tuple[int, int]]] = []
    free = set(healthy)
    rest = []
    for d, s in outside:  # first pass: a healthy target slot in the straggler's own replica
        slot = next(((d, t) for t in sorted(target) if (d, t) in free), None)
        if slot is None:
            rest.append((d, s))
        else:
            free.discard(slot)
            pairs.append(((d, s), slot))
    remaining = [slot for slot in healthy if slot in free]
    pairs.extend(zip(rest, remaining))
    swaps = []
    for (d1, s1), (d2, s2) in pairs:
        a, b = rows[d1][s1], rows[d2][s2]
        rows[d1][s1], rows[d2][s2] = b, a
        swaps.append((a, b))
    return TopologyPlan(_freeze(rows), tuple(swaps), tuple(sorted(target)))


def reroute_congested_link(grid: Sequence[Sequence[Node]], link: tuple[Node, Node]) -> TopologyPlan:
    """Turn a congested link carrying DP all-reduce traffic into a PP link, with one swap (Falcon S3).

    See the module docstring for the traffic model. When ``a`` and ``b`` are
    in the same stage (one DP group), ``b`` is swapped into the stage next to
    ``a`` in ``a``'s replica (the later stage when there is one, else the
    earlier), so the link only carries that pipeline's activations. Otherwise
    the grid is returned unchanged.

    Parameters
    ----------
    grid : sequence of sequence of node
        ``grid[d][s]``: node of replica ``d`` at stage ``s``.
    link : (node, node)
        The endpoints of the congested link, two distinct nodes of ``grid``.

    Returns
    -------
    TopologyPlan
        ``stages`` holds the endpoints' stages afterwards.

    Raises
    ------
    ValueError
        When an endpoint is not in the grid, the endpoints are equal, or the
        link carries DP traffic in a job without pipeline stages to move it to
        (``pp == 1``).

    References
    ----------
    Falcon: Pinpointing and Mitigating Stragglers for Large-Scale Hybrid-Parallel Training,
    USENIX ATC'24 (arXiv:2410.12588), the topology-adjustment mitigation (S3).

    Examples
    --------
    ``a0`` and ``b0`` are both stage 0 (the same DP group): ``b0`` trades
    places with ``a1``, and the link now joins stages 0 and 1 of replica ``a``:

    >>> plan = reroute_congested_link([["a0", "a1"], ["b0", "b1"]], ("a0", "b0"))
    >>> plan.grid, plan.swaps, plan.stages
    ((('a0', 'b0'), ('a1', 'b1')), (('b0', 'a1'),), (0, 1))
    """
    rows, where = _validate_grid(grid)
    pp = len(rows[0])
    try:
        a, b = link
    except (TypeError, ValueError):
        raise ValueError(f"link must be a pair of nodes, got {link!r}") from None
    for node in (a, b):
        if node not in where:
            raise ValueError(f"link: node {node!r} is not in the grid")
    if a == b:
        raise ValueError(f"link: both endpoints are {a!r}")
    (da, sa), (db, sb) = where[a], where[b]
    if sa != sb:  # PP traffic or none: nothing to move
        return TopologyPlan(_freeze(rows), (), (sa, sb))
    if pp == 1:
        raise ValueError("link: the job has a single pipeline stage (pp == 1), there is no PP group to move it to")
    t = sa + 1 if sa + 1 < pp else sa - 1
    c = rows[da][t]
    rows[da][t], rows[db][sb] = b, c
    return TopologyPlan(_freeze(rows), ((b, c),), (sa, t))
