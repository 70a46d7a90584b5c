"""Events that are failures in themselves: a training process that exited badly, an uncaught exception.

Each becomes one finding at once, with Unicron's severity: a crashed
process, a CUDA error or an illegal memory access must restart the process
(sev2); a timed-out or broken connection is retried in place (sev3). Their
findings are single events (``transient``): raised once, never cleared; the
correlator expires them.

References
----------
He et al., "Unicron: Economizing Self-Healing LLM Training at Scale", 2023, Table 1.
"""

from __future__ import annotations

from typing import Any

from vigil.detectors.base import Detector, Finding, KeyContext, register
from vigil.schemas import ProcessExit, TrainingException, to_seconds

__all__ = ["EXCEPTION_KINDS", "ProcessExitDetector", "ExceptionClassifier"]

#: Unicron's severity table for training exceptions: category -> (finding kind, severity).
EXCEPTION_KINDS: dict[str, tuple[str, int]] = {
    "cuda_error": ("cuda_error", 2),
    "illegal_memory_access": ("illegal_memory_access", 2),
    "out_of_memory": ("software_error", 2),
    "other": ("software_error", 2),
    "nccl_timeout": ("nccl_timeout", 3),
    "connection_reset": ("connection_reset", 3),
    "connection_refused": ("connection_refused", 3),
    "nccl_error": ("network_error", 3),
}


class _Transient(Detector):
    """The findings of the last input only (the engine reports each once)."""

    transient = True

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._last: list[Finding] = []

    @property
    def findings(self) -> list[Finding]:
        return list(self._last)

    @property
    def finding(self) -> Finding | None:
        return self._last[0] if self._last else None

    def update(self, event: Any, *, t: float) -> None:
        self.observe(event, t=t)

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 0


@register
class ProcessExitDetector(_Transient):
    """A training process that exited with a non-zero code or was killed by a signal (sev2).

    A clean exit (code 0) is the end of a job, not a failure.

    Examples
    --------
    >>> from vigil.schemas import ProcessExit, Source, from_seconds
    >>> det = ProcessExitDetector()
    >>> det.observe(ProcessExit(event_time=from_seconds(10.0), source=Source(node="n1", job="j", rank=3),
    ...                         pid=42, signal=9), t=10.0)
    >>> f = det.finding
    >>> f.kind, f.severity, f.subject, f.evidence["signal"]
    ('process_exit', 2, {'job': 'j', 'node': 'n1', 'rank': 3}, 9)
    >>> det.observe(ProcessExit(event_time=from_seconds(11.0), source=Source(node="n1", job="j", rank=3),
    ...                         pid=43, exit_code=0), t=11.0)
    >>> det.finding is None
    True
    """

    name = "process_exit"
    version = "1"
    consumes = ("process_exit",)
    per = "node"

    def observe(self, item: ProcessExit, *, t: float, context: KeyContext | None = None) -> None:
        self._last = []
        if item.signal is None and item.exit_code == 0:
            return
        at = to_seconds(item.event_time)
        self._last = [Finding("process_exit", 2, at, at,
                              {"pid": item.pid, "exit_code": item.exit_code, "signal": item.signal,
                               "local_rank": item.local_rank},
                              subject={"job": item.source.job, "node": item.source.node, "rank": item.source.rank})]

    @classmethod
    def _conformance_feed(cls, seed: int):
        import random

        from vigil.schemas import Source, from_seconds

        rng = random.Random(seed)
        calls = []
        for i in range(40):
            bad = rng.random() < 0.3
            ev = ProcessExit(event_time=from_seconds(float(i)), source=Source(node="n1", job="j", rank=i % 4),
                             pid=1000 + i, exit_code=None if bad else 0, signal=9 if bad else None)
            calls.append(("update", (ev,), {"t": float(i)}))
        return calls


@register
class ExceptionClassifier(_Transient):
    """An uncaught training exception, by the category the hooks classified it in (Unicron's table).

    Examples
    --------
    >>> from vigil.schemas import Source, TrainingException, from_seconds
    >>> det = ExceptionClassifier()
    >>> det.observe(TrainingException(event_time=from_seconds(5.0), source=Source(job="j", rank=1, node="n2"),
    ...                               category="nccl_timeout", exc_type="DistBackendError"), t=5.0)
    >>> det.finding.kind, det.finding.severity
    ('nccl_timeout', 3)
    """

    name = "exception_classifier"
    version = "1"
    consumes = ("training_exception",)
    per = "job"

    def observe(self, item: TrainingException, *, t: float, context: KeyContext | None = None) -> None:
        kind, severity = EXCEPTION_KINDS[item.category.value]
        at = to_seconds(item.event_time)
        self._last = [Finding(kind, severity, at, at,
                              {"category": item.category.value, "exc_type": item.exc_type,
                               "message": item.message[:500]},
                              subject={"job": item.source.job, "node": item.source.node, "rank": item.source.rank})]

    @classmethod
    def _conformance_feed(cls, seed: int):
        import random

        from vigil.schemas import Source, from_seconds

        rng = random.Random(seed)
        return [("update", (TrainingException(event_time=from_seconds(float(i)), source=Source(job="j", rank=i % 4),
                                              category=rng.choice(sorted(EXCEPTION_KINDS)), exc_type="RuntimeError"),),
                 {"t": float(i)}) for i in range(40)]
