"""A small SDK for standalone stream apps: typed events in, findings out.

An app reads the topics of the event types it names, gets each event as a
validated schema model, and raises or clears *findings*. Findings go to the
findings topic, where vigil's correlator makes them incidents like those of
the built-in detectors (one incident per root cause, attribution, alerts on
the alert topic). The history client answers SQL.

Example (``examples/stream_app/hot_gpu.py``)::

    from vigil.sdk import StreamApp

    app = StreamApp("hot-gpu", consumes=["gpu_telemetry"])

    @app.handler
    def on_gpu(event, ctx):
        if event.temperature_c is not None and event.temperature_c > 90:
            ctx.raise_finding("gpu_too_hot", severity=3, node=event.source.node, gpu=event.source.gpu,
                              onset=event.event_time, evidence={"temperature_c": event.temperature_c})

    app.run()

Configuration comes from the same ``VIGIL_*`` variables as the rest of vigil.
Delivery is at-least-once (offsets are committed after the handler ran) and
finding ids derive from their content, so a redelivered event raises nothing
new. A malformed message goes to the dead-letter topic; a handler exception
is logged with the event and the app goes on.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, Producer

from vigil.schemas import NODE_SAMPLE_TYPES, NODE_SAMPLES, DetectorFinding, Envelope, Source, Subject, decode, encode, message_key, \
    topic_name, utcnow
from vigil.streams.engine.incidents import subject_key
from vigil.streams.kafka import dead_letter, refused_event, take

log = logging.getLogger(__name__)
_FINDING_NS = uuid.UUID("3c0c7f55-54a4-4b8b-9d55-0a8f8e1b6d21")

Handler = Callable[[Envelope, "Context"], None]


@dataclass
class Context:
    """What a handler may do: raise and clear findings, query the history."""

    app: "StreamApp"
    raised: list[DetectorFinding] = field(default_factory=list)

    def raise_finding(self, kind: str, *, severity: int, onset: datetime, evidence: dict[str, Any] | None = None,
                      job: str | None = None, node: str | None = None, gpu: int | None = None,
                      rank: int | None = None, link: str | None = None, job_nodes: list[str] | None = None) -> None:
        self._emit("raised", kind, severity, Subject(job=job, node=node, gpu=gpu, rank=rank, link=link), onset,
                   evidence or {}, job_nodes or [])

    def clear_finding(self, kind: str, *, severity: int, onset: datetime, job: str | None = None,
                      node: str | None = None, gpu: int | None = None, rank: int | None = None,
                      link: str | None = None) -> None:
        """Say that a finding raised with this kind, subject and onset has ended."""
        self._emit("cleared", kind, severity, Subject(job=job, node=node, gpu=gpu, rank=rank, link=link), onset,
                   {}, [])

    def _emit(self, status: str, kind: str, severity: int, subject: Subject, onset: datetime,
              evidence: dict[str, Any], job_nodes: list[str]) -> None:
        self.raised.append(DetectorFinding(
            event_id=uuid.uuid5(_FINDING_NS, f"{self.app.name}|{status}|{kind}|{subject_key(subject)}|{onset.isoformat()}"),
            event_time=utcnow(), source=Source(), status=status, kind=kind, severity=severity,  # type: ignore[arg-type]
            subject=subject, onset_time=onset, detector=self.app.name, detector_version=self.app.version,
            job_nodes=job_nodes, evidence=evidence,
        ))

    def history(self) -> Any:
        """A client with ``.query(sql)`` over vigil's ClickHouse history."""
        from vigil.settings import Settings
        from vigil.stack import open_history

        return open_history(Settings())


class StreamApp:
    """A consumer group over the topics of ``consumes``, calling handlers per event."""

    def __init__(self, name: str, consumes: list[str], *, version: str = "1", settings: Any = None) -> None:
        from vigil.settings import Settings
        from vigil.stack import resolve_bootstrap

        self.name = name
        self.version = version
        self.consumes = list(consumes)
        self.settings = settings or Settings()
        self._handlers: list[Handler] = []
        self._stop = threading.Event()
        bootstrap = resolve_bootstrap(self.settings)
        self._conf = {"bootstrap.servers": bootstrap, **self.settings.kafka_security()}
        self._prefix = self.settings.topic_prefix
        self.processed = 0

    def handler(self, fn: Handler) -> Handler:
        """Decorator: call ``fn(event, ctx)`` for every event consumed."""
        self._handlers.append(fn)
        return fn

    def stop(self) -> None:
        self._stop.set()

    def run(self, max_events: int | None = None) -> None:
        """Consume until SIGINT/SIGTERM, :meth:`stop`, or ``max_events`` events."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self._stop.set())
        consumer = Consumer({**self._conf, "group.id": f"{self._prefix}-app-{self.name}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": int(self.settings.session_timeout_s * 1000),
                             "heartbeat.interval.ms": int(self.settings.heartbeat_interval_s * 1000),
                             "fetch.wait.max.ms": 20, "log_level": 3})
        producer = Producer({**self._conf, "enable.idempotence": True, "acks": "all", "linger.ms": 2, "log_level": 3})
        wanted = set(self.consumes)
        per_gpu = "gpu_telemetry" in wanted and "gpu_samples" not in wanted
        topics = list(dict.fromkeys(topic_name(t, self._prefix) for t in self.consumes))
        if wanted & NODE_SAMPLE_TYPES:  # node agents send these together, one message per node and interval
            topics.append(topic_name(NODE_SAMPLES, self._prefix))
        consumer.subscribe(topics)
        findings_topic = topic_name("finding", self._prefix)
        dlq_topic = topic_name("dead_letter", self._prefix)
        try:
            while not self._stop.is_set() and (max_events is None or self.processed < max_events):
                for msg in take(consumer, 500, 0.2):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", msg.error())
                        continue
                    decoded = decode(msg.value())
                    for err in decoded.errors:
                        dl = dead_letter(err, msg.topic(), msg.partition(), msg.offset())
                        producer.produce(dlq_topic, key=msg.topic().encode(), value=encode(dl))
                    events = decoded.events
                    if per_gpu:  # an app that reads per-GPU samples gets those a node sent in columns as such
                        events = [g for e in events for g in (e.telemetry() if e.event_type == "gpu_samples"  # type: ignore[attr-defined]
                                                              else (e,))]
                    for event in events:
                        if event.event_type not in wanted:  # type: ignore[attr-defined]
                            continue  # a node-samples message's other kinds
                        ctx = Context(self)
                        for fn in self._handlers:
                            try:
                                fn(event, ctx)
                            except Exception as exc:  # the app's own bug: keep the event, go on
                                log.exception("handler %s failed on %s", fn.__name__, event.event_id)
                                dl = refused_event(event, f"{self.name}.{fn.__name__}: {exc!r}", msg.topic(),
                                                   msg.partition(), msg.offset())
                                producer.produce(dlq_topic, key=msg.topic().encode(), value=encode(dl))
                        for f in ctx.raised:
                            producer.produce(findings_topic, key=message_key(f), value=encode(f))
                        self.processed += 1
                    producer.poll(0)
                    producer.flush(10)
                    consumer.commit(message=msg, asynchronous=False)
        finally:
            producer.flush(10)
            consumer.close()
