"""What vigil's own parts report about their input and themselves: dead letters (a message that could not be
processed, kept whole), the agents' collector health, dropped events and the watchdogs' checks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vigil.schemas.envelope import INT32_MAX, INT64_MAX, Count, Envelope, Label, label_field


#: A dead letter keeps at most this many raw bytes (with the size and SHA-256 of the whole),
#: and at most DETAIL_MAX characters of detail: it is always small enough to produce.
RAW_KEEP = 64 * 1024
RAW_B64_MAX = 4 * ((RAW_KEEP + 2) // 3)
DETAIL_MAX = 4000


class DeadLetter(Envelope):
    """A message that could not be processed, kept whole with the reason."""

    event_type: Literal["dead_letter"] = Field("dead_letter", description="Event type tag.")
    reason: str = label_field(description="Failure class: not_json, unknown_event_type, unsupported_version, invalid, "
                              "wrong_topic, store_refused, refused...")
    detail: str = Field(max_length=DETAIL_MAX, description="What failed, where, and what was expected.")
    field: str | None = label_field(None, "Offending field, when known.")
    source_topic: str = Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._?-]+$",
                              description="Topic the message was read from ('?' when not known).")
    source_partition: int = Field(ge=0, le=INT32_MAX, description="Partition it was read from.")
    source_offset: int = Field(ge=0, le=INT64_MAX, description="Offset it was read at.")
    raw_b64: str = Field(max_length=RAW_B64_MAX, description="The raw message bytes, base64-encoded; only the first "
                         "RAW_KEEP bytes when the message was larger (raw_truncated).")
    raw_size: int | None = Field(None, ge=0, le=INT64_MAX, description="Size of the whole raw message in bytes.")
    raw_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                   description="SHA-256 of the whole raw message, hex (identifies a truncated one).")
    raw_truncated: bool = Field(False, description="Whether raw_b64 holds only the first RAW_KEEP bytes.")


# --- what the producers say about themselves (issue 8) -------------------------


class AgentHealth(Envelope):
    """A node-agent collector failed, or recovered after failing.

    A collector reports each distinct problem once (``failed``), keeps running,
    and reports ``recovered`` once the problem is gone; repeats in between are
    only counted.
    """

    event_type: Literal["agent_health"] = Field("agent_health", description="Event type tag.")
    collector: str = label_field(description="Collector name, e.g. nvml, kmsg, nic, watchdog.disk.")
    status: Literal["failed", "recovered"] = Field(description="failed: a new problem; recovered: it is gone.")
    problem: str = label_field(max_length=4096, description="Stable key of the problem, e.g. the unreadable path or the error class.")
    detail: str = Field("", description="What failed, where, and what was expected.")
    occurrences: int = Field(1, ge=1, le=INT64_MAX, description="How many times the problem was seen (on recovery: in total).")


class EventsDropped(Envelope):
    """Events a producer had to discard (its local spool was full): never silent."""

    event_type: Literal["events_dropped"] = Field("events_dropped", description="Event type tag.")
    count: int = Field(ge=0, le=INT64_MAX, description="Number of events discarded.")
    messages: int = Field(ge=0, le=INT64_MAX, description="Number of Kafka messages (single events or batches) discarded.")
    by_type: dict[Label, Count] = Field(default_factory=dict, description="Discarded events per event type.")
    reason: str = label_field(description="Why: spool_full, record_too_large, hook_buffer_full...")
    component: str = label_field(description="What dropped them: publisher spool, training hook buffer...")


class WatchdogReport(Envelope):
    """One check of a long-run watchdog: a level, its trend and the time left.

    ``rate_per_s`` is the trend of ``used`` (bytes written per second, inodes
    used per second, memory growth per second) and ``time_to_limit_s`` the
    estimated seconds until ``used`` reaches ``limit`` at that rate (unset
    when it is not growing).
    """

    event_type: Literal["watchdog"] = Field("watchdog", description="Event type tag.")
    check: Literal["disk_space", "disk_inodes", "host_memory", "gpu_memory", "job_liveness", "log_staleness"] = Field(
        description="What was checked."
    )
    target: str = label_field(max_length=4096, description="What it was checked on: a path, a job id, a log file, a GPU.")
    status: Literal["ok", "warning", "critical"] = Field(description="Verdict of the check.")
    summary: str = Field("", description="One line for a human.")
    used: float | None = Field(None, ge=0, description="Amount in use (bytes, inodes, seconds since the log was written).")
    limit: float | None = Field(None, ge=0, description="Capacity or allowed value (total bytes or inodes, expected interval).")
    used_fraction: float | None = Field(None, ge=0, description="used / limit, when both are known.")
    rate_per_s: float | None = Field(None, description="Trend of ``used`` per second over the watchdog's window.")
    time_to_limit_s: float | None = Field(None, ge=0, description="Estimated seconds until ``used`` reaches ``limit`` at that rate.")
