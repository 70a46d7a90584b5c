"""The detection worker: telemetry topics -> DetectionEngine -> alerts topic.

Each agent decodes raw messages itself (values are bytes), so a malformed
message becomes a dead letter with its reason and raw bytes while the agent
keeps going. Timer-driven detectors (hang, heartbeat loss) are ticked from a
faust timer with the wall clock: this is the outermost layer, the only place
that reads it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from schemas import Alert, decode, encode, message_key
from streams.config import StreamConfig
from streams.detection import DetectionEngine, EngineParams
from streams.faustapp import VigilApp, create_app
from detectors import DetectorError
from streams.kafka import dead_letter, refused_event

log = logging.getLogger(__name__)


def build_worker_app(config: StreamConfig, ready_file: Path | None = None) -> VigilApp:
    app = create_app(config)
    engine = DetectionEngine(EngineParams(hang_k=config.hang_k,
                                          heartbeat_missed_intervals=config.heartbeat_missed_intervals))
    app.detection_engine = engine  # type: ignore[attr-defined]

    def raw_topic(event_type: str) -> Any:
        return app.topic(config.topic(event_type), value_type=bytes, key_type=bytes,
                         value_serializer="raw", key_serializer="raw")

    alerts_topic = raw_topic("alert")
    dlq_topic = raw_topic("dead_letter")

    async def publish_alerts(alerts: list[Alert]) -> None:
        for alert in alerts:
            await alerts_topic.send(key=message_key(alert), value=encode(alert))
            log.info("alert %s v%d %s sev%d %s", alert.status, alert.incident_version, alert.kind,
                     alert.severity, alert.subject.model_dump(exclude_none=True))

    # Which subjects each partition carried, to forget them when it is revoked.
    subjects_of: dict[tuple[str, int], tuple[set[str], set[str]]] = {}

    async def consume(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            decoded = decode(event.value)
            nodes, jobs = subjects_of.setdefault((msg.topic, msg.partition), (set(), set()))
            for ev in decoded.events:
                if ev.event_type == "heartbeat" and ev.source.node:  # type: ignore[attr-defined]
                    nodes.add(ev.source.node)
                elif ev.source.job:
                    jobs.add(ev.source.job)
            for err in decoded.errors:
                dl = dead_letter(err, msg.topic, msg.partition, msg.offset, msg.timestamp)
                await dlq_topic.send(key=msg.topic.encode(), value=encode(dl))
                log.warning("dead letter %s/%d/%d: %s", msg.topic, msg.partition, msg.offset, err)
            now = time.time()
            for ev in decoded.events:
                try:
                    alerts = engine.on_event(ev, now)
                except DetectorError as exc:  # valid JSON a detector cannot use: keep it, go on
                    dl = refused_event(ev, f"detector refused it: {exc}", msg.topic, msg.partition, msg.offset)
                    await dlq_topic.send(key=msg.topic.encode(), value=encode(dl))
                    log.warning("refused %s: %s", ev.event_id, exc)
                    continue
                await publish_alerts(alerts)

    for event_type in ("heartbeat", "iteration"):
        app.agent(raw_topic(event_type), name=f"detect-{event_type}")(consume)

    @app.on_partitions_assigned.connect
    async def on_assigned(app: Any, assigned: Any, **kwargs: Any) -> None:
        # An eager rebalance revokes every partition and hands most of them straight
        # back: forget only the subjects whose partitions went to another worker.
        kept = {(tp.topic, tp.partition) for tp in assigned}
        for key in [k for k in subjects_of if k not in kept]:
            nodes, jobs = subjects_of.pop(key)
            engine.forget(nodes=nodes, jobs=jobs)

    ready = {"written": False}

    @app.timer(interval=config.tick_interval_s)
    async def tick() -> None:
        await publish_alerts(engine.tick(time.time()))
        if ready_file is not None and not ready["written"] and app.consumer.assignment():
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.write_text(str(sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())))
            ready["written"] = True

    return app


def run_worker(config: StreamConfig, ready_file: Path | None = None, loglevel: str = "WARNING") -> None:
    """Run a detection worker until SIGINT/SIGTERM."""
    import faust

    app = build_worker_app(config, ready_file)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
