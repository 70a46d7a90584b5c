"""ClickHouse tables for the history, derived from the event models.

One table per event type (a node's GPU samples in columns are stored as the
rows of the per-GPU samples, :data:`STORED_AS`). Columns are the envelope (``source`` flattened),
then the payload: nested models are flattened with their field name as prefix,
dicts and lists are stored as JSON strings. Deriving the DDL from the models
means a new field can never be forgotten by the history.

Tables are ``ReplacingMergeTree`` with ``event_id`` last in the sort key, so
even a duplicate that slipped past the sink's id check collapses on merge; the
sink itself checks ids before inserting, so the stored rows are exact.
"""

from __future__ import annotations

import enum
import functools
import json
import types
import typing
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from operator import attrgetter, itemgetter
from typing import Any, Callable, Literal

from pydantic import BaseModel

from vigil.schemas.envelope import Envelope
from vigil.schemas.events import EVENT_TYPES


@dataclass(frozen=True)
class TableSpec:
    event_type: str
    table: str
    order_by: tuple[str, ...]
    #: The time that partitions the table and bounds the sink's duplicate check.
    time_column: str = "event_time"
    #: Raw telemetry: high volume, partitioned by day so that a retention TTL
    #: drops whole parts; everything else (incidents, decisions, state) by month.
    telemetry: bool = False

    @property
    def partition_by(self) -> str:
        return f"toYYYYMMDD({self.time_column})" if self.telemetry else f"toYYYYMM({self.time_column})"

    def ttl_clause(self, days: int | None) -> str:
        """The TTL of a telemetry table kept ``days`` days (None or 0: kept forever)."""
        if not days or not self.telemetry:
            return ""
        return f"toDateTime({self.time_column}) + toIntervalDay({int(days)})"


TABLE_SPECS: dict[str, TableSpec] = {
    s.event_type: s
    for s in (
        TableSpec("iteration", "iterations", ("job", "event_time", "rank", "event_id"), telemetry=True),
        TableSpec("iteration_step", "iteration_steps", ("job", "event_time", "event_id"), telemetry=True),
        TableSpec("collective", "collectives", ("job", "event_time", "event_id"), telemetry=True),
        TableSpec("xid", "xid_errors", ("node", "event_time", "event_id")),
        TableSpec("nic_counters", "nic_counters", ("node", "device", "port", "event_time", "event_id"), telemetry=True),
        TableSpec("gpu_telemetry", "gpu_telemetry", ("node", "gpu", "event_time", "event_id"), telemetry=True),
        TableSpec("heartbeat", "heartbeats", ("node", "event_time", "event_id"), telemetry=True),
        TableSpec("process_exit", "process_exits", ("node", "event_time", "event_id")),
        TableSpec("training_exception", "training_exceptions", ("job", "event_time", "event_id")),
        TableSpec("job_state", "job_states", ("job", "event_time", "event_id")),
        TableSpec("node_state", "node_states", ("node", "event_time", "event_id")),
        TableSpec("finding", "findings", ("kind", "onset_time", "event_id"), "onset_time"),
        # onset_time, not detection_time: a restarted worker re-emits an alert with
        # the same id and onset but a later detection time.
        TableSpec("alert", "alerts", ("kind", "incident_id", "incident_version", "event_id"), "onset_time"),
        TableSpec("decision", "decisions", ("event_time", "decision_id", "event_id")),
        TableSpec("action_result", "actions", ("decision_id", "event_time", "event_id")),
        TableSpec("dead_letter", "dead_letters", ("source_topic", "event_time", "event_id")),
        TableSpec("agent_health", "agent_health", ("node", "collector", "event_time", "event_id")),
        TableSpec("events_dropped", "events_dropped", ("node", "event_time", "event_id")),
        TableSpec("watchdog", "watchdog_reports", ("node", "check", "event_time", "event_id")),
        TableSpec("checkpoint", "checkpoints", ("job", "event_time", "event_id")),
        TableSpec("flight_recorder_dump", "flight_recorder_dumps", ("job", "event_time", "rank", "event_id")),
    )
}


#: Event types stored as another's rows: a node's GPU samples in columns are one row per GPU in the GPU
#: telemetry table (the history's SQL does not tell the two forms apart).
STORED_AS: dict[str, str] = {"gpu_samples": "gpu_telemetry"}


