"""Event models, the envelope, topic names and ClickHouse DDL. Depends on pydantic only."""

from vigil.schemas.codec import Decoded, content_id, decode, encode, encode_batch
from vigil.schemas.envelope import Envelope, Source, from_seconds, to_seconds, utcnow
from vigil.schemas.errors import DecodeError, SchemaError
from vigil.schemas.events import (
    EVENT_TYPES, GPUS_PER_NODE, JOB_ENDED, NODE_AWAY, ActionResult, Checkpoint, Alert, CollectiveCall, CollectiveOp, DeadLetter, Decision, DetectorFinding,
    ExceptionCategory, FlightRecorderDump, GpuSamples, GpuTelemetry, Heartbeat, IterationStep, IterationTiming, JobState, NicCounters, NodeState,
    ProcessExit, Slowdown, Subject, TrainingException, XidError,
)
from vigil.schemas.topics import (
    NODE_SAMPLE_TYPES, NODE_SAMPLES, TOPICS, all_topic_names, group_type, message_key, topic_accepts, topic_name,
)

__all__ = [
    "Decoded", "content_id", "decode", "encode", "encode_batch", "Envelope", "Source", "from_seconds", "to_seconds",
    "utcnow", "DecodeError", "SchemaError", "EVENT_TYPES", "GPUS_PER_NODE", "JOB_ENDED", "NODE_AWAY", "ActionResult", "Checkpoint", "Alert", "CollectiveCall",
    "CollectiveOp", "DeadLetter", "Decision", "DetectorFinding", "ExceptionCategory", "FlightRecorderDump", "GpuSamples", "GpuTelemetry", "Heartbeat",
    "IterationStep", "IterationTiming", "JobState", "NicCounters", "NodeState", "ProcessExit", "Slowdown", "Subject",
    "TrainingException", "XidError", "TOPICS", "NODE_SAMPLES", "NODE_SAMPLE_TYPES", "group_type", "all_topic_names", "message_key", "topic_accepts", "topic_name",
]
