"""What a stream app needs to know, as plain values (the CLI fills it from settings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamConfig:
    bootstrap: str
    topic_prefix: str = "vigil"
    group_id: str = "vigil-detect"
    kafka_security: dict[str, Any] = field(default_factory=dict)
    session_timeout_s: float = 6.0
    heartbeat_interval_s: float = 1.0
    fetch_max_wait_ms: int = 20
    tick_interval_s: float = 0.1
    hang_k: float = 3.0
    hang_min_timeout_s: float = 0.0
    heartbeat_missed_intervals: float = 2.5
    #: How far back a worker replays a partition it takes over, to rebuild state.
    recovery_window_s: float = 600.0
    #: Run the decision engine next to the correlator (alerts -> decisions).
    decide: bool = True
    #: A failure that returns within this many seconds of its remedy climbs the ladder.
    escalation_window_s: float = 600.0
    #: Restarts tried for one failure within the window before reconfiguring.
    max_restarts: int = 3
    #: Where faust may keep files; its tables live in memory, so unset means a temporary directory.
    data_dir: str | None = None

    def kafka_conf(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration for this cluster, plus ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka_security, **extra}

    def topic(self, event_type: str) -> str:
        from vigil.schemas.topics import topic_name

        return topic_name(event_type, self.topic_prefix)
