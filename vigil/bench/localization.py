"""Scores for straggler localization and ACF iteration tracking on generated traces.

``score_localizer`` draws multi-rank cases from
:func:`vigil.sim.rank_traces.make_localization_case` (a culprit class per
case, a random 3D layout, jitter and data-dependent imbalance always present)
and counts a case correct when the localizer names the right class *and* the
right location. ``score_acf`` draws collective-call streams from
:func:`vigil.sim.rank_traces.make_collective_stream`, feeds them to the
``iteration_period`` detector and compares its iteration time with the truth
over the same span. Both are seeded and take a few seconds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vigil.detectors.period import IterationPeriod, acf_period
from vigil.detectors.straggler import StragglerLocalizer, _median_records, falcon_localize, localize, localize_window
from vigil.sim.rank_traces import make_collective_stream, make_localization_case

__all__ = ["score_localizer", "score_acf"]


def score_localizer(seed: int = 0, n_cases: int = 250, n_iters: int = 8) -> dict[str, Any]:
    """Accuracy (class and location) of the localizer on ``n_cases`` generated cases.

    Returns ``accuracy`` (windowed :func:`localize_window`, the detector's
    method), ``accuracy_online`` (the ``straggler`` detector's final verdict),
    ``accuracy_single_iteration`` (:func:`localize` on one iteration),
    ``accuracy_no_ops`` (windowed, without per-op timings; links are then
    unlocalizable), ``falcon_accuracy`` (the 1.1x-median baseline on the
    windowed medians), ``by_class`` accuracies and ``confusion``.
    """
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    ok = ok_online = ok_single = ok_noops = ok_falcon = 0
    by_class: dict[str, list[int]] = {}
    confusion: dict[str, dict[str, int]] = {}
    for _ in range(n_cases):
        its, truth = make_localization_case(rng, n_iters=n_iters)
        want = (truth["culprit"], truth["location"])
        loc = localize_window(its)
        got = (loc.culprit, loc.location)
        hit = got == want
        ok += hit
        by_class.setdefault(truth["culprit"], []).append(int(hit))
        row = confusion.setdefault(truth["culprit"], {})
        key = loc.culprit + ("@wrong_location" if loc.culprit == truth["culprit"] and not hit else "")
        row[key] = row.get(key, 0) + 1
        det = StragglerLocalizer()
        for i, recs in enumerate(its):
            det.update(recs, t=float(i))
        res = det.localization
        ok_online += res is not None and (res.culprit, res.location) == want
        single = localize(its[-1])
        ok_single += (single.culprit, single.location) == want
        stripped = [[{k: v for k, v in r.items() if k != "ops"} for r in it] for it in its]
        noops = localize_window(stripped)
        ok_noops += (noops.culprit, noops.location) == want
        fal = falcon_localize(_median_records(its))
        ok_falcon += (fal.culprit, fal.location) == want
    n = float(n_cases)
    return {
        "accuracy": ok / n,
        "accuracy_online": ok_online / n,
        "accuracy_single_iteration": ok_single / n,
        "accuracy_no_ops": ok_noops / n,
        "falcon_accuracy": ok_falcon / n,
        "by_class": {k: float(np.mean(v)) for k, v in sorted(by_class.items())},
        "cases_by_class": {k: len(v) for k, v in sorted(by_class.items())},
        "confusion": confusion,
        "n_cases": n_cases,
        "n_iters": n_iters,
        "seconds": time.perf_counter() - t0,
    }


def score_acf(seed: int = 0, n_cases: int = 100, n_iters: int = 40) -> dict[str, Any]:
    """Relative error of the ACF iteration time on ``n_cases`` generated streams.

    The detector's :attr:`~vigil.detectors.period.IterationPeriod.iteration_time`
    (median over its window) is compared with the median true iteration time
    of the iterations that lie inside that window. Also reports the period
    accuracy of the detector and of Falcon's plain first-lag rule (threshold
    0.95, no refinement) on the first ``max_calls`` calls.
    """
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    errs, period_ok, falcon_ok, found = [], 0, 0, 0
    for _ in range(n_cases):
        calls, truth = make_collective_stream(rng, n_iters=n_iters)
        det = IterationPeriod()
        for op, grp, t in calls:
            det.update(op, grp, t=t)
        P = truth["period"]
        plain = acf_period([f"{o}|{g}" for o, g, _ in calls[: det.max_calls]], refine=False)
        falcon_ok += plain == P
        if det.period is None or det.iteration_time is None:
            errs.append(float("inf"))
            continue
        found += 1
        period_ok += det.period == P
        lo, hi = det.window_span
        starts = np.asarray(truth["iter_starts"])
        times = np.asarray(truth["iter_times"])
        inside = (starts >= lo) & (starts + times <= hi)
        ref = float(np.median(times[inside])) if inside.any() else float(np.median(times[1:]))
        errs.append(abs(det.iteration_time - ref) / ref)
    e = np.asarray(errs)
    finite = e[np.isfinite(e)]
    return {
        "rel_error_median": float(np.median(e)),
        "rel_error_p95": float(np.quantile(e, 0.95)),
        "within_2pct": float(np.mean(e <= 0.02)),
        "period_accuracy": period_ok / n_cases,
        "falcon_first_lag_period_accuracy": falcon_ok / n_cases,
        "found": found / n_cases,
        "rel_error_mean_found": float(np.mean(finite)) if finite.size else None,
        "n_cases": n_cases,
        "seconds": time.perf_counter() - t0,
    }


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps({"localizer": score_localizer(), "acf": score_acf()}, indent=2, default=str))
