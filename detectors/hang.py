"""Hang detection: no step completes within a timeout learned from the job's own steps.

A hung job sends no events, so this detector fires from ``tick(now)``, never
from ``update``. The timeout is what a healthy job of this shape never
exceeds, so that warm-up, checkpoints, long evaluation steps and delivery
lag page no one, and a real hang is still caught within about ``k`` steps:

* ``k`` x the mean step time (Unicron's rule), and at least ``max_factor`` x
  the longest step of the recent window (NVRx's: rare long steps are part
  of the job), never below ``min_timeout_s``;
* plus the longest delivery delay of the recent steps (their arrival at the
  worker minus their end): the hooks batch, the agent batches, the broker
  and the worker add their latency, and none of that is the job hanging;
* after the job starts or restarts, until ``warmup`` steps completed, the
  timeout is ``startup_timeout_s`` (compiling kernels, loading a
  checkpoint, rendezvous), and those steps do not teach the step time;
  nor until ``min_steps`` step times were learned: the longest of a few
  steps (or delays) says little about the next one;
* while a checkpoint is under way (the hooks' ``mon.checkpoint()``, and the
  ``torch.save`` / DCP saves they mark themselves), the timeout runs from its
  start and is ``checkpoint_timeout_s`` or ``k`` x the longest checkpoint
  seen, and a step that held it teaches only its time outside it;
* once a rank of the job ended cleanly (the hooks' ``mon.close()``, or its
  exit code 0), the job is finishing: its other ranks get
  ``startup_timeout_s`` to finish too.

Defaults: ``k=3`` (Unicron), ``max_factor=1.5``, ``min_timeout_s=0.8``,
``warmup=5``, ``min_steps=10``; on the real-agent scenario suite (``vigil bench
scenarios``) they give no false hang for 0.2 s steps, a first step 15x the
others, or a checkpoint step 10x, and catch a real hang within
``k x D_iter + 1 s``.

References
----------
He et al., "Unicron: Economizing Self-Healing LLM Training at Scale", 2023
(hang = no iteration within 3x the mean iteration time). NVIDIA Resiliency
Extension (NVRx): timeouts computed as a multiple of the longest observed
interval, with a separate initial (start-up) timeout.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.detectors.inputs import PROGRESS, Progress
from vigil.schemas import Checkpoint, JobState, ProcessExit, to_seconds

#: The default multiple of the mean step time (DESIGN.md's k = 3): one home, read by the benchmarks' scoring.
DEFAULT_K = 3.0


@register
class HangDetector(Detector):
    """Fires when a job makes no progress for longer than its learned timeout (see the module docstring).

    Parameters
    ----------
    k : float
        Multiple of the mean step time, > 1.
    warmup : int
        Steps after a start or restart before the learned timeout applies.
    window : int
        Steps in the running mean, the longest step and the longest delay.
    max_factor : float
        The timeout is at least this multiple of the longest recent step, >= 1.
    min_timeout_s : float
        Floor of the learned timeout in seconds (a busy host stalls a healthy process for a fraction of a
        second: fast steps must not make that a hang).
    min_steps : int
        Step times learned (after warm-up) before the learned timeout applies; until then
        ``startup_timeout_s``.
    startup_timeout_s : float
        Silence allowed before ``warmup`` steps completed.
    checkpoint_timeout_s : float
        Silence allowed from the start of a checkpoint (or ``k`` x the longest one seen).

    Examples
    --------
    >>> det = HangDetector(k=3, warmup=3, min_steps=5)
    >>> for step in range(10):
    ...     det.update(1.0, t=float(step + 1))       # one step per second, delivered at once
    >>> det.tick(12.5)                                # 2.5 s of silence: fine
    >>> det.finding is None
    True
    >>> det.tick(13.2)                                # 3.2 s > 3 x 1.0 s
    >>> det.finding.kind, det.finding.severity, det.finding.onset
    ('task_hang', 2, 10.0)
    >>> det.update(1.0, t=13.5)                       # progress again: clears
    >>> det.finding is None
    True
    """

    name = "hang"
    version = "3"
    consumes = (PROGRESS, "checkpoint", "job_state", "process_exit")
    per = "job"
    silence = True

    def __init__(self, k: float = DEFAULT_K, warmup: int = 5, window: int = 50, max_factor: float = 1.5,
                 min_timeout_s: float = 0.8, startup_timeout_s: float = 600.0,
                 checkpoint_timeout_s: float = 600.0, min_steps: int = 10) -> None:
        if not k > 1:
            raise DetectorError(f"k must be > 1, got {k!r}")
        _check_positive_ints(warmup=warmup, window=window, min_steps=min_steps)
        if min_steps > window:
            raise DetectorError(f"min_steps ({min_steps}) cannot exceed window ({window}): never that many learned")
        if not max_factor >= 1:
            raise DetectorError(f"max_factor must be >= 1, got {max_factor!r}")
        if not min_timeout_s >= 0:
            raise DetectorError(f"min_timeout_s must be >= 0, got {min_timeout_s!r}")
        self.k = float(k)
        self.warmup = warmup
        self.min_steps = min_steps
        self.window = window
        self.max_factor = float(max_factor)
        self.min_timeout_s = float(min_timeout_s)
        self.startup_timeout_s = _check_positive(startup_timeout_s, "startup_timeout_s")
        self.checkpoint_timeout_s = _check_positive(checkpoint_timeout_s, "checkpoint_timeout_s")
        self._reset()

    def _reset(self) -> None:
        self._steps: deque[float] = deque(maxlen=self.window)
        self._lags: deque[float] = deque(maxlen=self.window)
        self._since_start = 0  # steps since the job started or restarted
        self._count = 0
        self._last_progress: float | None = None
        self._last_step: int | None = None
        self._checkpoint_since: float | None = None
        self._checkpoint_step: int | None = None
        self._checkpoints: deque[float] = deque(maxlen=8)
        self._checkpoint_spans: deque[tuple[float, float]] = deque(maxlen=16)  # (start, end) of recent ones
        self._ending_since: float | None = None  # a rank ended cleanly: the job is finishing
        self._finding: Finding | None = None
        self._gate: float | None = None  # timeout_s, kept until the state changes (read every engine tick)

    # -- inputs ------------------------------------------------------------
    def update(self, duration_s: float, *, t: float, lag_s: float = 0.0, step: int | None = None) -> None:
        """A step of ``duration_s`` seconds completed at ``t``, heard ``lag_s`` seconds after it ended."""
        duration_s = _check_positive(duration_s, "duration_s")
        t = _check_time(t, "t")
        if step is not None and self._last_step is not None and step < self._last_step:
            self.restart(t)  # resumed from an earlier checkpoint: a restart the job did itself
        self._last_step = step if step is not None else self._last_step
        self._count += 1
        self._since_start += 1
        if self._since_start > self.warmup:
            # A step that held a checkpoint teaches only its time outside it: a save between two steps
            # (the usual place) leaves the next step whole, a save every step inside it leaves the rest.
            held = max((min(t, end) - max(t - duration_s, start) for start, end in self._checkpoint_spans),
                       default=0.0)
            if duration_s - max(0.0, held) > 0:
                self._steps.append(duration_s - max(0.0, held))
        if self._since_start > self.warmup:  # warm-up steps carry the start's own lag (connecting, joining)
            self._lags.append(max(0.0, float(lag_s)))
        # Ranks report out of order: progress is the latest completion seen.
        if self._last_progress is None or t > self._last_progress:
            self._last_progress = t
        self._finding = None
        self._gate = None

    def finishing(self, t: float) -> None:
        """A rank of the job ended cleanly at ``t``: the rest get ``startup_timeout_s`` to end too."""
        self._ending_since = _check_time(t, "t")
        self._finding = None
        self._gate = None

    def restart(self, t: float) -> None:
        """The job's processes (re)started at ``t``: warm-up again, silence counted from ``t``."""
        t = _check_time(t, "t")
        self._since_start = 0
        self._checkpoint_since = None
        self._ending_since = None
        self._last_progress = t if self._last_progress is None else max(self._last_progress, t)
        self._finding = None
        self._gate = None

    def checkpoint(self, phase: str, *, t: float, step: int | None = None, duration_s: float | None = None) -> None:
        """A checkpoint ``started`` at ``t``, or ``completed``/``failed`` (taking ``duration_s``)."""
        t = _check_time(t, "t")
        if phase == "started":
            self._checkpoint_since = t
            self._checkpoint_step = step
            self._finding = None
            self._gate = None
        elif phase in ("completed", "failed"):
            if self._checkpoint_since is not None:
                took = duration_s if duration_s is not None else t - self._checkpoint_since
                self._checkpoints.append(max(0.0, float(took)))
                self._checkpoint_spans.append((t - max(0.0, float(took)), t))
            self._checkpoint_since = None
            # the silence before the checkpoint ended was the checkpoint's
            self._last_progress = t if self._last_progress is None else max(self._last_progress, t)
            self._finding = None
            self._gate = None
        else:
            raise DetectorError(f"phase must be started, completed or failed, got {phase!r}")

    def observe(self, item: Any, *, t: float, context: KeyContext | None = None) -> None:
        """The job's progress (with its arrival time), its checkpoints, and its restarts."""
        if isinstance(item, Progress):
            if item.duration_s > 0:
                lag = item.arrived - item.end if item.arrived is not None else 0.0
                self.update(item.duration_s, t=item.end, lag_s=lag, step=item.step if item.step >= 0 else None)
        elif isinstance(item, Checkpoint):
            self.checkpoint(item.phase, t=to_seconds(item.event_time), step=item.step, duration_s=item.duration_s)
        elif isinstance(item, JobState) and item.state == "restarting":
            self.restart(to_seconds(item.event_time))
        elif isinstance(item, ProcessExit) and item.exit_code == 0 and item.signal is None:
            self.finishing(to_seconds(item.event_time))

    def tick(self, now: float) -> None:
        now = _check_time(now, "now")
        if self._finding is not None or self._last_progress is None:
            return
        since, timeout, why = self._deadline()
        silence = now - since
        if silence > timeout:
            evidence = {"silence_s": round(now - self._last_progress, 6), "timeout_s": round(timeout, 6),
                        "timeout_from": why, "mean_iteration_s": round(self.mean_iteration_s, 6),
                        "delivery_lag_s": round(self.delivery_lag_s, 6), "iterations_seen": self._count}
            if self._checkpoint_since is not None:
                evidence["checkpoint_step"] = self._checkpoint_step
            self._finding = Finding(kind="task_hang", severity=2, onset=self._last_progress, detected_at=now,
                                    evidence=evidence)

    def _deadline(self) -> tuple[float, float, str]:
        """(silence counted from, its timeout, what set it)."""
        lag = self.delivery_lag_s
        if self._ending_since is not None:
            return max(self._ending_since, self._last_progress or 0.0), self.startup_timeout_s + lag, "finishing"
        if self._checkpoint_since is not None:
            longest = max(self._checkpoints, default=0.0)
            return self._checkpoint_since, max(self.checkpoint_timeout_s, self.k * longest) + lag, "checkpoint"
        if self._since_start <= self.warmup or len(self._steps) < self.min_steps:
            return self._last_progress, self.startup_timeout_s + lag, "startup"  # type: ignore[return-value]
        return self._last_progress, self.learned_timeout_s + lag, "steps"  # type: ignore[return-value]

    # -- results -----------------------------------------------------------
    @property
    def learned_timeout_s(self) -> float:
        """The step-time part of the timeout (no delay, no warm-up, no checkpoint)."""
        if not self._steps:
            return self.startup_timeout_s
        mean = sum(self._steps) / len(self._steps)
        return max(self.k * mean, self.max_factor * max(self._steps), self.min_timeout_s)

    @property
    def timeout_s(self) -> float:
        """Silence in *arrival* time allowed before a hang may be declared (the engine's gate).

        The gate counts from when the job's last event reached the worker, which already carries that
        event's delivery delay: the delay part of the timeout is left out here, or it would be counted twice
        (the event-time deadline of :meth:`tick` still holds it)."""
        if self._last_progress is None:
            return self.startup_timeout_s
        gate = self.__dict__.get("_gate")  # (a snapshot of an older build has none)
        if gate is None:
            gate = self._gate = max(0.0, self._deadline()[1] - self.delivery_lag_s)
        return gate

    @property
    def delivery_lag_s(self) -> float:
        """The longest delivery delay of the recent steps (after warm-up): the timeouts' allowance for it."""
        return max(self._lags, default=0.0)

    @property
    def mean_iteration_s(self) -> float:
        return sum(self._steps) / len(self._steps) if self._steps else 0.0

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
