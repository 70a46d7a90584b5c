"""The whole benchmark (:func:`run`: throughput, then the capacity curve, then the projection) and
:func:`merge` (one result from several shorter runs).

**Capacity**: :func:`~vigil.bench.pipeline.live.live` at increasing ``N`` until
a target breaks (a point measured in one run, or in ``runs_per_point`` shorter
ones combined by :mod:`vigil.bench.pipeline.runs`); the largest ``N`` holding
every target; the projection of workers and memory for 100k and 1M GPUs
(:mod:`vigil.bench.pipeline.projection`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from vigil.bench.command import reproducing_command
from vigil.bench.machine import machine_info, measured
from vigil.bench.pipeline.live import live
from vigil.bench.pipeline.projection import project
from vigil.bench.pipeline.runs import combine_runs, run_seed, split_faults
from vigil.bench.pipeline.throughput import BACKLOG_SECONDS, throughput

__all__ = ["CLI_OPTIONS", "merge", "run"]

#: ``run`` arguments that ``vigil bench pipeline`` takes, and its options.
CLI_OPTIONS = {"load_gpus": "--load-gpus", "workers": "--workers", "faults_per_kind": "--faults-per-kind",
               "throughput_workers": "--throughput-workers", "throughput_gpus": "--throughput-gpus",
               "throughput_seconds": "--throughput-seconds", "seed": "--seed", "runs_per_point": "--runs-per-point",
               "stop_at_first_miss": "--stop-at-first-miss/--keep-going"}


def run(json_path: str | None, load_gpus: tuple[int, ...] = (2000, 5000, 10_000, 25_000, 50_000), workers: int = 1,
        faults_per_kind: int = 100, throughput_workers: tuple[int, ...] = (1, 2), throughput_gpus: int = 25_000,
        throughput_seconds: float = BACKLOG_SECONDS, seed: int = 0, stop_at_first_miss: bool = True,
        progress: Callable[[str], Any] | None = None, runs_per_point: int = 1) -> dict[str, Any]:
    command = reproducing_command(run, dict(locals()), "vigil bench pipeline", CLI_OPTIONS)
    split_faults(faults_per_kind, runs_per_point)  # a split that leaves a run no fault fails now, not after throughput
    started = time.time()
    result: dict[str, Any] = {"command": command, "throughput": {}, "throughput_detail": {}, "capacity": []}
    with measured(result.setdefault("machine", {})):
        for w in throughput_workers:
            detail = throughput(w, gpus=throughput_gpus, seconds=throughput_seconds, seed=seed + 1, progress=progress)
            result["throughput"][str(w)] = detail["records_per_s"]
            result["throughput_detail"][str(w)] = detail
            _write(json_path, result, started)
        for gpus in sorted(load_gpus):
            point = _point(gpus, workers, faults_per_kind, seed, runs_per_point, progress)
            result["capacity"].append(point)
            _write(json_path, result, started)
            if stop_at_first_miss and not point["targets_met"]:
                break
    held = [p["gpus_per_worker"] for p in result["capacity"] if p["targets_met"]]
    result["max_gpus_per_worker_meeting_targets"] = max(held) if held else None
    result["projection"] = project(result["capacity"], result["max_gpus_per_worker_meeting_targets"],
                                  throughput=result["throughput"])
    _write(json_path, result, started)
    return result


def _point(gpus: int, workers: int, faults_per_kind: int, seed: int, runs_per_point: int,
           progress: Callable[[str], Any] | None) -> dict[str, Any]:
    """One capacity point: one :func:`live` run, or ``runs_per_point`` shorter ones combined."""
    if runs_per_point == 1:
        point = live(gpus * workers, workers=workers, faults_per_kind=faults_per_kind, seed=seed, progress=progress)
        point["runs_per_point"] = 1
        return point
    say = progress or (lambda _m: None)
    parts: list[dict[str, Any]] = []
    for r, faults in enumerate(split_faults(faults_per_kind, runs_per_point)):
        part = live(gpus * workers, workers=workers, faults_per_kind=faults, seed=run_seed(seed, r),
                    progress=lambda m, r=r: say(f"run {r + 1}/{runs_per_point}: {m}"), keep_lag_ms=True)
        part.update(seed=run_seed(seed, r), faults_per_kind=faults)
        parts.append(part)
        if part.get("stopped_early"):
            break  # overloaded: the point has failed, and the next run on the same load would be too
    point = combine_runs(parts)
    point["runs_per_point"] = runs_per_point  # asked for; `runs` lists those that ran
    return point


#: Speed marks (:func:`vigil.bench.machine.speed_mark`) within this ratio are taken for one machine.
SAME_SPEED = 1.25


def _same_machine(parts: list[dict[str, Any]]) -> None:
    """Refuse ``parts`` (flat, as :func:`merge` keeps them) measured on more than one machine."""
    machines = [p.get("machine") or {} for p in parts]
    models = {m.get("cpu_model") for m in machines}
    marks = [m["speed_mark_s"] for m in machines if m.get("speed_mark_s")]
    if len(models) > 1 or (marks and max(marks) > SAME_SPEED * min(marks)):
        seen = sorted({f"{m.get('cpu_model') or 'CPU not recorded'} (speed mark {m.get('speed_mark_s') or '-'} s)"
                       for m in machines})
        raise ValueError(f"the parts were measured on different machines: {'; '.join(seen)}; "
                         "measure every point on one machine and merge those")


def _write(json_path: str | None, result: dict[str, Any], started: float) -> None:
    result["wall_s"] = round(time.time() - started, 1)
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")


def merge(parts: list[dict[str, Any]], json_path: str | None = None, notes: list[str] | None = None,
          merge_command: str | None = None) -> dict[str, Any]:
    """One result from several runs of :func:`run` (each short enough to hold a shared machine's benchmark
    lock): their throughputs and capacity points (a later part's point replaces an earlier one of the
    same load), the largest load meeting every target and the projection recomputed; each part's command,
    machine and load average kept under ``parts``; ``wall_s`` the sum of theirs. ``merge_command``: the
    line that merged them (``python -m vigil.bench.pipeline merge ...``), kept beside the parts' commands.
    A part that is itself a merge brings its commands, parts and notes as they are (flat, its notes first).
    Parts measured on different machines (another CPU, or speed marks more than :data:`SAME_SPEED` apart) are
    refused: a curve and a projection drawn through points of two machines describe neither."""
    flat = [q for p in parts for q in (p["parts"] if isinstance(p.get("parts"), list) else
                                       [{"command": p.get("command"), "machine": p.get("machine"),
                                         "wall_s": p.get("wall_s")}])]
    _same_machine(flat)
    commands: list[Any] = []
    for p in parts:
        command = p.get("command")
        commands += command if isinstance(command, list) else [command]
    result: dict[str, Any] = {"command": commands, "throughput": {}, "throughput_detail": {}, "capacity": []}
    points: dict[int, dict[str, Any]] = {}
    for part in parts:
        result["throughput"].update(part.get("throughput") or {})
        result["throughput_detail"].update(part.get("throughput_detail") or {})
        for point in part.get("capacity") or []:
            points[point["gpus_per_worker"]] = point
    result["capacity"] = [points[g] for g in sorted(points)]
    held = [p["gpus_per_worker"] for p in result["capacity"] if p["targets_met"]]
    result["max_gpus_per_worker_meeting_targets"] = max(held) if held else None
    result["projection"] = project(result["capacity"], result["max_gpus_per_worker_meeting_targets"],
                                  throughput=result["throughput"])
    # the parts' machine (they share one), not the one that merged them
    result["machine"] = {**((parts[0].get("machine") or {}) if parts else machine_info()),
                         "load_before": parts[0]["machine"].get("load_before") if parts else None,
                         "load_after": parts[-1]["machine"].get("load_after") if parts else None}
    result["parts"] = flat
    result["wall_s"] = round(sum(p.get("wall_s") or 0.0 for p in parts), 1)
    if merge_command is not None:
        result["merge_command"] = merge_command
    carried = [n for p in parts for n in (p.get("notes") or [])]
    if carried or notes:
        result["notes"] = carried + list(notes or [])
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result

