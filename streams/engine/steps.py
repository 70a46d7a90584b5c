"""A job's steps, from whichever events the job sends: :class:`~vigil.detectors.inputs.Progress` and
:class:`~vigil.detectors.inputs.RankTimings` for its detectors.

* ``iteration`` events, one per rank: a step is complete when a rank reports
  a later one; its first record is the job's progress, the closed step's
  records its rank timings;
* ``iteration_step`` events (every rank in columns): both at once;
* neither: the progress that the collective-period detector infers (only
  while the job reports no steps of its own).

The job progressed when another step ends later than the last one did. Step
numbers may go back (a restart from a checkpoint); old events (redelivered,
late ranks) end earlier and are not progress.
"""

from __future__ import annotations

from typing import Any

from vigil.detectors.inputs import Progress, RankTimings
from vigil.schemas import IterationStep, IterationTiming, to_seconds

__all__ = ["StepAssembler"]


class StepAssembler:
    """The step bookkeeping of one job (pure; times are event times)."""

    __slots__ = ("last_step", "_records")

    def __init__(self) -> None:
        #: (step, end) of the last step that counted as progress; step -1 when inferred.
        self.last_step: tuple[int, float] | None = None
        self._records: list[IterationTiming] = []

    def on_iteration(self, it: IterationTiming) -> list[Any]:
        """One rank's record of a step; the step is closed once a later one begins."""
        if self.last_step is not None and it.step == self.last_step[0]:
            self._records.append(it)
            return []
        progress = self._progress(it.step, to_seconds(it.end), it.duration_s)
        if progress is None:
            return []
        closing, self._records = self._records, [it]
        out: list[Any] = [progress]
        ranks = [r for r in closing if r.compute_s is not None and r.communication_s is not None]
        if ranks:
            out.append(RankTimings(
                step=ranks[0].step, end=to_seconds(ranks[0].end),
                ranks=tuple(r.source.rank if r.source.rank is not None else i for i, r in enumerate(ranks)),
                nodes=tuple(r.source.node for r in ranks), gpus=tuple(r.source.gpu for r in ranks),
                compute_s=tuple(r.compute_s for r in ranks),  # type: ignore[misc]
                communication_s=tuple(r.communication_s for r in ranks),  # type: ignore[misc]
                dp=tuple(r.dp or 0 for r in ranks), pp=tuple(r.pp or 0 for r in ranks),
                tp=tuple(r.tp or 0 for r in ranks), wait_s=tuple(r.wait_s for r in ranks),
                ops=tuple(dict(r.communication_by_kind) or None for r in ranks)))
        return out

    def on_step(self, st: IterationStep) -> list[Any]:
        """A whole step in columns: progress and rank timings at once."""
        end = to_seconds(st.end)
        progress = self._progress(st.step, end, st.duration_s)
        if progress is None:
            return []
        return [progress, RankTimings(
            step=st.step, end=end, ranks=tuple(st.ranks), nodes=tuple(st.nodes), gpus=tuple(st.gpus),
            compute_s=tuple(st.compute_s), communication_s=tuple(st.communication_s), dp=tuple(st.dp),
            pp=tuple(st.pp), tp=tuple(st.tp), wait_s=tuple(st.wait_s))]

    def on_inferred(self, progress: Progress) -> list[Any]:
        """Progress inferred from the job's collective calls: used while the job reports no steps."""
        if self.last_step is not None and self.last_step[0] >= 0:
            return []
        self.last_step = (-1, progress.end)
        return [progress]

    def _progress(self, step: int, end: float, duration: float) -> Progress | None:
        last = self.last_step
        if last is not None and (step == last[0] or end <= last[1]):
            return None
        self.last_step = (step, end)
        return Progress(step=step, end=end, duration_s=duration)
