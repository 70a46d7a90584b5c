"""How one step's time divides into compute, communication and waiting for peers.

The hooks collect, for each step, intervals on one timeline (the host clock
on the CPU path, CUDA events on the device on the CUDA path):

* **collectives** (all-reduce, all-gather, reduce-scatter, ...), from issue to
  completion, with the kind of their process group (``tp``, ``dp``, ...);
* **blocked**: the intervals in which the rank's compute lane (the training
  thread on CPU, the compute stream on a GPU) could not proceed because it
  waited for a collective: a synchronous collective, the ``wait()`` of an
  asynchronous one, DDP's wait for its last gradient buckets;
* **waits**: time blocked waiting for a peer outside collectives, i.e.
  point-to-point send/recv (incl. ``batch_isend_irecv``) and the blocks the
  training loop marks with :meth:`~vigil.producers.training.TrainingMonitor.pipeline_wait`
  (pipeline bubbles);
* **compute marks**: the blocks the loop marks with
  :meth:`~vigil.producers.training.TrainingMonitor.compute` (optional).

:func:`split_step` turns them into the step's figures:

``communication_s``
    the length of the union of the collective intervals (overlapping
    collectives, e.g. DDP buckets in flight together, count once);
``wait_s``
    the length of the union of the waits;
``compute_s``
    with marks: the union of the marked blocks minus the blocked time and the
    waits inside them; without: the step's span minus the blocked time and
    the waits (``*_remainder``: whatever else the step did, e.g. loading
    data, counts as compute then, so mark compute where that matters).

Communication that overlaps compute (asynchronous collectives, DDP buckets
during the backward pass) is counted in ``communication_s`` *and* leaves
compute untouched, so the three figures may add up to more than the step:
they say how long each thing lasted, not a partition of the step.

The interval helpers are plain functions over ``(start, end)`` pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

__all__ = ["merge", "union_length", "minus_length", "StepSplit", "split_step",
           "COLLECTIVE", "BLOCKED", "WAIT", "COMPUTE"]

#: Flags of an interval (a synchronous collective is ``COLLECTIVE | BLOCKED``).
COLLECTIVE, BLOCKED, WAIT, COMPUTE = 1, 2, 4, 8


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of ``(start, end)`` intervals (empty or reversed ones are dropped).

    >>> merge([(3, 4), (0, 1), (0.5, 2), (5, 5)])
    [(0, 2), (3, 4)]
    """
    out: list[list[float]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of intervals.

    >>> union_length([(0, 1), (0.5, 2), (3, 4)])
    3.0
    """
    return float(sum(e - s for s, e in merge(intervals)))


def minus_length(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Length of ``union(a)`` outside ``union(b)``.

    >>> minus_length([(0, 10)], [(2, 3), (2.5, 4), (9, 12)])
    7.0
    """
    ma, mb = merge(a), merge(b)
    total = 0.0
    j = 0
    for s, e in ma:
        cur = s
        while j < len(mb) and mb[j][1] <= cur:
            j += 1
        k = j
        while k < len(mb) and mb[k][0] < e:
            bs, be = mb[k]
            if bs > cur:
                total += bs - cur
            cur = max(cur, be)
            if cur >= e:
                break
            k += 1
        if cur < e:
            total += e - cur
    return float(total)


@dataclass(frozen=True)
class StepSplit:
    """One step's figures (seconds), the seconds per kind of group, and how each was measured."""

    compute_s: float
    communication_s: float
    wait_s: float
    by_kind: dict[str, float] = field(default_factory=dict)
    measured: dict[str, str] = field(default_factory=dict)


def split_step(span: tuple[float, float], intervals: Sequence[tuple[int, float, float, str | None]], *,
               source: str = "cpu_wall") -> StepSplit:
    """The step's compute, communication and wait from its intervals.

    Parameters
    ----------
    span : (start, end)
        The step on the same timeline as the intervals.
    intervals : sequence of (flags, start, end, kind)
        ``flags`` a combination of :data:`COLLECTIVE`, :data:`BLOCKED`,
        :data:`WAIT`, :data:`COMPUTE`; ``kind`` the group kind of a collective
        or wait (``tp``, ``dp``, ``pp``...) or None.
    source : {"cpu_wall", "cuda_events"}
        The timeline, recorded in ``measured`` (compute without marks is
        ``<source>_remainder``).

    Examples
    --------
    A 1 s step: 0.3 s forward, a 0.2 s tensor-parallel all-reduce, a 0.1 s
    wait for the previous pipeline stage, 0.4 s backward (marked), and a
    data-parallel all-reduce overlapping the last 0.1 s of the backward:

    >>> iv = [(COMPUTE, 0.0, 0.3, None), (COLLECTIVE | BLOCKED, 0.3, 0.5, "tp"),
    ...       (WAIT, 0.5, 0.6, "pp"), (COMPUTE, 0.6, 1.0, None), (COLLECTIVE, 0.9, 1.0, "dp")]
    >>> s = split_step((0.0, 1.0), iv)
    >>> round(s.compute_s, 3), round(s.communication_s, 3), round(s.wait_s, 3)
    (0.7, 0.3, 0.1)
    >>> {k: round(v, 3) for k, v in s.by_kind.items()}
    {'dp': 0.1, 'pp': 0.1, 'tp': 0.2}
    >>> s.measured["compute_s"], s.measured["communication_s"]
    ('cpu_wall', 'cpu_wall')
    """
    coll: list[tuple[float, float]] = []
    not_compute: list[tuple[float, float]] = []
    waits: list[tuple[float, float]] = []
    marks: list[tuple[float, float]] = []
    per_kind: dict[str, list[tuple[float, float]]] = {}
    for flags, s, e, kind in intervals:
        if e is None or s is None or e <= s:
            continue
        if flags & COLLECTIVE:
            coll.append((s, e))
        if flags & WAIT:
            waits.append((s, e))
        if flags & (BLOCKED | WAIT):
            not_compute.append((s, e))
        if flags & COMPUTE:
            marks.append((s, e))
        if kind is not None and flags & (COLLECTIVE | WAIT):
            per_kind.setdefault(kind, []).append((s, e))
    if marks:
        compute = minus_length(marks, not_compute)
        how = source
    else:
        compute = minus_length([span], not_compute)
        how = f"{source}_remainder"
    measured = {"compute_s": how, "communication_s": source, "wait_s": source}
    return StepSplit(compute, union_length(coll), union_length(waits),
                     {k: union_length(v) for k, v in sorted(per_kind.items())}, measured)
