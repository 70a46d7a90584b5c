"""The decision engine: alerts and action results in, decisions out.

Fail-stops climb the escalation ladder (:mod:`vigil.streams.engine.escalation`); fail-slows
are mitigated by ski rental (:mod:`vigil.streams.engine.skirental`); a job arriving or
finishing and a node joining or coming back trigger re-planning. Every
decision names the incidents it answers, its reason, its plan (the contract
the actuators validate, see ``actuators/``) and an idempotency key; its id is
derived from what it answers, so a replay decides the same ids and an
actuator never acts twice.

Action results feed back: a failed or timed-out remedy climbs the ladder; a
remedy that worked resolves the incidents it answered ("recovered by ..."),
so a failure that comes back afterwards is a new incident, seen as the same
failure returning, while a symptom that began before it is resolved, not
answered. A graver remedy decided while a milder one is under way takes over
the milder one's incidents, and the milder one failing then climbs nothing
(nor does a remedy that fails after one as grave, decided later, worked).
The durations of finished actions teach the ski-rental
overheads, and the durations of finished fail-slows (from the alert's onset to
its resolution; a lower bound when a strategy or a remedy acted on the job
meanwhile, completed when the straggler node that a checkpoint-restart
left behind comes back) teach it how long the next one will last. The ski rental is
offered only the strategies that the job's layout allows (micro-batches need
two replicas, a topology adjustment two pipeline stages). When nothing is
left to try, or the job fails while being recovered, a sev1 ``recovery_failed``
alert calls a human, only when an actuator carried a remedy out (took it up:
a result was heard): with no actuator the decisions are advice, and the
failures' own alerts have paged. A job that ends and starts again (requeued
by its scheduler) is a new run: its failures enter the ladder afresh.

Pure: no Kafka, time is an argument. Parts: :mod:`~vigil.streams.engine.decisions_lifecycle`
(the inventory of jobs and nodes, a job's runs and ends), :mod:`~vigil.streams.engine.decisions_mitigation`
(the fail-slow mitigation); this module answers alerts and action results (the ladder).

Examples
--------
>>> import uuid
>>> from datetime import datetime, timezone
>>> from vigil.schemas import Alert, Source, Subject
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> crash = Alert(event_time=t0, source=Source(), incident_id=uuid.uuid4(), incident_version=1, status="open",
...               severity=2, kind="process_exit", subject=Subject(job="gpt", node="n1", rank=3),
...               onset_time=t0, detection_time=t0, detector="process_exit", detector_version="1")
>>> engine = DecisionEngine()
>>> [(d.action, d.target.job) for d in engine.on_alert(crash, now=0.0)]
[('restart_process', 'gpt')]
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from vigil.schemas import ActionResult, Alert, Decision, Envelope, JobState, Source, Subject, from_seconds, to_seconds
from vigil.streams.engine.decisions_lifecycle import _JobInfo, _Lifecycle
from vigil.streams.engine.decisions_mitigation import _Mitigation
from vigil.streams.engine.escalation import LADDER, Escalation
from vigil.streams.engine.incidents import GPU_CAUSES, LINK_CAUSES, NODES_SILENT
from vigil.streams.engine.layouts import JobLayouts
from vigil.streams.engine.skirental import FailSlowMitigation

log = logging.getLogger(__name__)

_DECISION_NS = uuid.UUID("5b2f6d0a-8c3e-4f1a-b7d9-2e6c4a8f1d07")
#: Kinds that are degradations, not fail-stops: mitigated by ski rental, not by the ladder.
DEGRADATIONS = GPU_CAUSES | LINK_CAUSES | {"fail_slow", "straggler", "recovery", "recovery_failed",
                                           "actuator_circuit_open", "health_check_failed"}
#: Incidents no machine acts on, a human does: a cause shared and not the nodes' (the telemetry path, a
#: switch), a run whose chain of jobs stopped (resubmit it).
SHARED_CAUSES = {NODES_SILENT, "chain_broken"}
#: The severity each rung answers (Unicron: sev3 retry, sev2 restart, sev1 reconfigure).
RUNG_SEVERITY = {"retry_in_place": 3, "restart_process": 2, "reconfigure": 1, "notify_human": 1}
#: Remedies after which the failure counts as recovered when the actuator reports success.
RECOVERING = {"retry_in_place", "restart_process", "reconfigure", "checkpoint_restart", "isolate_node"}
#: What a restart collects from the ranks before stopping them, per failure kind: a hung rank's flight
#: recorder names the collective it is stuck in and who never joined it (plan key collect_diagnostics).
DIAGNOSE = {"task_hang": ["flight_recorder"]}


#: How grave each recovering remedy is, as a ladder rung (a checkpoint-restart restarts the
#: job; isolating a node moves its jobs, as a reconfiguration does).
RUNG = {**{a: i for i, a in enumerate(LADDER)}, "checkpoint_restart": LADDER.index("restart_process"),
        "isolate_node": LADDER.index("reconfigure")}
_NEVER = (float("-inf"), -1)  # (when, rung) of a job no remedy has cured yet


@dataclass
class _Decided:
    job: str | None
    kind: str
    action: str
    answers: list[uuid.UUID]
    at: float
    culprit: str | None = None  # the node the failure was seen on, to exclude when re-planning
    started_at: float | None = None
    #: a graver remedy of the same job took over this one's failures: its own failure climbs nothing
    superseded: bool = False
    #: an actuator took it up (a result was heard): only then can it have failed
    heard: bool = False


class DecisionEngine(_Lifecycle, _Mitigation):
    """Turns incidents into remedies, one decision per step of the ladder.

    Parameters
    ----------
    escalation : Escalation
        The fail-stop ladder (window and restart budget).
    mitigation : FailSlowMitigation
        The fail-slow ski rental (strategy overheads).
    recovered : callable, optional
        ``recovered(incident_ids, job, at, why) -> list[Alert]``: told when a
        remedy worked, returns the alerts that resolve those incidents (the
        correlator's :meth:`~vigil.streams.engine.incidents.Correlator.recovered`).
    replan : callable, optional
        ``replan(jobs: dict[str, JobState], healthy_nodes: set[str]) -> dict``:
        the multi-job plan to carry in a re-planning decision.
    cluster : str
        Cluster name stamped on what the engine emits.
    settle_s : float
        A sev3 failure is answered after this long, unless a graver cause
        takes its incident over first (0: at once).
    silence_settle_s : float
        A lost node is answered after this long: when many nodes go silent
        together the correlator merges them into one incident with a shared
        cause, and no node is drained for it.
    inflight_timeout_s : float
        A new failure of a job joins the remedy under way (same rung or
        higher) for this long; past it, with no result heard (no actuator
        took the decision), the failure gets its own remedy.
    """

    def __init__(self, escalation: Escalation | None = None, mitigation: FailSlowMitigation | None = None,
                 recovered: Callable[[list[uuid.UUID], str | None, float, str], list[Alert]] | None = None,
                 replan: Callable[[dict[str, JobState], set[str]], dict[str, Any]] | None = None,
                 cluster: str = "default", settle_s: float = 1.0, inflight_timeout_s: float = 120.0,
                 silence_settle_s: float = 2.0) -> None:
        if not settle_s >= 0:
            raise ValueError(f"settle_s must be >= 0 s, got {settle_s}")
        if not inflight_timeout_s > 0:
            raise ValueError(f"inflight_timeout_s must be > 0 s, got {inflight_timeout_s}")
        self.settle_s = settle_s
        self.silence_settle_s = silence_settle_s
        self.inflight_timeout_s = inflight_timeout_s
        self._settling: dict[uuid.UUID, tuple[Alert, float]] = {}
        self.escalation = escalation or Escalation()
        self.mitigation = mitigation or FailSlowMitigation()
        self._recovered = recovered
        self._replan = replan
        self.cluster = cluster
        self.jobs: dict[str, _JobInfo] = {}
        self.nodes_down: set[str] = set()
        self.known_nodes: set[str] = set()
        #: each job's layout as its states told it (node agents name their own node; a move is a new set)
        self.layouts = JobLayouts()
        self._decided: dict[uuid.UUID, _Decided] = {}
        self._incident_rung: dict[uuid.UUID, int] = {}
        self._failslow_incident: dict[str, list[uuid.UUID]] = {}
        self._results_seen: set[uuid.UUID] = set()
        #: job -> the remedy under way (no final result yet): a second failure of the job it covers
        #: joins it instead of starting another (a crash and its peers' errors are one restart).
        self._inflight: dict[str, uuid.UUID] = {}
        #: job -> (when, ladder rung) of its last remedy that worked: a failure that began before
        #: belongs to what it cured
        self._recovered_at: dict[str, tuple[float, int]] = {}
        #: job -> (slow node, healthy and slow iteration time, slowdown class) of its fail-slow
        self._failslow_ctx: dict[str, tuple[str | None, float, float, str]] = {}
        #: job -> when its current run began (it arrived, or was requeued after it ended)
        self._run_began: dict[str, float] = {}

    # -- alerts ------------------------------------------------------------
    def on_alert(self, alert: Alert, now: float) -> list[Envelope]:
        self._learn_nodes(alert)
        if alert.status == "resolved":
            return self._on_resolved(alert, now)
        if alert.kind in SHARED_CAUSES:
            self._settling.pop(alert.incident_id, None)  # the lost node it began as is not drained
            self._incident_rung[alert.incident_id] = len(LADDER)
            return []
        if alert.kind in DEGRADATIONS:
            return self._on_degradation(alert, now)
        rung = 2 if alert.severity == 1 else 1 if alert.severity == 2 else 0
        if self._incident_rung.get(alert.incident_id, -1) >= rung:
            return []  # an update that does not make it worse: already answered
        self._incident_rung[alert.incident_id] = rung
        if alert.severity == 3 and self.settle_s > 0:
            # The peers of a crashed rank report their broken connections a moment before the
            # crash itself is known: wait briefly for the cause rather than race its remedy.
            self._settling[alert.incident_id] = (alert, now + self.settle_s)
            return []
        if alert.kind == "node_lost" and self.silence_settle_s > 0:
            # Many nodes silent at once share a cause (the telemetry path, a switch, the broker):
            # wait to see whether this one is alone before draining it.
            self._settling[alert.incident_id] = (alert, now + self.silence_settle_s)
            return []
        self._settling.pop(alert.incident_id, None)
        return self._answer(alert, now)

    def _answer(self, alert: Alert, now: float) -> list[Envelope]:
        jobs = self._jobs_of(alert)
        if not jobs:
            if alert.severity == 1 and alert.subject.node:
                return [self._decide(None, alert.kind, "isolate_node", alert, now,
                                     f"sev1 {alert.kind} on {alert.subject.node}, which runs no known job: isolate it",
                                     {"reason": f"vigil: {alert.kind}"}, target=Subject(node=alert.subject.node))]
            return []
        out: list[Envelope] = []
        began = min(now, to_seconds(alert.onset_time))
        if alert.subject.job is not None and began < self._recovered_at.get(alert.subject.job, _NEVER)[0]:
            # A symptom of the job from before its last remedy worked (a peer's broken connection
            # that waited to settle, seen after the restart): that remedy answered it already.
            if self._recovered is None:
                return []
            return list(self._recovered([alert.incident_id], alert.subject.job, now,
                                        "began before the job's last recovery, which answered it"))
        for job in jobs:
            action = self.escalation.next_action(job, alert.kind, alert.severity, now, began=began)
            answers = [alert.incident_id]
            running = self._running(job, now)
            if running is not None:
                if LADDER.index(running.action) >= LADDER.index(action):
                    if alert.incident_id not in running.answers:
                        running.answers.append(alert.incident_id)
                    continue
                # a graver remedy replaces the one under way (a retry of a peer, then the crash that
                # caused it): it answers that one's failures, and that one failing escalates nothing
                running.superseded = True
                answers += [i for i in running.answers if i not in answers]
            history = self.escalation.history(job, alert.kind)
            why = f"sev{alert.severity} {alert.kind}"
            if history and self.escalation.returned(job, alert.kind, began):
                why += f" returned within {self.escalation.window_s:.0f} s of {history[-1][1]}"
            out += self._remedy(job, alert.kind, action, answers, now, f"{why}: {action}", source_alert=alert)
        return out

    def _cured_since(self, decided: _Decided) -> bool:
        """Did a remedy at least as grave work for the job after ``decided`` was decided?

        Then ``decided`` failing (a retry sent to a rank the restart had
        already replaced) is no reason to climb the ladder.
        """
        if decided.job is None or decided.action not in RECOVERING:
            return False
        at, rung = self._recovered_at.get(decided.job, _NEVER)
        return decided.at < at and RUNG[decided.action] <= rung

    def _running(self, job: str, now: float) -> _Decided | None:
        """The ladder remedy of ``job`` under way: decided, no final result yet, not timed out."""
        running = self._decided.get(self._inflight.get(job))  # type: ignore[arg-type]
        if running is None or running.action not in LADDER or now - running.at >= self.inflight_timeout_s:
            return None
        return running

    def _on_resolved(self, alert: Alert, now: float) -> list[Envelope]:
        self._incident_rung.pop(alert.incident_id, None)
        self._settling.pop(alert.incident_id, None)
        for job, incidents in list(self._failslow_incident.items()):
            if alert.incident_id in incidents:
                incidents.remove(alert.incident_id)
                if not incidents:
                    del self._failslow_incident[job]
                    self._failslow_ctx.pop(job, None)
                    # Its duration teaches the ski rental (a lower bound if anything acted on the job).
                    self.mitigation.stop(job, now=now)
        return []

    # -- action results ----------------------------------------------------
    def on_action_result(self, result: ActionResult, now: float) -> list[Envelope]:
        decided = self._decided.get(result.decision_id)
        if decided is None or result.event_id in self._results_seen:
            return []
        self._results_seen.add(result.event_id)
        decided.heard = True
        if result.state == "running":
            decided.started_at = now
            return []
        if decided.job is not None and self._inflight.get(decided.job) == result.decision_id:
            del self._inflight[decided.job]
        if result.state == "succeeded" and decided.started_at is not None:
            self.mitigation.observe_duration(decided.action, now - decided.started_at)
        if decided.superseded:
            return []  # what it answered is the graver remedy's to resolve or escalate
        if result.state == "succeeded":
            # When the remedy took effect, as the actuator stamped it, not when its result got here:
            # a relaunched rank that fails at once fails after the restart, however late this is heard.
            done = min(now, to_seconds(result.event_time))
            if decided.action in RECOVERING and decided.job is not None:
                self._recovered_at[decided.job] = (done, RUNG[decided.action])
            if decided.action in RECOVERING and self._recovered is not None and decided.answers:
                return list(self._recovered(decided.answers, decided.job, done,
                                            f"recovered by {decided.action} (decision {result.decision_id})"))
            return []
        if self._cured_since(decided):
            return []  # it failed, but a remedy as grave decided after it has worked since
        if result.state in ("failed", "timed_out") and decided.job is not None and decided.action in LADDER:
            nxt = self.escalation.failed(decided.job, decided.kind, decided.action, now)
            why = f"{decided.action} {result.state}: {result.detail[:300]}"
            return self._remedy(decided.job, decided.kind, nxt, decided.answers, now,
                                f"{why}; escalating to {nxt} (sev{RUNG_SEVERITY[nxt]})",
                                culprit=decided.culprit)
        return []

    # -- state -------------------------------------------------------------
    def _remedies(self, job: str, now: float, kind: str | None = None) -> list[_Decided]:
        """The job's ladder remedies of its current run decided within the escalation window (of
        ``kind`` when given)."""
        since = max(now - self.escalation.window_s, self._run_began.get(job, float("-inf")))
        return [d for d in self._decided.values() if d.job == job and d.action in LADDER and d.at >= since
                and (kind is None or d.kind == kind)]

    def _replanning(self, trigger: str, now: float) -> list[Envelope]:
        """A multi-job re-plan, when this engine plans allocations (a ``replan`` callable was given):
        most clusters' schedulers place their own jobs, and an unplanned re-plan is noise."""
        if self._replan is None:
            return []
        plan: dict[str, Any] = {"trigger": trigger}
        plan.update(self._replan(self._active_specs(), self.known_nodes - self.nodes_down))  # type: ignore[arg-type]
        key = f"replan|{trigger}|{now:.3f}"
        return [Decision(
            event_id=uuid.uuid5(_DECISION_NS, f"event|{key}"), event_time=from_seconds(now),
            source=Source(cluster=self.cluster), decision_id=uuid.uuid5(_DECISION_NS, key), idempotency_key=key,
            action="replan", target=Subject(), reason=f"re-plan all jobs: {trigger}", plan=plan)]

    # -- timers ------------------------------------------------------------
    def tick(self, now: float) -> list[Envelope]:
        out: list[Envelope] = []
        for incident, (alert, due) in list(self._settling.items()):
            if now >= due:
                del self._settling[incident]
                out += self._answer(alert, now)
        for job, strategy, lost in self.mitigation.tick(now):
            answers = list(self._failslow_incident.get(job, []))
            out.append(self._decide(job, "fail_slow", strategy, None, now,
                                    f"ski rental buys {strategy} after {lost:.1f} s lost: "
                                    f"{self.mitigation.explain(job)}",
                                    self._failslow_plan(job, strategy), answers=answers))
        self.escalation.forget_before(now - 10 * self.escalation.window_s)
        if len(self._decided) > 10_000:  # a long-lived worker's memory of old decisions stays bounded
            keep, horizon = set(self._inflight.values()), now - 10 * self.escalation.window_s
            self._decided = {k: d for k, d in self._decided.items() if d.at >= horizon or k in keep}
        return out

    # -- helpers -----------------------------------------------------------
    def _remedy(self, job: str, kind: str, action: str, answers: list[uuid.UUID], now: float, reason: str,
                source_alert: Alert | None = None, culprit: str | None = None) -> list[Envelope]:
        self.escalation.acted(job, kind, action, now)
        self.mitigation.touched(job, now)  # a fail-slow in progress may end with this remedy, not by itself
        nodes = sorted(self.jobs.get(job, _JobInfo()).nodes)
        if source_alert is not None:
            culprit = source_alert.subject.node
        plan: dict[str, Any]
        if action == "retry_in_place":
            rank = source_alert.subject.rank if source_alert is not None else None
            plan = {"ranks": [] if rank is None else [rank]}
        elif action == "restart_process":
            plan = {"nodes": nodes} if nodes else {}
        elif action == "reconfigure":
            # Nodes known to be down come first: when a restart failed because another node died,
            # the node of the rank that crashed first is healthy and must not be drained.
            excluded = sorted(self.nodes_down & set(nodes)) or sorted({culprit} if culprit else set())
            plan = {"exclude_nodes": excluded}
        else:
            plan = {}
        if kind in DIAGNOSE and action in ("restart_process", "checkpoint_restart"):
            plan["collect_diagnostics"] = list(DIAGNOSE[kind])
        tried = any(d.heard for d in self._remedies(job, now, kind))
        decision = self._decide(job, kind, action, source_alert, now, reason, plan, answers=answers, culprit=culprit)
        out: list[Envelope] = [decision]
        if action == "notify_human" and tried:  # a page only when a remedy of vigil's was carried out and failed
            out.append(self._recovery_failed(job, kind, answers, now, reason))
        return out

    def _decide(self, job: str | None, kind: str, action: str, alert: Alert | None, now: float, reason: str,
                plan: dict[str, Any], answers: list[uuid.UUID] | None = None, target: Subject | None = None,
                culprit: str | None = None) -> Decision:
        answers = list(answers if answers is not None else ([alert.incident_id] if alert else []))
        attempt = len(self.escalation.history(job, kind)) if job else 0
        key = f"{job}|{kind}|{action}|{'+'.join(sorted(map(str, answers)))}|{attempt}"
        decision_id = uuid.uuid5(_DECISION_NS, key)
        self._decided[decision_id] = _Decided(job, kind, action, answers, now, culprit=culprit)
        if job is not None and action in LADDER:
            self._inflight[job] = decision_id  # a human called counts too: later failures join that call
        return Decision(
            event_id=uuid.uuid5(_DECISION_NS, f"event|{key}"), event_time=from_seconds(now),
            source=Source(cluster=self.cluster, job=job), decision_id=decision_id, idempotency_key=key,
            action=action,  # type: ignore[arg-type]
            target=target or Subject(job=job, node=alert.subject.node if alert else None,
                                     rank=alert.subject.rank if alert else None),
            reason=reason, answers=answers, plan=plan)

    def _recovery_failed(self, job: str, kind: str, answers: list[uuid.UUID], now: float, reason: str) -> Alert:
        incident = uuid.uuid5(_DECISION_NS, f"recovery_failed|{job}|{kind}|{'+'.join(sorted(map(str, answers)))}")
        tried = ", ".join(a for _, a in self.escalation.history(job, kind))
        return Alert(
            event_id=uuid.uuid5(incident, "1"), event_time=from_seconds(now), source=Source(cluster=self.cluster, job=job),
            incident_id=incident, incident_version=1, status="open", severity=1, kind="recovery_failed",
            subject=Subject(job=job), onset_time=from_seconds(now), detection_time=from_seconds(now),
            summary=f"automatic recovery of {job} from {kind} gave up after {tried}: {reason}"[:1000],
            evidence=[{"answers": [str(a) for a in answers], "tried": tried}], evidence_count=1,
            detector="decision_engine", detector_version="1")

    def _jobs_of(self, alert: Alert) -> list[str]:
        if alert.subject.job:
            return [alert.subject.job]
        jobs = set(alert.jobs)  # the incident's job findings, and the jobs running where a node finding is
        node = alert.subject.node
        if node:
            jobs |= {j for j, info in self.jobs.items() if node in info.nodes}
        return sorted(j for j in jobs if j)

    def _learn_nodes(self, alert: Alert) -> None:
        for job, nodes in alert.jobs.items():
            self.jobs.setdefault(job, _JobInfo()).nodes.update(nodes)
        if alert.subject.job and alert.subject.node:
            self.jobs.setdefault(alert.subject.job, _JobInfo()).nodes.add(alert.subject.node)
