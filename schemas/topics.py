"""Topic names in one registry.

Every topic holds one event type (the dead-letter topic holds dead letters),
keyed so that the events one stateful consumer needs land in one partition:
timings by job, node data by node, alerts by incident. One exception carries
the high-rate node data: a node agent sends one message per node per interval
to the node-samples topic, holding its heartbeat with the GPU samples and NIC
counters taken since the last one, so a worker pays one message's overhead
for ten records (see :func:`group_type`). A topic may also hold another form
of its event (:data:`ALSO`): the GPU topic takes a node's samples in columns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from vigil.schemas.envelope import Envelope


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name under the prefix, the event it holds and its key."""

    suffix: str
    event_type: str
    key: str  # which envelope/payload attribute keys the message
    partitions: int
    description: str

    def name(self, prefix: str) -> str:
        return f"{prefix}.{self.suffix}"


TOPICS: dict[str, TopicSpec] = {
    spec.event_type: spec
    for spec in (
        TopicSpec("telemetry.iterations", "iteration", "job", 8, "Per-rank iteration timings."),
        TopicSpec("telemetry.steps", "iteration_step", "job", 8, "Per-step iteration timings of all ranks, in columns."),
        TopicSpec("telemetry.collectives", "collective", "job", 8, "Collective-call timings."),
        TopicSpec("telemetry.xid", "xid", "node", 4, "NVIDIA XID errors."),
        TopicSpec("telemetry.nic", "nic_counters", "node", 4, "RoCE/IB port counters."),
        TopicSpec("telemetry.gpu", "gpu_telemetry", "node", 4, "GPU telemetry samples."),
        TopicSpec("telemetry.heartbeats", "heartbeat", "node", 4, "Node agent heartbeats."),
        TopicSpec("telemetry.node", "node_samples", "node", 4,
                  "One message per node per interval: its heartbeat, GPU samples and NIC counters."),
        TopicSpec("telemetry.processes", "process_exit", "node", 4, "Training process exits."),
        TopicSpec("telemetry.exceptions", "training_exception", "job", 4, "Training exceptions."),
        TopicSpec("state.jobs", "job_state", "job", 4, "Job specs and lifecycle."),
        TopicSpec("state.nodes", "node_state", "node", 4, "Node availability."),
        TopicSpec("telemetry.checkpoints", "checkpoint", "job", 8, "Checkpoints of training processes: start and end."),
        # One partition: one correlator sees every finding (findings are rare).
        TopicSpec("findings", "finding", "cluster", 1, "Detector findings, before correlation."),
        TopicSpec("alerts", "alert", "incident", 4, "Incidents: open, update, resolved."),
        TopicSpec("decisions", "decision", "job", 4, "Decisions of the decision engine."),
        TopicSpec("actions", "action_result", "decision", 4, "Actuator results."),
        TopicSpec("deadletter", "dead_letter", "source_topic", 1, "Messages that could not be processed."),
        TopicSpec("telemetry.agent", "agent_health", "node", 4, "Node-agent collector failures and recoveries."),
        TopicSpec("telemetry.dropped", "events_dropped", "node", 1, "Counts of events producers had to discard."),
        TopicSpec("telemetry.watchdogs", "watchdog", "node", 4, "Disk, memory, job-liveness and log-staleness checks."),
        TopicSpec("telemetry.flight_recorder", "flight_recorder_dump", "job", 4,
                  "Flight-recorder dumps of training ranks (collective sequence numbers and states), on a hang."),
    )
}


#: Event types that travel on another type's topic (keyed the same way): a node's GPU samples in
#: columns, on the GPU telemetry topic beside the per-GPU samples of older agents and others' producers.
ALSO: dict[str, str] = {"gpu_samples": "gpu_telemetry"}

#: The pseudo event type of the node-samples topic, and the event types it may carry.
NODE_SAMPLES = "node_samples"
NODE_SAMPLE_TYPES = frozenset({"heartbeat", "gpu_telemetry", "gpu_samples", "nic_counters"})


def spec_of(event_type: str) -> TopicSpec:
    """The topic an event type travels on (its own, or the one :data:`ALSO` names)."""
    return TOPICS[ALSO.get(event_type, event_type)]


def group_type(events: Sequence[Envelope]) -> str:
    """The topic's event type for one message of ``events``: their own, or :data:`NODE_SAMPLES`.

    A message holds events of one type and one key, or one node's periodic
    samples (any mix of :data:`NODE_SAMPLE_TYPES`); anything else is a
    producer's mistake and raises ``ValueError``.
    """
    first = events[0]
    types = {e.event_type for e in events}  # type: ignore[attr-defined]
    key = message_key(first)
    if any(message_key(e) != key for e in events):
        raise ValueError("a message must hold events of one key")
    if len(types) == 1:
        return first.event_type  # type: ignore[attr-defined]
    if types <= NODE_SAMPLE_TYPES:
        return NODE_SAMPLES
    raise ValueError(f"a message must hold one event type, or only node samples {sorted(NODE_SAMPLE_TYPES)}; "
                     f"got {sorted(types)}")


@functools.lru_cache(maxsize=1024)
def topic_accepts(topic: str) -> frozenset[str]:
    """The event types a message read from ``topic`` (a full name, any prefix) may hold.

    A topic holds its own event type (and those :data:`ALSO` puts on it); the
    node-samples topic holds :data:`NODE_SAMPLE_TYPES`. A topic that is not
    vigil's accepts nothing.

    >>> sorted(topic_accepts("vigil.telemetry.heartbeats")), sorted(topic_accepts("a.b.telemetry.node"))
    (['heartbeat'], ['gpu_samples', 'gpu_telemetry', 'heartbeat', 'nic_counters'])
    >>> sorted(topic_accepts("vigil.telemetry.gpu"))
    ['gpu_samples', 'gpu_telemetry']
    >>> topic_accepts("vigil.decisionsX")
    frozenset()
    """
    for spec in TOPICS.values():
        if topic.endswith("." + spec.suffix) and len(topic) > len(spec.suffix) + 1:
            if spec.event_type == NODE_SAMPLES:
                return NODE_SAMPLE_TYPES
            return frozenset({spec.event_type, *(t for t, home in ALSO.items() if home == spec.event_type)})
    return frozenset()


def topic_name(event_type: str, prefix: str) -> str:
    """Full topic name for an event type, e.g. ``vigil.telemetry.heartbeats``."""
    return spec_of(event_type).name(prefix)


def all_topic_names(prefix: str) -> list[str]:
    return [spec.name(prefix) for spec in TOPICS.values()]


def message_key(event: Envelope) -> bytes:
    """The partitioning key of an event, per its topic's ``key``."""
    key_attr = spec_of(event.event_type).key  # type: ignore[attr-defined]
    if key_attr in ("job", "node"):
        value = getattr(event.source, key_attr)
        if value is None and key_attr == "job":
            value = getattr(getattr(event, "target", None), "job", None)
    elif key_attr == "incident":
        value = event.incident_id  # type: ignore[attr-defined]
    elif key_attr == "cluster":
        value = event.source.cluster
    elif key_attr == "decision":
        value = event.decision_id  # type: ignore[attr-defined]
    else:
        value = getattr(event, key_attr)
    return str(value if value is not None else event.source.cluster).encode()
