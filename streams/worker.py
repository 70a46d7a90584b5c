"""The detection worker: telemetry -> findings -> incidents -> alerts.

Two stages in one faust app. Detection agents consume the telemetry topics
(partitioned by job or node, shared by every worker of the group), run the
:class:`DetectionEngine` and publish findings to the findings topic. That
topic has one partition, so exactly one worker of the group runs the
:class:`Correlator` over all findings and publishes alerts: attribution
across jobs and nodes needs one place that sees both.

Each agent decodes raw messages itself (values are bytes), so a malformed
message becomes a dead letter with its reason and raw bytes while the agent
keeps going. Timer-driven detectors are ticked from a faust timer with the
wall clock: this is the outermost layer, the only place that reads it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from vigil.detectors import DetectorError
from vigil.schemas import TOPICS, ActionResult, Alert, Decision, DetectorFinding, Envelope, JobState, NodeState, decode, \
    encode, message_key
from vigil.streams.config import StreamConfig
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.detection import DetectionEngine, EngineParams
from vigil.streams.engine.escalation import Escalation
from vigil.streams.engine.planning import replan
from vigil.streams.faustapp import VigilApp, create_app
from vigil.streams.engine.incidents import Correlator
from vigil.streams.kafka import dead_letter, refused_event
from vigil.streams.plugins import load_plugins
from vigil.streams.recovery import read_before_committed, read_recent

log = logging.getLogger(__name__)

#: Telemetry the detection stage reads.
TELEMETRY = ("heartbeat", "node_samples", "iteration", "iteration_step", "collective", "xid", "nic_counters",
             "gpu_telemetry", "process_exit", "training_exception")


def build_worker_app(config: StreamConfig, ready_file: Path | None = None,
                     params: EngineParams | None = None) -> VigilApp:
    app = create_app(config)
    plugins = load_plugins()
    engine = DetectionEngine(params or EngineParams(hang_k=config.hang_k, hang_min_timeout_s=config.hang_min_timeout_s,
                                                    heartbeat_missed_intervals=config.heartbeat_missed_intervals,
                                                    plugins=tuple(plugins.values())))
    correlator = Correlator()
    decider = DecisionEngine(Escalation(config.escalation_window_s, config.max_restarts),
                             recovered=correlator.recovered, replan=replan) if config.decide else None
    app.detection_engine = engine  # type: ignore[attr-defined]
    app.correlator = correlator  # type: ignore[attr-defined]
    app.decision_engine = decider  # type: ignore[attr-defined]

    def raw_topic(event_type: str) -> Any:
        return app.topic(config.topic(event_type), value_type=bytes, key_type=bytes,
                         value_serializer="raw", key_serializer="raw")

    alerts_topic = raw_topic("alert")
    decisions_topic = raw_topic("decision")
    findings_topic = raw_topic("finding")
    dlq_topic = raw_topic("dead_letter")
    owns_correlation = {"yes": False}
    # Cleared while a takeover rebuilds state: agents wait, so nothing newer is
    # processed (or published) before the replay of what came before.
    recovered = asyncio.Event()
    recovered.set()

    async def send_dead_letter(dl: Envelope, why: Any) -> None:
        await dlq_topic.send(key=dl.source_topic.encode(), value=encode(dl))  # type: ignore[attr-defined]
        log.warning("dead letter %s/%s/%s: %s", dl.source_topic, dl.source_partition, dl.source_offset, why)  # type: ignore[attr-defined]

    async def publish_findings(findings: list[DetectorFinding]) -> None:
        for f in findings:
            await findings_topic.send(key=message_key(f), value=encode(f))

    # Alert ids already on the topic (learned on takeover): never published twice.
    published: set[Any] = set()

    async def publish_alerts(alerts: list[Alert]) -> None:
        for alert in alerts:
            if alert.event_id in published:
                continue
            await alerts_topic.send(key=message_key(alert), value=encode(alert))
            log.info("alert %s v%d %s sev%d %s", alert.status, alert.incident_version, alert.kind,
                     alert.severity, alert.subject.model_dump(exclude_none=True))
            if decider is not None:
                await publish_decided(decider.on_alert(alert, time.time()))

    async def publish_decided(out: list[Envelope]) -> None:
        """The decision engine's output: decisions, and alerts calling a human or resolving."""
        for ev in out:
            if isinstance(ev, Decision):
                if ev.event_id in published:
                    continue
                published.add(ev.event_id)
                await decisions_topic.send(key=message_key(ev), value=encode(ev))
                log.info("decision %s for %s: %s", ev.action, ev.target.model_dump(exclude_none=True), ev.reason)
            elif isinstance(ev, Alert):
                await publish_alerts([ev])

    # Which subjects each partition carried, to forget them when it moves away.
    subjects_of: dict[tuple[str, int], tuple[set[str], set[str]]] = {}
    key_of_topic = {config.topic(t): TOPICS[t].key for t in TELEMETRY}
    async def decoded(stream: Any) -> Any:
        """Each message decoded, its bad parts dead-lettered; after any takeover replay."""
        async for event in stream.events():
            await recovered.wait()
            msg = event.message
            result = decode(event.value)
            for err in result.errors:
                await send_dead_letter(dead_letter(err, msg.topic, msg.partition, msg.offset, msg.timestamp), err)
            yield event, msg, result

    async def detect(stream: Any) -> None:
        async for event, msg, message in decoded(stream):
            nodes, jobs = subjects_of.setdefault((msg.topic, msg.partition), (set(), set()))
            if message.events:
                key = key_of_topic.get(msg.topic)
                if key in ("job", "node"):
                    known = jobs if key == "job" else nodes
                    known.update(s for s in {getattr(ev.source, key) for ev in message.events} if s)
            now = time.time()
            for ev in message.events:
                if engine.future(ev, now):
                    await send_dead_letter(refused_event(
                        ev, f"event_time {ev.event_time.isoformat()} is more than {engine.params.max_future_s:.0f} s "
                            "ahead of the worker's clock (check the node's clock)",
                        msg.topic, msg.partition, msg.offset,
                        raw=event.value if len(message.events) == 1 else None), "event from the future")
            try:
                findings = engine.on_events(message.events, now)
            except DetectorError:
                findings = []
                # One event a detector cannot use: find it, keep it, go on with the rest.
                for ev in message.events:
                    try:
                        findings += engine.on_events([ev], time.time())
                    except DetectorError as exc:
                        await send_dead_letter(refused_event(ev, f"detector refused it: {exc}", msg.topic,
                                                             msg.partition, msg.offset), exc)
            await publish_findings(findings)

    for event_type in TELEMETRY:
        app.agent(raw_topic(event_type), name=f"detect-{event_type}")(detect)

    @app.agent(findings_topic, name="correlate")
    async def correlate(stream: Any) -> None:
        async for _event, _msg, findings in decoded(stream):
            now = time.time()
            for f in findings.events:
                if isinstance(f, DetectorFinding):
                    await publish_alerts(correlator.on_finding(f, now))

    owned: set[tuple[str, int]] = set()
    # False from a revocation until the new assignment is recovered: the worker is not
    # consuming, so the silence of its subjects in that time is its own.
    consuming = {"yes": False}

    @app.on_partitions_revoked.connect
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        consuming["yes"] = False

    @app.on_partitions_assigned.connect
    async def on_assigned(app: Any, assigned: Any, **kwargs: Any) -> None:
        # An eager rebalance revokes every partition and hands most of them straight
        # back: forget only the subjects whose partitions went to another worker.
        kept = {(tp.topic, tp.partition) for tp in assigned}
        for key in [k for k in subjects_of if k not in kept]:
            nodes, jobs = subjects_of.pop(key)
            engine.forget(nodes=nodes, jobs=jobs)
        findings_tp = (config.topic("finding"), 0)
        owns_correlation["yes"] = findings_tp in kept
        telemetry = {config.topic(t) for t in TELEMETRY}
        new = {k for k in kept if k not in owned and (k[0] in telemetry or k == findings_tp)}
        owned.clear()
        owned.update(kept)
        if new and config.recovery_window_s > 0:
            recovered.clear()
            try:
                await _recover(sorted(new), findings_tp in new)
            finally:
                recovered.set()
        engine.resumed(time.time())  # silences count from here, not from before the rebalance
        consuming["yes"] = True

    async def _recover(partitions: list[tuple[str, int]], correlation: bool) -> None:
        """Rebuild detector and incident state from what the previous owner had processed."""
        loop = asyncio.get_running_loop()
        now = time.time()
        conf = config.kafka_conf()
        records = await loop.run_in_executor(None, lambda: read_before_committed(
            conf, config.group_id, partitions, config.recovery_window_s, now))
        findings_topic_name = config.topic("finding")
        replayed_findings = 0
        for rec in records:
            decoded = decode(rec.value)
            if rec.topic == findings_topic_name:
                for f in decoded.events:
                    if isinstance(f, DetectorFinding):
                        # alerts and decisions were published then; the replay rebuilds state only
                        for alert in correlator.on_finding(f, rec.timestamp or now):
                            if decider is not None:
                                decider.on_alert(alert, rec.timestamp or now)
                        replayed_findings += 1
                continue
            nodes, jobs = subjects_of.setdefault((rec.topic, rec.partition), (set(), set()))
            for ev in decoded.events:
                key = TOPICS[ev.event_type].key  # type: ignore[attr-defined]
                (jobs if key == "job" else nodes).add(getattr(ev.source, key) or "")
            try:
                engine.on_events(decoded.events, now)  # findings were published then
            except DetectorError:
                pass
        if correlation:
            for topic in ("alert", "decision"):
                recent = await loop.run_in_executor(None, lambda: read_recent(
                    conf, config.topic(topic), config.recovery_window_s, now))
                for rec in recent:
                    published.update(a.event_id for a in decode(rec.value).events)
        log.info("recovered state from %d records (%d findings) of %d partition(s)", len(records),
                 replayed_findings, len(partitions))

    @app.task
    async def announce() -> None:
        # Logged once the worker's logging is set up (plugins load before that).
        for name, cls in plugins.items():
            log.info("loaded detector plugin %s (%s.%s)", name, cls.__module__, cls.__qualname__)

    ready = {"written": False}
    feedback = _Feedback(config, started_at=time.time()) if decider is not None else None
    pulse = _BrokerPulse(config)

    @app.task
    async def start_pulse() -> None:
        pulse.start()

    @app.timer(interval=config.tick_interval_s)
    async def tick() -> None:
        if not recovered.is_set():
            return
        now = time.time()
        if pulse.last_ok is not None and consuming["yes"]:
            # reachable and consuming (a rebalance hears nothing for seconds)
            engine.heard(pulse.last_ok)
        await publish_findings(engine.tick(now))
        if owns_correlation["yes"]:
            await publish_alerts(correlator.tick(now))
            if decider is not None and feedback is not None:
                for ev, live in feedback.poll():
                    if isinstance(ev, ActionResult):
                        out = decider.on_action_result(ev, now)
                    elif isinstance(ev, (JobState, NodeState)):
                        out = decider.on_state(ev, now)
                    else:
                        continue
                    if live:
                        await publish_decided(out)
                await publish_decided(decider.tick(now))
        if ready_file is not None and not ready["written"] and app.consumer.assignment():
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.write_text(str(sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())))
            ready["written"] = True

    return app


