"""``vigil tail``: follow alerts, decisions and actions live, filtered by severity and job.

Decisions and action results do not carry a severity, and an action result
does not name its job: :class:`Follower` joins them as it reads. A decision's
severity is the worst of the incidents it answers (from their alerts), else
that of its rung on the escalation ladder (restart: 2, reconfigure: 1...);
its job is its target's, else the answered incidents'. An action result takes
its decision's. A tail that starts at the end of the topics first reads the
last ``lookback_s`` of alerts and decisions without printing them, so that a
decision or action about an earlier incident is still filtered right; one
whose decision it never saw passes no job or severity filter.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator

from rich.markup import escape

from vigil.schemas import ActionResult, Alert, Decision, Envelope

__all__ = ["KINDS", "Follower", "format_record", "open_consumer", "records"]

#: What ``vigil tail`` follows: name -> the event type it prints.
KINDS = {"alerts": "alert", "decisions": "decision", "actions": "action_result"}
#: Severity of the ladder's rungs and of the other remedies (fail-slow mitigations are sev3).
ACTION_SEVERITY = {"retry_in_place": 3, "restart_process": 2, "reconfigure": 1, "isolate_node": 1,
                   "notify_human": 1, "rebalance_microbatches": 3, "adjust_topology": 3, "checkpoint_restart": 3}
_MEMORY = 100_000


def _remember(store: OrderedDict, key: Any, value: Any) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > _MEMORY:
        store.popitem(last=False)


@dataclass(frozen=True)
class Known:
    """What the follower makes of one record: its severity and jobs (None/empty: unknown)."""

    severity: int | None
    jobs: frozenset[str]


class Follower:
    """Joins alerts, decisions and action results; decides what a filter lets through.

    >>> from vigil.schemas import Subject, from_seconds
    >>> t = from_seconds(0)
    >>> a = Alert(event_time=t, incident_id=uuid.UUID(int=1), incident_version=1, status="open", severity=1,
    ...           kind="node_lost", subject=Subject(node="n3"), onset_time=t, detection_time=t, detector="d",
    ...           detector_version="1", jobs={"llama": ["n3"]})
    >>> d = Decision(event_time=t, decision_id=uuid.UUID(int=2), idempotency_key="k", action="reconfigure",
    ...              target=Subject(job="llama"), reason="sev1 node_lost", answers=[uuid.UUID(int=1)])
    >>> r = ActionResult(event_time=t, decision_id=uuid.UUID(int=2), state="succeeded", backend="slurm")
    >>> f = Follower(severity=1, job="llama")
    >>> [f.shows(e) for e in (a, d, r)]
    [True, True, True]
    >>> Follower(severity=2, job="other").shows(r)
    False
    """

    def __init__(self, severity: int | None = None, job: str | None = None) -> None:
        self.severity = severity
        self.job = job
        self.incidents: OrderedDict[uuid.UUID, Known] = OrderedDict()
        self.decisions: OrderedDict[uuid.UUID, tuple[Decision, Known]] = OrderedDict()

    def learn(self, event: Envelope) -> Known:
        """Take in one record (printed or not); return what is known of it."""
        if isinstance(event, Alert):
            jobs = set(event.jobs) | ({event.subject.job} if event.subject.job else set())
            old = self.incidents.get(event.incident_id)
            severity = event.severity if old is None or old.severity is None else min(old.severity, event.severity)
            known = Known(severity, frozenset(jobs | (set(old.jobs) if old else set())))
            _remember(self.incidents, event.incident_id, known)
            return Known(event.severity, known.jobs)
        if isinstance(event, Decision):
            answered = [self.incidents[i] for i in event.answers if i in self.incidents]
            severities = [k.severity for k in answered if k.severity is not None]
            severity = min(severities) if severities else ACTION_SEVERITY.get(event.action)
            direct = {j for j in (event.target.job, event.source.job) if j}
            jobs = direct or {j for k in answered for j in k.jobs}
            known = Known(severity, frozenset(jobs))
            _remember(self.decisions, event.decision_id, (event, known))
            return known
        if isinstance(event, ActionResult):
            seen = self.decisions.get(event.decision_id)
            if seen is not None:
                return seen[1]
            return Known(None, frozenset({event.source.job} if event.source.job else ()))
        return Known(None, frozenset())

    def passes(self, known: Known) -> bool:
        if self.severity is not None and (known.severity is None or known.severity > self.severity):
            return False
        return self.job is None or self.job in known.jobs

    def shows(self, event: Envelope) -> bool:
        return self.passes(self.learn(event))

    def decision_of(self, result: ActionResult) -> Decision | None:
        seen = self.decisions.get(result.decision_id)
        return seen[0] if seen is not None else None


def _subject(subject: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in subject.model_dump(exclude_none=True).items()) or "-"


def format_record(event: Envelope, follower: Follower) -> str:
    """One line of rich markup for a human; every text that came off a topic is escaped.

    Anyone who can write a topic writes these fields: markup in them must print
    as the characters it is, not restyle or hide the rest of the line.
    """
    if isinstance(event, Alert):
        colour = {1: "red", 2: "yellow", 3: "cyan"}[event.severity]
        return (f"[{colour}]sev{event.severity}[/{colour}] {escape(f'{event.status:<8} {event.kind:<12} ')}"
                + escape(f"{_subject(event.subject):<24} onset {event.onset_time:%H:%M:%S.%f}"[:-3]
                         + f"  {event.summary}"))
    if isinstance(event, Decision):
        answers = f" answers {len(event.answers)} incident(s)" if event.answers else ""
        return ("[magenta]decision[/magenta] "
                + escape(f"{event.action:<16} {_subject(event.target):<24} {event.event_time:%H:%M:%S.%f}"[:-3]
                         + f"{answers}: {event.reason}"))
    if isinstance(event, ActionResult):
        decision = follower.decision_of(event)
        what = f"{decision.action} {_subject(decision.target)}" if decision else f"decision {event.decision_id}"
        colour = {"succeeded": "green", "failed": "red", "timed_out": "red"}.get(event.state, "white")
        return (f"[blue]action[/blue]   [{colour}]{escape(f'{event.state:<9}')}[/{colour}] "
                + escape(f"{what:<40} {event.event_time:%H:%M:%S.%f}"[:-3] + f"  {event.backend}"
                         + (f": {event.detail}" if event.detail else "")))
    return escape(str(event))


def open_consumer(kafka_conf: dict[str, Any], topics: dict[str, str], from_beginning: bool,
                  lookback_s: float, timeout_s: float = 10.0) -> tuple[Any, dict[tuple[str, int], tuple[int, int]]]:
    """A group-less consumer over ``topics`` (event type -> topic name).

    From the beginning, or: alerts and decisions from ``lookback_s`` ago,
    actions from the end. Returns it and, per partition, (the offset from
    which records are printed, the end of the backlog: the high watermark
    when it opened). Ends are explicit offsets, not "the end when fetching
    starts": a record published once this returns is never missed.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({**kafka_conf, "group.id": "vigil-tail", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 50, "log_level": 3})
    metadata = consumer.list_topics(timeout=timeout_s)
    assign, marks = [], {}
    since_ms = int((time.time() - lookback_s) * 1000)
    for kind, topic in topics.items():
        tmeta = metadata.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            consumer.close()
            raise KafkaException(f"topic {topic} does not exist; start the stack with `vigil up`")
        parts = [TopicPartition(topic, p) for p in tmeta.partitions]
        for p in parts:
            _, high = consumer.get_watermark_offsets(p, timeout=timeout_s)
            marks[(topic, p.partition)] = (0 if from_beginning else high, high)
        if from_beginning:
            assign += [TopicPartition(topic, p.partition, OFFSET_BEGINNING) for p in parts]
        elif kind == "action_result":
            assign += [TopicPartition(topic, p.partition, marks[(topic, p.partition)][1]) for p in parts]
        else:
            starts = consumer.offsets_for_times([TopicPartition(topic, p.partition, since_ms) for p in parts],
                                                timeout=timeout_s)
            assign += [TopicPartition(topic, s.partition, s.offset if s.offset >= 0 else marks[(topic, s.partition)][1])
                       for s in starts]
    consumer.assign(assign)
    return consumer, marks


