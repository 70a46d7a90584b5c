"""The worker's stages, each with its state in the open: detect, correlate and decide.

A stage takes what the worker read (raw messages with their place in the
log, or decoded events) and returns what should be published; it reads no
clock and touches no Kafka, so the worker's loop (:mod:`vigil.streams.worker`)
is the only place that does I/O.

* :class:`DetectStage` — telemetry messages to findings (and dead letters),
  through the :class:`~vigil.streams.engine.detection.DetectionEngine`; it
  remembers which subjects each partition carried, to forget them when the
  partition moves to another worker.
* :class:`CorrelateStage` — findings to alerts, one incident per root cause
  (the :class:`~vigil.streams.engine.incidents.Correlator`), job ends that
  resolve their incidents, and the runs left to be continued (the
  :class:`~vigil.detectors.chain.RunChain`).
* :class:`DecideStage` — alerts to decisions (the
  :class:`~vigil.streams.engine.decisions.DecisionEngine`), with the action
  results and job/node states that feed the decisions back.
* :class:`AlertFlow` — the two in a row: each alert is decided on as it is
  made, and no alert or decision id is published twice (those already on
  the topics, learned on takeover, and those published here).

In *replay* (a takeover rebuilding state from the log) the stages update
their state and publish nothing: the previous owner published it then.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Sequence

from vigil.detectors import DetectorError
from vigil.detectors.chain import RunChain
from vigil.schemas import (
    JOB_ENDED, TOPICS, ActionResult, Alert, Decision, DeadLetter, DetectorFinding, Envelope, JobState,
    NodeState, Subject, decode, to_seconds, topic_accepts,
)
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.detection import DetectionEngine, detector_finding
from vigil.streams.engine.incidents import Correlator
from vigil.streams.kafka import dead_letter, refused_event

log = logging.getLogger(__name__)

__all__ = ["AlertFlow", "CorrelateStage", "DecideStage", "DetectStage", "Place", "build_stages"]


#: The event types whose records are columns: one record per rank of a step, one per GPU of a node's samples.
_STEP = "iteration_step"
_GPU_SAMPLES = "gpu_samples"
#: An event's job or node name.
_SUBJECT_OF = {"job": attrgetter("source.job"), "node": attrgetter("source.node")}


@dataclass(frozen=True)
class Place:
    """Where a message sits in the log."""

    topic: str
    partition: int
    offset: int
    timestamp: float | None = None


@dataclass
class Detected:
    findings: list[DetectorFinding] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: telemetry records the message held (a columnar step counts one per rank, columnar GPU samples one per GPU)
    records: int = 0


class DetectStage:
    """Telemetry in, findings out (see the module docstring)."""

    def __init__(self, engine: DetectionEngine, key_of_topic: dict[str, str]) -> None:
        self.engine = engine
        self.key_of_topic = key_of_topic  # topic name -> "job" | "node"
        #: (topic, partition) -> (nodes, jobs) it carried
        self.subjects_of: dict[tuple[str, int], tuple[set[str], set[str]]] = {}
        #: topic -> events decoded from it (read by the worker's /metrics when scraped)
        self.events_in: dict[str, int] = {}

    def on_message(self, place: Place, value: bytes | None, now: float, replay: bool = False) -> Detected:
        out = Detected()
        accepts = topic_accepts(place.topic)
        message = decode(value, accept=accepts)  # a topic holds only its own event types
        self.events_in[place.topic] = self.events_in.get(place.topic, 0) + len(message.events)
        if not replay:
            out.dead_letters += [dead_letter(err, place.topic, place.partition, place.offset, place.timestamp)
                                 for err in message.errors]
        events = message.events
        if not events:
            if place.timestamp is not None:  # still news of how far behind this feed is read
                self.engine.on_events([], now, replay=replay, written=place.timestamp,
                                      feed=(place.topic, place.partition))
            return out
        # a columnar step counts one record per rank, a node's GPU samples in columns one per GPU (records/s
        # stays comparable with per-rank and per-GPU events); a topic holds only its own types (decode refused
        # the rest), so only the topics that may carry columns are looked into
        if _STEP in accepts:
            out.records = sum(len(ev.ranks) for ev in events)  # type: ignore[attr-defined]
        elif _GPU_SAMPLES in accepts:
            out.records = sum(len(ev.gpus) if ev.event_type == _GPU_SAMPLES else 1 for ev in events)  # type: ignore[attr-defined]
        else:
            out.records = len(events)
        self._remember(place, events)
        future: list[Envelope] = []
        try:
            out.findings = self.engine.on_events(events, now, replay=replay, written=place.timestamp,
                                                 feed=(place.topic, place.partition))
            future = self.engine.refused_future
        except Exception:  # noqa: BLE001 - see below
            # One event a detector cannot use: find it, keep it, go on with the rest. Any exception, not
            # only DetectorError: a detector's bug on one odd event must not crash the worker into a loop
            # of re-reading that message while the whole cluster goes unwatched.
            for ev in events:
                try:
                    out.findings += self.engine.on_events([ev], now, replay=replay)
                except DetectorError as exc:
                    if not replay:
                        out.dead_letters.append(refused_event(ev, f"detector refused it: {exc}", place.topic,
                                                              place.partition, place.offset))
                except Exception as exc:  # noqa: BLE001
                    log.exception("a detector failed on %s %s (offset %s of %s[%s]); the event is dead-lettered",
                                  ev.event_type, ev.event_id, place.offset, place.topic, place.partition)
                    if not replay:
                        out.dead_letters.append(refused_event(
                            ev, f"detector failed on it: {type(exc).__name__}: {exc}"[:500], place.topic,
                            place.partition, place.offset))
                else:
                    future += self.engine.refused_future
        if not replay:
            for ev in future:
                out.dead_letters.append(refused_event(
                    ev, f"event_time {ev.event_time.isoformat()} is more than "
                        f"{self.engine.params.max_future_s:.0f} s ahead of the worker's clock (check the node's clock)",
                    place.topic, place.partition, place.offset, raw=value if len(events) == 1 else None))
        return out

    def _remember(self, place: Place, events: list[Envelope]) -> None:
        per = self.key_of_topic.get(place.topic)
        if per not in ("job", "node"):
            return
        carried = self.subjects_of.get((place.topic, place.partition))
        if carried is None:
            carried = self.subjects_of[(place.topic, place.partition)] = (set(), set())
        names = set(map(_SUBJECT_OF[per], events))  # a message's events mostly share one subject: a set in C
        names.discard(None)
        names.discard("")
        (carried[1] if per == "job" else carried[0]).update(names)

    def on_lifecycle(self, event: Envelope, now: float) -> list[DetectorFinding]:
        """A job or node state (read by every worker: the subject may be on any of them)."""
        if isinstance(event, (JobState, NodeState)):
            return self.engine.on_lifecycle(event, now)
        return []

    def keep_only(self, kept: set[tuple[str, int]]) -> None:
        """Forget the subjects of every partition not in ``kept`` (it moved to another worker)."""
        for place in [p for p in self.subjects_of if p not in kept]:
            nodes, jobs = self.subjects_of.pop(place)
            self.engine.forget(nodes=nodes, jobs=jobs)

    def tick(self, now: float, states: Sequence[Envelope] = ()) -> list[DetectorFinding]:
        """The job and node states heard since the last tick, then the timers: a job that ended (or a node
        that left) before this tick is not judged silent, and its hang is never raised."""
        out: list[DetectorFinding] = []
        for event in states:
            out += self.on_lifecycle(event, now)
        return out + self.engine.tick(now)


class CorrelateStage:
    """Findings in, alerts out (see the module docstring).

    State: the :class:`~vigil.streams.engine.incidents.Correlator` (open incidents) and the
    :class:`~vigil.detectors.chain.RunChain` (runs whose chain of jobs must go on: it sees every job
    state, as this stage does).
    """

    def __init__(self, correlator: Correlator, chain: RunChain | None = None) -> None:
        self.correlator = correlator
        self.chain = chain if chain is not None else RunChain()

    def on_finding(self, finding: DetectorFinding, now: float) -> list[Alert]:
        return self.correlator.on_finding(finding, now)

    def on_job_state(self, event: JobState, now: float) -> list[Alert]:
        self.chain.observe(event, now)
        if event.state in JOB_ENDED and event.source.job:
            # a job that ended takes its incidents with it (their cause, the job, is gone)
            return self.correlator.job_ended(event.source.job, to_seconds(event.event_time), event.state)
        if event.state in ("pending", "running") and event.source.job:  # a new run begins (or goes on)
            self.correlator.job_started(event.source.job, to_seconds(event.event_time))
        return []

    def chain_findings(self, now: float) -> list[DetectorFinding]:
        """Runs left to be continued that nothing continued (and those that went on again)."""
        return [detector_finding(status, f.kind, f.severity, Subject(run=run), f.onset, "run_chain", "1",
                                 f.evidence, self.chain.cluster_of(run), [], f.detected_at if status == "raised"
                                 else now, [], None) for status, run, f in self.chain.tick(now)]

    def tick(self, now: float) -> list[Alert]:
        return self.correlator.tick(now)


class DecideStage:
    """Alerts in; decisions (and the alerts that call a human) out; action results and job/node
    states fed back. State: the :class:`~vigil.streams.engine.decisions.DecisionEngine`."""

    def __init__(self, decider: DecisionEngine) -> None:
        self.decider = decider

    def on_alert(self, alert: Alert, now: float) -> list[Envelope]:
        return self.decider.on_alert(alert, now)

    def on_feedback(self, event: Envelope, now: float) -> list[Envelope]:
        if isinstance(event, ActionResult):
            return self.decider.on_action_result(event, now)
        if isinstance(event, (JobState, NodeState)):
            return self.decider.on_state(event, now)
        return []

    def tick(self, now: float) -> list[Envelope]:
        return self.decider.tick(now)


class AlertFlow:
    """Correlate, then decide on each alert as it is made; each alert and decision published once.

    State: ``published``, the ids already on the alert and decision topics (learned on takeover) or
    published here. An alert already on its topic is neither published nor decided on again (its
    decisions were made then); the alerts the decide stage raises go through the same door. In
    replay, alerts are decided on (the decision engine's state) and nothing is published.
    """

    def __init__(self, correlate: CorrelateStage, decide: DecideStage | None, memory: int = 100_000) -> None:
        self.correlate = correlate
        self.decide = decide
        self.memory = memory
        self.published: OrderedDict[uuid.UUID, None] = OrderedDict()

    def learn_published(self, events: list[Envelope]) -> None:
        """Alerts and decisions read back from their topics: never published again."""
        for ev in events:
            if isinstance(ev, (Alert, Decision)):
                self._mark(ev.event_id)

    def _mark(self, event_id: uuid.UUID) -> None:
        self.published[event_id] = None
        while len(self.published) > self.memory:
            self.published.popitem(last=False)

    def on_findings(self, findings: list[DetectorFinding], now: float, replay: bool = False) -> list[Envelope]:
        out: list[Envelope] = []
        for f in findings:
            for alert in self.correlate.on_finding(f, now):
                out += self._alert(alert, now, replay)
        return out

    def on_feedback(self, event: Envelope, now: float, live: bool) -> list[Envelope]:
        """An action result or a job/node state; what it decides is published only when ``live``."""
        out: list[Envelope] = []
        if isinstance(event, JobState):
            for alert in self.correlate.on_job_state(event, now):
                out += self._alert(alert, now, replay=not live)
        if self.decide is not None:
            out += self._decided(self.decide.on_feedback(event, now), now, replay=not live)
        return out

    def tick(self, now: float) -> list[Envelope]:
        out: list[Envelope] = []
        chain = self.correlate.chain_findings(now)
        if chain:  # on the findings topic for the history too (read back, they are known by id)
            out += chain + self.on_findings(chain, now)
        for alert in self.correlate.tick(now):
            out += self._alert(alert, now, replay=False)
        if self.decide is not None:
            out += self._decided(self.decide.tick(now), now, replay=False)
        return out

    def _alert(self, alert: Alert, now: float, replay: bool) -> list[Envelope]:
        """The alert, then what the decide stage makes of it."""
        if replay:
            if self.decide is not None:
                self._decided(self.decide.on_alert(alert, now), now, replay=True)
            return []
        if alert.event_id in self.published:
            return []
        self._mark(alert.event_id)
        out: list[Envelope] = [alert]
        if self.decide is not None:
            out += self._decided(self.decide.on_alert(alert, now), now, replay=False)
        return out

    def _decided(self, events: list[Envelope], now: float, replay: bool) -> list[Envelope]:
        """Decisions (each published once) and the alerts the decide stage raises (a human called)."""
        out: list[Envelope] = []
        for ev in events:
            if isinstance(ev, Alert):
                out += self._alert(ev, now, replay)
            elif not replay and ev.event_id not in self.published:
                self._mark(ev.event_id)
                out.append(ev)
        return out


def build_stages(config: Any, params: Any = None, telemetry: tuple[str, ...] = ()) -> tuple[DetectStage, AlertFlow]:
    """A worker's stages as ``config`` (a :class:`~vigil.streams.config.StreamConfig`) wires them: the
    worker's own, and a replay's on a simulated clock (the same path, no Kafka). ``params``: the detection
    engine's (default ``config.engine``); ``telemetry``: the event types the detect stage reads. Returns
    the detect stage and the flow through correlate and decide (decide only when ``config.decide``)."""
    from vigil.streams.engine.escalation import Escalation
    from vigil.streams.engine.planning import replan

    correlator = Correlator()
    decider = DecisionEngine(Escalation(**config.escalation), recovered=correlator.recovered,
                             replan=replan if config.replan else None) if config.decide else None
    detect = DetectStage(DetectionEngine(params or config.engine), key_of_topics(config, telemetry))
    correlate = CorrelateStage(correlator, chain=RunChain(**config.chain))
    return detect, AlertFlow(correlate, DecideStage(decider) if decider is not None else None)


def key_of_topics(config: Any, event_types: tuple[str, ...]) -> dict[str, str]:
    """Topic name -> the key its messages are partitioned by."""
    return {config.topic(t): TOPICS[t].key for t in event_types}
