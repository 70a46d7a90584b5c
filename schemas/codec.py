"""Bytes <-> events.

A Kafka message carries one event (a JSON object) or a batch of events (a JSON
array), so that high-rate producers can amortize per-message overhead. Each
item of a batch is validated on its own: one bad item is reported with its own
bytes and does not take its neighbours down.

Decoding is strict about what a producer says:

* **types**: JSON is validated as JSON (pydantic's strict mode): ``"version":
  "1"``, ``"seq": true`` or ``"interval_s": "1.0"`` are refused, never
  coerced (an integer is still taken where a float is expected);
* **per topic**: given ``accept`` (the event types of the topic the message
  was read from, :func:`vigil.schemas.topics.topic_accepts`), an item of any
  other type is refused with the reason ``wrong_topic``;
* **identity**: an item without ``event_id`` gets one derived from its
  content (:func:`content_id`: a UUIDv5 of its canonical JSON), so a
  redelivered or replayed message is the same event and is stored once; an
  explicit ``"event_id": null`` is refused. A missing ``version`` is refused,
  never guessed.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Collection, Iterable, Union

from pydantic import Field, TypeAdapter, ValidationError

from vigil.schemas.envelope import Envelope
from vigil.schemas.errors import DecodeError
from vigil.schemas.events import EVENT_TYPES

#: Namespace of the ids derived from content (:func:`content_id`).
CONTENT_ID_NAMESPACE = uuid.UUID("3d0c6f2a-9a7e-4f44-b1c5-8a0e2e6c4b71")


@dataclass
class Decoded:
    """What came out of one message: the good events and the failed items."""

    events: list[Envelope] = field(default_factory=list)
    errors: list[DecodeError] = field(default_factory=list)


def encode(event: Envelope) -> bytes:
    return event.model_dump_json(exclude_none=True).encode()


def encode_batch(events: Iterable[Envelope]) -> bytes:
    return b"[" + b",".join(encode(e) for e in events) + b"]"


def content_id(obj: dict[str, Any]) -> uuid.UUID:
    """The id of an event that came without one: the UUIDv5, in :data:`CONTENT_ID_NAMESPACE`, of its
    canonical JSON (every key but ``event_id``, keys sorted, no whitespace, non-ASCII kept as UTF-8).

    Two messages with the same content are the same event; any difference (a
    sequence number, a time) makes another.

    >>> content_id({"event_type": "heartbeat", "seq": 1}) == content_id({"seq": 1, "event_type": "heartbeat"})
    True
    >>> content_id({"event_type": "heartbeat", "seq": 1}) == content_id({"event_type": "heartbeat", "seq": 2})
    False
    """
    body = {k: v for k, v in obj.items() if k != "event_id"}
    return uuid.uuid5(CONTENT_ID_NAMESPACE, json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def decode_event(obj: object, raw: bytes, accept: Collection[str] | None = None) -> Envelope:
    """Validate one parsed JSON value as an event; ``raw`` is kept on failure.

    ``accept``: the event types allowed here (None: any).
    """
    if not isinstance(obj, dict):
        raise DecodeError("not_an_object", f"expected a JSON object, got {type(obj).__name__}", raw)
    event_type = obj.get("event_type")
    model = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        raise DecodeError(
            "unknown_event_type",
            f"event_type {str(event_type)[:100]!r} is not one of {sorted(EVENT_TYPES)}",
            raw,
            field="event_type",
        )
    if accept is not None and event_type not in accept:
        raise DecodeError(
            "wrong_topic",
            f"a {event_type} event does not belong on this topic (it holds {', '.join(sorted(accept)) or 'no vigil events'})",
            raw,
            field="event_type",
        )
    version = obj.get("version")
    if type(version) is not int or version not in model.SUPPORTED_VERSIONS:
        raise DecodeError(
            "unsupported_version",
            f"{event_type} version {str(version)[:40]!r} is not one this code reads ({list(model.SUPPORTED_VERSIONS)}); "
            "upgrade the consumer rather than guess",
            raw,
            field="version",
        )
    if "event_id" not in obj:
        obj = {**obj, "event_id": str(content_id(obj))}
    try:
        # As JSON, strictly: no string or bool becomes a number (a JSON string is still a time or an id).
        return model.model_validate_json(json.dumps(obj), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise DecodeError(
            "invalid",
            f"{event_type}: {first['msg'][:500]} at {(where or 'top level')[:200]} ({exc.error_count()} error(s))",
            raw,
            field=where[:200] if where else None,
        ) from None
    except ValueError as exc:  # e.g. a float the encoder cannot write back (inf from 1e400)
        raise DecodeError("invalid", f"{event_type}: {str(exc)[:300]}", raw) from None


_TYPE_MARK = re.compile(rb'"event_type"\s*:\s*"([a-z_]+)"')


def _fast(raw: bytes, accept: Collection[str] | None = None) -> list[Envelope] | None:
    """Validate a message of known event types straight from its bytes.

    pydantic's core parses and validates the JSON in one pass, several times
    faster than json.loads + per-item validation; a batch of several types (a
    node's samples) goes through a union discriminated by ``event_type``: the
    types of ``accept`` (the topic's), else those the bytes name. Returns None
    when the message is not of that shape or anything in it fails, when an
    item did not state its own ``event_type``, ``event_id`` and ``version`` (a
    default must not stand in for them: what the validator saw set is what
    counts, as a marker in the bytes could sit in a nested object), or when an
    item is not of a type in ``accept``: the slow path then finds which items
    are bad and why.
    """
    if accept:
        models = _models(frozenset(accept))
        if models is None:
            return None
    else:
        types = set(_TYPE_MARK.findall(raw))
        if not types:
            return None
        found = [EVENT_TYPES.get(t.decode()) for t in types]
        if None in found:
            return None
        models = tuple(sorted(found, key=lambda m: m.__name__))  # type: ignore[union-attr]
    first = raw[:1]
    if first in _BLANK:
        first = raw.lstrip()[:1]
    try:
        # the adapters' own validators: TypeAdapter.validate_json's Python wrapper cost ~7 % of a node's message
        if first == b"[":
            events = _list_adapter(models).validator.validate_json(raw, strict=True)
        else:
            events = [_one_adapter(models).validator.validate_json(raw, strict=True)]
    except (ValidationError, ValueError):
        return None
    if not events:
        return None  # an empty batch: the slow path says so
    for event in events:  # one pass, set operations in C: this runs for every record of the hot topics
        if not _STATED <= event.model_fields_set or (accept is not None and event.event_type not in accept):  # type: ignore[attr-defined]
            return None
    return events


#: What every item must have stated itself (see :func:`_fast`).
_STATED = frozenset({"event_type", "event_id", "version"})


_BLANK = (b" ", b"\t", b"\n", b"\r")


@functools.lru_cache(maxsize=64)
def _models(accept: frozenset[str]) -> tuple[type[Envelope], ...] | None:
    """The models of the event types in ``accept`` (None when one is not an event type)."""
    found = [EVENT_TYPES.get(t) for t in accept]
    return None if None in found else tuple(sorted(found, key=lambda m: m.__name__))  # type: ignore[union-attr]


@functools.lru_cache(maxsize=64)
def _list_adapter(models: tuple[type[Envelope], ...]) -> TypeAdapter:
    if len(models) == 1:
        return TypeAdapter(list[models[0]])  # type: ignore[valid-type]
    union = Annotated[Union[models], Field(discriminator="event_type")]  # type: ignore[valid-type]
    return TypeAdapter(list[union])  # type: ignore[valid-type]


@functools.lru_cache(maxsize=64)
def _one_adapter(models: tuple[type[Envelope], ...]) -> TypeAdapter:
    if len(models) == 1:
        return TypeAdapter(models[0])
    return TypeAdapter(Annotated[Union[models], Field(discriminator="event_type")])  # type: ignore[valid-type]


def decode(raw: bytes | None, accept: Collection[str] | None = None) -> Decoded:
    """Decode a message value into events; never raises for bad input.

    ``accept``: the event types of the topic the message was read from
    (:func:`vigil.schemas.topics.topic_accepts`); an item of another type is
    an error with the reason ``wrong_topic``. None accepts every type (a
    reader that subscribed to what it wants, say).
    """
    out = Decoded()
    if raw is None:
        out.errors.append(DecodeError("empty", "message has no value", b""))
        return out
    try:
        fast = _fast(raw, accept)
    except RecursionError:
        fast = None
    if fast is not None:
        out.events = fast
        return out
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        out.errors.append(DecodeError("not_json", f"not valid UTF-8 JSON: {str(exc)[:300]}", raw))
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
            try:
                out.events.append(decode_event(item, raw if single else b"", accept))
            except RecursionError:
                raise DecodeError("not_json", "JSON nested too deeply to validate", raw if single else b"") from None
        except DecodeError as err:
            err.index = index
            if not single:  # the item's own bytes, made only for the bad ones
                err.raw = _item_bytes(item)
            out.errors.append(err)
    return out


def _item_bytes(item: object) -> bytes:
    try:
        return json.dumps(item).encode()
    except (RecursionError, ValueError):
        return repr(item)[:100_000].encode(errors="replace")