def records(consumer: Any, marks: dict[tuple[str, int], tuple[int, int]], poll_s: float = 0.5,
            backlog_timeout_s: float = 30.0) -> Iterator[tuple[Envelope, bool]]:
    """Every decoded record as (event, printed?), forever; what does not decode is skipped (the worker
    dead-letters it).

    The backlog (up to the high watermarks at opening) comes first, in event-time order across
    topics, so that an alert is learnt before the decision that answers it; then records as they
    arrive.
    """
    from vigil.schemas import decode
    from vigil.streams.kafka import rewind_shrunk, take

    def printed(msg: Any) -> bool:
        return msg.offset() >= marks.get((msg.topic(), msg.partition()), (0, 0))[0]

    backlog: list[tuple[Any, Envelope, bool]] = []
    live: list[tuple[Envelope, bool]] = []
    behind = {tp for tp, (_, high) in marks.items() if high > 0}
    positions: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + backlog_timeout_s
    while behind and time.monotonic() < deadline:
        for msg in take(consumer, 500, poll_s):
            if msg.error():
                continue
            tp = (msg.topic(), msg.partition())
            events = decode(msg.value()).events
            if msg.offset() < marks[tp][1]:
                backlog += [(e.event_time, e, printed(msg)) for e in events]
            else:
                live += [(e, True) for e in events]
            positions[tp] = msg.offset() + 1
            if positions[tp] >= marks[tp][1]:
                behind.discard(tp)
        for tp in list(behind):  # a partition whose start lies at or past its backlog has none to read
            pos = consumer.position([_partition(tp)])[0].offset
            if pos >= marks[tp][1]:
                behind.discard(tp)
    backlog.sort(key=lambda r: r[0])
    for _, event, show in backlog:
        yield event, show
    yield from live
    while True:
        msg = consumer.poll(poll_s)
        if msg is None:  # idle: a log the broker lost and began again (a dev broker restarted) is read anew
            for tp in rewind_shrunk(consumer):
                marks[(tp.topic, tp.partition)] = (0, 0)
            continue
        if msg.error():
            continue
        for event in decode(msg.value()).events:
            yield event, printed(msg)


def _partition(tp: tuple[str, int]) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(tp[0], tp[1])
