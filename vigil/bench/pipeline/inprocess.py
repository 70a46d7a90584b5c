"""The detect stage's CPU per record in one process (:func:`inprocess`), and where it goes (cProfile)."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

from vigil.bench.command import reproducing_command
from vigil.bench.machine import measured
from vigil.schemas import topic_name
from vigil.sim.load import LoadGenerator

__all__ = ["INPROCESS_OPTIONS", "inprocess"]

#: ``inprocess`` arguments that ``python -m vigil.bench.pipeline inprocess`` takes, and its options.
INPROCESS_OPTIONS = {"gpus": "--gpus", "seconds": "--seconds", "warmup_s": "--warmup-seconds", "repeats": "--repeats",
                     "profile_lines": "--profile-lines"}


def inprocess(gpus: int = 25_000, seconds: float = 10.0, seed: int = 1, repeats: int = 3, profile_lines: int = 0,
              json_path: str | None = None, warmup_s: float = 5.0) -> dict[str, Any]:
    """CPU seconds per record of the detect stage alone (decode, engine, detectors, timers) on the
    generator's messages, on a simulated clock (no Kafka, no correlation); optionally cProfile's top lines.

    The messages are made first; each repeat runs a fresh stage over them (the best of ``repeats`` is the
    figure: the least disturbed by the rest of the machine). The first ``warmup_s`` of the cluster's
    telemetry builds the state (every job's and node's detectors) untimed, and what survived it is then
    frozen out of the collector's sight as the worker does (``gc.freeze``): the figure is the steady
    state's, the profile too. The result's ``command`` reproduces it (``python -m vigil.bench.pipeline
    inprocess ...``, or the Python call when ``seed``, which that command does not take, was changed).
    """
    command = reproducing_command(inprocess, dict(locals()), "python -m vigil.bench.pipeline inprocess",
                                  INPROCESS_OPTIONS)
    import cProfile
    import io
    import pstats

    from vigil.streams.config import StreamConfig
    from vigil.streams.engine.detection import DetectionEngine, EngineParams
    from vigil.streams.stages import DetectStage, Place, key_of_topics
    from vigil.streams.worker import TELEMETRY

    gen = LoadGenerator(gpus, 1e9, seed=seed)
    warm = int(warmup_s)
    # each second's messages arrive spread over it (20-900 ms after they are due), so that the timers tick
    # as often as the worker's do (every tick_interval_s of the arrival clock) between them
    msgs = []
    for t in range(1, warm + int(seconds) + 1):
        due = [m for m in gen.advance(1e9 + t) if m.event_type != "job_state"]
        msgs += [(m, 1e9 + t + 0.02 + 0.88 * i / len(due)) for i, m in enumerate(due)]
    config = StreamConfig(bootstrap="-")
    first = next((i for i, (_, at) in enumerate(msgs) if at > 1e9 + warm + 1), len(msgs))
    records = sum(m.records for m, _ in msgs[first:])
    topics = {t: topic_name(t, "vigil") for t in ("node_samples", "iteration_step")}

    def once(profiler: Any = None) -> float:
        stage = DetectStage(DetectionEngine(EngineParams()), key_of_topics(config, TELEMETRY))
        next_tick = 0.0
        began = 0.0
        gc.unfreeze()
        for offset, (m, now) in enumerate(msgs):
            if offset == first:  # the state is built: from here it is timed
                gc.collect(1)
                gc.freeze()
                began = time.process_time()
                if profiler is not None:
                    profiler.enable()
            stage.on_message(Place(topics[m.event_type], 0, offset, now), m.value, now)
            if now >= next_tick:
                stage.tick(now)
                next_tick = now + config.tick_interval_s
        if profiler is not None:
            profiler.disable()
        took = time.process_time() - began
        del stage
        gc.unfreeze()
        gc.collect()
        return took

    out: dict[str, Any] = {"command": command, "gpus": gpus, "cluster_seconds": seconds, "warmup_s": warm,
                           "records": records, "messages": len(msgs) - first}
    with measured(out.setdefault("machine", {})):
        cpu = [once() for _ in range(repeats)]
    best = min(cpu)
    out.update(cpu_s=[round(c, 3) for c in cpu], us_per_record=round(1e6 * best / records, 2),
               records_per_cpu_s=round(records / best), cores_to_keep_up=round(best / seconds, 3))
    if profile_lines:
        prof = cProfile.Profile()
        once(prof)
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(profile_lines)
        out["profile_tottime"] = [line for line in text.getvalue().splitlines() if line.strip()][-profile_lines - 1:]
        text = io.StringIO()
        stats.stream = text
        stats.sort_stats("cumulative").print_stats(profile_lines)
        out["profile_cumulative"] = [line for line in text.getvalue().splitlines() if line.strip()][-profile_lines - 1:]
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return out

