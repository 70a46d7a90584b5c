"""Fail-slow cases outside the family of :mod:`vigil.sim.traces`, with their ground truth and labelling rule.

The main fail-slow set holds instant steps on stationary jitter. These cases
take a clean trace of that generator (warm-up, heavy-tailed jitter, garbage
collection, checkpoints, spikes) and multiply its iteration times by a
profile that real jobs show:

``ramp``
    A gradual slowdown (thermal drift, memory fragmentation): the time grows
    linearly over 20..300 iterations (log-uniform) to +10..60 % and stays
    there; half recover at once later. Ground truth: one fail-slow whose
    onset is the **start of the ramp**.
``flapping``
    A slowdown of +15..50 % that comes and goes: 3..8 periods on (10..40
    iterations) and off (10..40). Each on-period is a fail-slow episode.
``benign_shift``
    A sustained shift of the level by 5..30 % up or down right after a
    **known configuration-change event** (a new batch size, another data
    mix). Rule: a shift that follows a known event is benign; the system
    knows the event, so the harness restarts the detector there, as the
    engine must. Clean: any alarm is a false positive.
``restart_level``
    A restart on other nodes (a known event): a new warm-up, then a level
    0.8..1.25 x the old one. Benign by the same rule; clean.
``checkpoint_eval``
    Periodic evaluation or checkpoint blocks: every 100..500 iterations,
    1..10 iterations 1.2..3 x slower. Clean.
``warmup``
    A long warm-up at the start: an excess of 20..100 % decaying with a
    time constant of 20..200 iterations. Clean (the speed-up that follows is
    no recovery: a ``"recovery"`` alarm on it is a false positive).

Ground truth uses :class:`vigil.sim.traces.InjectedFailSlow`; ``step`` is the
sustained relative slowdown of the episode (for a ramp, its final size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from vigil.sim.traces import InjectedFailSlow, IterationTrace, generate_trace

__all__ = ["OUT_OF_FAMILY", "FailSlowCase", "generate_case", "generate_cases"]

OUT_OF_FAMILY = ("ramp", "flapping", "benign_shift", "restart_level", "checkpoint_eval", "warmup")


@dataclass(frozen=True)
class FailSlowCase:
    """One out-of-family trace: ``trace.fail_slows`` is the truth (empty: clean); ``events`` the known events."""

    family: str
    trace: IterationTrace
    events: tuple[int, ...]


def _lu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _episode(times: np.ndarray, ts: np.ndarray, onset: int, recovery: int | None, step: float,
             cause: str = "computation") -> InjectedFailSlow:
    return InjectedFailSlow(onset=onset, recovery=recovery, cause=cause, location="gpu:0", severity=step,
                            slowdown=step, step=step, recovery_step=math.nan if recovery is None else step / (1 + step),
                            duration_s=float(ts[(recovery or len(ts)) - 1] - ts[onset - 1]),
                            onset_time=float(ts[onset]), recovery_time=None if recovery is None else float(ts[recovery]))


def generate_case(family: str, seed: int) -> FailSlowCase:
    """One case of ``family`` from ``seed`` (see the module docstring)."""
    if family not in OUT_OF_FAMILY:
        raise ValueError(f"family must be one of {OUT_OF_FAMILY}, got {family!r}")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1000, 3001))
    base = generate_trace(int(rng.integers(0, 2**63 - 1)), faulty=False, n_iterations=n)
    prof = np.ones(n)
    events: tuple[int, ...] = ()
    spans: list[tuple[int, int | None, float]] = []  # (onset, recovery, step)
    i = np.arange(n, dtype=float)
    if family == "ramp":
        o = int(rng.integers(300, n - 400))
        L = int(round(_lu(rng, 20, 300)))
        sev = _lu(rng, 0.10, 0.60)
        end = min(n, o + L)
        prof[o:end] = 1.0 + sev * (np.arange(end - o) + 1) / L
        prof[end:] = 1.0 + sev
        rec = None
        if rng.random() < 0.5 and end + 100 < n - 50:
            rec = int(rng.integers(end + 100, n - 50))
            prof[rec:] = 1.0
        spans.append((o, rec, sev))
    elif family == "flapping":
        sev = float(rng.uniform(0.15, 0.5))
        k = int(rng.integers(300, n // 2))
        for _ in range(int(rng.integers(3, 9))):
            on, off = int(rng.integers(10, 41)), int(rng.integers(10, 41))
            if k + on + off >= n:
                break
            prof[k:k + on] = 1.0 + sev
            spans.append((k, k + on, sev))
            k += on + off
    elif family == "benign_shift":
        e = int(rng.integers(300, n - 300))
        f = 1.0 + _lu(rng, 0.05, 0.30)
        prof[e:] = f if rng.random() < 0.5 else 1.0 / f
        events = (e,)
    elif family == "restart_level":
        e = int(rng.integers(300, n - 300))
        tau = float(rng.uniform(3.0, 15.0))
        prof[e:] = float(rng.uniform(0.8, 1.25)) * (1.0 + rng.uniform(0.2, 1.0) * np.exp(-(i[e:] - e) / tau))
        prof[e] *= _lu(rng, 3.0, 10.0)
        events = (e,)
    elif family == "checkpoint_eval":
        every = int(rng.integers(100, 501))
        w = int(rng.integers(1, 11))
        for s in range(int(rng.integers(every // 2, every + 1)), n, every):
            prof[s:s + w] = float(rng.uniform(1.2, 3.0))
    else:  # warmup
        prof *= 1.0 + rng.uniform(0.2, 1.0) * np.exp(-i / rng.uniform(20.0, 200.0))
    times = base.iteration_times * prof
    ts = np.cumsum(times)
    eps = tuple(_episode(times, ts, o, r, st) for o, r, st in spans)
    trace = replace(base, iteration_times=times, timestamps=ts, expected=base.expected * prof, fail_slows=eps)
    return FailSlowCase(family=family, trace=trace, events=events)


def generate_cases(n_per_family: int = 50, seed: int = 0,
                   families: tuple[str, ...] = OUT_OF_FAMILY) -> list[FailSlowCase]:
    """``n_per_family`` cases of each family, seeds derived from ``(seed, family, k)``.

    >>> cases = generate_cases(1, seed=3)
    >>> [c.family for c in cases] == list(OUT_OF_FAMILY)
    True
    >>> [len(c.trace.fail_slows) > 0 for c in cases]
    [True, True, False, False, False, False]
    """
    out = []
    for fam in families:
        seeds = np.random.SeedSequence([seed, 1000 + OUT_OF_FAMILY.index(fam)]).generate_state(n_per_family)
        out += [generate_case(fam, int(s)) for s in seeds]
    return out
