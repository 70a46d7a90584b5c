"""``vigil bench pipeline``: alert latency while a worker carries a large cluster's telemetry; capacity; throughput.

A map of the package:

* :mod:`~vigil.bench.pipeline.live` — one capacity point: a real broker, real
  workers, the load generator with faults; each fault's delay to its first
  alert naming its cause, consumer lag, CPU and RSS;
* :mod:`~vigil.bench.pipeline.throughput` — records/s draining a backlog;
* :mod:`~vigil.bench.pipeline.capacity` — the whole benchmark (:func:`run`)
  and :func:`merge` of shorter runs;
* :mod:`~vigil.bench.pipeline.runs` — one point from several shorter runs
  (faults split, results combined: pure);
* :mod:`~vigil.bench.pipeline.projection` — workers and memory for 100k and
  1M GPUs from the measured costs;
* :mod:`~vigil.bench.pipeline.scoring` — which alert answers which fault,
  distributions, targets (pure);
* :mod:`~vigil.bench.pipeline.replay` — the generator's messages through the
  worker's stages on a simulated clock, scored as the live run is: what is
  alerted, without a broker or the wall clock (deterministic);
* :mod:`~vigil.bench.pipeline.inprocess` — the detect stage's CPU per record
  and its profile;
* :mod:`~vigil.bench.pipeline.procs` — cores, worker processes, their stats.

``python -m vigil.bench.pipeline worker|inprocess|replay|merge`` runs the helpers.
"""

from vigil.bench.pipeline.cli import main
from vigil.bench.pipeline.capacity import CLI_OPTIONS, merge, run
from vigil.bench.pipeline.inprocess import INPROCESS_OPTIONS, inprocess
from vigil.bench.pipeline.live import live
from vigil.bench.pipeline.projection import project
from vigil.bench.pipeline.runs import combine_runs, split_faults
from vigil.bench.pipeline.scoring import (
    HANG_K, MIN_P99_SAMPLES, RSS_TARGET_MB, TARGETS, match, names_cause, percentile, quantile_ci, summarize,
    targets_met,
)
from vigil.bench.pipeline.throughput import throughput

__all__ = ["CLI_OPTIONS", "HANG_K", "combine_runs", "split_faults", "INPROCESS_OPTIONS", "inprocess", "main", "MIN_P99_SAMPLES", "RSS_TARGET_MB", "TARGETS", "live", "match", "merge", "names_cause",
           "percentile", "project", "quantile_ci", "run", "summarize", "targets_met", "throughput"]
