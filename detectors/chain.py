"""A chain of jobs that stopped: a training run whose last job left to be continued, and nothing continued it.

Long runs live across many jobs under a time limit (a Slurm job array run
one at a time, ``--dependency`` chains, a requeue). Each job saves and
leaves (``time_limit``, ``preempted``) so that the next one resumes. When no
next job runs or waits in the queue, every GPU of the run sits idle and no
node-level signal says so: this watch does, keyed by the run, not by a job.

Pure: job states and ``now`` in, findings out; the worker that correlates
feeds it every job state and ticks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vigil.detectors.base import Finding, _check_positive
from vigil.schemas import JobState, to_seconds

__all__ = ["RunChain", "CHAIN_BROKEN", "TO_BE_CONTINUED"]

CHAIN_BROKEN = "chain_broken"
#: How a job leaves to be continued by the next job of its run.
TO_BE_CONTINUED = frozenset({"time_limit", "preempted"})
_RUNNING = frozenset({"running", "restarting"})
_ALIVE = _RUNNING | {"pending"}


@dataclass
class _Run:
    jobs: dict[str, str]  # job -> its latest state
    queued_at: dict[str, float] = field(default_factory=dict)  # pending job -> when it was announced queued
    left_at: float | None = None  # when the last job left to be continued (None: not waiting for one)
    last_job: str | None = None
    how: str | None = None
    checkpoint_step: int | None = None
    cluster: str = "default"


class RunChain:
    """Per run: ``chain_broken`` (sev2) when its last job left to be continued and no job of the run
    is running or queued ``timeout_s`` later; cleared when one is.

    A queued (``pending``) job counts as alive for ``pending_timeout_s``
    after it was announced: the scheduler has it (a job array's element is
    queued under another id than it runs with, so a job of the run starting
    takes the queued ones' place). No agent runs for a queued job, so one
    cancelled or dropped before it starts is never heard of again: past that
    lifetime without a start the chain is broken. A queued job reported
    ended (``cancelled``, ``failed``) before it ran is gone at once, and does
    not end the run: only a job that ran ends it. Breaks older than
    ``horizon_s`` when first seen (a worker reading an old log) are history,
    not news.

    Examples
    --------
    >>> from vigil.schemas import JobState, Source, from_seconds
    >>> def state(job, s, t):
    ...     return JobState(event_time=from_seconds(t), source=Source(job=job), state=s, run="llm-7b")
    >>> chain = RunChain(timeout_s=600.0)
    >>> chain.observe(state("101", "running", 0.0), now=0.0)
    >>> chain.observe(state("101", "time_limit", 3600.0), now=3600.0)
    >>> chain.tick(4000.0)
    []
    >>> [(status, run, f.kind) for status, run, f in chain.tick(4200.1)]
    [('raised', 'llm-7b', 'chain_broken')]
    >>> chain.observe(state("102", "running", 4300.0), now=4300.0)
    >>> [(status, run) for status, run, f in chain.tick(4300.0)], chain.broken()
    ([('cleared', 'llm-7b')], [])
    """

    def __init__(self, timeout_s: float = 1800.0, horizon_s: float = 86400.0, max_runs: int = 100_000,
                 pending_timeout_s: float = 86400.0) -> None:
        self.timeout_s = _check_positive(timeout_s, "timeout_s")
        # a day: longer than a busy queue keeps a large job waiting, so a slow start pages no one
        self.pending_timeout_s = _check_positive(pending_timeout_s, "pending_timeout_s")
        self.horizon_s = _check_positive(horizon_s, "horizon_s")
        self.max_runs = max_runs
        self._runs: dict[str, _Run] = {}
        self._raised: dict[str, Finding] = {}
        self._cleared: list[tuple[str, Finding]] = []

    def observe(self, event: JobState, now: float) -> None:
        """A job's state; only jobs that name their run are followed."""
        run, job = event.run, event.source.job
        if not run or not job:
            return
        at = to_seconds(event.event_time)
        r = self._runs.get(run)
        if r is None:
            if len(self._runs) >= self.max_runs:  # bounded: forget the run that has waited longest
                self._runs.pop(next(iter(self._runs)))
            r = self._runs[run] = _Run(jobs={}, cluster=event.source.cluster)
        if event.state in ("running", "restarting"):  # a queued job announced before has started as this one
            r.jobs = {j: s for j, s in r.jobs.items() if s != "pending"}
            r.queued_at.clear()
        if event.state == "pending":
            r.jobs[job] = event.state
            r.queued_at[job] = max(at, r.queued_at.get(job, at))
            if now < self._due(r):  # the chain goes on (a queued job read again long after changes nothing)
                self._clear(run)
        elif r.jobs.get(job) == "pending" and event.state in ("cancelled", "failed"):
            del r.jobs[job], r.queued_at[job]  # queued, never ran, gone: the run did not end with it
        elif event.state in _ALIVE:
            r.jobs[job] = event.state
            r.left_at = None
            self._clear(run)
        elif event.state in TO_BE_CONTINUED:
            r.jobs[job] = event.state
            if not any(s in _RUNNING for j, s in r.jobs.items() if j != job):
                r.left_at, r.last_job, r.how, r.checkpoint_step = at, job, event.state, event.checkpoint_step
        else:
            r.jobs[job] = event.state
            if not any(s in _ALIVE for s in r.jobs.values()):
                r.left_at = None  # completed, failed or cancelled: the run ended (a failure is other detectors' news)
                self._clear(run)
        # keep only the latest few jobs of a long chain
        while len(r.jobs) > 16:
            oldest = next(iter(r.jobs))
            del r.jobs[oldest]
            r.queued_at.pop(oldest, None)

    def _due(self, r: _Run) -> float:
        """When the run's chain is broken unless a job of it starts (inf: not waiting for one)."""
        if r.left_at is None:
            return math.inf
        return max([r.left_at + self.timeout_s] + [t + self.pending_timeout_s for t in r.queued_at.values()])

    def _clear(self, run: str) -> None:
        f = self._raised.pop(run, None)
        if f is not None:
            self._cleared.append((run, f))

    def tick(self, now: float) -> list[tuple[str, str, Finding]]:
        """What changed by ``now``: ``("raised" | "cleared", run, finding)``."""
        out: list[tuple[str, str, Finding]] = [("cleared", run, f) for run, f in self._cleared]
        self._cleared = []
        for run, r in self._runs.items():
            if r.left_at is None or run in self._raised:
                continue
            due = self._due(r)
            if now < due:
                continue
            if now - due > self.horizon_s:
                r.left_at = None  # long past when first judged: history
                continue
            queued = sorted(r.queued_at)
            why = (f"job {r.last_job} of run {run} left ({r.how}) to be continued; "
                   + (f"the job queued to continue it ({', '.join(queued)}) has not started in "
                      f"{now - max(r.queued_at.values()):.0f} s (cancelled or held?)" if queued else
                      f"no job of the run has run or queued for {now - r.left_at:.0f} s")
                   + f": resubmit it (the checkpoint is at step {r.checkpoint_step})")
            f = Finding(CHAIN_BROKEN, 2, r.left_at, now, {
                "run": run, "last_job": r.last_job, "left_as": r.how, "checkpoint_step": r.checkpoint_step,
                "waited_s": round(now - r.left_at, 1), "queued_jobs": queued, "why": why})
            self._raised[run] = f
            out.append(("raised", run, f))
        return out

    def broken(self) -> list[str]:
        """Runs whose chain is broken now."""
        return sorted(self._raised)

    def cluster_of(self, run: str) -> str:
        r = self._runs.get(run)
        return r.cluster if r is not None else "default"
