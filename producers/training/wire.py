"""How training processes hand their records to the node: compact records and sinks.

The hot path inside a training process only appends tuples to a list; at a
step boundary (or every ``flush_interval_s``) the list leaves the process as
one datagram of compact JSON::

    {"s": {"cluster": .., "node": .., "job": .., "rank": .., "gpu": ..},
     "r": [["it", step, start, end, compute_s, comm_s, dp, pp, tp, wait_s, by_kind, measured(, config_change)],
           ["cc", op, group, nbytes, start, end],
           ["ex", category, exc_type, message, traceback, thread, t],
           ["ck", phase, step, t, duration_s],
           ["bye", pid, t],
           ["dr", count, reason, t],
           ["fr", t, {trigger, available, ..., groups, entries}]]}

(``it`` records of nine fields, without the last three, are read too: hooks
before ``wait_s``; a thirteenth, ``config_change``, comes only on the step a
change of configuration was announced for, so hooks that announce none send
what a node agent before that field reads.)

Times are seconds since the epoch (``time.time()``). The node batcher
(:mod:`vigil.producers.training.batching`) turns records into events with
:func:`records_to_events`, so validation and encoding cost the node agent's
CPU, not the training step's.

Sinks: :class:`UnixDatagramSink` (to the node batcher's socket),
:class:`PublisherSink` (straight to a :class:`~vigil.producers.publisher.Publisher`,
for a process without a node agent) and :class:`CallbackSink` (tests).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from vigil.schemas import (
    Checkpoint, CollectiveCall, Envelope, IterationTiming, ProcessExit, Source, TrainingException, from_seconds,
)
from vigil.schemas.events import CollectiveOp, EventsDropped, FlightRecorderDump

log = logging.getLogger(__name__)

__all__ = ["records_to_events", "encode_datagram", "decode_datagram", "Sink", "UnixDatagramSink",
           "PublisherSink", "CallbackSink", "MAX_DATAGRAM"]

#: Largest datagram a sink sends (records are split across datagrams above it).
MAX_DATAGRAM = 60_000
_OPS = {op.value for op in CollectiveOp}


def encode_datagram(source: dict[str, Any], records: Sequence[Sequence[Any]]) -> bytes:
    return json.dumps({"s": source, "r": records}, separators=(",", ":")).encode()


def decode_datagram(data: bytes) -> tuple[dict[str, Any], list[list[Any]]]:
    obj = json.loads(data)
    if not isinstance(obj, dict) or not isinstance(obj.get("s"), dict) or not isinstance(obj.get("r"), list):
        raise ValueError("a hook datagram is a JSON object with 's' (source) and 'r' (records)")
    return obj["s"], obj["r"]


def records_to_events(source: dict[str, Any], records: Iterable[Sequence[Any]]) -> tuple[list[Envelope], list[str]]:
    """Events from one datagram's records; bad records are returned as error strings, not raised."""
    src = Source(**{k: v for k, v in source.items() if v is not None})
    events: list[Envelope] = []
    errors: list[str] = []
    for rec in records:
        try:
            kind = rec[0]
            if kind == "it":
                _, step, start, end, compute_s, comm_s, dp, pp, tp, *more = rec
                change = None
                if len(more) == 4:
                    wait_s, by_kind, measured, change = more
                elif len(more) == 3:
                    wait_s, by_kind, measured = more
                elif not more:
                    wait_s = by_kind = measured = None
                else:
                    raise ValueError(f"an 'it' record has 9, 12 or 13 fields, got {len(rec)}")
                events.append(IterationTiming(
                    event_time=from_seconds(end), source=src, step=step, start=from_seconds(start),
                    end=from_seconds(max(end, start)), duration_s=max(0.0, end - start),
                    compute_s=None if compute_s is None else max(0.0, compute_s),
                    communication_s=None if comm_s is None else max(0.0, comm_s), dp=dp, pp=pp, tp=tp,
                    wait_s=None if wait_s is None else max(0.0, wait_s),
                    communication_by_kind={k: max(0.0, v) for k, v in (by_kind or {}).items()},
                    measured=measured or {}, config_change=change,
                ))
            elif kind == "fr":
                _, t, payload = rec
                events.append(FlightRecorderDump(event_time=from_seconds(t), source=src, **payload))
            elif kind == "cc":
                _, op, group, nbytes, start, end = rec
                events.append(CollectiveCall(
                    event_time=from_seconds(end), source=src, op=op if op in _OPS else "other", group=group,
                    nbytes=nbytes, start=from_seconds(start), end=from_seconds(max(end, start)),
                ))
            elif kind == "ex":
                _, category, exc_type, message, tb, thread, t = rec
                events.append(TrainingException(
                    event_time=from_seconds(t), source=src, category=category, exc_type=exc_type,
                    message=message, traceback=tb, thread=thread,
                ))
            elif kind == "bye":  # the training loop ended: the process is about to exit cleanly
                _, pid, t = rec
                events.append(ProcessExit(event_time=from_seconds(t), source=src, pid=pid, exit_code=0,
                                          command="training loop ended (announced by the hooks)"))
            elif kind == "ck":
                _, phase, step, t, duration = rec
                events.append(Checkpoint(event_time=from_seconds(t), source=src, step=step, phase=phase,
                                         duration_s=None if duration is None else max(0.0, duration)))
            elif kind == "dr":
                _, count, reason, t = rec
                events.append(EventsDropped(
                    event_time=from_seconds(t), source=src, count=count, messages=0, reason=reason,
                    component="training.hooks",
                ))
            else:
                errors.append(f"unknown record kind {kind!r}")
        except Exception as exc:  # one bad record does not take its neighbours down
            errors.append(f"{rec[:1]!r}: {exc}")
    return events, errors


