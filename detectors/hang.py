"""Hang detection: no iteration completes within k x the running mean.

A hung job sends no events, so this detector fires from ``tick(now)``, never
from ``update``.
"""

from __future__ import annotations

import random
from typing import Any

from river import stats, utils

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.detectors.inputs import PROGRESS, Progress


@register
class HangDetector(Detector):
    """Fires when a job makes no progress for too long.

    Two modes:

    - ``"mean"`` (Unicron): the timeout is ``k`` x the running mean of the last
      ``window`` iteration times.
    - ``"max"`` (NVRx-style): the timeout is the largest iteration time seen so
      far x ``safety_factor``, which tolerates jobs with rare long steps
      (evaluation, checkpointing) at the price of slower detection.

    The timeout is never shorter than ``min_timeout_s``. Nothing fires before
    ``warmup`` iterations have completed (the first steps compile kernels and
    fill caches; their time says nothing about a hang).

    Parameters
    ----------
    k : float
        Multiple of the mean iteration time (mode ``"mean"``), > 1.
    warmup : int
        Iterations to see before the detector may fire.
    mode : {"mean", "max"}
    safety_factor : float
        Multiple of the largest iteration time (mode ``"max"``), > 1.
    window : int
        Iterations in the running mean.
    min_timeout_s : float
        Floor of the timeout in seconds.

    Examples
    --------
    >>> det = HangDetector(k=3, warmup=3)
    >>> for step in range(10):
    ...     det.update(1.0, t=float(step + 1))       # one iteration per second
    >>> det.tick(12.5)                                # 2.5 s of silence: fine
    >>> det.finding is None
    True
    >>> det.tick(13.2)                                # 3.2 s > 3 x 1.0 s
    >>> det.finding.kind, det.finding.severity, det.finding.onset
    ('task_hang', 2, 10.0)
    >>> det.update(1.0, t=13.5)                       # progress again: clears
    >>> det.finding is None
    True

    References
    ----------
    He et al., "Unicron: Economizing Self-Healing LLM Training at Scale", 2023
    (hang = no iteration within 3x the mean iteration time). NVIDIA Resiliency
    Extension (NVRx), in-process restart: timeouts from the largest observed
    interval times a safety factor.
    """

    name = "hang"
    version = "1"
    consumes = (PROGRESS,)
    per = "job"
    silence = True

    def __init__(self, k: float = 3.0, warmup: int = 5, mode: str = "mean", safety_factor: float = 5.0,
                 window: int = 50, min_timeout_s: float = 0.0) -> None:
        if not k > 1:
            raise DetectorError(f"k must be > 1, got {k!r}")
        _check_positive_ints(warmup=warmup, window=window)
        if mode not in ("mean", "max"):
            raise DetectorError(f"mode must be 'mean' or 'max', got {mode!r}")
        if not safety_factor > 1:
            raise DetectorError(f"safety_factor must be > 1, got {safety_factor!r}")
        if not min_timeout_s >= 0:
            raise DetectorError(f"min_timeout_s must be >= 0, got {min_timeout_s!r}")
        self.k = float(k)
        self.warmup = warmup
        self.mode = mode
        self.safety_factor = float(safety_factor)
        self.window = window
        self.min_timeout_s = float(min_timeout_s)
        self._reset()

    def _reset(self) -> None:
        self._mean = utils.Rolling(stats.Mean, window_size=self.window)
        self._max_duration = 0.0
        self._count = 0
        self._last_progress: float | None = None
        self._finding: Finding | None = None

    # -- inputs ------------------------------------------------------------
    def update(self, duration_s: float, *, t: float) -> None:
        """Record an iteration of ``duration_s`` seconds that completed at ``t``."""
        duration_s = _check_positive(duration_s, "duration_s")
        t = _check_time(t, "t")
        self._mean.update(duration_s)
        self._max_duration = max(self._max_duration, duration_s)
        self._count += 1
        # Ranks report out of order: progress is the latest completion seen.
        if self._last_progress is None or t > self._last_progress:
            self._last_progress = t
        self._finding = None

    def observe(self, item: Progress, *, t: float, context: KeyContext | None = None) -> None:
        """The job completed a step (a zero-length one says nothing about the pace)."""
        if item.duration_s > 0:
            self.update(item.duration_s, t=item.end)

    def tick(self, now: float) -> None:
        now = _check_time(now, "now")
        if self._finding is not None or self._count < self.warmup or self._last_progress is None:
            return
        timeout = self.timeout_s
        silence = now - self._last_progress
        if silence > timeout:
            self._finding = Finding(
                kind="task_hang", severity=2, onset=self._last_progress, detected_at=now,
                evidence={"silence_s": round(silence, 6), "timeout_s": round(timeout, 6),
                          "mean_iteration_s": round(self._mean.get(), 6), "mode": self.mode,
                          "iterations_seen": self._count},
            )

    # -- results -----------------------------------------------------------
    @property
    def timeout_s(self) -> float:
        """Current silence allowed before a hang is declared."""
        if self.mode == "mean":
            timeout = self.k * self._mean.get()
        else:
            timeout = self.safety_factor * self._max_duration
        return max(timeout, self.min_timeout_s)

    @property
    def mean_iteration_s(self) -> float:
        return self._mean.get()

    @property
    def last_progress(self) -> float | None:
        return self._last_progress

    @property
    def finding(self) -> Finding | None:
        return self._finding

    # -- conformance -------------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"k": 3.0, "warmup": 5}

    @classmethod
    def _conformance_feed(cls, seed: int):
        rng = random.Random(seed)
        t = 0.0
        calls = []
        for _ in range(200):
            d = 1.0 + rng.uniform(-0.1, 0.1)
            t += d
            calls.append(("update", (d,), {"t": t}))
            calls.append(("tick", (t + rng.uniform(0, 1.5),), {}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 400