class _BrokerPulse:
    """When the worker last reached the broker, from a metadata request every ``interval_s``.

    Detection must tell "these nodes went silent" from "I cannot hear anyone":
    during a broker outage every silence detector would fire at once.
    """

    def __init__(self, config: StreamConfig, interval_s: float = 0.5) -> None:
        self.config = config
        self.interval_s = interval_s
        self.last_ok: float | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="vigil-broker-pulse", daemon=True).start()

    def _run(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config.kafka_conf(**{"log_level": 0}))
        while True:  # a daemon thread: it ends with the worker
            asked = time.time()
            try:
                admin.list_topics(topic=self.config.topic("heartbeat"), timeout=max(self.interval_s, 1.0))
                self.last_ok = asked
            except KafkaException:
                pass
            time.sleep(self.interval_s)  # a period, not a condition to await


class _Feedback:
    """What the decision engine hears back: action results and job/node state, read without a group.

    Every worker of the group would otherwise split these partitions, while
    the one decision engine (next to the correlator) needs them all. What was
    written before the worker started only rebuilds state (``live`` False).
    """

    def __init__(self, config: StreamConfig, started_at: float) -> None:
        self.config = config
        self.started_at = started_at
        self._consumer: Any = None

    def poll(self, max_messages: int = 500) -> list[tuple[Envelope, bool]]:
        from vigil.streams.kafka import reader

        if self._consumer is None:
            self._consumer = reader(self.config.kafka_conf(),
                                    [self.config.topic(t) for t in ("action_result", "job_state", "node_state")])
        out = []
        for msg in self._consumer.consume(max_messages, timeout=0):
            if msg.error() is not None or msg.value() is None:
                continue
            _kind, stamp = msg.timestamp()
            live = stamp <= 0 or stamp / 1000.0 >= self.started_at - 1.0
            out.extend((ev, live) for ev in decode(msg.value()).events)
        return out


def run_worker(config: StreamConfig, ready_file: Path | None = None, loglevel: str = "WARNING") -> None:
    """Run a detection worker until SIGINT/SIGTERM."""
    import faust

    app = build_worker_app(config, ready_file)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
