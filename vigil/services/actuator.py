"""The actuator service: decisions from Kafka through an :class:`~vigil.actuators.executor.Executor`, results back.

:class:`ActuatorService` is a plain confluent-kafka consumer (like the history
sink): it reads ``<prefix>.decisions`` and, for the inventory,
``<prefix>.state.jobs`` and ``<prefix>.state.nodes``; it publishes action
results to ``<prefix>.actions``, circuit-breaker alerts to
``<prefix>.alerts``, and messages it cannot use to ``<prefix>.deadletter``
(with the reason and the raw bytes), and goes on. Offsets are committed only
after the results of a batch are delivered (at-least-once); the ledger makes
a redelivered decision a no-op that re-publishes its recorded result.

``vigil actuate`` runs it with a Slurm, Kubernetes or local backend;
``vigil agent --actuate`` runs one inside the node agent with the local
backend on the agent's own process supervisor (:class:`SupervisorControl`).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from vigil.actuators.backends import LocalBackend
from vigil.actuators.errors import ActionCancelled, ActuatorError
from vigil.actuators.executor import MAX_DECISION_AGE_S, Executor
from vigil.schemas import Decision, Envelope, encode, message_key, topic_name
from vigil.schemas.envelope import to_seconds, utcnow
from vigil.streams.config import HEARTBEAT_INTERVAL_S, SESSION_TIMEOUT_S

log = logging.getLogger(__name__)

__all__ = ["ActuatedSupervisor", "ActuatorService", "AgentActuator", "SupervisorControl"]


class SupervisorControl:
    """:class:`~vigil.actuators.backends.local.ProcessControl` on top of a :class:`~vigil.producers.agent.ProcessSupervisor`.

    Restarts back off: the n-th restart within ``backoff_reset_s`` of the
    one before waits ``backoff_s`` x 2^(n-1) seconds (at most
    ``backoff_max_s``) between stopping the ranks and launching them again.
    ``on_restart(count, why)`` is told of each (the agent publishes it as the
    job ``restarting``).
    """

    def __init__(self, supervisor: Any, job: str, grace_s: float = 10.0, backoff_s: float = 1.0,
                 backoff_max_s: float = 60.0, backoff_reset_s: float = 600.0,
                 on_restart: Callable[[int, str], Any] | None = None) -> None:
        self.supervisor = supervisor
        self.job = job
        self.grace_s = grace_s
        self.backoff_s, self.backoff_max_s, self.backoff_reset_s = backoff_s, backoff_max_s, backoff_reset_s
        self.on_restart = on_restart
        self._streak = 0
        self._last: float | None = None

    def jobs(self) -> set[str]:
        return {self.job}

    def ranks(self, job: str) -> list[int]:
        return list(self.supervisor.global_ranks) if job == self.job else []

    def restart(self, job: str, reason: str, wait_s: float = 0.0,
                prepare: Callable[[], bool] | None = None) -> None:
        if job != self.job:
            raise ValueError(f"this supervisor runs job {self.job}, not {job}")
        now = time.monotonic()
        self._streak = self._streak + 1 if self._last is not None and now - self._last < self.backoff_reset_s else 1
        self._last = now
        delay = min(self.backoff_s * 2 ** (self._streak - 1), self.backoff_max_s) if self.backoff_s > 0 else 0.0
        if self.on_restart is not None:
            self.on_restart(self._streak, f"{reason} (relaunch after {delay:g} s)")
        try:
            self.supervisor.restart(reason, grace_s=self.grace_s, wait_s=wait_s, prepare=prepare, delay_s=delay)
        except RuntimeError as exc:
            if getattr(self.supervisor, "closed", False):  # the agent is stopping: no verdict on the remedy
                raise ActionCancelled(f"the agent is stopping ({exc})") from None
            raise


class ActuatorService:
    """Consume decisions (and job/node state) into ``executor``; publish what it says.

    ``filter_jobs``: act only on decisions whose target job is one of these
    (others are skipped and committed). ``clock`` is the only clock read.
    """

    #: Counts what it publishes for /metrics (:class:`vigil.streams.metrics.PublishCounters`); None: nothing.
    metrics: Any = None

    def __init__(self, executor: Executor, kafka_conf: dict[str, Any], prefix: str, *, group_id: str,
                 filter_jobs: Iterable[str] | None = None, clock: Callable[[], datetime] = utcnow,
                 ready_file: Path | None = None, batch_size: int = 100, poll_timeout_s: float = 0.2,
                 session_timeout_s: float = SESSION_TIMEOUT_S, heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
                 max_action_s: float = 900.0, after_decision: Callable[[Decision], None] | None = None) -> None:
        from confluent_kafka import Consumer, Producer

        self.executor = executor
        self.after_decision = after_decision
        self.prefix = prefix
        self.filter_jobs = frozenset(filter_jobs) if filter_jobs else None
        self.clock = clock
        self.ready_file = ready_file
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.decisions_topic = topic_name("decision", prefix)
        self.state_topics = (topic_name("job_state", prefix), topic_name("node_state", prefix))
        self.handled = 0
        self.dead_letters = 0
        self.busy = False
        self._acting: str | None = None  # the action of the decision in hand (what its results are counted under)
        self.failure: BaseException | None = None
        self._last_tick = 0.0
        self._consumer = Consumer({
            **kafka_conf, "group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": int(session_timeout_s * 1000),
            "heartbeat.interval.ms": int(heartbeat_interval_s * 1000),
            # An action (a checkpoint-restart, a drain of many nodes) may take minutes between polls.
            "max.poll.interval.ms": int(max_action_s * 1000), "fetch.wait.max.ms": 20,
        })
        self._producer = Producer({**kafka_conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
        self._consumer.subscribe([self.decisions_topic, *self.state_topics], on_assign=self._on_assign)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if self.ready_file is not None and not self.ready_file.exists():
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.write_text(json.dumps({"pid": os.getpid(), "partitions": len(partitions)}))

    # -- publishing --------------------------------------------------------------------------------------

    def publish(self, event: Envelope) -> None:
        topic = topic_name(event.event_type, self.prefix)  # type: ignore[attr-defined]
        self._producer.produce(topic, encode(event), key=message_key(event))
        self._producer.poll(0)
        if self.metrics is not None:
            self.metrics.count([event], action=self._acting)

    def _flush(self, timeout_s: float = 30.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise RuntimeError(f"{left} result message(s) not delivered within {timeout_s:g} s; offsets not committed")

    # -- the loop ----------------------------------------------------------------------------------------

    def start_up(self) -> None:
        """Publish the final results of actions a crashed actuator left running (ledger recovery)."""
        for event in self.executor.recovered_results(self.clock()):
            self.publish(event)
        self._flush()

    def poll_once(self) -> int:
        """Handle one batch of messages, publish, commit; return messages handled."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, TopicPartition

        from vigil.schemas import decode
        from vigil.streams.kafka import dead_letter, refused_event, take

        messages = take(self._consumer, self.batch_size, self.poll_timeout_s)
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            kind, ms = msg.timestamp()
            decoded = decode(msg.value())
            for err in decoded.errors:
                self.publish(dead_letter(err, topic, partition, offset,
                                         ms / 1000.0 if kind != TIMESTAMP_NOT_AVAILABLE else None))
                self.dead_letters += 1
                log.warning("dead-lettered a message at %s/%d/%d: %s: %s", topic, partition, offset, err.reason,
                            err.detail)
                if topic == self.decisions_topic:  # someone meant an action to happen: refuse it out loud
                    for event in self.executor.undecodable(err.raw or (msg.value() or b""), f"{err.reason}: {err.detail}",
                                                           self.clock(), f"{topic}/{partition}/{offset}"):
                        self.publish(event)
            for event in decoded.events:
                if topic == self.decisions_topic:
                    if not isinstance(event, Decision):
                        self.publish(refused_event(event, f"a {event.event_type} event on the decisions topic "  # type: ignore[attr-defined]
                                                          "(only decision events belong there)", topic, partition, offset,
                                                   msg.value() if len(decoded.events) == 1 else None))
                        self.dead_letters += 1
                        continue
                    if self.filter_jobs is not None and event.target.job not in self.filter_jobs:
                        continue
                    self.busy = True
                    self._acting = event.action
                    try:
                        self.executor.handle(event, self.clock(), emit=self.publish,
                                             origin=f"{topic}/{partition}/{offset}")
                    except (sqlite3.Error, ActuatorError):
                        raise  # the ledger is unusable (or inconsistent): stop, uncommitted, and say so
                    except Exception as exc:  # a bug on one decision must not stop every later one
                        log.exception("actuator failed on decision %s", event.decision_id)
                        self.publish(refused_event(event, f"the actuator failed on this decision: "
                                                          f"{type(exc).__name__}: {exc}", topic, partition, offset))
                        self.dead_letters += 1
                    finally:
                        self.busy = False
                        self._acting = None
                    self.handled += 1
                    if self.after_decision is not None:
                        self.after_decision(event)
                else:
                    self.executor.observe(event)
            offsets[(topic, partition)] = offset + 1
        now = time.monotonic()
        if now - self._last_tick >= 1.0:  # human resets written to the ledger
            self._last_tick = now
            for event in self.executor.tick(self.clock()):
                self.publish(event)
        if messages or offsets:
            self._flush()
        if offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)
        return len(messages)

    def run(self, stop: threading.Event, until: Callable[[], bool] | None = None) -> None:
        """Poll until ``stop`` is set (or ``until()`` is true); Kafka hiccups are logged and retried."""
        from confluent_kafka import KafkaException

        try:
            self.start_up()
            while not stop.is_set() and not (until is not None and until()):
                try:
                    self.poll_once()
                except KafkaException as exc:
                    # e.g. a commit during a rebalance: results are out; the batch may be redelivered
                    # and the ledger makes it a no-op.
                    log.warning("actuator: %s; continuing", exc)
        except BaseException as exc:
            self.failure = exc
            log.exception("actuator stopped")
            raise

    def close(self) -> None:
        try:
            self._producer.flush(10)
        finally:
            self._consumer.close()


