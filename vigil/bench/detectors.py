"""Labelled benchmark of the change-point detectors on generated iteration-time traces.

``run(json_path)`` generates ``n_traces`` traces with :mod:`vigil.sim.traces`
(half clean, half with one or two injected fail-slows), feeds every trace,
value by value with its timestamps, to a fresh instance (default parameters)
of each detector in :data:`DETECTORS`, and scores the ``"fail_slow"`` change
points each one reports. ``"recovery"`` change points (the level went down)
are not alarms; they are scored separately for the recovery recall.

Scoring
-------
Indices are iteration numbers (0-based). A fail-slow episode ``e`` has a true
onset ``o_e`` (first slowed iteration) and a recovery ``r_e`` (first normal
iteration; the end of the trace when it outlasts it).

- **Alarm**: a change point of kind ``"fail_slow"``, with its detection index
  ``d`` (the update at which it was reported) and its reported onset ``o``.
- **True positive**: an alarm matches episode ``e`` when
  ``|o - o_e| <= ONSET_TOLERANCE`` (20 iterations) and ``o_e <= d < r_e``
  (reported while the episode lasts). Alarms are taken in order of
  detection; each is matched to the nearest-onset episode not yet detected.
  The first match of an episode is its detection.
- **False positive**: an alarm that matches no undetected episode (including
  a second alarm for an episode already detected, and any alarm on a clean
  trace).
- **Required episodes**: those whose effective step (relative increase of the
  expected iteration time at the onset, ``InjectedFailSlow.step``) is at least
  ``REQUIRED_STEP`` (10 %) and that last at least ``REQUIRED_ITERS`` (10)
  iterations inside the trace. Smaller or shorter ones (5 % slowdowns, a
  slow GPU hidden behind a slower one, a 20 s blip on a 4 s step) may be
  detected (that is a true positive, never a false one) but need not be:
  Falcon's verification counts 10 % and more.
- **IterationTrace accuracy**: a clean trace is correct when it raises no alarm; a
  faulty trace when every required episode is detected and there is no false
  positive. ``accuracy`` is the fraction of correct traces;
  ``accuracy_clean``, ``accuracy_computation``, ``accuracy_communication``
  split it by the cause of the trace's first episode.
- ``fpr``: fraction of clean traces with at least one alarm;
  ``false_alarms_per_10k``: false positives per 10,000 iterations, all traces.
- ``fnr``: missed episodes / all episodes (any size); ``fnr_ge10``: missed
  required episodes / required episodes.
- ``delay_median``, ``delay_p95``: ``d - o_e`` of detected required episodes
  (iterations); ``delay_median_ge20``: the same for steps of 20 % and more.
- ``onset_error_median``: median ``|o - o_e|`` of detected episodes.
- ``recovery_recall``: of the detected episodes that recover inside the trace
  with a recovery step of 10 % or more, the fraction for which a
  ``"recovery"`` change point with onset within the tolerance of ``r_e`` is
  reported before the end of the trace.
- ``updates_per_s``: updates divided by the wall time of the update loop
  (the detector's own work plus a Python loop, one core).

``localizer`` and ``acf`` come from :mod:`vigil.bench.localization` when it
exists (``null`` otherwise).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import numpy as np

from vigil.detectors.base import REGISTRY, Detector
import vigil.detectors.baselines  # noqa: F401  (registration)
import vigil.detectors.verification  # noqa: F401  (registration)
from vigil.sim.traces import IterationTrace, generate_traces

__all__ = ["DETECTORS", "ONSET_TOLERANCE", "REQUIRED_STEP", "REQUIRED_ITERS", "run", "run_detector", "score_trace"]

#: Detectors compared, by registry name.
DETECTORS = ("bocd_verify", "bocd", "sliding_window", "adwin", "page_hinkley")
#: Largest |reported onset - true onset| (iterations) of a true positive.
ONSET_TOLERANCE = 20
#: Episodes that must be detected: effective step >= 10 % ...
REQUIRED_STEP = 0.10
#: ... lasting at least this many iterations inside the trace.
REQUIRED_ITERS = 10


def run_detector(det: Detector, trace: IterationTrace) -> tuple[list[tuple[int, int, str]], float]:
    """Feed ``trace`` to ``det``; return its change points ``(index, onset_index, kind)`` and the loop time."""
    out: list[tuple[int, int, str]] = []
    xs = trace.iteration_times.tolist()
    ts = trace.timestamps.tolist()
    update = det.update
    t0 = time.perf_counter()
    for i, (x, t) in enumerate(zip(xs, ts)):
        update(x, t=t)
        if det.change_detected:
            c = det.last_change
            out.append((i, int(c.evidence["onset_index"]), c.kind))
    return out, time.perf_counter() - t0


def _required(trace: IterationTrace, e) -> bool:
    end = e.recovery if e.recovery is not None else len(trace)
    return e.step >= REQUIRED_STEP and end - e.onset >= REQUIRED_ITERS


def score_trace(trace: IterationTrace, changes: list[tuple[int, int, str]]) -> dict[str, Any]:
    """Match one trace's change points to its ground truth (see the module docstring)."""
    n = len(trace)
    eps = list(trace.fail_slows)
    detected: dict[int, tuple[int, int]] = {}  # episode -> (delay, onset error)
    fp = 0
    for d, o, kind in changes:
        if kind != "fail_slow":
            continue
        best, best_err = None, None
        for k, e in enumerate(eps):
            end = e.recovery if e.recovery is not None else n
            err = abs(o - e.onset)
            if k in detected or err > ONSET_TOLERANCE or not e.onset <= d < end:
                continue
            if best_err is None or err < best_err:
                best, best_err = k, err
        if best is None:
            fp += 1
        else:
            detected[best] = (d - eps[best].onset, best_err)
    required = [k for k, e in enumerate(eps) if _required(trace, e)]
    correct = fp == 0 and all(k in detected for k in required)
    # Recoveries of detected episodes.
    rec_total = rec_found = 0
    for k, e in enumerate(eps):
        if k not in detected or e.recovery is None or not e.recovery_step >= REQUIRED_STEP:
            continue
        rec_total += 1
        if any(kind == "recovery" and abs(o - e.recovery) <= ONSET_TOLERANCE and d >= e.recovery
               for d, o, kind in changes):
            rec_found += 1
    return {
        "correct": correct, "fp": fp, "detected": detected, "required": required, "episodes": eps,
        "rec_total": rec_total, "rec_found": rec_found,
    }


