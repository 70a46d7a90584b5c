"""The versioned envelope every event carries."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar

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

# -- bounds the history tables need ---------------------------------------------------------------
# Every int column is ClickHouse Int64: a value past it is refused when decoded, not by the
# store (where one row would fail its whole batch). Bounds are pydantic-core constraints,
# checked in Rust at no measurable cost; patterns use its Rust regex engine, whose ``$``
# is the end of the text (Python's ``re`` also matches ``$`` before a trailing newline).

#: The largest (and, negated minus one, the smallest) value of an Int64 column.
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
#: Kafka partitions and offsets: int32 and int64 in the protocol.
INT32_MAX = 2**31 - 1

#: What a name (cluster, node, job) may look like: host names, Slurm job ids, Kubernetes
#: object names, ``user@host``. No spaces, control, bidi or non-ASCII characters, no shell
#: or Slurm set syntax (``,`` ``[`` ``]`` ``*`` ``;``), no leading ``-`` (an option to a
#: command). The actuator applies its own, narrower, rule before a name reaches argv.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+=-]*$"
NAME_MAX = 256

#: Characters no label may hold: C0/C1 controls and DEL, and the Unicode bidi controls
#: (embeddings, overrides, isolates, marks) that make text read differently from what it is.
#: Written with \\uXXXX escapes, which the Rust, Python and ECMAScript engines all read.
FORBIDDEN_CLASS = r"\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
#: A label (a process group, a device, a detector or failure kind, a counter's name): any
#: printable text up to :data:`LABEL_MAX` characters without those.
LABEL_PATTERN = f"^[^{FORBIDDEN_CLASS}]*$"
LABEL_MAX = 256

#: A name, a label, an Int64 and a non-negative Int64, for use inside containers
#: (``list[Name]``, ``dict[Label, Count]``); a plain field says the same with ``Field(...)``.
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
Label = Annotated[str, Field(min_length=1, max_length=LABEL_MAX, pattern=LABEL_PATTERN)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


def name_field(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A field holding one name (see :data:`NAME_PATTERN`)."""
    return Field(default, min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN, description=description, **kw)


def label_field(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A field holding one label (see :data:`LABEL_PATTERN`)."""
    kw.setdefault("min_length", 1)
    kw.setdefault("max_length", LABEL_MAX)
    return Field(default, pattern=LABEL_PATTERN, description=description, **kw)


def time_field(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A field holding an aware time within [:data:`EARLIEST`, :data:`LATEST`]."""
    return Field(default, ge=EARLIEST, le=LATEST, description=description, **kw)


class Source(Frozen):
    """Where an event came from. Fields that do not apply stay unset."""

    cluster: str = Field("default", min_length=1, max_length=128, pattern=NAME_PATTERN, description="Cluster name.")
    node: str | None = name_field(None, "Host name of the node.")
    job: str | None = name_field(None, "Training job id.")
    rank: int | None = Field(None, ge=0, le=INT64_MAX, description="Global rank of the training process.")
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