class AgentActuator:
    """``vigil agent --actuate``: the local backend on the agent's own supervisor, fed by an :class:`ActuatorService`.

    It takes the decisions for ``job`` in a consumer group of its own (every
    node's agent sees every decision for its job and acts on its own ranks)
    and carries out those a local supervisor can (retry in place, restart,
    checkpoint-restart); the others are refused with the reason, on the
    actions topic. Progress for the no-progress guard is the highest step the
    node batcher has seen for the job (and the decision's
    ``plan["progress_step"]``). When the guard gives up, or a decision asks to
    move the job (``reconfigure``, which only the scheduler can do), it gives
    up: ``on_give_up(reason)`` is called once and the thread ends (the agent
    stops the ranks and exits for the scheduler to requeue the job).
    """

    def __init__(self, supervisor: Any, *, job: str, node: str, cluster: str, kafka_conf: dict[str, Any], prefix: str,
                 ledger_path: Path, control_dir: str | os.PathLike | None = None, batcher: Any = None,
                 limits: Any = None, dry_run: bool = False, grace_s: float = 10.0, checkpoint_wait_s: float = 120.0,
                 max_age_s: float | None = MAX_DECISION_AGE_S, group_id: str | None = None, session_timeout_s: float = SESSION_TIMEOUT_S,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S, ready_file: Path | None = None,
                 on_give_up: Callable[[str], None] | None = None, backoff_s: float = 1.0,
                 backoff_max_s: float = 60.0, on_restart: Callable[[int, str], Any] | None = None,
                 keyring: Any = None) -> None:
        from vigil.actuators.inventory import Inventory
        from vigil.actuators.ledger import Ledger
        from vigil.actuators.safety import Safety, SafetyLimits
        from vigil.schemas import Source

        self.job = job
        self.control = SupervisorControl(supervisor, job, grace_s, backoff_s=backoff_s, backoff_max_s=backoff_max_s,
                                         on_restart=on_restart)
        backend = LocalBackend(self.control, control_dir, node=node, checkpoint_wait_s=checkpoint_wait_s)
        progress = getattr(batcher, "highest_step", None)
        self.ledger = Ledger(ledger_path, now=to_seconds(utcnow()))
        if keyring is None:  # the decision keys of the agent's settings (VIGIL_DECISION_KEYS, or its stack's)
            from vigil.settings import Settings

            keyring = Settings().decision_keyring()
        self.executor = Executor(backend, self.ledger, Inventory(nodes=[node], jobs=[job]),
                                 Safety(limits or SafetyLimits(), progress=progress), dry_run=dry_run,
                                 source=Source(cluster=cluster, node=node), max_age_s=max_age_s,
                                 actions=LocalBackend.supports, clock=utcnow, keyring=keyring)
        self.service = ActuatorService(self.executor, kafka_conf, prefix,
                                       group_id=group_id or f"{prefix}-agent-actuator-{node}-{job}",
                                       filter_jobs=[job], ready_file=ready_file, session_timeout_s=session_timeout_s,
                                       heartbeat_interval_s=heartbeat_interval_s, after_decision=self._after)
        self.node = node
        self._cannot: str | None = None
        self.on_give_up = on_give_up
        self.gave_up: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """True while a decision is being carried out (ranks may be down on purpose)."""
        return self.service.busy

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _after(self, decision: Decision) -> None:
        if decision.action == "reconfigure" and decision.target.job == self.job:
            self._cannot = (f"decision {decision.decision_id} asks to move job {self.job} off "
                            f"{', '.join(decision.plan.get('exclude_nodes') or []) or 'its nodes'}, which only the "
                            f"scheduler can do ({decision.reason[:200]})")

    def _run(self) -> None:
        try:
            self.service.run(self._stop, until=lambda: self.job in self.executor.safety.given_up
                             or self._cannot is not None)
        except Exception as exc:  # noqa: BLE001 - reported to the agent, which stops
            self.gave_up = f"the actuator stopped: {type(exc).__name__}: {exc}"
        else:
            reason = self.executor.safety.given_up.get(self.job)
            if reason is not None:
                self.gave_up = f"the no-progress guard gave up on job {self.job}: {reason}"
            elif self._cannot is not None:
                self.gave_up = self._cannot
        if self.gave_up is not None and self.on_give_up is not None:
            self.on_give_up(self.gave_up)

    def start(self) -> "AgentActuator":
        self._thread = threading.Thread(target=self._run, name="vigil-agent-actuator", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            self.service.close()
        finally:
            self.ledger.close()


class ActuatedSupervisor:
    """The agent's view of a supervisor under ``--actuate``: done only when every rank exited 0.

    Failed ranks wait for decisions (a restart brings them back); nothing
    counts as done while the actuator is carrying out a decision.
    """

    def __init__(self, supervisor: Any, actuator: AgentActuator) -> None:
        self._supervisor = supervisor
        self._actuator = actuator

    def __getattr__(self, name: str) -> Any:
        return getattr(self._supervisor, name)

    @property
    def done(self) -> bool:
        sup = self._supervisor
        return sup.done and sup.exit_code == 0 and not self._actuator.busy


# -- the command line ------------------------------------------------------------------------------------