def _median(v: list[float]) -> float | None:
    return float(np.median(v)) if v else None


def _p95(v: list[float]) -> float | None:
    return float(np.percentile(v, 95)) if v else None


def _evaluate(name: str, traces: list[IterationTrace]) -> dict[str, Any]:
    cls = REGISTRY[name]
    n_correct = fp_total = clean_alarmed = 0
    by_class = {"clean": [0, 0], "computation": [0, 0], "communication": [0, 0]}
    n_eps = n_missed = n_req = n_req_missed = 0
    delays: list[float] = []
    delays20: list[float] = []
    onset_err: list[float] = []
    rec_total = rec_found = 0
    loop_time = 0.0
    n_updates = 0
    for tr in traces:
        det = cls()
        changes, dt = run_detector(det, tr)
        loop_time += dt
        n_updates += len(tr)
        s = score_trace(tr, changes)
        n_correct += s["correct"]
        fp_total += s["fp"]
        cls_name = "clean" if tr.clean else tr.fail_slows[0].cause
        by_class[cls_name][0] += s["correct"]
        by_class[cls_name][1] += 1
        if tr.clean:
            clean_alarmed += s["fp"] > 0
        for k, e in enumerate(s["episodes"]):
            n_eps += 1
            hit = s["detected"].get(k)
            n_missed += hit is None
            if hit is not None:
                onset_err.append(hit[1])
            if k in s["required"]:
                n_req += 1
                n_req_missed += hit is None
                if hit is not None:
                    delays.append(hit[0])
                    if e.step >= 0.20:
                        delays20.append(hit[0])
        rec_total += s["rec_total"]
        rec_found += s["rec_found"]
    n_clean = by_class["clean"][1]
    return {
        "accuracy": n_correct / len(traces),
        "fpr": clean_alarmed / n_clean if n_clean else None,
        "fnr": n_missed / n_eps if n_eps else None,
        "fnr_ge10": n_req_missed / n_req if n_req else None,
        "delay_median": _median(delays),
        "delay_p95": _p95(delays),
        "delay_median_ge20": _median(delays20),
        "onset_error_median": _median(onset_err),
        "updates_per_s": n_updates / loop_time if loop_time > 0 else None,
        "accuracy_clean": by_class["clean"][0] / n_clean if n_clean else None,
        "accuracy_computation": (by_class["computation"][0] / by_class["computation"][1]
                                 if by_class["computation"][1] else None),
        "accuracy_communication": (by_class["communication"][0] / by_class["communication"][1]
                                   if by_class["communication"][1] else None),
        "false_alarms": fp_total,
        "false_alarms_per_10k": fp_total / n_updates * 1e4,
        "recovery_recall": rec_found / rec_total if rec_total else None,
        "episodes": n_eps,
        "required_episodes": n_req,
    }


