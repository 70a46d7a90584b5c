"""Every event vigil reads or writes, as frozen pydantic v2 models.

Each model fixes ``event_type`` to a literal; :data:`EVENT_TYPES` maps that
name to the model. Telemetry comes from node agents, training hooks and the
simulator; alerts, decisions and action results are what vigil itself says.

By family: :mod:`.telemetry` (what node agents, training hooks and the
simulator measure), :mod:`.lifecycle` (job and node states, checkpoints),
:mod:`.incidents` (what vigil says: findings, alerts, decisions, action
results), :mod:`.health` (dead letters, and what producers report about
themselves). This module holds the registry of them all.
"""

from __future__ import annotations

from vigil.schemas.envelope import Envelope
from vigil.schemas.events.health import (DETAIL_MAX, RAW_B64_MAX, RAW_KEEP, AgentHealth, DeadLetter, EventsDropped,
                                         WatchdogReport)
from vigil.schemas.events.incidents import ActionResult, Alert, Decision, DetectorFinding, Slowdown, Subject
from vigil.schemas.events.lifecycle import GPUS_PER_NODE, JOB_ENDED, NODE_AWAY, Checkpoint, JobState, NodeState
from vigil.schemas.events.telemetry import (GpuIndex, TimingFigure, TimingMethod, U64, CollectiveCall, CollectiveOp,
                                            ExceptionCategory, FlightRecorderDump, GPU_FIGURES, GpuRow, GpuSamples,
                                            GpuTelemetry, Heartbeat,
                                            IterationStep, IterationTiming, NicCounters, ProcessExit,
                                            TrainingException, XidError)

__all__ = [
    "EVENT_MODELS", "EVENT_TYPES", "GPUS_PER_NODE", "JOB_ENDED", "NODE_AWAY", "RAW_KEEP", "RAW_B64_MAX", "DETAIL_MAX",
    "U64", "GpuIndex", "TimingFigure", "TimingMethod",
    "IterationTiming", "IterationStep", "CollectiveOp", "CollectiveCall", "XidError", "NicCounters", "GpuTelemetry",
    "GpuSamples", "GpuRow", "GPU_FIGURES",
    "Heartbeat", "ProcessExit", "ExceptionCategory", "TrainingException", "FlightRecorderDump",
    "JobState", "NodeState", "Checkpoint",
    "Subject", "Slowdown", "Alert", "DetectorFinding", "Decision", "ActionResult",
    "DeadLetter", "AgentHealth", "EventsDropped", "WatchdogReport",
]

EVENT_MODELS: tuple[type[Envelope], ...] = (
    IterationTiming, IterationStep, CollectiveCall, XidError, NicCounters, GpuTelemetry, GpuSamples, Heartbeat,
    ProcessExit, TrainingException, JobState, NodeState, Checkpoint, DetectorFinding, Alert, Decision, ActionResult,
    DeadLetter, AgentHealth, EventsDropped, WatchdogReport, FlightRecorderDump,
)

#: event_type -> model
EVENT_TYPES: dict[str, type[Envelope]] = {
    m.model_fields["event_type"].default: m for m in EVENT_MODELS
}
