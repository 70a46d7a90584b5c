"""A bounded, append-only disk spool of Kafka messages for broker outages.

While the broker is unreachable the :class:`~vigil.producers.publisher.Publisher`
appends every message here; when the broker answers again it reads them back
from the head, in the order they were appended, and acknowledges them once
Kafka has confirmed their delivery. Downstream consumers deduplicate by event
id, so a message replayed twice (delivered, but the acknowledgement was lost
with the process) is never counted twice.

Layout of the spool directory::

    seg-00000000000000000001.log   segments, appended in order
    seg-00000000000000000002.log
    cursor                          "<segment id> <byte offset>" of the head
    dropped                         drops not yet reported (JSON), see below

A segment is a sequence of records::

    u32 length | u32 crc32(payload) | payload
    payload = u16 topic length | u32 key length | u32 events | u16 type length
              | topic | key | event type | value

The ``cursor`` file is replaced atomically (write, fsync, rename) on every
acknowledgement. On open, a torn record at the end of the last segment (the
process died mid-write) is cut off. (A record corrupted in place on disk ends its
segment's readable part; the spool cannot know how many events it held.)

Bounded: the spool never holds more than ``max_bytes`` on disk. When an append
would exceed it, whole segments are deleted oldest-first (``segment_bytes``,
by default an eighth of the bound, is the granularity) and what was deleted
unread is returned to the caller as a :class:`DropReport`. The spool also
adds it to :attr:`Spool.unreported_drops`, kept in the ``dropped`` file until
the owner has published a record of it and calls :meth:`Spool.mark_reported`:
a drop is published once per outage, even across a restart, never silently,
and the record of a drop cannot itself be dropped.

The spool is not thread-safe; its owner serializes access.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["SpoolError", "SpoolRecord", "Position", "DropReport", "Spool"]

_HEADER = struct.Struct(">II")  # length, crc32
_META = struct.Struct(">HIIH")  # topic length, key length, events, type length
_SEG_PREFIX = "seg-"
_SEG_SUFFIX = ".log"


class SpoolError(OSError):
    """The spool directory cannot be used (the message names the path)."""


@dataclass(frozen=True)
class SpoolRecord:
    """One Kafka message: where it goes, its key and value, and what it holds."""

    topic: str
    key: bytes
    value: bytes
    events: int = 1
    event_type: str = ""

    def encode(self) -> bytes:
        t = self.topic.encode()
        et = self.event_type.encode()
        payload = _META.pack(len(t), len(self.key), self.events, len(et)) + t + self.key + et + self.value
        return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload

    @classmethod
    def decode_payload(cls, payload: bytes) -> "SpoolRecord":
        tl, kl, n, etl = _META.unpack_from(payload)
        o = _META.size
        topic = payload[o:o + tl].decode()
        o += tl
        key = payload[o:o + kl]
        o += kl
        event_type = payload[o:o + etl].decode()
        o += etl
        return cls(topic, key, payload[o:], n, event_type)


@dataclass(frozen=True, order=True)
class Position:
    """Just after a record: segment id and byte offset (what :meth:`Spool.ack` takes)."""

    segment: int
    offset: int


@dataclass
class DropReport:
    """What a deletion for space (or a corrupt record) discarded unread."""

    messages: int = 0
    events: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    def add(self, rec: SpoolRecord) -> None:
        self.messages += 1
        self.events += rec.events
        if rec.event_type:
            self.by_type[rec.event_type] = self.by_type.get(rec.event_type, 0) + rec.events

    def merge(self, other: "DropReport") -> None:
        self.messages += other.messages
        self.events += other.events
        for k, v in other.by_type.items():
            self.by_type[k] = self.by_type.get(k, 0) + v

    def __bool__(self) -> bool:  # "something was dropped"
        return self.messages > 0


class Spool:
    """Bounded append-only message spool in ``directory``.

    Parameters
    ----------
    directory : path
        Created if missing. One spool per directory (one publisher).
    max_bytes : int, default 256 MiB
        Bound on the bytes on disk.
    segment_bytes : int, optional
        Size at which a segment is closed; default ``max_bytes // 8``.
    fsync : bool, default False
        fsync every append (survives power loss, not only a process crash;
        costs a disk flush per message).

    Examples
    --------
    >>> import tempfile
    >>> sp = Spool(tempfile.mkdtemp(), max_bytes=1 << 20)
    >>> _ = sp.append(SpoolRecord("t", b"k", b"v1"))
    >>> _ = sp.append(SpoolRecord("t", b"k", b"v2"))
    >>> [(r.value, pos.offset) for pos, r in sp.read(10)]
    [(b'v1', 24), (b'v2', 48)]
    >>> sp.ack(sp.read(1)[0][0]); [r.value for _, r in sp.read(10)]
    [b'v2']
    """

    def __init__(self, directory: str | os.PathLike, max_bytes: int = 256 << 20,
                 segment_bytes: int | None = None, fsync: bool = False) -> None:
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.segment_bytes = int(segment_bytes or max(512, self.max_bytes // 8))
        if not 0 < self.segment_bytes <= self.max_bytes:
            raise ValueError(f"segment_bytes must be in (0, max_bytes], got {self.segment_bytes}")
        self.fsync = fsync
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(exc.errno, f"cannot create the spool directory {self.directory}: {exc.strerror}") from exc
        self._sizes: dict[int, int] = {}  # segment id -> bytes
        self._fd: int | None = None  # active (last) segment, opened for append
        self._cursor = Position(1, 0)
        self._unreported = DropReport()
        self._pending = 0  # messages not yet acknowledged, kept as they come and go
        self._open()

    # -- state --------------------------------------------------------------

    def _seg_path(self, seg: int) -> Path:
        return self.directory / f"{_SEG_PREFIX}{seg:020d}{_SEG_SUFFIX}"

    def _open(self) -> None:
        for p in self.directory.iterdir():
            if p.name.startswith(_SEG_PREFIX) and p.name.endswith(_SEG_SUFFIX):
                try:
                    self._sizes[int(p.name[len(_SEG_PREFIX):-len(_SEG_SUFFIX)])] = p.stat().st_size
                except ValueError:
                    continue
        dropped_file = self.directory / "dropped"
        if dropped_file.exists():
            try:
                d = json.loads(dropped_file.read_text())
                self._unreported = DropReport(int(d["messages"]), int(d["events"]), {str(k): int(v) for k, v in d["by_type"].items()})
            except (ValueError, KeyError, TypeError, AttributeError):
                self._unreported = DropReport()
        cursor_file = self.directory / "cursor"
        if cursor_file.exists():
            try:
                seg, off = cursor_file.read_text().split()
                self._cursor = Position(max(1, int(seg)), int(off))
            except ValueError:
                self._cursor = Position(1, 0)  # unreadable: replay everything (duplicates are deduplicated)
        # Segments wholly behind the cursor are done.
        for seg in sorted(self._sizes):
            if seg < self._cursor.segment:
                self._delete(seg)
        if self._sizes:
            last = max(self._sizes)
            self._repair_tail(last)
        if self._sizes and self._cursor.segment not in self._sizes:
            self._cursor = Position(min(self._sizes), 0)
        elif not self._sizes and self._cursor.offset:
            self._cursor = Position(self._cursor.segment + 1, 0)
        self._pending = self._count_between(self._cursor, None)

    def _count_between(self, start: Position, end: Position | None) -> int:
        """Records from ``start`` to ``end`` (None: the end of the spool), counted by their headers alone."""
        n = 0
        for seg in sorted(self._sizes):
            if seg < start.segment or (end is not None and seg > end.segment):
                continue
            stop = end.offset if end is not None and seg == end.segment else self._sizes[seg]
            o = start.offset if seg == start.segment else 0
            try:
                with open(self._seg_path(seg), "rb") as f:
                    while o + _HEADER.size <= stop:
                        f.seek(o)
                        head = f.read(_HEADER.size)
                        if len(head) < _HEADER.size:
                            break
                        o += _HEADER.size + _HEADER.unpack(head)[0]
                        if o > stop:
                            break
                        n += 1
            except FileNotFoundError:
                continue
        return n

    def _repair_tail(self, seg: int) -> None:
        """Cut a torn record off the end of the last segment."""
        path = self._seg_path(seg)
        good = 0
        with open(path, "rb") as f:
            data = f.read()
        while good + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, good)
            end = good + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[good + _HEADER.size:end]) != crc:
                break
            good = end
        if good != len(data):
            os.truncate(path, good)
            self._sizes[seg] = good

    def _delete(self, seg: int) -> None:
        if self._fd is not None and seg == max(self._sizes, default=-1):
            os.close(self._fd)
            self._fd = None
        try:
            self._seg_path(seg).unlink()
        except FileNotFoundError:
            pass
        self._sizes.pop(seg, None)

    def _write_cursor(self) -> None:
        tmp = self.directory / "cursor.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self._cursor.segment} {self._cursor.offset}\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / "cursor")

    def _write_dropped(self) -> None:
        tmp = self.directory / "dropped.tmp"
        u = self._unreported
        tmp.write_text(json.dumps({"messages": u.messages, "events": u.events, "by_type": u.by_type}))
        os.replace(tmp, self.directory / "dropped")

    @property
    def unreported_drops(self) -> DropReport:
        """Drops not yet reported by the owner (a copy)."""
        u = self._unreported
        return DropReport(u.messages, u.events, dict(u.by_type))

    def mark_reported(self, report: DropReport) -> None:
        """The owner published a record of ``report`` (a value :attr:`unreported_drops` returned)."""
        u = self._unreported
        u.messages = max(0, u.messages - report.messages)
        u.events = max(0, u.events - report.events)
        for k, v in report.by_type.items():
            left = u.by_type.get(k, 0) - v
            if left > 0:
                u.by_type[k] = left
            else:
                u.by_type.pop(k, None)
        self._write_dropped()

    @property
    def bytes_on_disk(self) -> int:
        return sum(self._sizes.values())

    @property
    def pending_bytes(self) -> int:
        """Bytes not yet acknowledged (an upper bound on what :meth:`read` returns)."""
        total = 0
        for seg, size in self._sizes.items():
            if seg > self._cursor.segment:
                total += size
            elif seg == self._cursor.segment:
                total += max(0, size - self._cursor.offset)
        return total

    @property
    def pending_messages(self) -> int:
        """Messages not yet acknowledged, without reading the segments (:func:`len` reads them)."""
        return self._pending

    def __len__(self) -> int:
        """Messages not yet acknowledged (scans the segments; for tests and reports)."""
        return sum(1 for _ in self._iter(self._cursor))

    @property
    def empty(self) -> bool:
        return self.pending_bytes == 0

    # -- writing ------------------------------------------------------------

    def append(self, record: SpoolRecord) -> DropReport:
        """Append one message; return what had to be deleted (oldest-first) to make room."""
        data = record.encode()
        dropped = DropReport()
        if len(data) > self.max_bytes:
            dropped.add(record)  # can never fit: reported, like any other drop
            self._unreported.merge(dropped)
            self._write_dropped()
            return dropped
        while self._sizes and self.bytes_on_disk + len(data) > self.max_bytes:
            dropped.merge(self._drop_oldest())
        if dropped:
            self._unreported.merge(dropped)
            self._write_dropped()
        if not self._sizes:
            self._new_segment(self._cursor.segment)
        else:
            last = max(self._sizes)
            if self._sizes[last] > 0 and self._sizes[last] + len(data) > self.segment_bytes:
                self._new_segment(last + 1)
        seg = max(self._sizes)
        if self._fd is None:
            self._fd = os.open(self._seg_path(seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        written = os.write(self._fd, data)
        if written != len(data):  # a short write on a full disk: cut it off and fail loudly
            os.ftruncate(self._fd, self._sizes[seg])
            raise SpoolError(28, f"short write to {self._seg_path(seg)} ({written}/{len(data)} bytes)")
        if self.fsync:
            os.fsync(self._fd)
        self._sizes[seg] += len(data)
        self._pending += 1
        return dropped

    def _new_segment(self, seg: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._seg_path(seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sizes[seg] = 0

    def _drop_oldest(self) -> DropReport:
        # Invariant: the cursor is in the oldest segment.
        seg = min(self._sizes)
        dropped = DropReport()
        for _pos, rec in self._iter_segment(seg, self._cursor.offset if seg == self._cursor.segment else 0):
            dropped.add(rec)
        self._delete(seg)
        self._cursor = Position(min(self._sizes) if self._sizes else seg + 1, 0)
        self._write_cursor()
        self._pending = max(0, self._pending - dropped.messages)
        return dropped

    # -- reading ------------------------------------------------------------

    def _iter_segment(self, seg: int, offset: int) -> Iterator[tuple[Position, SpoolRecord]]:
        try:
            with open(self._seg_path(seg), "rb") as f:
                f.seek(offset)
                data = f.read(max(0, self._sizes.get(seg, 0) - offset))
        except FileNotFoundError:
            return
        o = 0
        while o + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, o)
            end = o + _HEADER.size + length
            if end > len(data):
                return
            payload = data[o + _HEADER.size:end]
            if zlib.crc32(payload) != crc:
                return  # corrupt: the rest of this segment is unreadable
            o = end
            yield Position(seg, offset + o), SpoolRecord.decode_payload(payload)

    def _iter(self, start: Position) -> Iterator[tuple[Position, SpoolRecord]]:
        for seg in sorted(self._sizes):
            if seg < start.segment:
                continue
            yield from self._iter_segment(seg, start.offset if seg == start.segment else 0)

    def read(self, max_messages: int, max_bytes: int | None = None) -> list[tuple[Position, SpoolRecord]]:
        """Up to ``max_messages`` unacknowledged messages from the head, oldest first."""
        out: list[tuple[Position, SpoolRecord]] = []
        size = 0
        for pos, rec in self._iter(self._cursor):
            out.append((pos, rec))
            size += len(rec.value)
            if len(out) >= max_messages or (max_bytes is not None and size >= max_bytes):
                break
        return out

    def ack(self, upto: Position) -> None:
        """Everything up to ``upto`` (a position :meth:`read` returned) was delivered."""
        if upto <= self._cursor:
            return  # already past it (e.g. its segment was dropped for space meanwhile)
        # only the headers of what read() just returned: a few small reads, not the payloads again
        self._pending = max(0, self._pending - self._count_between(self._cursor, upto))
        for seg in sorted(self._sizes):
            if seg < upto.segment:
                self._delete(seg)
        cursor = upto
        if upto.segment in self._sizes and upto.offset >= self._sizes[upto.segment]:
            # That segment is read to its end: delete it (the next append starts a fresh one).
            self._delete(upto.segment)
            cursor = Position(min(self._sizes) if self._sizes else upto.segment + 1, 0)
        self._cursor = cursor
        self._write_cursor()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
