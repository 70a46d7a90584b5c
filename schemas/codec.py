"""Bytes <-> events.

A Kafka message carries one event (a JSON object) or a batch of events (a JSON
array), so that high-rate producers can amortize per-message overhead. Each
item of a batch is validated on its own: one bad item is reported with its own
bytes and does not take its neighbours down.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Iterable, Union

from pydantic import Field, TypeAdapter, ValidationError

from vigil.schemas.envelope import Envelope
from vigil.schemas.errors import DecodeError
from vigil.schemas.events import EVENT_TYPES


@dataclass
class Decoded:
    """What came out of one message: the good events and the failed items."""

    events: list[Envelope] = field(default_factory=list)
    errors: list[DecodeError] = field(default_factory=list)


def encode(event: Envelope) -> bytes:
    return event.model_dump_json(exclude_none=True).encode()


def encode_batch(events: Iterable[Envelope]) -> bytes:
    return b"[" + b",".join(encode(e) for e in events) + b"]"


def decode_event(obj: object, raw: bytes) -> Envelope:
    """Validate one parsed JSON value as an event; ``raw`` is kept on failure."""
    if not isinstance(obj, dict):
        raise DecodeError("not_an_object", f"expected a JSON object, got {type(obj).__name__}", raw)
    event_type = obj.get("event_type")
    model = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        raise DecodeError(
            "unknown_event_type",
            f"event_type {event_type!r} is not one of {sorted(EVENT_TYPES)}",
            raw,
            field="event_type",
        )
    version = obj.get("version")
    if type(version) is not int or version not in model.SUPPORTED_VERSIONS:
        raise DecodeError(
            "unsupported_version",
            f"{event_type} version {version!r} is not one this code reads ({list(model.SUPPORTED_VERSIONS)}); "
            "upgrade the consumer rather than guess",
            raw,
            field="version",
        )
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise DecodeError(
            "invalid",
            f"{event_type}: {first['msg']} at {where or 'top level'} "
            f"({exc.error_count()} error(s))",
            raw,
            field=where,
        ) from None


_TYPE_MARK = re.compile(rb'"event_type"\s*:\s*"([a-z_]+)"')
_VERSION_MARK = re.compile(rb'"version"\s*:')


def _fast(raw: bytes) -> list[Envelope] | None:
    """Validate a message of known event types straight from its bytes.

    pydantic's core parses and validates the JSON in one pass, several times
    faster than json.loads + per-item validation; a batch of several types (a
    node's samples) goes through a union discriminated by ``event_type``.
    Returns None when the message is not of that shape or anything in it
    fails: the slow path then finds which items are bad and why.
    """
    marks = _TYPE_MARK.findall(raw)
    types = set(marks)
    # Every event states its version (a missing one is not guessed).
    if not types or len(_VERSION_MARK.findall(raw)) < len(marks):
        return None
    found = [EVENT_TYPES.get(t.decode()) for t in types]
    if None in found:
        return None
    models = tuple(sorted(found, key=lambda m: m.__name__))  # type: ignore[union-attr]
    try:
        if raw.lstrip()[:1] == b"[":
            events = _list_adapter(models).validate_json(raw)
            # Each item must have said its own type (the marker could sit inside a string).
            return events if len(events) == len(marks) else None
        if len(models) != 1:
            return None
        return [models[0].model_validate_json(raw)]
    except (ValidationError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _list_adapter(models: tuple[type[Envelope], ...]) -> TypeAdapter:
    if len(models) == 1:
        return TypeAdapter(list[models[0]])  # type: ignore[valid-type]
    union = Annotated[Union[models], Field(discriminator="event_type")]  # type: ignore[valid-type]
    return TypeAdapter(list[union])  # type: ignore[valid-type]


def decode(raw: bytes | None) -> Decoded:
    """Decode a message value into events; never raises for bad input."""
    out = Decoded()
    if raw is None:
        out.errors.append(DecodeError("empty", "message has no value", b""))
        return out
    try:
        fast = _fast(raw)
    except RecursionError:
        fast = None
    if fast is not None:
        out.events = fast
        return out
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        out.errors.append(DecodeError("not_json", f"not valid UTF-8 JSON: {exc}", raw))
        return out
    except RecursionError:
        out.errors.append(DecodeError("not_json", "JSON nested too deeply to parse", raw))
        return out
    single = not isinstance(parsed, list)
    if not single and not parsed:
        # Nothing to lose, but a producer that sends empty batches is broken: say so.
        out.errors.append(DecodeError("empty", "batch holds no events (an empty JSON array)", raw))
        return out
    items = [parsed] if single else parsed
    for index, item in enumerate(items):
        try:
            out.events.append(decode_event(item, raw if single else b""))
        except DecodeError as err:
            err.index = index
            if not single:  # the item's own bytes, made only for the bad ones
                err.raw = json.dumps(item).encode()
            out.errors.append(err)
    return out
