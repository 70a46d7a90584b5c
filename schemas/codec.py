"""Bytes <-> events.

A Kafka message carries one event (a JSON object) or a batch of events (a JSON
array), so that high-rate producers can amortize per-message overhead. Each
item of a batch is validated on its own: one bad item is reported with its own
bytes and does not take its neighbours down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from pydantic import ValidationError

from schemas.envelope import Envelope
from schemas.errors import DecodeError
from schemas.events import EVENT_TYPES


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


def decode(raw: bytes | None) -> Decoded:
    """Decode a message value into events; never raises for bad input."""
    out = Decoded()
    if raw is None:
        out.errors.append(DecodeError("empty", "message has no value", b""))
        return out
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        out.errors.append(DecodeError("not_json", f"not valid UTF-8 JSON: {exc}", raw))
        return out
    except RecursionError:
        out.errors.append(DecodeError("not_json", "JSON nested too deeply to parse", raw))
        return out
    items = parsed if isinstance(parsed, list) else [parsed]
    single = not isinstance(parsed, list)
    for index, item in enumerate(items):
        item_raw = raw if single else json.dumps(item).encode()
        try:
            out.events.append(decode_event(item, item_raw))
        except DecodeError as err:
            err.index = index
            out.errors.append(err)
    return out
