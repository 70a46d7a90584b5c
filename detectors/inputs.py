"""Inputs the engine derives from events for the detectors of a job.

A job reports its steps in one of three ways: one ``iteration`` event per
rank, one ``iteration_step`` event with every rank in columns, or nothing but
its collective calls (whose period gives the iteration time). The engine turns
all three into the same two inputs, so a detector of a job's progress or of
its ranks' balance reads one shape:

* :class:`Progress` (``"progress"``): the job completed a step;
* :class:`RankTimings` (``"rank_timings"``): every reporting rank's timings of one step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Progress", "RankTimings", "PROGRESS", "RANK_TIMINGS"]

PROGRESS = "progress"
RANK_TIMINGS = "rank_timings"


@dataclass(frozen=True, slots=True)
class Progress:
    """The job completed ``step`` at ``end`` (seconds); the step took ``duration_s``.

    ``step`` is -1 when the step was inferred from the period of the job's
    collective calls (the job reports no step numbers).
    """

    step: int
    end: float
    duration_s: float
    #: When the worker heard of it (its clock): arrival minus end is the delivery delay.
    arrived: float | None = None


@dataclass(frozen=True, slots=True)
class RankTimings:
    """One step's timings of every reporting rank, in columns (element ``i`` is rank ``ranks[i]``)."""

    step: int
    end: float
    ranks: tuple[int, ...]
    nodes: tuple[str | None, ...]
    gpus: tuple[int | None, ...]
    compute_s: tuple[float, ...]
    communication_s: tuple[float, ...]
    dp: tuple[int, ...]
    pp: tuple[int, ...]
    tp: tuple[int, ...]
    #: Seconds each rank was blocked waiting for a peer (pipeline bubbles, P2P waits); None: not measured.
    wait_s: tuple[float | None, ...] = ()
    #: Communication seconds by kind of group (tp, pp, dp...) per rank; None: not measured.
    ops: tuple[dict[str, float] | None, ...] = ()

    def placement(self, rank: int) -> tuple[str | None, int | None] | None:
        """Node and GPU of ``rank`` in this step, or None when it did not report."""
        try:
            i = self.ranks.index(rank)
        except ValueError:
            return None
        return self.nodes[i], self.gpus[i]
