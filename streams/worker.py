"""The detection worker: telemetry -> findings -> incidents -> alerts -> decisions.

One process of the detection group; three small agents
(:mod:`vigil.streams.stages`) hold the state, this module moves the bytes:
``detect`` (telemetry -> findings, on every worker, for the partitions it
owns), ``correlate`` (findings -> alerts) and ``decide`` (alerts -> decisions,
fed back action results and job/node states), the last two joined by an
:class:`~vigil.streams.stages.AlertFlow` that publishes each alert and decision
once, on the one worker that owns the findings partition. Three Kafka
clients, one per concern, all librdkafka (confluent-kafka):

* **the group consumer** reads the telemetry topics (partitioned by job or by
  node and shared by the group) and the findings topic (one partition, so
  exactly one worker of the group correlates and decides: attribution across
  jobs and nodes needs one place that sees both). It is also the one
  recovery path: a partition this worker takes over is first read from
  ``recovery_window_s`` before the group's committed offset up to it, in
  *replay* (state is rebuilt, nothing is published: the previous owner
  published it), then live;
* **the broadcast reader** (no group: every worker reads all of it) follows
  the action results and job/node states the decisions feed on, and the
  alerts and decisions already published (so a new correlator never
  publishes one twice), from the recovery window's start;
* **the producer** publishes findings, alerts, decisions and dead letters.

Offsets are committed after what a message produced is delivered
(at-least-once); every consumer downstream is idempotent by event id. The
wall clock is read here and nowhere below.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, Consumer, KafkaError, KafkaException, Producer, \
    TopicPartition

from vigil.schemas import (
    Alert, Decision, DetectorFinding, Envelope, JobState, NodeState, decode, encode, message_key, topic_accepts,
)
from vigil.streams.config import StreamConfig
from vigil.streams.engine.detection import EngineParams
from vigil.streams.plugins import load_plugins
from vigil.streams.kafka import rewind_shrunk, take
from vigil.streams.recovery import window_starts
from vigil.streams.stages import Place, build_stages

log = logging.getLogger(__name__)

__all__ = ["TELEMETRY", "FEEDBACK", "Worker", "WorkerStats", "run_worker"]

#: Telemetry the detection stage reads.
TELEMETRY = ("heartbeat", "node_samples", "iteration", "iteration_step", "collective", "checkpoint", "xid",
             "nic_counters", "gpu_telemetry", "process_exit", "training_exception", "flight_recorder_dump")
#: What the broadcast reader follows.
FEEDBACK = ("action_result", "job_state", "node_state", "alert", "decision")
#: Rare events that are a failure in themselves: handled before the telemetry read with them.
URGENT = ("training_exception", "process_exit", "xid", "flight_recorder_dump")
#: Messages taken from the consumer at a time: a batch is processed before the next timer tick, and
#: an urgent message waits at most for the batch before its own.
BATCH = 200


class WorkerStats:
    """What a worker carries and how late it reads it, for a benchmark or a metrics endpoint.

    ``lag_ms`` counts the telemetry messages by how long after they were
    produced (their CreateTime) the worker began to process them, in
    milliseconds: the consumer lag in time, fetch wait and broker included;
    exact below a second, above it in buckets of 1 % named by their lower
    edge (a backlog's minutes of lag would otherwise make one key per ms).
    ``busy_s`` is the time spent processing what ``consume`` returned (the
    rest of the loop waits for data or ticks timers).
    """

    def __init__(self) -> None:
        self.messages = 0
        self.records = 0
        self.lag_ms: dict[int, int] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.busy_s = 0.0
        self.ticks_s = 0.0
        self.last_lag_ms: int | None = None

    def processed(self, created_ms: int, now: float, records: int) -> None:
        self.messages += 1
        self.records += records
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        if created_ms > 0:
            lag = max(0, int(now * 1000.0) - created_ms)
            if lag >= 1000:
                step = 10 ** (len(str(lag)) - 3)
                lag -= lag % step
            self.lag_ms[lag] = self.lag_ms.get(lag, 0) + 1
            self.last_lag_ms = lag

    def snapshot(self) -> dict[str, Any]:
        return {"messages": self.messages, "records": self.records, "first_at": self.first_at,
                "last_at": self.last_at, "busy_s": round(self.busy_s, 6), "ticks_s": round(self.ticks_s, 6),
                "lag_ms": dict(self.lag_ms)}


class BrokerPulse:
    """When the worker last reached the broker, from a metadata request every ``interval_s``.

    Detection must tell "these nodes went silent" from "I cannot hear anyone":
    during a broker outage every silence detector would fire at once.
    """

    def __init__(self, client: Any, topic: str, interval_s: float = 0.25, clock: Callable[[], float] = time.time) -> None:
        self.client, self.topic, self.interval_s, self.clock = client, topic, interval_s, clock
        self.last_ok: float | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="vigil-broker-pulse", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        reachable = True
        while not self._stop.is_set():
            asked = self.clock()
            try:
                self.client.list_topics(topic=self.topic, timeout=max(self.interval_s, 1.0))
                self.last_ok = asked
                if not reachable:
                    log.warning("the broker answers again")
                reachable = True
            except KafkaException as exc:
                if reachable:
                    log.warning("lost the broker (%s): silences are the worker's own until it answers", exc)
                reachable = False
            self._stop.wait(self.interval_s)  # a period, not a condition to await


def _rewind_shrunk(consumer: Consumer) -> list[TopicPartition]:
    rewound = rewind_shrunk(consumer)
    for tp in rewound:
        log.warning("%s[%d] restarted empty (the broker lost its log): read again from its start", tp.topic, tp.partition)
    return rewound


class BroadcastReader:
    """Action results, job/node states, published alerts and decisions: all partitions, no group."""

    def __init__(self, config: StreamConfig, started_at: float) -> None:
        self.started_at = started_at
        # earliest: a log that restarted empty (an in-memory dev broker) is read from its start again
        self._consumer = Consumer({**config.kafka_conf(), "group.id": f"{config.group_id}-broadcast",
                                   "enable.auto.commit": False, "enable.partition.eof": True,
                                   "auto.offset.reset": "earliest",
                                   "fetch.wait.max.ms": config.fetch_max_wait_ms, "log_level": 3})
        names = [config.topic(t) for t in FEEDBACK]
        meta = self._consumer.list_topics(timeout=30)
        tps = [TopicPartition(n, p) for n in names if n in meta.topics and meta.topics[n].error is None
               for p in meta.topics[n].partitions]
        # Job and node states from the start (a job's spec may be days old), the rest from the window.
        states = {config.topic("job_state"), config.topic("node_state")}
        starts = window_starts(self._consumer, [tp for tp in tps if tp.topic not in states],
                               started_at - config.recovery_window_s, 30.0)
        starts.update({(tp.topic, tp.partition): OFFSET_BEGINNING for tp in tps if tp.topic in states})
        self._consumer.assign([TopicPartition(tp.topic, tp.partition, starts[(tp.topic, tp.partition)])
                               for tp in tps])
        published = {config.topic("alert"), config.topic("decision")}
        #: partitions of the alert and decision topics not yet read to their end (as of the start)
        self._behind = {(tp.topic, tp.partition) for tp in tps if tp.topic in published
                        and starts[(tp.topic, tp.partition)] != OFFSET_END}

    @property
    def caught_up(self) -> bool:
        """Every alert and decision published before the worker started has been read."""
        return not self._behind

    def poll(self, max_messages: int = 500) -> list[tuple[Envelope, bool]]:
        """``(event, live)`` pairs; ``live`` when written after the worker started (else: state only)."""
        out: list[tuple[Envelope, bool]] = []
        _rewind_shrunk(self._consumer)
        for msg in self._consumer.consume(max_messages, timeout=0):
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    self._behind.discard((msg.topic(), msg.partition()))
                continue
            if msg.value() is None:
                continue
            _kind, stamp = msg.timestamp()
            live = stamp <= 0 or stamp / 1000.0 >= self.started_at - 1.0
            out.extend((ev, live) for ev in decode(msg.value(), accept=topic_accepts(msg.topic())).events)
        return out

    def close(self) -> None:
        self._consumer.close()


class Worker:
    """One detection worker: a loop over one group consumer, the stages, a producer (see the module docstring)."""

    #: Counts what it publishes for /metrics (:class:`vigil.streams.metrics.PublishCounters`); None: nothing.
    metrics: Any = None

    def __init__(self, config: StreamConfig, params: EngineParams | None = None, ready_file: Path | None = None,
                 clock: Callable[[], float] = time.time, stats: WorkerStats | None = None,
                 gc_freeze_s: float | None = 60.0, sign: Callable[[Decision], Decision] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.stats = stats
        #: How often what survived so far is moved out of the garbage collector's sight (``gc.freeze``):
        #: a full collection walks every live object, half a million at 25,000 GPUs, which stopped the
        #: worker for 100-200 ms; the state is long-lived and acyclic, so little is lost by not walking it.
        self.gc_freeze_s = gc_freeze_s
        #: Signs each decision before it is published (:class:`vigil.schemas.signing.Keyring.sign`); None: unsigned.
        self.sign = sign
        self.ready_file = ready_file
        self.plugins = load_plugins()
        params = params or config.engine
        if self.plugins:
            params = EngineParams(**{**params.__dict__, "plugins": tuple(self.plugins.values())})
        self.detect, self.flow = build_stages(config, params, TELEMETRY)
        self.correlate, self.decide = self.flow.correlate, self.flow.decide
        self.findings_topic = config.topic("finding")
        self.findings_tp = (self.findings_topic, 0)
        self._urgent = frozenset([config.topic(t) for t in URGENT] + [self.findings_topic])
        self._producer = Producer({**config.kafka_conf(), "linger.ms": 1, "acks": "all", "log_level": 3})
        self._consumer = Consumer({
            **config.kafka_conf(), "group.id": config.group_id, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": int(config.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(config.heartbeat_interval_s * 1000),
            "fetch.wait.max.ms": config.fetch_max_wait_ms, "log_level": 3})
        self._pulse = BrokerPulse(self._producer, config.topic("heartbeat"), clock=clock)
        self._broadcast: BroadcastReader | None = None
        self._heard_back: list[tuple[Envelope, bool]] = []
        self.owned: set[tuple[str, int]] = set()
        self._replay_until: dict[tuple[str, int], int] = {}
        self._replayed = 0
        self._processed: dict[tuple[str, int], int] = {}
        self.consuming = False
        self.owns_correlation = False

    # -- the group's partitions -------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        now = self.clock()
        kept = {(tp.topic, tp.partition) for tp in partitions}
        self.detect.keep_only(kept)
        new = [tp for tp in partitions if (tp.topic, tp.partition) not in self.owned]
        self._replay_until = {}
        starts: dict[tuple[str, int], int] = {}
        if new and self.config.recovery_window_s > 0:
            committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(new, timeout=30)}
            todo = [tp for tp in new if committed.get((tp.topic, tp.partition), -1) > 0]
            starts = window_starts(consumer, todo, now - self.config.recovery_window_s, 30.0) if todo else {}
            for tp in todo:
                key = (tp.topic, tp.partition)
                start, end = starts[key], committed[key]
                if start != OFFSET_END and 0 <= start < end:
                    self._replay_until[key] = end
        for tp in partitions:
            key = (tp.topic, tp.partition)
            tp.offset = starts[key] if key in self._replay_until else OFFSET_STORED
        consumer.assign(partitions)
        self.owned = kept
        self.owns_correlation = self.findings_tp in kept
        if not self._replay_until:
            self._resumed(now)
        log.info("joined the group: assigned %d partition(s), replaying %d", len(partitions), len(self._replay_until))
        if self.ready_file is not None and partitions and not self.ready_file.exists():
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.write_text(str(sorted(f"{t}:{p}" for t, p in kept)))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.consuming = False  # its subjects' silence from now on is the worker's own
        self._commit(sync=True)
        self.owned -= set(self._replay_until)  # a replay cut short starts again if they come back

    def _resumed(self, now: float) -> None:
        self.detect.engine.resumed(now)  # silences count from here, not from before the rebalance
        self.consuming = True

    # -- messages ------------------------------------------------------------------------------------------
    def _on_message(self, msg: Any, now: float) -> int:
        """Process one message; return how many telemetry records it held."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        key = (topic, partition)
        until = self._replay_until.get(key)
        replay = until is not None and offset < until
        kind, stamp = msg.timestamp()
        place = Place(topic, partition, offset, stamp / 1000.0 if stamp > 0 else None)
        records = 0
        if topic == self.findings_topic:
            found = [f for f in decode(msg.value()).events if isinstance(f, DetectorFinding)]
            # a replayed finding is judged at the time it was written (holds, escalation windows)
            self._publish(self.flow.on_findings(found, place.timestamp or now if replay else now, replay=replay))
        else:
            out = self.detect.on_message(place, msg.value(), now, replay=replay)
            records = out.records
            self._publish(out.dead_letters)
            if not replay:
                self._found(out.findings, now)
        if not replay:  # a replayed offset is behind the committed one: never committed again
            self._processed[key] = offset + 1
        else:
            self._replayed += 1
        if until is not None and offset + 1 >= until:
            del self._replay_until[key]
            if not self._replay_until:
                log.info("recovered state from %d records of the log; live from here", self._replayed)
                self._replayed = 0
                self._resumed(now)
        return records

    def _found(self, findings: list[DetectorFinding], now: float) -> None:
        """Findings go to their topic; the correlating worker also takes its own at once (they come
        back from the topic later and are recognised by id)."""
        self._publish(findings)
        if self.owns_correlation and self.findings_tp not in self._replay_until and findings:
            self._publish(self.flow.on_findings(findings, now))

    def _publish(self, events: list[Envelope]) -> None:
        for ev in events:
            etype = ev.event_type  # type: ignore[attr-defined]
            if etype == "decision" and self.sign is not None:
                ev = self.sign(ev)  # type: ignore[arg-type]  # actuators act only on signed decisions
            topic = self.config.topic(etype)
            key = ev.source_topic.encode() if etype == "dead_letter" else message_key(ev)  # type: ignore[attr-defined]
            self._producer.produce(topic, encode(ev), key=key)
            if etype in ("alert", "decision"):
                self._log(ev)
        if events:
            self._producer.poll(0)
            if self.metrics is not None:
                self.metrics.count(events)

    @staticmethod
    def _log(ev: Envelope) -> None:
        if isinstance(ev, Alert):
            log.info("alert %s v%d %s sev%d %s", ev.status, ev.incident_version, ev.kind, ev.severity,
                     ev.subject.model_dump(exclude_none=True))
        elif isinstance(ev, Decision):
            log.info("decision %s for %s: %s", ev.action, ev.target.model_dump(exclude_none=True), ev.reason)

    # -- timers and commits ------------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        if self._replay_until:
            return  # rebuilding: timers would judge silence from half a picture
        if self._pulse.last_ok is not None and self.consuming:
            self.detect.engine.heard(self._pulse.last_ok)  # reachable and consuming
        polled = self._broadcast.poll() if self._broadcast is not None else []
        # every worker takes the job and node states (its jobs and nodes may be among them), before the
        # timers: a job that ended or a node that left since the last tick is not judged silent
        self._found(self.detect.tick(now, [ev for ev, _ in polled if isinstance(ev, (JobState, NodeState))]), now)
        if self._broadcast is None:
            return
        for ev, live in polled:
            if isinstance(ev, (Alert, Decision)):
                self.flow.learn_published([ev])
            else:
                self._heard_back.append((ev, live))
        if self.owns_correlation and not self._broadcast.caught_up:
            return  # what was published before it started must be known before it publishes
        for ev, live in self._heard_back:  # only the correlating worker acts on it; the others keep the state
            self._publish(self.flow.on_feedback(ev, now, live and self.owns_correlation))
        self._heard_back = []
        if self.owns_correlation:
            self._publish(self.flow.tick(now))

    def _commit(self, sync: bool = False) -> None:
        if not self._processed:
            return
        left = self._producer.flush(30.0)
        if left:
            log.warning("%d message(s) not delivered; offsets not committed", left)
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._processed.items() if (t, p) in self.owned]
        self._processed = {}
        if offsets:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=not sync)
            except KafkaException as exc:  # e.g. during a rebalance: the batch may be redelivered
                log.warning("commit failed: %s", exc)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set."""
        topics = [self.config.topic(t) for t in TELEMETRY] + [self.findings_topic]
        self._broadcast = BroadcastReader(self.config, self.clock())
        for name, cls in self.plugins.items():
            log.info("loaded detector plugin %s (%s.%s)", name, cls.__module__, cls.__qualname__)
        self._consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._pulse.start()
        interval = self.config.tick_interval_s
        next_tick = self.clock() + interval
        last_commit = self.clock()
        next_freeze = self.clock() + min(10.0, self.gc_freeze_s or 0.0)  # once the state is built, then periodically
        try:
            while not stop.is_set():
                wait = min(interval, max(0.0, next_tick - self.clock()))
                messages = take(self._consumer, BATCH, wait)
                began = self.clock()
                stats = self.stats
                if len(messages) > 1:  # failures first (a stable sort: each partition keeps its order)
                    urgent = self._urgent
                    messages.sort(key=lambda m: m.topic() not in urgent)
                for msg in messages:
                    if msg.error() is not None:
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", msg.error())
                        continue
                    now = self.clock()  # each message's own arrival: a batch can take a while
                    records = self._on_message(msg, now)
                    if stats is not None:
                        stats.processed(msg.timestamp()[1], now, records)
                now = self.clock()
                if stats is not None and messages:
                    stats.busy_s += now - began
                if now >= next_tick:
                    for tp in _rewind_shrunk(self._consumer):
                        self._processed.pop((tp.topic, tp.partition), None)
                    self._tick(now)
                    next_tick = now + interval
                    if stats is not None:
                        stats.ticks_s += self.clock() - now
                self._producer.poll(0)
                if now - last_commit >= self.config.commit_interval_s:
                    self._commit()
                    last_commit = now
                if self.gc_freeze_s and now >= next_freeze:
                    gc.collect(1)  # the young garbage first: only survivors are frozen
                    gc.freeze()
                    next_freeze = now + self.gc_freeze_s
        finally:
            self._pulse.stop()
            self._commit(sync=True)
            self._consumer.close()
            self._broadcast.close()
            self._producer.flush(10.0)


def run_worker(config: StreamConfig, ready_file: Path | None = None, loglevel: str = "WARNING",
               sign: Callable[[Decision], Decision] | None = None, metrics: Any = None) -> None:
    """Run a detection worker until SIGINT/SIGTERM; ``sign`` signs the decisions it publishes; ``metrics``
    (a :class:`vigil.streams.metrics.WorkerMetrics`, already serving) watches it."""
    import signal

    logging.basicConfig(level=getattr(logging, loglevel.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if sign is None and config.decide:
        log.warning("no decision signing key (VIGIL_DECISION_KEYS): decisions are published unsigned, "
                    "and actuators refuse them")
    if metrics is not None:
        config = metrics.instrument(config)  # its detectors timed (a sample of them)
    worker = Worker(config, ready_file=ready_file, sign=sign)
    if metrics is not None:
        metrics.watch(worker, stop)
    worker.run(stop)
