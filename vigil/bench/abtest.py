"""Paired A/B comparison of interleaved blocks: the overhead of the hooks with a bootstrap interval.

Blocks of steps alternate hooks-off and hooks-on within one run, so drift of
the machine hits both; :func:`ab_overhead` pairs each on-block with its
neighbours and reports the median relative difference with a percentile
bootstrap interval, per measure (wall time, the main thread's CPU, the
process's CPU).
"""

from __future__ import annotations

import random
import statistics
from typing import Any

__all__ = ["MEASURES", "ab_overhead"]


MEASURES = ("wall", "cpu_main", "cpu_process")


def _bootstrap_ci(values: list[float], stat: Any, rng: Any, n_boot: int, level: float) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(values)``."""
    n = len(values)
    if n < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    boots = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    lo = boots[int((1.0 - level) / 2 * (n_boot - 1))]
    hi = boots[int((1.0 + level) / 2 * (n_boot - 1) + 0.5)]
    return lo, hi


def ab_overhead(ranks: list[list[tuple]], block: int, *, skip_blocks: int = 1, warm: int = 0, seed: int = 0,
                n_boot: int = 2000, level: float = 0.95) -> dict[str, Any]:
    """The end-to-end A/B of an alternating run, on wall time and on CPU time.

    ``ranks``: per rank, per step ``(step, hooks_on, wall_s, process_cpu_s,
    main_thread_cpu_s, hook_threads_cpu_s)`` (:func:`run_workload`'s
    ``ranks``). Steps are grouped in blocks of ``block``; the first
    ``skip_blocks`` blocks (warm-up) and the first ``warm`` steps of every
    block are left out. ``warm`` is 0 by default: the hooks flush their
    records at the first step of an on block (the last flush was more than
    ``flush_interval_s`` ago), so leaving that step out would leave the flush
    out; the switch itself (wrappers installed or removed, the control thread
    started or joined) happens between the timed steps. Per block, each
    measure is the mean over its steps (a mean, not a median: the flush is
    one step in many), averaged over the ranks. Each hooks-on block is
    compared with the mean of its hooks-off neighbours (both where there are
    two: a linear drift cancels), which gives one estimate per on block:

    * ``wall``: ``wall_on / wall_off - 1``;
    * ``cpu_main``: the extra CPU time of the rank's main thread plus the
      threads the hooks started (the control channel), over the off blocks'
      wall time (``vs_wall``) and over their CPU time (``vs_cpu``);
    * ``cpu_process``: the same with the whole process's CPU time
      (``time.process_time``: also gloo's worker and transport threads).

    and ``cpu_main_extra_us``, that extra CPU in microseconds per step. For
    each: the median over the on blocks with a seeded percentile bootstrap
    interval of the median (``ci``, ``level``), the mean with its interval,
    the spread (population sd) of the estimates (the pair spread), and the
    estimates, in percent (microseconds for ``cpu_main_extra_us``).
    """

    sums: dict[int, list[float]] = {}  # block -> [wall, cpu_main, cpu_proc] summed over ranks of per-rank means
    kind: dict[int, bool] = {}
    count: dict[int, int] = {}
    for rows in ranks:
        per: dict[int, list[list[float]]] = {}
        for step, on, wall, proc, main, hook in rows:
            b = step // block
            if b < skip_blocks or step - b * block < warm:
                continue
            per.setdefault(b, []).append([wall, main + hook, proc])
            kind[b] = on
        for b, xs in per.items():
            m = [statistics.fmean(col) for col in zip(*xs)]
            acc = sums.setdefault(b, [0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += m[i]
            count[b] = count.get(b, 0) + 1
    blocks = {b: [v / count[b] for v in acc] for b, acc in sums.items()}
    est: dict[str, list[float]] = {"wall": [], "cpu_main_vs_wall": [], "cpu_main_vs_cpu": [],
                                   "cpu_process_vs_wall": [], "cpu_process_vs_cpu": [], "cpu_main_extra_us": []}
    off_blocks, on_blocks = [], []
    for b in sorted(blocks):
        if not kind[b]:
            off_blocks.append(blocks[b])
            continue
        nb = [blocks[n] for n in (b - 1, b + 1) if n in blocks and not kind[n]]
        if not nb:
            continue
        on_blocks.append(blocks[b])
        ref = [statistics.fmean(col) for col in zip(*nb)]
        on = blocks[b]
        est["wall"].append(100.0 * (on[0] / ref[0] - 1.0))
        est["cpu_main_vs_wall"].append(100.0 * (on[1] - ref[1]) / ref[0])
        est["cpu_main_vs_cpu"].append(100.0 * (on[1] - ref[1]) / ref[1])
        est["cpu_process_vs_wall"].append(100.0 * (on[2] - ref[2]) / ref[0])
        est["cpu_process_vs_cpu"].append(100.0 * (on[2] - ref[2]) / ref[2])
        est["cpu_main_extra_us"].append(1e6 * (on[1] - ref[1]))
    if not on_blocks:
        raise ValueError("no hooks-on block next to a hooks-off block")
    rng = random.Random(seed)
    out: dict[str, Any] = {"pairs": len(on_blocks), "level": level, "bootstrap": n_boot, "seed": seed}
    for name, xs in est.items():
        lo, hi = _bootstrap_ci(xs, statistics.median, rng, n_boot, level)
        mlo, mhi = _bootstrap_ci(xs, statistics.fmean, rng, n_boot, level)
        out[name] = {"median": round(statistics.median(xs), 3), "ci": [round(lo, 3), round(hi, 3)],
                     "mean": round(statistics.fmean(xs), 3), "mean_ci": [round(mlo, 3), round(mhi, 3)],
                     "spread": round(statistics.pstdev(xs), 3), "estimates": [round(x, 3) for x in xs]}

    def ms(bl: list[list[float]], i: int) -> float | None:
        return round(1000.0 * statistics.median(x[i] for x in bl), 3) if bl else None
    out["step_ms"] = {"wall_off": ms(off_blocks, 0), "wall_on": ms(on_blocks, 0),
                      "cpu_main_off": ms(off_blocks, 1), "cpu_main_on": ms(on_blocks, 1),
                      "cpu_process_off": ms(off_blocks, 2), "cpu_process_on": ms(on_blocks, 2)}
    return out
