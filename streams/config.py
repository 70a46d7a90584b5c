"""What a stream app needs to know, as plain values (``vigil.settings.Settings`` builds it).

The Kafka-client defaults here are the stream apps' own and have their one
home here; the detectors' and the decision engine's defaults live with those
classes and arrive as ``engine`` and ``escalation`` only when the operator
changed them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from vigil.schemas.topics import topic_name

if TYPE_CHECKING:
    from vigil.streams.engine.detection import EngineParams


#: Every consumer group of vigil's (the workers', the actuators', notify's, the agent's): tansu (and
#: Kafka) join a group in about half the session timeout, so 6 s gives ~3 s.
SESSION_TIMEOUT_S = 6.0
HEARTBEAT_INTERVAL_S = 1.0


def _engine_defaults() -> "EngineParams":
    from vigil.streams.engine.detection import EngineParams  # the detectors load only where a worker runs

    return EngineParams()


@dataclass(frozen=True)
class StreamConfig:
    bootstrap: str
    topic_prefix: str = "vigil"
    group_id: str = "vigil-detect"
    kafka_security: dict[str, Any] = field(default_factory=dict)
    session_timeout_s: float = SESSION_TIMEOUT_S
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    #: How long a fetch may wait for data: the alert path's latency floor.
    fetch_max_wait_ms: int = 20
    #: How often timer-driven detectors are ticked.
    tick_interval_s: float = 0.1
    #: How often processed offsets are committed (after what they produced is delivered).
    commit_interval_s: float = 1.0
    #: How far back a worker replays a partition it takes over, to rebuild state.
    recovery_window_s: float = 600.0
    #: Run the decision engine next to the correlator (alerts -> decisions).
    decide: bool = True
    #: Decide multi-job re-plans (``replan``) when jobs come and go and nodes join: only where an
    #: actuator carries them out (most clusters' schedulers place their own jobs).
    replan: bool = False
    #: The detection engine's parameters (detector settings by name, plugins).
    engine: "EngineParams" = field(default_factory=_engine_defaults)
    #: Arguments of the escalation ladder (:class:`~vigil.streams.engine.escalation.Escalation`).
    escalation: Mapping[str, Any] = field(default_factory=dict)
    #: Arguments of the run-chain watch (:class:`~vigil.detectors.chain.RunChain`).
    chain: Mapping[str, Any] = field(default_factory=dict)

    def kafka_conf(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration for this cluster, plus ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka_security, **extra}

    def topic(self, event_type: str) -> str:
        return topic_name(event_type, self.topic_prefix)
