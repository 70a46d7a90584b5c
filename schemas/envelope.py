"""The versioned envelope every event carries."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator


def utcnow() -> datetime:
    """The current time as an aware UTC datetime (for the outer layers only)."""
    return datetime.now(timezone.utc)


def from_seconds(seconds: float) -> datetime:
    """Seconds since the epoch to an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def to_seconds(moment: datetime) -> float:
    """An aware datetime to seconds since the epoch (the detectors' time unit)."""
    return moment.timestamp()


class Frozen(BaseModel):
    """Immutable, strict about unknown fields; no inf/nan (no detector can use them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)



#: Times outside these years are input errors (and do not fit ClickHouse's DateTime64).
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)  # simulated clocks start at 0
LATEST = datetime(2261, 12, 31, tzinfo=timezone.utc)


def check_time(value: datetime) -> datetime:
    if not EARLIEST <= value <= LATEST:
        raise ValueError(f"{value.isoformat()} is outside {EARLIEST.year}..{LATEST.year}")
    return value


class Source(Frozen):
    """Where an event came from. Fields that do not apply stay unset."""

    cluster: str = Field("default", min_length=1, max_length=128, description="Cluster name.")
    node: str | None = Field(None, min_length=1, max_length=256, description="Host name of the node.")
    job: str | None = Field(None, min_length=1, max_length=256, description="Training job id.")
    rank: int | None = Field(None, ge=0, description="Global rank of the training process.")
    gpu: int | None = Field(None, ge=0, le=1023, description="GPU index on the node.")


class Envelope(Frozen):
    """Fields common to all events; subclasses add ``event_type`` and a payload.

    ``event_id`` is unique per event and is what every consumer deduplicates
    on, so a redelivered or replayed event is never counted twice.
    """

    #: Versions of this event's schema that this code can read.
    SUPPORTED_VERSIONS: ClassVar[tuple[int, ...]] = (1,)

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="Unique id of this event.")
    version: int = Field(1, description="Schema version of this event type.")
    event_time: AwareDatetime = Field(description="When the event happened (UTC, timezone-aware).")
    source: Source = Field(default_factory=Source, description="Where the event came from.")

    @field_validator("event_time")
    @classmethod
    def _plausible_time(cls, value: datetime) -> datetime:
        # Cheap, once per event. Other values ClickHouse cannot hold (an int past
        # 64 bits, a year 1) are refused one by one by the history sink, which
        # dead-letters them: checking every field here costs more than parsing.
        return check_time(value)

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version not in cls.SUPPORTED_VERSIONS:
            raise ValueError(f"version {version} is not one of {list(cls.SUPPORTED_VERSIONS)} that this code reads")
        return version
