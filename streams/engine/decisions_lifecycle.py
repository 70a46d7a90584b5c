"""The decision engine's view of job and node lifecycle: the inventory it keeps (each job's nodes and
last state, the nodes down and known), a job's new run, a job that failed while being recovered, a job
that ended.

:class:`_Lifecycle` is a part of :class:`~vigil.streams.engine.decisions.DecisionEngine` (its methods
use the engine's inventory, remedies and re-planning).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vigil.schemas import JOB_ENDED, NODE_AWAY, Envelope, JobState, NodeState


@dataclass
class _JobInfo:
    nodes: set[str] = field(default_factory=set)
    spec: JobState | None = None


class _Lifecycle:
    """The lifecycle part of :class:`~vigil.streams.engine.decisions.DecisionEngine`."""

    # -- state -------------------------------------------------------------
    def on_state(self, event: JobState | NodeState, now: float) -> list[Envelope]:
        """Job and node lifecycle: keep the inventory, re-plan on arrival, finish, join."""
        if isinstance(event, JobState):
            job = event.source.job
            if not job:
                return []
            info = self.jobs.setdefault(job, _JobInfo())
            prev = info.spec
            if event.state not in JOB_ENDED and self.layouts.learn(job, event):
                self.mitigation.touched(job, now)  # moved or resized: a fail-slow of its old layout no longer shows
            layout = self.layouts.get(job)
            if layout is not None and layout.nodes:  # where it runs now: nodes it has left are no longer its concern
                info.nodes = set(layout.nodes)
                if set(event.nodes) != layout.nodes:  # (one agent of many named its own node: the spec holds them all)
                    event = event.model_copy(update={"nodes": sorted(layout.nodes)})
            info.spec = event
            arrived = event.state in ("pending", "running") and (prev is None or prev.state in JOB_ENDED)
            finished = event.state in JOB_ENDED and prev is not None and prev.state not in JOB_ENDED
            out: list[Envelope] = []
            if arrived:
                # A new run (a requeue by its scheduler is one): its failures are not the last run's
                # returning, and what was decided for that run is no remedy of this one.
                self._run_began[job] = now
                self.escalation.forget_job(job)
                self._inflight.pop(job, None)
            if event.state == "failed" and (prev is None or prev.state != "failed"):
                out += self._recovery_gave_up(job, event.reason, now)
            if event.state in JOB_ENDED:
                self._job_ended(job, now)
            if arrived or finished:
                out += self._replanning(f"job {job} {'arrived' if arrived else event.state}", now)
            return out
        node = event.source.node
        if not node:
            return []
        self.known_nodes.add(node)
        if event.state in ("lost", "unhealthy", "repaired") or event.state in NODE_AWAY:
            # out of capacity: an unhealthy or repaired node until its agent's check passes ("joined")
            self.nodes_down.add(node)
            if event.state == "drained":  # a straggler left by a checkpoint-restart: its return ends the fail-slow
                for job, info in self.jobs.items():
                    if node in info.nodes:
                        self.mitigation.straggler_left(job, node)
            elif event.state == "lost":
                self.mitigation.node_gone(node)
        elif event.state in ("joined", "healthy"):  # "repaired" counts once the node passed its check
            back = node in self.nodes_down or event.state == "joined"
            if back:
                self.mitigation.node_back(node, now)
            self.nodes_down.discard(node)
            if back:
                return self._replanning(f"node {node} {event.state}", now)
        return []

    def _active_specs(self) -> dict[str, JobState]:
        """The jobs that hold or wait for nodes (pending, running, restarting), by name."""
        return {j: i.spec for j, i in self.jobs.items()
                if i.spec is not None and i.spec.state in ("pending", "running", "restarting")}
    def _recovery_gave_up(self, job: str, reason: str, now: float) -> list[Envelope]:
        """A job that failed while vigil was recovering it (a remedy of this run, decided within the
        escalation window, that an actuator took up): automatic recovery failed, and a human is called.
        A job that fails with no remedy tried, or none carried out (no actuator took the decisions: the
        scheduler handles its failures), was never vigil's to recover: its own alerts already say why."""
        recent = self._remedies(job, now)
        latest = max(recent, key=lambda d: d.at, default=None)
        tried = max((d for d in recent if d.heard), key=lambda d: d.at, default=None)
        if latest is None or latest.action == "notify_human" or tried is None:  # (a human was called already)
            return []
        return [self._recovery_failed(job, tried.kind, tried.answers, now,
                                      f"job {job} failed after {tried.action}: {reason or 'no reason given'}")]

    def _job_ended(self, job: str, now: float) -> None:
        """The job ended (finished, cancelled, gave up): nothing waits to be decided for it any more."""
        self.layouts.forget(job)
        for incident, (alert, _due) in list(self._settling.items()):
            if alert.subject.job == job:
                del self._settling[incident]
        self._inflight.pop(job, None)
