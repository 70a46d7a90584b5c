"""Heartbeats on a fixed interval with a sequence number (+1 per beat since the agent started)."""

from __future__ import annotations

from datetime import datetime

from vigil.producers.agent.base import Collector
from vigil.schemas import Envelope, Heartbeat, Source


class HeartbeatCollector(Collector):
    name = "heartbeat"

    def __init__(self, interval_s: float, source: Source) -> None:
        super().__init__(interval_s, source)
        self.seq = 0

    def collect(self, now: datetime) -> list[Envelope]:
        hb = Heartbeat(event_time=now, source=self.source, seq=self.seq, interval_s=self.interval_s)
        self.seq += 1
        return [hb]
