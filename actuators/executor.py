"""The executor: one decision in, action results (and alerts) out; idempotent by decision id.

:meth:`Executor.handle` takes a :class:`~vigil.schemas.Decision` and the current
time and returns the events to publish:

* nothing new for a decision the ledger already holds (same ``decision_id``,
  or a different decision with an already-used ``idempotency_key``): the
  recorded final result is returned again, with the same ``event_id``, so a
  result lost between the ledger and Kafka is re-published and a duplicate
  is dropped downstream;
* a decision that is not vigil's (unsigned, a bad signature, an unknown key
  id: :class:`~vigil.schemas.signing.Keyring`) or a replay (a decision id
  already in the ledger, read again from another place in the log): one
  ``failed`` result under an id of its own (``decision_id`` derived from the
  refused decision's, so that the decision engine never takes it for the
  outcome of a decision it made), nothing recorded under the decision's id,
  nothing executed, and a sev2 ``actuator_refused_decision`` alert; the same
  for a message on the decisions topic that is no valid decision at all
  (:meth:`Executor.undecodable`: a target the schema refuses, such as
  ``node[1-64]``), besides its dead letter;
* a refusal (malformed plan, a name that stands for a set of nodes, unknown
  node or job, an action the backend does not support, a stale or
  future-dated decision, a safety refusal): ``pending -> failed``, one
  ``failed`` result with the reason, nothing executed; the refusals that say
  the input was wrong (not the safety limits') add a sev2
  ``actuator_refused_decision`` alert; a refusal by the blast-radius breaker
  opens the circuit and adds a sev1 ``actuator_circuit_open``
  :class:`~vigil.schemas.Alert`;
* otherwise ``pending -> running`` (a ``running`` result) and the backend's
  final state (``succeeded`` / ``failed`` / ``timed_out``, a second result),
  followed by a ``drained`` node state for each node the backend's drain or
  cordon took out of service (even when a later command failed).
  A backend that raises is a ``failed`` result with the exception.

``notify_human`` and ``none`` run nothing: one ``succeeded`` result saying so.

A backend that declares ``asynchronous = True`` may return a ``running``
outcome: the action has started and its end comes later, through
:meth:`Executor.complete` (the simulated cluster's backend works so: its
actions take simulated time).
Every state change is checked by :mod:`vigil.actuators.state` and written to the
ledger before the event is returned. Time is an argument (``now``, an aware
datetime); the executor reads no clock of its own (an owner may pass one
to stamp when an action finished).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import datetime
from typing import Any, Callable, Iterable

from vigil.actuators.backends.base import Backend, Outcome
from vigil.actuators.errors import ActionCancelled, PlanError
from vigil.actuators.inventory import Inventory
from vigil.actuators.ledger import Ledger, LedgerRecord
from vigil.actuators.plans import NAME_RE, NO_MACHINE_ACTIONS, Action, parse_action
from vigil.actuators.safety import Safety
from vigil.actuators.state import ActionState
from vigil.schemas import ActionResult, Alert, Decision, Envelope, NodeState, Source, Subject, to_seconds
from vigil.schemas.envelope import from_seconds
from vigil.schemas.signing import Keyring

log = logging.getLogger(__name__)

__all__ = ["Executor", "CIRCUIT_ALERT_KIND", "MAX_DECISION_AGE_S", "REFUSED_ALERT_KIND"]

CIRCUIT_ALERT_KIND = "actuator_circuit_open"
REFUSED_ALERT_KIND = "actuator_refused_decision"
#: Refusal alerts per kind of refusal in any minute; beyond, counted into the next one (a flood of
#: forged decisions must not become a flood of pages).
ALERTS_PER_MINUTE = 10
#: Decisions older than this many seconds when handled are refused as stale: the cluster they were
#: decided on has moved on (every actuator's default: ``vigil actuate``, the agent's).
MAX_DECISION_AGE_S = 600.0
_NS = uuid.UUID("0b7d2f3c-6a51-4f0e-8a7e-3c1f4b6e9d20")


class Executor:
    """Carry out decisions through ``backend`` with a persisted ``ledger``, an ``inventory`` and ``safety`` checks.

    Parameters
    ----------
    backend : Backend
        What acts (:mod:`vigil.actuators.backends`).
    ledger : Ledger
        The persisted record of every decision; the executor's safety state is
        rebuilt from it on construction.
    inventory : Inventory
        Known nodes and jobs; feed it ``job_state`` / ``node_state`` events with :meth:`observe`.
    safety : Safety, optional
        Circuit breaker, no-progress guard, rate limit (defaults: :class:`~vigil.actuators.safety.SafetyLimits`).
    dry_run : bool
        Record what would run, run nothing; results say ``dry run: ...`` with backend ``dry-run:<name>``.
    source : Source, optional
        Who reports (cluster, node of this actuator); part of every result's identity.
    max_age_s : float or None
        Decisions older than this when handled are refused as stale (None: no limit).
    actions : iterable of str, optional
        Only these actions are this executor's; decisions for others are ignored
        (no result, no ledger row), e.g. a node agent leaves ``isolate_node`` to
        the scheduler's actuator.
    clock : callable, optional
        The owner's clock, read only to stamp when an action *finished* (so
        results carry real durations); without it the final result has ``now``.
    keyring : Keyring, optional
        The decision keys this actuator accepts signatures from. None: no keys,
        so every decision is refused (as unsigned or signed with an unknown key)
        unless the keyring allows unsigned ones.
    max_future_s : float
        Decisions dated more than this ahead of ``now`` are refused (a clock
        problem, or a decision made to outlive its staleness limit).
    """

    def __init__(self, backend: Backend, ledger: Ledger, inventory: Inventory, safety: Safety | None = None, *,
                 dry_run: bool = False, source: Source | None = None, max_age_s: float | None = MAX_DECISION_AGE_S,
                 actions: Iterable[str] | None = None, clock: Callable[[], datetime] | None = None,
                 keyring: Keyring | None = None, max_future_s: float = 60.0) -> None:
        self.backend = backend
        self.ledger = ledger
        self.inventory = inventory
        self.safety = safety if safety is not None else Safety()
        self.dry_run = dry_run
        self.source = source or Source()
        self.max_age_s = max_age_s
        self.actions = frozenset(actions) if actions is not None else None
        self.clock = clock
        self.keyring = keyring if keyring is not None else Keyring()
        self.max_future_s = max_future_s
        self.backend_label = f"dry-run:{backend.name}" if dry_run else backend.name
        self._last_reset = 0
        self._incident: str | None = None
        #: actions an asynchronous backend has under way: decision id -> (decision, ignored-keys note)
        self._running: dict[uuid.UUID, tuple[Decision, str]] = {}
        #: kind of refusal -> (start of its minute, alerts sent in it, refusals not alerted since the last alert)
        self._alerted: dict[str, tuple[float, int, int]] = {}
        self._replay()

    # -- state from the ledger ----------------------------------------------------------------------------

    def _replay(self) -> None:
        """Rebuild the safety windows and counts from the ledger (actions and human resets, in time order)."""
        timeline: list[tuple[float, int, object]] = [(r.created_at, 0, r) for r in self.ledger.history()]
        resets = self.ledger.resets()
        timeline += [(r.at, 1, r) for r in resets]
        for _, _, item in sorted(timeline, key=lambda x: (x[0], x[1])):
            if isinstance(item, LedgerRecord):
                self.safety.record(item.action, item.job, item.created_at, item.progress, item.drained)
            elif item.kind == "circuit":  # type: ignore[attr-defined]
                self.safety.reset_circuit()
            else:
                self.safety.reset_job(item.job)  # type: ignore[attr-defined]
        self._last_reset = max((r.id for r in resets), default=0)
        circuit = self.ledger.circuit()
        if circuit.is_open:
            self.safety.open_circuit(circuit.reason, circuit.opened_at or 0.0)
            self._incident = circuit.incident_id

    def observe(self, event: Envelope) -> bool:
        """Learn nodes and jobs from a ``job_state`` / ``node_state`` event; True if it was one."""
        return self.inventory.observe(event)

    def tick(self, now: datetime) -> list[Envelope]:
        """Apply human resets written to the ledger since the last call; a closed circuit's alert is resolved."""
        out: list[Envelope] = []
        for reset in self.ledger.resets(self._last_reset):
            self._last_reset = reset.id
            if reset.kind == "job" and reset.job:
                log.warning("no-progress guard of job %s reset by %s", reset.job, reset.who or "a human")
                self.safety.reset_job(reset.job)
                continue
            was_open, reason = self.safety.circuit_open, self.safety.circuit_reason
            self.safety.reset_circuit()
            self.ledger.apply_circuit_reset()
            log.warning("circuit breaker reset by %s", reset.who or "a human")
            if was_open and self._incident is not None:
                out.append(self._circuit_alert(now, "resolved", 2, Subject(),
                                               f"circuit breaker reset by {reset.who or 'a human'}; actuator acting again "
                                               f"(it had opened: {reason})"[:1000], {"reset_id": reset.id}))
                self._incident = None
        return out

    def recovered_results(self, now: datetime) -> list[ActionResult]:
        """Final results of actions a crashed actuator left running (marked failed when the ledger opened)."""
        return [self._result_from(rec.decision_id, rec, now, job=rec.job) for rec in self.ledger.recovered]

    # -- handling one decision ----------------------------------------------------------------------------

    def handle(self, decision: Decision, now: datetime,
               emit: Callable[[Envelope], None] | None = None, origin: str | None = None) -> list[Envelope]:
        """Carry out ``decision`` (or not); return the events to publish, in order.

        ``emit``, when given, is called with each event as soon as it exists:
        the ``running`` result before the backend runs, so it can be published
        while a long action is under way. The returned list holds them all.
        ``origin``: where the decision was read (``topic/partition/offset``);
        a known decision read from another place is a replay and is refused.
        """
        out: list[Envelope] = []

        def send(events: list[Envelope]) -> list[Envelope]:
            out.extend(events)
            if emit is not None:
                for event in events:
                    emit(event)
            return out

        send(self.tick(now))
        if self.actions is not None and decision.action not in self.actions:
            log.info("decision %s (%s) is not for this actuator; ignored", decision.decision_id, decision.action)
            return out
        unauthenticated = self.keyring.check(decision)
        if unauthenticated is not None:
            return send(self._rejected(decision, "unauthenticated", f"not a decision of vigil's decision engine: "
                                       f"{unauthenticated}; nothing executed", now, origin))
        known = self.ledger.lookup(decision)
        if known is not None:
            if origin is not None and known.decision_id == str(decision.decision_id):
                first = self.ledger.origin_of(known.decision_id)
                if first is not None and first != origin:
                    return send(self._rejected(
                        decision, "replayed", f"replayed: decision {decision.decision_id} was first read at {first} "
                        f"(it {known.state.value}), and again at {origin}; a decision acts at most once", now, origin))
            return send(self._replayed(decision, known, now))
        t = to_seconds(now)
        rec, created = self.ledger.begin(decision, self.backend_label, t)
        if not created:  # recorded between lookup and begin (another thread): the same as known
            return send(self._replayed(decision, rec, now))
        did = decision.decision_id
        if origin is not None:
            self.ledger.record_origin(did, origin)

        def refuse(why: str, alert: str | None = None) -> list[Envelope]:
            log.warning("decision %s (%s) refused: %s", did, decision.action, why)
            final = self.ledger.transition(did, ActionState.failed, t, detail=why)
            send([self._result(decision, final.state, final.detail, now)])
            if alert is not None:
                send(self._refusal_alert(decision, alert, why, now, origin))
            return out

        try:
            action = parse_action(decision)
        except PlanError as exc:
            return refuse(f"malformed plan: {exc}", "malformed_plan")
        if self.max_age_s is not None and t - to_seconds(decision.event_time) > self.max_age_s:
            age = t - to_seconds(decision.event_time)
            return refuse(f"stale decision: made at {decision.event_time.isoformat()}, {age:.0f} s ago "
                          f"(at most {self.max_age_s:g} s); not acting on an old picture of the cluster", "stale")
        if to_seconds(decision.event_time) - t > self.max_future_s:
            return refuse(f"decision dated {decision.event_time.isoformat()}, "
                          f"{to_seconds(decision.event_time) - t:.0f} s ahead of this actuator's clock "
                          f"(at most {self.max_future_s:g} s): check the clocks", "future")
        if action.action in NO_MACHINE_ACTIONS:
            return send(self._no_machine_action(action, t, now))
        if action.action not in self.backend.supports:
            return refuse(f"{action.action} is not supported by the {self.backend.name} backend "
                          f"(it supports: {', '.join(sorted(self.backend.supports))})")
        self.inventory.refresh(t)
        unknown = self._unknown_targets(action, check_nodes=getattr(self.backend, "acts_on_nodes", True))
        if unknown:
            return refuse(unknown, "unknown_target")
        progress = self.safety.progress_of(action)
        refusal = self.safety.check(action, t, len(self.inventory.nodes), progress)
        if refusal is not None:
            refuse(refusal.reason)
            if refusal.opens_circuit:
                send(self._open_circuit(action, refusal.reason, t, now))
            return out
        # From here on the action runs: count it first (its effect may be partial even if it fails).
        self.safety.record(action.action, action.job, t, progress, action.drains)
        ignored = f" (ignored plan keys: {', '.join(action.ignored_keys)})" if action.ignored_keys else ""
        running = self.ledger.transition(did, ActionState.running, t, executed=True, progress=progress,
                                         drained=action.drains,
                                         detail=f"{self.backend_label}: {action.action} started{ignored}")
        send([self._result(decision, running.state, running.detail, now)])
        try:
            outcome = self.backend.execute(action, dry_run=self.dry_run)
            if not outcome.state.terminal and not (outcome.state is ActionState.running
                                                   and getattr(self.backend, "asynchronous", False)):
                raise ValueError(f"backend {self.backend.name} returned the non-final state {outcome.state.value}")
        except ActionCancelled as exc:
            outcome = Outcome(ActionState.cancelled, f"not finished: {exc}")
        except Exception as exc:
            log.exception("backend %s failed on decision %s", self.backend.name, did)
            outcome = Outcome(ActionState.failed, f"backend {self.backend.name} raised {type(exc).__name__}: {exc}")
        if not outcome.state.terminal:
            self._running[did] = (decision, ignored)
            return out  # under way: complete() reports its end
        # The end of an action is stamped by the owner's clock when it gave one (durations feed the
        # decision engine's cost estimates), else it is ``now``.
        done = self.clock() if self.clock is not None else now
        return send(self._finish(decision, action.action, outcome, ignored, done))

    def complete(self, decision_id: uuid.UUID, outcome: Outcome, now: datetime) -> list[Envelope]:
        """The end of an action an asynchronous backend started: its final result (none if unknown)."""
        decision, ignored = self._running.pop(decision_id, (None, ""))
        if decision is None:
            return []
        return self._finish(decision, decision.action, outcome, ignored, now)

    def _finish(self, decision: Decision, action: str, outcome: Outcome, ignored: str,
                done: datetime) -> list[Envelope]:
        final = self.ledger.transition(decision.decision_id, outcome.state, to_seconds(done),
                                       detail=outcome.detail + ignored, commands=outcome.argv)
        (log.info if final.state is ActionState.succeeded else log.warning)(
            "decision %s (%s on %s): %s: %s", decision.decision_id, action, decision.target.job or decision.target.node,
            final.state.value, final.detail)
        return [self._result(decision, final.state, final.detail, done),
                *self._drained(decision.decision_id, action, outcome.drained, done)]

    def _drained(self, decision_id: uuid.UUID | str, action: str, nodes: Iterable[str], now: datetime) -> list[NodeState]:
        """Each node the backend took out of service, announced ``drained``: its silence is then no loss,
        and it is no capacity until its agent's check passes again. One id per (decision, node): the
        announcement of a replayed decision is the same event."""
        out = []
        for node in nodes:
            if not NAME_RE.fullmatch(node):
                continue  # (the backend validated it before running anything: never reached)
            out.append(NodeState(event_id=uuid.uuid5(_NS, f"drained/{decision_id}/{node}"), event_time=now,
                                 source=Source(cluster=self.source.cluster, node=node), state="drained",
                                 reason=f"{self.backend_label}: {action} (decision {decision_id}) took it out of "
                                        "service"))
        return out

    def _no_machine_action(self, action: Action, t: float, now: datetime) -> list[Envelope]:
        did = action.decision.decision_id
        self.ledger.transition(did, ActionState.running, t)
        if action.action == "notify_human":
            detail = ("no machine action: a human is told through this decision and the alerts it answers "
                      f"({action.reason or 'no reason given'})")
        else:
            detail = f"nothing to do: the decision is to take no action ({action.reason or 'no reason given'})"
        final = self.ledger.transition(did, ActionState.succeeded, t, detail=detail)
        return [self._result(action.decision, final.state, final.detail, now)]

    def _unknown_targets(self, action: Action, check_nodes: bool = True) -> str | None:
        problems = []
        if action.job is not None and not self.inventory.knows_job(action.job):
            problems.append(f"unknown job {action.job!r}")
        nodes = [n for n in action.named_nodes if not self.inventory.knows_node(n)] if check_nodes else []
        if nodes:
            problems.append(f"unknown node{'s' if len(nodes) > 1 else ''} {', '.join(repr(n) for n in nodes[:10])}")
        if not problems:
            return None
        return (f"{' and '.join(problems)}: not in this actuator's inventory ({self.inventory!r}: the operator's "
                f"--node/--job/--inventory and scheduler; never the state topics); nothing executed")

    def _open_circuit(self, action: Action, why: str, t: float, now: datetime) -> list[Envelope]:
        incident = str(uuid.uuid5(_NS, f"circuit/{self.source.cluster}/{self.source.node}/{t!r}"))
        self.safety.open_circuit(why, t)
        self.ledger.open_circuit(why, t, incident)
        self._incident = incident
        log.error("circuit breaker open: %s", why)
        summary = (f"actuator circuit breaker open: {why}"[:900] + "; a human must look, then `vigil actuate --reset-circuit`")
        return [self._circuit_alert(now, "open", 1, Subject(job=action.job, node=action.node), summary,
                                    {"decision_id": action.decision_id, "action": action.action,
                                     "drains": list(action.drains),
                                     "drained_in_window": sorted(self.safety.drained_in_window(t))[:100]})]

    def _circuit_alert(self, now: datetime, status: str, version: int, subject: Subject, summary: str,
                       evidence: dict) -> Alert:
        assert self._incident is not None
        return Alert(event_id=uuid.uuid5(_NS, f"alert/{self._incident}/{version}"), event_time=now,
                     source=Source(cluster=self.source.cluster, node=self.source.node),
                     incident_id=uuid.UUID(self._incident), incident_version=version, status=status, severity=1,
                     kind=CIRCUIT_ALERT_KIND, subject=subject,
                     onset_time=from_seconds(self.safety.circuit_opened_at) if self.safety.circuit_opened_at else now,
                     detection_time=now, summary=summary, evidence=[evidence], evidence_count=1,
                     detector="actuator.circuit_breaker", detector_version="1")

    # -- refusals of what is not vigil's ----------------------------------------------------------------

    def _rejected(self, decision: Decision, kind: str, why: str, now: datetime, origin: str | None) -> list[Envelope]:
        """A decision refused before the ledger: a result under an id of its own, and an alert."""
        log.warning("decision %s (%s) refused: %s", decision.decision_id, decision.action, why)
        rid = uuid.uuid5(_NS, f"rejected/{kind}/{decision.decision_id}/{decision.signature}/{origin}")
        detail = f"refused decision {decision.decision_id} ({decision.action}): {why}"
        result = ActionResult(event_id=uuid.uuid5(_NS, f"result/{rid}"), event_time=now,
                              source=Source(cluster=self.source.cluster, node=self.source.node),
                              decision_id=rid, state=ActionState.failed.value, backend=self.backend_label,
                              detail=detail[:4000])
        return [result, *self._refusal_alert(decision, kind, why, now, origin)]

    def undecodable(self, raw: bytes, why: str, now: datetime, origin: str | None) -> list[Envelope]:
        """A message on the decisions topic that is no valid decision, refused as one (besides its dead letter).

        Whoever wrote it meant something to happen (a target of ``node[1-64]``, a forged action):
        the operator hears of it as of any other refused decision, with what could be read of it.
        """
        fields: dict[str, Any] = {}
        try:
            parsed = json.loads(raw) if len(raw) <= 1 << 20 else None
            fields = parsed if isinstance(parsed, dict) else {}
        except (ValueError, RecursionError):
            pass
        try:
            did = uuid.UUID(str(fields.get("decision_id")))
        except ValueError:
            did = uuid.uuid5(_NS, "undecodable/" + hashlib.sha256(raw).hexdigest())
        action = fields.get("action")
        action = action if isinstance(action, str) and NAME_RE.fullmatch(action) else "unreadable"
        # Built without validation on purpose: it is what failed validation, kept only to be reported.
        decision = Decision.model_construct(decision_id=did, action=action, signature=None, target=Subject())
        return self._rejected(decision, "undecodable", f"not a valid decision: {why}", now, origin)

    def _refusal_alert(self, decision: Decision, kind: str, why: str, now: datetime,
                       origin: str | None) -> list[Alert]:
        """A sev2 alert for a refused decision (at most :data:`ALERTS_PER_MINUTE` per kind of refusal)."""
        t = to_seconds(now)
        start, sent, held = self._alerted.get(kind, (t, 0, 0))
        if t - start >= 60.0:
            start, sent = t, 0
        if sent >= ALERTS_PER_MINUTE:
            self._alerted[kind] = (start, sent, held + 1)
            return []
        self._alerted[kind] = (start, sent + 1, 0)
        incident = uuid.uuid5(_NS, f"refused/{kind}/{decision.decision_id}/{decision.signature}/{origin}")
        more = f" ({held} more {kind} refusal(s) not alerted separately)" if held else ""
        try:  # (the target as given: a model built without validation may hold anything)
            subject = Subject(job=decision.target.job, node=decision.target.node)
        except ValueError:
            subject = Subject()
        return [Alert(event_id=uuid.uuid5(_NS, f"alert/{incident}/1"), event_time=now,
                      source=Source(cluster=self.source.cluster, node=self.source.node),
                      incident_id=incident, incident_version=1, status="open", severity=2, kind=REFUSED_ALERT_KIND,
                      subject=subject, onset_time=now, detection_time=now,
                      summary=f"actuator refused a decision ({kind}): {why}{more}"[:1000],
                      evidence=[{"decision_id": str(decision.decision_id), "action": decision.action, "refusal": kind,
                                 "origin": origin, "suppressed": held}],
                      evidence_count=1 + held, detector="actuator.integrity", detector_version="1")]

    # -- results ------------------------------------------------------------------------------------------

    def _replayed(self, decision: Decision, rec: LedgerRecord, now: datetime) -> list[Envelope]:
        if not rec.state.terminal:
            return []  # being handled elsewhere; that handler reports
        if rec.decision_id == str(decision.decision_id):
            drained_by = getattr(self.backend, "drained", None)
            nodes = drained_by(rec.commands, rec.state is ActionState.succeeded) \
                if rec.executed and not rec.backend.startswith("dry-run:") and drained_by is not None else ()
            return [self._result_from(rec.decision_id, rec, now, job=decision.target.job),
                    *self._drained(rec.decision_id, rec.action, nodes, now)]
        detail = (f"duplicate of decision {rec.decision_id} (idempotency key {decision.idempotency_key!r}); "
                  f"nothing done; that decision {rec.state.value}: {rec.detail}")
        return [self._result(decision, rec.state, detail, now, backend=rec.backend)]

    def _result_from(self, decision_id: str, rec: LedgerRecord, now: datetime, job: str | None) -> ActionResult:
        return self._make(uuid.UUID(decision_id), rec.state, rec.detail, now, rec.backend, job)

    def _result(self, decision: Decision, state: ActionState, detail: str, now: datetime,
                backend: str | None = None) -> ActionResult:
        return self._make(decision.decision_id, state, detail, now, backend or self.backend_label, decision.target.job)

    def _make(self, decision_id: uuid.UUID, state: ActionState, detail: str, now: datetime, backend: str,
              job: str | None) -> ActionResult:
        # One id per (decision, state, reporter): a re-published result is the same event.
        eid = uuid.uuid5(_NS, f"result/{decision_id}/{state.value}/{self.source.cluster}/{self.source.node}")
        if job is not None and not NAME_RE.fullmatch(job):
            job = None  # a malformed target is not repeated into the result's source
        return ActionResult(event_id=eid, event_time=now,
                            source=Source(cluster=self.source.cluster, node=self.source.node, job=job),
                            decision_id=decision_id, state=state.value, backend=backend, detail=detail[:4000])
