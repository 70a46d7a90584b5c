"""The versioned envelope every event carries."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, ClassVar

from annotated_types import Ge, Le
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


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

    # The version and the time are bounded by constraints that pydantic's core checks
    # itself: a Python validator per event cost a quarter of the sink's validation.
    # (Other values ClickHouse cannot hold, an int past 64 bits say, are refused one
    # by one by the history sink, which dead-letters them: checking every field here
    # costs more than parsing.)
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="Unique id of this event.")
    version: int = Field(1, ge=min(SUPPORTED_VERSIONS), le=max(SUPPORTED_VERSIONS),
                         description="Schema version of this event type.")
    event_time: AwareDatetime = Field(ge=EARLIEST, le=LATEST,
                                      description="When the event happened (UTC, timezone-aware).")
    source: Source = Field(default_factory=Source, description="Where the event came from.")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """An event type that reads other versions redeclares ``version`` with bounds to match."""
        super().__pydantic_init_subclass__(**kwargs)
        constraints = cls.model_fields["version"].metadata
        low = next((c.ge for c in constraints if isinstance(c, Ge)), None)
        high = next((c.le for c in constraints if isinstance(c, Le)), None)
        if low is None or high is None or set(range(low, high + 1)) != set(cls.SUPPORTED_VERSIONS):
            raise TypeError(f"{cls.__name__}.version must be bounded to SUPPORTED_VERSIONS "
                            f"{list(cls.SUPPORTED_VERSIONS)} (ge=, le=), not {low}..{high}")
