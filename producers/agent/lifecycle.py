"""What the agent says about its node and its job: lifecycle events, so that an end is not taken for a failure.

A node agent announces its node when it starts (``joined``, or ``unhealthy``
when the node failed its health check: it then stays out of capacity) and
when it stops cleanly (``leaving``: its silence after that is no loss). A
launching agent announces its job: ``running`` at launch, ``restarting``
with each restart of its ranks, and how it ended: ``completed`` (every rank
exited 0), ``cancelled`` (stopped by a signal: scancel, an eviction),
``failed`` (a rank failed and the agent does not restart it, or it gave
up), ``time_limit`` / ``preempted`` (it saved and left to be continued: the
next job of its run, when queued, is announced ``pending``). Each is published at once, through the publisher's spool when the
broker is away.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from vigil.schemas import JobState, NodeState, Source
from vigil.schemas.envelope import utcnow

log = logging.getLogger(__name__)

__all__ = ["Lifecycle"]


class Lifecycle:
    """Publishes the node's and the job's lifecycle events (see the module docstring)."""

    def __init__(self, publisher: Any, source: Source, *, gpus: int = 0, dp: int = 1, pp: int = 1, tp: int = 1,
                 run: str | None = None, clock: Callable[[], Any] = utcnow) -> None:
        self.publisher = publisher
        self.node_source = Source(cluster=source.cluster, node=source.node)
        self.job_source = source
        self.gpus, self.dp, self.pp, self.tp, self.run = gpus, dp, pp, tp, run
        self.clock = clock
        self.restarts = 0
        self.job_state: str | None = None

    def node(self, state: str, reason: str, checks: Mapping[str, str] | None = None) -> NodeState:
        ev = NodeState(event_time=self.clock(), source=self.node_source, state=state, reason=reason[:2000],  # type: ignore[arg-type]
                       checks=dict(checks or {}))
        self._publish(ev)
        return ev

    def job(self, state: str, reason: str = "", exit_codes: Mapping[int, int] | None = None,
            checkpoint_step: int | None = None, checkpoint_s: float | None = None) -> JobState | None:
        if self.job_source.job is None:
            return None
        if state == "restarting":
            self.restarts += 1
        ev = JobState(event_time=self.clock(), source=self.job_source, state=state, reason=reason[:2000],  # type: ignore[arg-type]
                      nodes=[self.node_source.node] if self.node_source.node else [], gpus=self.gpus, dp=self.dp,
                      pp=self.pp, tp=self.tp, restart_count=self.restarts, run=self.run,
                      exit_codes={str(k): int(v) for k, v in (exit_codes or {}).items()},
                      checkpoint_step=checkpoint_step, checkpoint_s=checkpoint_s)
        self.job_state = state
        self._publish(ev)
        return ev

    def queued(self, job: str, reason: str) -> JobState | None:
        """The next job of this run waits in the scheduler's queue (the chain goes on)."""
        if self.run is None:
            return None
        ev = JobState(event_time=self.clock(), source=Source(cluster=self.job_source.cluster, job=job),
                      state="pending", reason=reason[:2000], run=self.run)
        self._publish(ev)
        return ev

    def _publish(self, ev: Any) -> None:
        try:
            self.publisher.publish([ev])
        except Exception:  # the spool keeps it when it can; a lifecycle event must never stop the agent
            log.exception("publishing %s failed", ev.event_type)
        log.info("%s %s: %s", ev.event_type, ev.state, getattr(ev, "reason", ""))
