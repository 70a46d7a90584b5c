"""The straggler detector: :mod:`vigil.detectors.localization` run online over a job's recent steps.

Per job, it keeps the last steps' per-rank records (compute, communication,
wait, per-kind ops, coordinates), localizes over their per-rank medians
(:func:`~vigil.detectors.localization.localize_window`) and reports a
persistent culprit (a rank, a stage, a link, a TP cell) with its onset, or a
data-dependent spread.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.detectors.inputs import RANK_TIMINGS, RankTimings
from vigil.detectors.localization import (  # noqa: F401 - re-exported: the localizer's public names live here too
    _KINDS, Localization, Suspect, _validate, falcon_localize, falcon_rule, localize, localize_window,
)
from vigil.schemas import Slowdown

__all__ = ["Suspect", "Localization", "localize", "localize_window", "falcon_rule", "falcon_localize", "StragglerLocalizer"]


@register
class StragglerLocalizer(Detector):
    """Online straggler localization over a sliding window of iterations.

    Each ``update`` takes one iteration's per-rank records (see
    :func:`localize`). After ``min_iterations`` iterations the detector runs
    :func:`localize_window` over the last ``window`` iterations; a culprit
    that is the verdict for ``confirm`` consecutive updates becomes the
    finding (sev3: a fail-slow to mitigate, not a failure).

    Parameters
    ----------
    window : int, default 8
        Iterations in the sliding window.
    min_iterations : int, default 4
        Iterations before the first verdict.
    confirm : int, default 2
        Consecutive identical verdicts that open (or change) the finding.
    **localize params : stage_rel, worker_rel, link_rel, z, dominance
        Passed to :func:`localize`.

    Update signature: ``update(records, *, t)`` — one iteration, ``t`` its end.

    Finding: kind ``"straggler"``, severity 3, onset = end time of the first
    of the window's latest iterations that each show the culprit on their own
    (when it was first confirmed),
    evidence ``culprit, location, suspects`` (list of dicts with ``culprit,
    location, excess_s, score, evidence``), ``iterations``.

    References
    ----------
    Falcon (Wu et al., 2024); Lin et al., OSDI 2025.

    Examples
    --------
    A dp 2 x pp 2 job whose second stage computes 20 % longer from its first step:

    >>> import numpy as np
    >>> rng = np.random.default_rng(11)
    >>> det = StragglerLocalizer()
    >>> for i in range(8):
    ...     det.update([{"rank": r, "dp": r % 2, "pp": r // 2, "tp": 0, "comm": 0.3,
    ...                  "compute": (1.2 if r // 2 == 1 else 1.0) * (1 + 0.01 * rng.standard_normal())}
    ...                 for r in range(4)], t=float(i))
    >>> f = det.finding
    >>> f.kind, f.evidence["culprit"], f.evidence["location"]
    ('straggler', 'stage', ('stage', 1))
    """

    name = "straggler"
    version = "1"
    consumes = (RANK_TIMINGS,)
    per = "job"
    #: Localizing costs far more than detecting: every step while the job is slow, else every Nth.
    quiet_every = 16

    def __init__(
        self,
        window: int = 8,
        min_iterations: int = 4,
        confirm: int = 2,
        stage_rel: float = 0.06,
        worker_rel: float = 0.06,
        link_rel: float = 0.15,
        z: float = 5.0,
        dominance: float = 1.5,
        spread_sigma: float = 0.05,
    ):
        _check_positive_ints(window=window, min_iterations=min_iterations, confirm=confirm)
        if min_iterations > window:
            raise DetectorError(f"min_iterations ({min_iterations}) must not exceed window ({window})")
        self.window = window
        self.min_iterations = min_iterations
        self.confirm = confirm
        self.stage_rel = _check_positive(stage_rel, "stage_rel")
        self.worker_rel = _check_positive(worker_rel, "worker_rel")
        self.link_rel = _check_positive(link_rel, "link_rel")
        self.z = _check_positive(z, "z")
        self.dominance = _check_positive(dominance, "dominance")
        self.spread_sigma = _check_positive(spread_sigma, "spread_sigma")
        self._reset()

    def _reset(self) -> None:
        self._iters: deque = deque(maxlen=self.window)
        self._times: deque = deque(maxlen=self.window)
        self._result: Localization | None = None
        self._streak = 0
        self._confirmed: dict[str, Any] | None = None
        self._observed = 0
        self._placement: RankTimings | None = None

    def observe(self, item: RankTimings, *, t: float, context: KeyContext | None = None) -> None:
        """One step of the job's ranks; localized on every step while the job is slow (a fail-slow or
        a straggler raised for it), else on every ``quiet_every``-th (persistent stragglers)."""
        self._observed += 1
        slow = context is not None and bool(context.raised & {"fail_slow", "straggler"})
        if not slow and self._confirmed is None and self._observed % self.quiet_every:
            return
        self._placement = item
        records = [{"rank": r, "dp": d, "pp": p, "tp": q, "compute": c, "comm": m}
                   for r, c, m, d, p, q in zip(item.ranks, item.compute_s, item.communication_s, item.dp, item.pp,
                                               item.tp)]
        if item.wait_s and any(w is not None for w in item.wait_s):
            for rec, w in zip(records, item.wait_s):
                rec["wait"] = w
        if item.ops and all(o for o in item.ops):  # per-kind communication only when every rank has it
            for rec, o in zip(records, item.ops):
                rec["ops"] = o
        self.update(records, t=item.end)

    def update(self, records: Sequence[Mapping[str, Any]], *, t: float) -> None:
        t = _check_time(t, "t")
        recs = [dict(r, ops=dict(r["ops"])) if isinstance(r.get("ops"), Mapping) else dict(r) for r in _validate(records)]
        self._iters.append(recs)
        self._times.append(t)
        if len(self._iters) < self.min_iterations:
            return
        res = localize_window(
            list(self._iters), stage_rel=self.stage_rel, worker_rel=self.worker_rel, link_rel=self.link_rel, z=self.z,
            dominance=self.dominance, spread_sigma=self.spread_sigma,
        )
        prev = self._result
        self._result = res
        if prev is not None and (res.culprit, res.location) == (prev.culprit, prev.location):
            self._streak += 1
        else:
            self._streak = 1
        if res.culprit in ("none", "spread"):  # spread: no one to mitigate; the verdict says so
            if self._streak >= self.confirm:
                self._confirmed = None
            return
        if self._streak >= self.confirm:
            c = self._confirmed
            if c is None or (c["culprit"], c["location"]) != (res.culprit, res.location):
                self._confirmed = {"culprit": res.culprit, "location": res.location,
                                   "onset": self._onset_of(res.location, t), "detected_at": t}
            self._confirmed["suspects"] = [
                {"culprit": s.culprit, "location": s.location, "excess_s": s.excess_s, "score": s.score, "evidence": s.evidence}
                for s in res.suspects
            ]

    def _onset_of(self, location: tuple | None, t: float) -> float:
        """When the culprit began: the end of the first of the window's latest iterations that each
        show it on their own (``t`` when the latest does not).

        Not the window's first iteration: while a job is healthy only every ``quiet_every``-th
        step is kept, so the window can reach far back, to before the culprit slowed down."""
        params = {"stage_rel": self.stage_rel, "worker_rel": self.worker_rel, "link_rel": self.link_rel,
                  "z": self.z, "dominance": self.dominance}
        onset = t
        for recs, at in zip(reversed(self._iters), reversed(self._times)):
            if all(s.location != location for s in localize(recs, **params).suspects):
                break
            onset = at
        return onset

    @property
    def localization(self) -> Localization | None:
        """The latest verdict over the window (None before ``min_iterations``)."""
        return self._result

    @property
    def finding(self) -> Finding | None:
        c = self._confirmed
        if c is None:
            return None
        evidence = {"culprit": c["culprit"], "location": c["location"], "suspects": c["suspects"],
                    "iterations": len(self._iters)}
        slowdown = None
        loc = c["location"]
        where = self._placement.placement(loc[1]) if self._placement is not None and isinstance(loc, (list, tuple)) \
            and len(loc) == 2 and loc[0] == "rank" else None
        if where is not None:  # the rank's node and GPU: what a GPU or link cause there explains
            evidence["node"], evidence["gpu"] = where
            slowdown = Slowdown(node=where[0], gpu=where[1])
        return Finding("straggler", 3, c["onset"], c["detected_at"], evidence, slowdown=slowdown)

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"window": 6, "min_iterations": 3}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        rng = np.random.default_rng(seed)
        dp, pp, tp = 4, 2, 2
        calls = []
        for i in range(12):
            f_d = np.exp(rng.normal(0, 0.02, dp))
            recs = []
            for d in range(dp):
                for p in range(pp):
                    for t in range(tp):
                        c = float(1.0 * f_d[d] * np.exp(rng.normal(0, 0.01)))
                        ops = {k: float(0.1 * np.exp(rng.normal(0, 0.02))) for k in _KINDS}
                        recs.append({"rank": (p * dp + d) * tp + t, "dp": d, "pp": p, "tp": t, "compute": c, "comm": sum(ops.values()), "ops": ops})
            calls.append(("update", (recs,), {"t": 10.0 * (i + 1)}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 12
