"""A detector's bug on one event costs that event (dead-lettered with the reason), never the worker."""

from __future__ import annotations

import base64

from vigil.schemas import Heartbeat, Source, decode, encode, from_seconds
from vigil.streams.config import StreamConfig
from vigil.streams.engine.detection import DetectionEngine
from vigil.streams.stages import DetectStage, Place, key_of_topics
from vigil.streams.worker import TELEMETRY

T0 = 1_780_000_000.0


def test_an_event_a_detector_crashes_on_is_dead_lettered_and_the_rest_go_on():
    cfg = StreamConfig(bootstrap="unused:9092", topic_prefix="t")
    stage = DetectStage(DetectionEngine(), key_of_topics(cfg, TELEMETRY))
    real = stage.engine.on_events
    seen: list[int] = []

    def buggy(events, now, replay=False, **where):  # a detector that divides by zero on heartbeat seq 2
        if any(e.seq == 2 for e in events):
            raise ZeroDivisionError("division by zero")
        seen.extend(e.seq for e in events)
        return real(events, now, replay=replay, **where)

    stage.engine.on_events = buggy  # type: ignore[method-assign]
    beats = [Heartbeat(event_time=from_seconds(T0), source=Source(cluster="c", node="n1"), seq=s, interval_s=1.0)
             for s in range(4)]
    out = stage.on_message(Place(cfg.topic("heartbeat"), 0, 7), b"[" + b",".join(map(encode, beats)) + b"]", T0)
    assert sorted(seen) == [0, 1, 3]
    assert len(out.dead_letters) == 1
    letter = out.dead_letters[0]
    assert letter.reason == "refused" and (letter.source_offset, letter.field) == (7, None)
    assert "detector failed on it: ZeroDivisionError: division by zero" in letter.detail
    raw = decode(base64.b64decode(letter.raw_b64)).events
    assert [e.seq for e in raw] == [2]  # the event it failed on, as it came
