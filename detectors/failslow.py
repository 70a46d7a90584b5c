"""A job's fail-slow: a verified slowdown of its iteration time, and which part of the step grew.

Detection runs on the job's iteration-time series (in a synchronous job every
rank sees the same step time) with a change-point detector from the registry,
:class:`~vigil.detectors.verification.ResidualCUSUMVerify` by default (a
robust residual CUSUM's candidates through Falcon's verification; Falcon's
own BOCD + verification remains as ``core="bocd_verify"``). When it verifies a slowdown, the per-rank split of the steps
around the onset tells computation from communication: a slow GPU makes the
slowest rank compute longer, a slow link makes every rank's communication
longer, even the one that waits least. For a computation fail-slow, the rank
that computed longest in most steps since the onset names the straggler's
node and GPU (what a micro-batch or topology plan moves work away from).

References
----------
T. Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for
Large-Scale Hybrid-Parallel Training", 2024.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vigil.detectors.base import REGISTRY, Detector, DetectorError, Finding, KeyContext, register
from vigil.detectors.inputs import PROGRESS, RANK_TIMINGS, Progress, RankTimings
from vigil.schemas import JobState, Slowdown

__all__ = ["FailSlowDetector", "slowdown_class"]


def slowdown_class(split: list[tuple[float, float, float]], onset: float,
                   before_steps: int = 50) -> tuple[str, float, float] | None:
    """``(class, d_compute, d_comm)`` from per-step ``(end, max compute, min communication)``.

    Compares the medians of up to ``before_steps`` steps before ``onset`` with
    those from it on; None when fewer than 3 steps before or 2 after are known.

    >>> before = [(float(i), 1.0, 0.2) for i in range(10)]
    >>> after = [(float(i), 1.3, 0.2) for i in range(10, 14)]
    >>> slowdown_class(before + after, onset=10.0)
    ('computation', 0.3, 0.0)
    """
    b = [x for x in split if x[0] < onset][-before_steps:]
    a = [x for x in split if x[0] >= onset]
    if len(b) < 3 or len(a) < 2:
        return None
    d_compute = float(np.median([x[1] for x in a]) - np.median([x[1] for x in b]))
    d_comm = float(np.median([x[2] for x in a]) - np.median([x[2] for x in b]))
    return ("computation" if d_compute >= d_comm else "communication"), round(d_compute, 6), round(d_comm, 6)


@register
class FailSlowDetector(Detector):
    """Per job: a verified slowdown of the iteration time, classed computation or communication.

    Parameters
    ----------
    core : str
        Registry name of the change-point detector run on the iteration
        times; it must offer ``update(x, *, t)`` and a ``finding`` holding the
        fail-slow in progress: ``"residual_cusum_verify"`` (robust to trends,
        seasons, warm-ups and short series; see
        :mod:`vigil.detectors.residual_cusum`) or Falcon's ``"bocd_verify"``.
        A restart of the job starts it afresh: the step time after a restart
        on other nodes is a new regime, not a fail-slow.
    history : int
        Steps of per-rank split kept for the classification.
    **core_params :
        Passed to the core's constructor.

    Examples
    --------
    A 2 % jittered 1 s step whose slowest rank starts computing 30 % longer at step 200:

    >>> import numpy as np
    >>> from vigil.detectors.inputs import Progress, RankTimings
    >>> rng = np.random.default_rng(0)
    >>> det = FailSlowDetector()
    >>> for step in range(260):
    ...     compute = 0.8 * (1.3 if step >= 200 else 1.0) * (1 + 0.02 * rng.standard_normal())
    ...     end = float(step)
    ...     det.observe(Progress(step, end, compute + 0.2), t=end)
    ...     det.observe(RankTimings(step, end, (0, 1), ("n1", "n2"), (0, 0), (compute, 0.8), (0.2, 0.2 + compute - 0.8),
    ...                             (0, 1), (0, 0), (0, 0)), t=end)
    >>> f = det.finding
    >>> f.kind, f.onset, f.slowdown.slowdown_class, round(f.slowdown.rel_change, 1)
    ('fail_slow', 200.0, 'computation', 0.2)
    """

    name = "fail_slow"
    version = "2"
    consumes = (PROGRESS, RANK_TIMINGS, "job_state")
    per = "job"

    def __init__(self, core: str = "residual_cusum_verify", history: int = 512, **core_params: Any) -> None:
        cls = REGISTRY.get(core)
        if cls is None:
            raise DetectorError(f"core must name a registered change-point detector, got {core!r}")
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise DetectorError(f"history must be a positive int, got {history!r}")
        self.core = core
        self.history = history
        self.core_params = dict(core_params)
        self._core_cls = cls
        self._reset()

    def _reset(self) -> None:
        self._detector = self._core_cls(**self.core_params)
        self._split: list[tuple[float, float, float]] = []
        self._slowest: list[tuple[float, str | None, int | None]] = []  # (end, node, gpu) of each step's slowest rank
        self._classified: tuple[float, Finding] | None = None

    def observe(self, item: Progress | RankTimings | JobState, *, t: float,
                context: KeyContext | None = None) -> None:
        if isinstance(item, JobState):
            if item.state == "restarting":
                self._reset()
            return
        if isinstance(item, Progress):
            if item.duration_s > 0:
                self._detector.update(item.duration_s, t=item.end)
            return
        slowest = max(range(len(item.compute_s)), key=item.compute_s.__getitem__)
        self._split.append((item.end, item.compute_s[slowest], min(item.communication_s)))
        self._slowest.append((item.end, item.nodes[slowest], item.gpus[slowest]))
        del self._split[:-self.history]
        del self._slowest[:-self.history]

    def update(self, x: float, *, t: float) -> None:
        """One iteration time ``x`` ending at ``t`` (no rank split: the class stays unknown)."""
        self._detector.update(x, t=t)

    @property
    def change_detected(self) -> bool:
        return bool(getattr(self._detector, "change_detected", False))

    @property
    def last_change(self) -> Finding | None:
        return getattr(self._detector, "last_change", None)

    @property
    def finding(self) -> Finding | None:
        f = self._detector.finding
        if f is None:
            return None
        if self._classified is not None and self._classified[0] == f.onset:
            return self._classified[1]
        # Classified once, when the fail-slow is first read (right after the step that verified it).
        evidence = dict(f.evidence)
        cls = slowdown_class(self._split, f.onset)
        if cls is not None:
            evidence["slowdown_class"], evidence["delta_compute_s"], evidence["delta_communication_s"] = cls
        before, after, rel = (evidence.get(k) for k in ("before", "after", "rel_change"))
        node, gpu = self._straggler(f.onset) if cls is not None and cls[0] == "computation" else (None, None)
        if node is not None:
            evidence["node"], evidence["gpu"] = node, gpu
        slowdown = Slowdown(before_s=_finite(before), after_s=_finite(after), rel_change=_finite(rel),
                            slowdown_class=cls[0] if cls is not None else None, node=node, gpu=gpu)
        out = Finding(f.kind, f.severity, f.onset, f.detected_at, evidence, slowdown=slowdown)
        self._classified = (f.onset, out)
        return out

    def _straggler(self, onset: float) -> tuple[str | None, int | None]:
        """Node and GPU of the rank that computed longest in most steps since ``onset`` (a strict majority)."""
        after = [(n, g) for end, n, g in self._slowest if end >= onset and n is not None]
        if not after:
            return None, None
        top, count = max(((w, after.count(w)) for w in set(after)), key=lambda x: (x[1], str(x[0])))
        return top if 2 * count > len(after) else (None, None)

    @classmethod
    def _conformance_feed(cls, seed: int):
        return REGISTRY["residual_cusum_verify"]._conformance_feed(seed)

    @classmethod
    def _conformance_warmup(cls) -> int:
        return REGISTRY["residual_cusum_verify"]._conformance_warmup()


def _finite(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0:
        return float(v)
    return None