def as_stored(events: list[Envelope], views: bool = False) -> list[Any]:
    """``events`` as the history stores them: each :class:`~vigil.schemas.GpuSamples` as its GPUs'
    samples (ids per GPU, the same for every delivery), the rest as they are. ``views``: the GPUs'
    samples as light :class:`~vigil.schemas.events.GpuRow` views (enough for :func:`column_values`),
    not as models (what a dead letter needs)."""
    if not any(e.event_type in STORED_AS for e in events):  # type: ignore[attr-defined]
        return events
    out: list[Any] = []
    for e in events:
        if e.event_type in STORED_AS:  # type: ignore[attr-defined]
            if views:
                rows = e.rows()  # type: ignore[attr-defined]
                for row in rows:
                    row.event_id  # noqa: B018 - made on first read; column_values reads the row's __dict__
                out += rows
            else:
                out += e.telemetry()  # type: ignore[attr-defined]
        else:
            out.append(e)
    return out


def _same(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class Column:
    name: str
    ch_type: str
    #: The column's value for one event.
    getter: Callable[[Envelope], Any]
    #: Field names from the event to the value (through nested models).
    path: tuple[str, ...] = ()
    #: Whether a nested model on the way may be None (the value is then None).
    optional_parent: bool = False
    #: The value's conversion for ClickHouse (``_same``: none); not applied to None.
    convert: Callable[[Any], Any] = _same


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


_EMPTY_JSON = {dict: "{}", list: "[]"}


def _json_default(v: Any) -> Any:
    # A nested model (an alert's slowdowns) as its JSON object, not its repr; the rest (UUIDs, times) as text.
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else str(v)


def _to_json(v: Any) -> str:
    # Empty containers are most of them (no NVLink errors, no evidence): skip the encoder.
    if not v and type(v) in (dict, list):
        return "{}" if type(v) is dict else "[]"
    return json.dumps(v, default=_json_default, separators=(",", ":"))


def _plain(annotation: Any) -> Any:
    """``Annotated[int, <bounds>]`` -> ``int``: bounds do not change the column's type."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def _base_type(annotation: Any) -> tuple[str, Callable[[Any], Any]]:
    """ClickHouse type and value converter for a (non-optional) annotation."""
    annotation = _plain(annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "Bool", _same
    if annotation is int:
        return "Int64", _same
    if annotation is float:
        return "Float64", _same
    if annotation is str:
        return "String", _same
    if annotation is uuid.UUID:
        return "UUID", _same
    if isinstance(annotation, type) and issubclass(annotation, datetime) or "Datetime" in str(annotation):
        return "DateTime64(6, 'UTC')", _same
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "LowCardinality(String)", lambda v: v.value if isinstance(v, enum.Enum) else v
    if origin is Literal:
        return "LowCardinality(String)", _same
    item = _plain(typing.get_args(annotation)[0]) if origin is list and typing.get_args(annotation) else None
    if item in (int, float, str, uuid.UUID):
        # Columns of plain values are ClickHouse arrays (ARRAY JOIN gives rows back).
        inner = {int: "Int64", float: "Float64", str: "String", uuid.UUID: "UUID"}[item]
        return f"Array({inner})", list
    if origin in (dict, list) or annotation is typing.Any:
        return "String", _to_json
    raise TypeError(f"no ClickHouse type for annotation {annotation!r}")


def _columns_of(model: type[BaseModel], prefix: str, path: tuple[str, ...],
                optional_path: tuple[bool, ...] = ()) -> list[Column]:
    cols: list[Column] = []
    for fname, finfo in model.model_fields.items():
        annotation, optional = _unwrap_optional(finfo.annotation)
        fpath = path + (fname,)
        fopt = optional_path + (optional,)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            # ``source`` is flattened without prefix: its fields are the envelope's columns.
            sub_prefix = "" if fname == "source" else f"{prefix}{fname}_"
            cols.extend(_columns_of(annotation, sub_prefix, fpath, fopt))
            continue
        ch_type, convert = _base_type(annotation)
        if optional:
            ch_type = (
                "LowCardinality(Nullable(String))"
                if ch_type == "LowCardinality(String)" or ch_type == "String" and fname in _LOW_CARD
                else f"Nullable({ch_type})"
            )
        elif fname in _LOW_CARD and ch_type == "String":
            ch_type = "LowCardinality(String)"

        def getter(event: Any, _path: tuple[str, ...] = fpath, _convert: Callable = convert) -> Any:
            value = event
            for part in _path:
                value = getattr(value, part)
                if value is None:
                    return None
            return _convert(value)

        cols.append(Column(prefix + fname, ch_type, getter, fpath, any(optional_path), convert))
    return cols


# Small sets of repeated values: dictionary-encoded.
_LOW_CARD = {"cluster", "node", "job", "event_type", "kind", "backend", "device", "group", "source_topic", "reason", "category", "exc_type",
             "collector", "check", "component", "target"}


def columns(event_type: str) -> list[Column]:
    return _COLUMNS[event_type]


_COLUMNS: dict[str, list[Column]] = {et: _columns_of(m, "", ()) for et, m in EVENT_TYPES.items()}


def create_table_sql(event_type: str, database: str = "vigil", ttl_days: int | None = None,
                     table: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for an event type (``table`` overrides the name, for rebuilds)."""
    spec = TABLE_SPECS[event_type]
    cols = ",\n    ".join(f"`{c.name}` {c.ch_type}" for c in columns(event_type))
    nullable = {c.name for c in columns(event_type) if c.ch_type.startswith(("Nullable", "LowCardinality(Nullable"))}
    # Nullable columns cannot be in a sort key by default; allow it explicitly.
    settings = ["allow_nullable_key = 1"] if nullable & set(spec.order_by) else []
    ttl = spec.ttl_clause(ttl_days)
    if ttl:
        settings.append("ttl_only_drop_parts = 1")  # expire whole daily parts, never rewrite them
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{table or spec.table} (\n    {cols},\n"
        f"    `ingest_time` DateTime64(3, 'UTC') DEFAULT now64(3)\n)\n"
        f"ENGINE = ReplacingMergeTree\nPARTITION BY {spec.partition_by}\n"
        f"ORDER BY ({', '.join(spec.order_by)})"
        + (f"\nTTL {ttl}" if ttl else "")
        + (f" SETTINGS {', '.join(settings)}" if settings else "")
    )


def rows(event_type: str, events: list[Envelope]) -> tuple[list[str], list[list[Any]]]:
    """Column names and row values for inserting ``events`` (all of one type)."""
    cols = columns(event_type)
    return [c.name for c in cols], [[c.getter(e) for c in cols] for e in events]


def column_values(event_type: str, events: list[Envelope]) -> tuple[list[str], list[list[Any]]]:
    """Column names and column values (one list per column) for a column-oriented insert of ``events``.

    The values of :func:`rows`, several times faster: the fields of each model
    (the event, then each nested model) are read from its ``__dict__`` all at
    once and transposed into columns by C code; only columns that need it are
    converted, value by value. Times (aware datetimes, as the models hold them)
    are given as integer microseconds since the epoch.
    """
    cols = columns(event_type)
    out: list[list[Any]] = [[] for _ in cols]
    if not events:
        return [c.name for c in cols], out
    for (parent, optional_parent), members in _column_groups(event_type).items():
        if not parent:
            dicts = list(map(_DICT, events))
        elif not optional_parent:
            dicts = list(map(attrgetter(".".join(parent) + ".__dict__"), events))
        else:
            models: list[Any] = events
            for part in parent:
                get = attrgetter(part)
                models = [None if m is None else get(m) for m in models]
            dicts = [_ALL_NONE if m is None else m.__dict__ for m in models]
        leaves = [cols[i].path[-1] for i in members]
        if len(leaves) == 1:
            values_by_column: Any = [list(map(itemgetter(leaves[0]), dicts))]
        else:
            values_by_column = map(list, zip(*map(itemgetter(*leaves), dicts)))
        for i, values in zip(members, values_by_column):
            convert = cols[i].convert
            if cols[i].ch_type.startswith(_TICKS_TYPES):
                # Integer ticks: clickhouse-connect converts a datetime in Python several times slower.
                out[i] = [None if v is None else (v - _EPOCH) // _MICROSECOND for v in values]
            elif convert is _to_json:
                # Most are empty (no NVLink errors, no evidence): no call for those.
                out[i] = [v if v is None else _EMPTY_JSON[type(v)] if not v and type(v) in _EMPTY_JSON else _to_json(v)
                          for v in values]
            else:
                out[i] = values if convert is _same else [None if v is None else convert(v) for v in values]
    return [c.name for c in cols], out


_TICKS_TYPES = ("DateTime64(6, 'UTC')", "Nullable(DateTime64(6, 'UTC'))")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


_DICT = attrgetter("__dict__")
_ALL_NONE: dict[str, None] = defaultdict(type(None))  # the fields of a nested model that is None


@functools.lru_cache(maxsize=None)
def _column_groups(event_type: str) -> dict[tuple[tuple[str, ...], bool], list[int]]:
    """Column indexes by the model that holds them: (path to it, may it be None)."""
    groups: dict[tuple[tuple[str, ...], bool], list[int]] = {}
    for i, col in enumerate(columns(event_type)):
        groups.setdefault((col.path[:-1], col.optional_parent), []).append(i)
    return groups


def table_name(event_type: str, database: str = "vigil") -> str:
    return f"{database}.{TABLE_SPECS[event_type].table}"