def _localization(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from vigil.bench import localization
    except ImportError:
        return {"accuracy": None}, {"rel_error_median": None}
    return localization.score_localizer(seed), localization.score_acf(seed)


def run(json_path: str | None = None, n_traces: int = 500, seed: int = 0,
        progress: Callable[[str], Any] | None = None, detectors: tuple[str, ...] = DETECTORS) -> dict[str, Any]:
    """Run the benchmark; write the result to ``json_path`` (when given) and return it."""
    t0 = time.perf_counter()
    traces = generate_traces(n_traces, seed=seed)
    result: dict[str, Any] = {
        "detectors": {},
        "localizer": None,
        "acf": None,
        "traces": {
            "n": len(traces), "clean": sum(tr.clean for tr in traces), "seed": seed,
            "iterations": int(sum(len(tr) for tr in traces)),
            "onset_tolerance": ONSET_TOLERANCE, "required_step": REQUIRED_STEP,
            "required_iterations": REQUIRED_ITERS,
        },
    }
    for name in detectors:
        if progress is not None:
            progress(f"detector {name}")
        result["detectors"][name] = _evaluate(name, traces)
    if progress is not None:
        progress("localizer and acf")
    result["localizer"], result["acf"] = _localization(seed)
    result["elapsed_s"] = time.perf_counter() - t0
    if json_path is not None:
        d = os.path.dirname(os.path.abspath(json_path))
        os.makedirs(d, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(_clean_json(result), f, indent=2, sort_keys=False)
            f.write("\n")
    return result


def _clean_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    if isinstance(obj, float):
        return None if not math.isfinite(obj) else round(obj, 6)
    if isinstance(obj, np.generic):
        return _clean_json(obj.item())
    return obj


def format_table(result: dict[str, Any]) -> str:
    """A short text table of the per-detector figures."""
    cols = ("accuracy", "fpr", "fnr", "fnr_ge10", "delay_median", "delay_p95", "onset_error_median",
            "updates_per_s")
    lines = ["detector        " + " ".join(f"{c[:12]:>12}" for c in cols)]
    for name, m in result["detectors"].items():
        cells = []
        for c in cols:
            v = m.get(c)
            cells.append(f"{'-':>12}" if v is None else (f"{v:12.0f}" if c == "updates_per_s" else f"{v:12.4f}"))
        lines.append(f"{name:<16}" + " ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import sys

    res = run(sys.argv[1] if len(sys.argv) > 1 else None, progress=lambda m: print(m, file=sys.stderr))
    print(format_table(res))
