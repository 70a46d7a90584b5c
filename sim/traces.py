"""Labelled iteration-time traces of training jobs, with injected fail-slows.

A trace is the sequence of iteration times of one synchronous training job
(every rank sees the same step time) together with the exact ground truth of
what was injected into it. The generator models what real step-time series
show, job by job:

- a per-job base iteration time (0.2 s .. 4 s, log-uniform) split into a
  computation part and an exposed-communication part (compute fraction
  0.5 .. 0.85);
- warm-up: a slow first iteration (kernel compilation, autotuning, 3..20x)
  and a decaying excess over the next iterations;
- heavy-tailed multiplicative jitter: ``exp(sigma * T_nu)`` with ``sigma``
  0.5 % .. 4 % and Student-t degrees of freedom 3 .. 8, plus a slow drift of
  up to +-2 % (data order, learning-rate phases);
- periodic Python garbage collection (in 70 % of jobs, every 20 .. 500
  iterations, one iteration longer by 10 % .. 150 %);
- periodic checkpoints (every 200 .. 2000 iterations): synchronous ones add a
  blocking pause of 5 .. 60 s to one iteration and a 0 .. 15 % excess to the
  next; asynchronous ones (30 % of jobs) block 0.5 .. 3 s and leave 1 .. 3
  iterations slower by 2 .. 8 % while the snapshot is written out;
- occasional single-iteration spikes (0.1 % .. 1 % of iterations, +20 % ..
  +300 %, log-uniform).

Faulty traces carry one fail-slow (80 %) or two overlapping ones (20 %):

- ``"computation"``: one GPU (rank) computes slower (throttling, a bad
  part); the synchronous step waits for it, so the compute part of every
  iteration stretches by ``g``; two slow GPUs do not add up, the slowest
  one sets the pace.
- ``"communication"``: one link is congested; the exposed communication part
  stretches by ``c``.

``severity`` is the relative increase in mean iteration time the fail-slow
causes on its own (log-uniform 5 % .. 90 %); the per-component slowdown is
derived from it (``g = severity / compute_fraction``). Durations are
log-uniform from 20 s to 3 h and may outlast the trace (``recovery`` is then
``None``). Because two overlapping fail-slows interact (``step`` is the
relative change of the expected iteration time at the onset given what else is
going on, which can differ from the nominal severity), the ground truth records
both.

Everything is driven by one seed; only numpy and the standard library are used (and the
schema's GPUS_PER_NODE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vigil.schemas import GPUS_PER_NODE

__all__ = ["InjectedFailSlow", "IterationTrace", "generate_trace", "generate_traces"]

#: Earliest onset of an injected fail-slow (iterations), past any warm-up.
MIN_ONSET = 200


@dataclass(frozen=True)
class InjectedFailSlow:
    """Ground truth of one injected fail-slow.

    Indices are 0-based iteration numbers: ``onset`` is the first slowed
    iteration, ``recovery`` the first iteration back at normal speed (``None``
    when the fail-slow lasts past the end of the trace). Times are the
    completion timestamps of those iterations (seconds since the job began).
    """

    onset: int
    recovery: int | None
    cause: str  # "computation" | "communication"
    location: str  # "gpu:<rank>" or "link:<node>-<node>"
    severity: float  # nominal relative increase of the mean iteration time
    slowdown: float  # relative slowdown of the component (GPU compute or link)
    step: float  # effective relative change of expected iteration time at the onset
    recovery_step: float  # effective relative decrease at the recovery (nan if none)
    duration_s: float  # nominal duration in seconds
    onset_time: float
    recovery_time: float | None

    @property
    def duration_iters(self) -> int | None:
        return None if self.recovery is None else self.recovery - self.onset


@dataclass(frozen=True)
class IterationTrace:
    """One job's iteration times with its ground truth."""

    trace_id: int
    seed: int
    iteration_times: np.ndarray  # seconds per iteration
    timestamps: np.ndarray  # completion time of each iteration (s since job start)
    expected: np.ndarray  # expected iteration time with fail-slows and drift; no warm-up, jitter or pauses
    base_iteration_time: float
    compute_fraction: float
    n_gpus: int
    jitter: float
    fail_slows: tuple[InjectedFailSlow, ...]
    gc_iterations: np.ndarray = field(repr=False)
    checkpoint_iterations: np.ndarray = field(repr=False)
    spike_iterations: np.ndarray = field(repr=False)
    warmup_iterations: int = 0

    @property
    def clean(self) -> bool:
        return not self.fail_slows

    def __len__(self) -> int:
        return int(self.iteration_times.shape[0])


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def generate_trace(seed: int, *, faulty: bool | None = None, n_iterations: int | None = None,
                   trace_id: int = 0) -> IterationTrace:
    """Generate one trace from ``seed``.

    ``faulty``: inject fail-slows (``None``: a fair coin). ``n_iterations``:
    length (default 1000 .. 5000, uniform).
    """
    rng = np.random.default_rng(seed)
    if faulty is None:
        faulty = bool(rng.random() < 0.5)
    n = int(n_iterations) if n_iterations is not None else int(rng.integers(1000, 5001))
    if n < 2 * MIN_ONSET and faulty:
        raise ValueError(f"a faulty trace needs at least {2 * MIN_ONSET} iterations, got {n}")

    base = _loguniform(rng, 0.2, 4.0)
    phi = float(rng.uniform(0.5, 0.85))  # compute fraction of the step
    n_gpus = int(2 ** rng.integers(3, 11))  # 8 .. 1024
    sigma = _loguniform(rng, 0.005, 0.04)
    nu = float(rng.uniform(3.0, 8.0))
    i = np.arange(n, dtype=float)

    # Slow drift and warm-up (multiplicative on the expected time).
    drift_amp = float(rng.uniform(0.0, 0.02))
    drift_period = float(rng.uniform(500.0, 5000.0))
    drift = 1.0 + drift_amp * np.sin(2 * np.pi * i / drift_period + rng.uniform(0, 2 * np.pi))
    wu_amp = float(rng.uniform(0.2, 1.0))
    wu_tau = float(rng.uniform(3.0, 15.0))
    warm = 1.0 + wu_amp * np.exp(-i / wu_tau)
    warm[0] = _loguniform(rng, 3.0, 20.0)
    warmup_iterations = int(math.ceil(wu_tau * math.log(wu_amp / 0.005))) if wu_amp > 0.005 else 1

    # Fail-slows: per-iteration component factors.
    comp = np.ones(n)
    comm = np.ones(n)
    specs: list[dict] = []
    if faulty:
        n_faults = 2 if rng.random() < 0.2 else 1
        for k in range(n_faults):
            cause = "computation" if rng.random() < 0.5 else "communication"
            severity = _loguniform(rng, 0.05, 0.90)
            duration_s = _loguniform(rng, 20.0, 3 * 3600.0)
            if k == 0:
                onset = int(rng.integers(max(MIN_ONSET, n // 10), max(MIN_ONSET + 1, int(0.85 * n))))
            else:
                first = specs[0]
                lo = first["onset"] + 20
                hi = min(first["end"], n - 50)
                if hi <= lo:
                    break
                onset = int(rng.integers(lo, hi))
            frac = phi if cause == "computation" else 1.0 - phi
            slowdown = severity / frac
            dur_it = max(1, int(round(duration_s / (base * (1.0 + severity)))))
            end = min(n, onset + dur_it)
            recovery = onset + dur_it if onset + dur_it < n else None
            if cause == "computation":
                location = f"gpu:{int(rng.integers(0, n_gpus))}"
            else:
                nodes = max(2, n_gpus // GPUS_PER_NODE)
                a = int(rng.integers(0, nodes))
                b = int((a + rng.integers(1, nodes)) % nodes)
                location = f"link:node{min(a, b)}-node{max(a, b)}"
            specs.append(dict(cause=cause, severity=severity, slowdown=slowdown, onset=onset, end=end,
                              recovery=recovery, duration_s=duration_s, location=location))
        for s in specs:
            target = comp if s["cause"] == "computation" else comm
            seg = slice(s["onset"], s["end"])
            target[seg] = np.maximum(target[seg], 1.0 + s["slowdown"])  # the slowest sets the pace
    step_factor = phi * comp + (1.0 - phi) * comm
    expected = base * step_factor * drift
    times = expected * warm
    # Heavy-tailed multiplicative jitter.
    z = rng.standard_t(nu, size=n) / math.sqrt(nu / (nu - 2.0))
    times = times * np.exp(sigma * z)

    # Garbage collection.
    gc_idx = np.empty(0, dtype=int)
    if rng.random() < 0.7:
        period = int(rng.integers(20, 501))
        gc_idx = np.arange(int(rng.integers(0, period)), n, period)
        times[gc_idx] += base * rng.uniform(0.1, 1.5, size=gc_idx.size)
    # Checkpoints.
    ck_period = int(rng.integers(200, 2001))
    ck_idx = np.arange(int(rng.integers(ck_period // 2, ck_period + 1)), n, ck_period)
    if rng.random() < 0.3:  # asynchronous
        times[ck_idx] += rng.uniform(0.5, 3.0, size=ck_idx.size)
        for j in ck_idx:
            tail = int(rng.integers(1, 4))
            seg = slice(j + 1, min(n, j + 1 + tail))
            times[seg] *= 1.0 + rng.uniform(0.02, 0.08)
    else:
        times[ck_idx] += rng.uniform(5.0, 60.0, size=ck_idx.size)
        nxt = ck_idx[ck_idx + 1 < n] + 1
        times[nxt] *= 1.0 + rng.uniform(0.0, 0.15, size=nxt.size)
    # Single-iteration spikes.
    p_spike = _loguniform(rng, 0.001, 0.01)
    spike_idx = np.flatnonzero(rng.random(n) < p_spike)
    times[spike_idx] *= 1.0 + np.exp(rng.uniform(math.log(0.2), math.log(3.0), size=spike_idx.size))

    timestamps = np.cumsum(times)

    fail_slows = []
    for s in specs:
        on, rec = s["onset"], s["recovery"]
        step = float(step_factor[on] / step_factor[on - 1] - 1.0)
        rstep = math.nan if rec is None else float(1.0 - step_factor[rec] / step_factor[rec - 1])
        fail_slows.append(InjectedFailSlow(
            onset=on, recovery=rec, cause=s["cause"], location=s["location"],
            severity=float(s["severity"]), slowdown=float(s["slowdown"]), step=step,
            recovery_step=rstep, duration_s=float(s["duration_s"]),
            onset_time=float(timestamps[on]),
            recovery_time=None if rec is None else float(timestamps[rec]),
        ))
    return IterationTrace(
        trace_id=trace_id, seed=seed, iteration_times=times, timestamps=timestamps, expected=expected,
        base_iteration_time=base, compute_fraction=phi, n_gpus=n_gpus, jitter=sigma,
        fail_slows=tuple(sorted(fail_slows, key=lambda f: f.onset)),
        gc_iterations=gc_idx, checkpoint_iterations=ck_idx, spike_iterations=spike_idx,
        warmup_iterations=min(warmup_iterations, n),
    )


def generate_traces(n_traces: int = 500, seed: int = 0, clean_fraction: float = 0.5) -> list[IterationTrace]:
    """``n_traces`` traces, the first ``round(n_traces * clean_fraction)`` clean.

    IterationTrace ``k`` is :func:`generate_trace` with a seed derived from ``(seed, k)``,
    so any single trace can be regenerated on its own.
    """
    if n_traces < 1:
        raise ValueError(f"n_traces must be >= 1, got {n_traces!r}")
    if not 0.0 <= clean_fraction <= 1.0:
        raise ValueError(f"clean_fraction must be in [0, 1], got {clean_fraction!r}")
    n_clean = int(round(n_traces * clean_fraction))
    seeds = np.random.SeedSequence(seed).generate_state(n_traces)
    return [generate_trace(int(seeds[k]), faulty=k >= n_clean, trace_id=k) for k in range(n_traces)]
