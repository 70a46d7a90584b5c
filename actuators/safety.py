"""Safety checks an action must pass before it runs: blast radius, no progress, rate.

Blast-radius circuit breaker
    At most ``max_drained_nodes`` distinct nodes, and at most
    ``max_drained_fraction`` of the known cluster, may be isolated or drained
    (``isolate_node``, the ``exclude_nodes`` of ``reconfigure``) in any sliding
    window of ``drain_window_s``; the tighter bound applies, but one node may
    always go (a sick node must be able to leave a small cluster). An action
    that would exceed the limit is refused and *opens the circuit*: the
    executor raises a sev1 ``actuator_circuit_open`` alert for a human, and
    from then on every machine action is refused until a human resets it
    (``vigil actuate --reset-circuit``, which writes the reset into the
    ledger; a running actuator picks it up). The reset also forgets the drains
    of the window that tripped it. Why a human: a burst of drains is more
    often a detector or a fabric-wide problem than many sick nodes, and
    draining more makes it worse.

No-progress guard
    Restarts of a job (``restart_process``, ``checkpoint_restart``,
    ``reconfigure``) are counted while the job's training step does not rise
    above what it was at the first of them. After ``max_restarts_without_progress``
    such restarts, further restarts of that job are refused ("no progress
    after K restarts: last step S") and the job is listed in :attr:`Safety.given_up`
    (the local agent exits on it). Progress is the larger of ``progress(job)``
    (a callable the owner passes, e.g. the highest step the node batcher has
    seen) and the decision's ``plan["progress_step"]``; with neither, progress
    is unknown and counts as none. A step above the baseline resets the
    count; so does a human (``vigil actuate --reset-job JOB``).

Per-job rate limit
    At most ``rate_limit`` actions that ran per job in any ``rate_window_s``.

Time is an argument (seconds); nothing here reads a clock. State is rebuilt
from the ledger on start by replaying :meth:`Safety.record` and the resets in
time order, so a restarted actuator keeps its windows and counts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from vigil.actuators.plans import NO_MACHINE_ACTIONS, RESTART_ACTIONS, Action

__all__ = ["Refusal", "Safety", "SafetyLimits"]


@dataclass(frozen=True)
class SafetyLimits:
    max_drained_nodes: int = 4
    max_drained_fraction: float = 0.10
    drain_window_s: float = 3600.0
    max_restarts_without_progress: int = 3
    rate_limit: int = 6
    rate_window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_drained_nodes < 1:
            raise ValueError(f"max_drained_nodes must be >= 1, got {self.max_drained_nodes}")
        if not 0 < self.max_drained_fraction <= 1:
            raise ValueError(f"max_drained_fraction must be in (0, 1], got {self.max_drained_fraction}")
        if self.max_restarts_without_progress < 1:
            raise ValueError(f"max_restarts_without_progress must be >= 1, got {self.max_restarts_without_progress}")
        if self.rate_limit < 1:
            raise ValueError(f"rate_limit must be >= 1, got {self.rate_limit}")
        for name in ("drain_window_s", "rate_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Refusal:
    """Why an action may not run; ``opens_circuit`` when it tripped the blast-radius breaker."""

    reason: str
    opens_circuit: bool = False
    gave_up: bool = False


@dataclass
class _Stall:
    baseline: int | None  # progress at the first restart of the stalled run
    restarts: int
    last_step: int | None


@dataclass
class Safety:
    limits: SafetyLimits = field(default_factory=SafetyLimits)
    progress: Callable[[str], int | None] | None = None

    def __post_init__(self) -> None:
        self._drains: deque[tuple[float, str]] = deque()
        self._actions: dict[str, deque[float]] = {}
        self._stalls: dict[str, _Stall] = {}
        self.circuit_open = False
        self.circuit_reason = ""
        self.circuit_opened_at: float | None = None
        #: Jobs the no-progress guard stopped restarting, with the reason.
        self.given_up: dict[str, str] = {}

    # -- what is known ----------------------------------------------------------------------------------

    def progress_of(self, action: Action) -> int | None:
        """The job's training step as far as anyone can tell (None: unknown)."""
        steps = [action.progress_step] if action.progress_step is not None else []
        if self.progress is not None and action.job is not None:
            seen = self.progress(action.job)
            if seen is not None:
                steps.append(int(seen))
        return max(steps) if steps else None

    def drain_limit(self, cluster_size: int) -> int:
        by_fraction = math.floor(self.limits.max_drained_fraction * cluster_size + 1e-9)
        return max(1, min(self.limits.max_drained_nodes, by_fraction))

    def drained_in_window(self, now: float) -> set[str]:
        self._prune(now)
        return {n for _, n in self._drains}

    def _prune(self, now: float) -> None:
        while self._drains and self._drains[0][0] <= now - self.limits.drain_window_s:
            self._drains.popleft()

    # -- the checks -------------------------------------------------------------------------------------

    def check(self, action: Action, now: float, cluster_size: int, progress: int | None = None) -> Refusal | None:
        """None if ``action`` may run now, else the :class:`Refusal`. Pass ``progress`` from :meth:`progress_of`."""
        if action.action in NO_MACHINE_ACTIONS:
            return None
        if self.circuit_open:
            return Refusal(f"circuit breaker open since {self.circuit_opened_at}: {self.circuit_reason}; "
                           "the actuator takes no machine action until a human resets it "
                           "(vigil actuate --reset-circuit)")
        job = action.job
        if job is not None:
            times = self._actions.get(job)
            if times is not None:
                while times and times[0] <= now - self.limits.rate_window_s:
                    times.popleft()
                if len(times) >= self.limits.rate_limit:
                    return Refusal(f"rate limit: {len(times)} actions on job {job} in the last "
                                   f"{self.limits.rate_window_s:g} s (at most {self.limits.rate_limit})")
        if action.action in RESTART_ACTIONS and job is not None:
            stall = self._stalls.get(job)
            k = self.limits.max_restarts_without_progress
            if stall is not None and stall.restarts >= k and not _advanced(progress, stall.baseline):
                last = progress if progress is not None else stall.last_step
                why = (f"no progress after {stall.restarts} restarts: last step {'unknown' if last is None else last}"
                       + (f", step at the first of them {stall.baseline}" if stall.baseline is not None else "")
                       + f"; not restarting job {job} again (a human can lift this: "
                       f"vigil actuate --reset-job {job} --ledger <this actuator's ledger>)")
                self.given_up[job] = why
                return Refusal(why, gave_up=True)
        if action.drains:
            in_window = self.drained_in_window(now)
            after = in_window | set(action.drains)
            limit = self.drain_limit(cluster_size)
            if len(after) > limit:
                return Refusal(
                    f"blast radius: draining {sorted(set(action.drains) - in_window)} would take "
                    f"{len(after)} nodes out in {self.limits.drain_window_s:g} s (already {len(in_window)}: "
                    f"{sorted(in_window)[:20]}); the limit is {limit} (at most {self.limits.max_drained_nodes} nodes "
                    f"or {self.limits.max_drained_fraction:.0%} of {cluster_size} known)",
                    opens_circuit=True)
        return None

    # -- what happened ----------------------------------------------------------------------------------

    def record(self, action: str, job: str | None, at: float, progress: int | None, drained: Sequence[str]) -> None:
        """An action ran (or started running) at ``at``: count it in the windows and the guard."""
        if action in NO_MACHINE_ACTIONS:
            return
        for node in drained:
            self._drains.append((at, node))
        if job is None:
            return
        self._actions.setdefault(job, deque()).append(at)
        if action in RESTART_ACTIONS:
            stall = self._stalls.get(job)
            if stall is None or _advanced(progress, stall.baseline):
                self._stalls[job] = _Stall(baseline=progress, restarts=1, last_step=progress)
                self.given_up.pop(job, None)
            else:
                stall.restarts += 1
                if progress is not None:
                    stall.last_step = progress

    def open_circuit(self, reason: str, at: float) -> None:
        self.circuit_open = True
        self.circuit_reason = reason
        self.circuit_opened_at = at

    def reset_circuit(self) -> None:
        """A human closed the circuit: forget the drains that tripped it."""
        self.circuit_open = False
        self.circuit_reason = ""
        self.circuit_opened_at = None
        self._drains.clear()

    def reset_job(self, job: str) -> None:
        """A human lifted the no-progress guard of ``job`` (and its rate window)."""
        self._stalls.pop(job, None)
        self._actions.pop(job, None)
        self.given_up.pop(job, None)


def _advanced(progress: int | None, baseline: int | None) -> bool:
    """Did training get past ``baseline``? Unknown progress is no progress."""
    if progress is None:
        return False
    return baseline is None or progress > baseline
