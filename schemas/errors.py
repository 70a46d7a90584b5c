"""Errors raised while turning bytes into events.

Every decoding error keeps the raw bytes it failed on, so the caller can send
the record to the dead-letter topic without losing anything.
"""

from __future__ import annotations


class SchemaError(ValueError):
    """Root of the schema package's errors."""


class DecodeError(SchemaError):
    """A message (or one item of a batch) could not become an event.

    Attributes
    ----------
    reason:
        Short machine-readable class of failure: ``not_json``, ``not_an_object``,
        ``unknown_event_type``, ``unsupported_version``, ``invalid``.
    detail:
        Human-readable message: what failed, where, what was expected.
    field:
        Dotted path of the offending field when one is known.
    index:
        Position of the item within a batch message (0 for a single event).
    raw:
        The bytes that failed (the whole message, or the item's JSON).
    """

    def __init__(self, reason: str, detail: str, raw: bytes, field: str | None = None, index: int = 0) -> None:
        self.reason = reason
        self.index = index  # position within a batch message
        self.detail = detail
        self.raw = raw
        self.field = field
        where = f" (field {field})" if field else ""
        super().__init__(f"{reason}{where}: {detail}")