class Sink:
    """Where a training process sends its records."""

    def send(self, source: dict[str, Any], records: list[list[Any]], urgent: bool = False) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CallbackSink(Sink):
    """Calls ``fn(events)`` (tests, or an in-process consumer)."""

    def __init__(self, fn: Callable[[list[Envelope]], None]) -> None:
        self.fn = fn

    def send(self, source: dict[str, Any], records: list[list[Any]], urgent: bool = False) -> None:
        events, errors = records_to_events(source, records)
        for e in errors:
            log.warning("bad hook record: %s", e)
        self.fn(events)


class PublisherSink(Sink):
    """Publishes straight to Kafka, batched by event type and key (no node agent)."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher

    def send(self, source: dict[str, Any], records: list[list[Any]], urgent: bool = False) -> None:
        from vigil.schemas import message_key

        events, errors = records_to_events(source, records)
        for e in errors:
            log.warning("bad hook record: %s", e)
        groups: dict[tuple[str, bytes], list[Envelope]] = {}
        for ev in events:
            groups.setdefault((ev.event_type, message_key(ev)), []).append(ev)  # type: ignore[attr-defined]
        for group in groups.values():
            self.publisher.publish(group)
        if urgent:
            self.publisher.flush(5.0)
        else:
            self.publisher.poll(0)


class UnixDatagramSink(Sink):
    """Sends datagrams to the node batcher's Unix socket, never blocking the training step.

    If the batcher is not there (or its queue is full) datagrams wait in a
    bounded queue (``max_pending``) and go with the next send; beyond it the
    oldest are dropped and counted, and the count is sent as a ``dr`` record
    once the batcher answers again (published as ``events_dropped``).
    """

    def __init__(self, path: str, max_pending: int = 1024) -> None:
        self.path = path
        self.max_pending = max_pending
        self._pending: deque[bytes] = deque()
        self._dropped = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._warned = False

    def send(self, source: dict[str, Any], records: list[list[Any]], urgent: bool = False) -> None:
        chunks = _split(source, records) if records else []
        with self._lock:
            if self._pending or self._dropped:
                self._drain(source, urgent)  # what waits goes first (and may make room)
            self._pending.extend(chunks)
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self._dropped += 1
            self._drain(source, urgent)

    def _drain(self, source: dict[str, Any], urgent: bool) -> None:
        if self._dropped:
            import time

            note = encode_datagram(source, [["dr", self._dropped, "hook_buffer_full", time.time()]])
            if self._send_one(note, urgent):
                self._dropped = 0
        while self._pending:
            if not self._send_one(self._pending[0], urgent):
                return
            self._pending.popleft()

    def _send_one(self, data: bytes, urgent: bool) -> bool:
        try:
            if urgent:
                self._sock.settimeout(2.0)
            self._sock.sendto(data, self.path)
            return True
        except (BlockingIOError, InterruptedError, socket.timeout):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN, errno.ENOBUFS):
                if not self._warned:
                    log.warning("no node batcher at %s (%s): hook records wait in memory", self.path, exc.strerror)
                    self._warned = True
                return False
            raise
        finally:
            if urgent:
                self._sock.setblocking(False)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._sock.close()


def _split(source: dict[str, Any], records: list[list[Any]]) -> list[bytes]:
    data = encode_datagram(source, records)
    if len(data) <= MAX_DATAGRAM or len(records) <= 1:
        if len(data) > MAX_DATAGRAM:  # one huge record (a traceback): cut its text fields
            rec = [r[:2000] if isinstance(r, str) else r for r in records[0]]
            data = encode_datagram(source, [rec])
        return [data]
    mid = len(records) // 2
    return _split(source, records[:mid]) + _split(source, records[mid:])
