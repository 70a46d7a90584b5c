"""Kernel-log XIDs from ``/dev/kmsg`` (or any file of log lines, e.g. a journal export).

``/dev/kmsg`` hands out one record per ``read()``::

    6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.

(priority, sequence, microseconds since boot, flags; then the message, and
continuation lines starting with a space). Every ``NVRM: Xid`` line and the
bare "fallen off the bus" line become :class:`~vigil.schemas.XidError` events with
the raw line kept, parsed by :func:`vigil.schemas.xid.parse_xid_line`.

The collector opens the device non-blocking and starts at its end (old XIDs
from before the agent started are not re-reported; ``from_start=True`` reads
the whole ring). A plain file is followed like ``tail -f`` (a file that
shrinks was rotated and is read from its start). ``EPIPE`` (records overwritten
before we read them) is counted and reading goes on. A permission error is
the collector being unavailable: reported once, the agent keeps running.
"""

from __future__ import annotations

import errno
import os
import stat
from datetime import datetime, timedelta
from pathlib import Path

from vigil.schemas.xid import parse_xid_line
from vigil.producers.agent.base import Collector, CollectorUnavailable
from vigil.schemas import Envelope, Source, XidError

__all__ = ["KmsgCollector", "parse_kmsg_record", "xid_event"]


def parse_kmsg_record(record: str) -> tuple[int | None, float | None, str]:
    """``(sequence, seconds since boot, message)`` of a /dev/kmsg record; a plain line passes through.

    >>> parse_kmsg_record("4,512,8123456,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\\n")
    (512, 8.123456, 'NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE')
    >>> parse_kmsg_record("[ 8.1] NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.")
    (None, None, '[ 8.1] NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.')
    """
    head, sep, rest = record.partition(";")
    if sep:
        fields = head.split(",")
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit() and fields[2].isdigit():
            message = rest.split("\n", 1)[0]  # continuation lines (" KEY=value") dropped
            return int(fields[1]), int(fields[2]) / 1e6, message.rstrip("\r\n")
    return None, None, record.rstrip("\r\n")


def xid_event(line: str, event_time: datetime, source: Source) -> XidError | None:
    """The XID event of one kernel-log message, or None when it is not an XID report."""
    rec = parse_xid_line(line)
    if rec is None:
        return None
    return XidError(event_time=event_time, source=source, code=rec.code, pci_bus_id=rec.pci, pid=rec.pid,
                    process_name=rec.process, message=rec.message, raw_line=rec.raw)


class KmsgCollector(Collector):
    name = "kmsg"

    def __init__(self, interval_s: float, source: Source, path: str | os.PathLike = "/dev/kmsg",
                 from_start: bool = False, boot_time: datetime | None = None) -> None:
        super().__init__(interval_s, source)
        self.path = Path(path)
        self.from_start = from_start
        self.boot_time = boot_time  # for kmsg timestamps; None: the read time is the event time
        self.overruns = 0
        self._fd: int | None = None
        self._is_char = False
        self._pos = 0
        self._partial = b""

    def _open(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise CollectorUnavailable(f"{self.path} does not exist") from None
        except PermissionError:
            raise CollectorUnavailable(f"no permission to read {self.path} (run the agent as root or with CAP_SYSLOG)") from None
        except OSError as exc:
            raise CollectorUnavailable(f"cannot open {self.path}: {exc.strerror}") from None
        self._is_char = stat.S_ISCHR(os.fstat(fd).st_mode)
        if not self.from_start:
            os.lseek(fd, 0, os.SEEK_END)
        self._pos = os.lseek(fd, 0, os.SEEK_CUR) if not self._is_char else 0
        self._fd = fd

    def collect(self, now: datetime) -> list[Envelope]:
        if self._fd is None:
            self._open()
        return self._read_char(now) if self._is_char else self._read_file(now)

    def _event(self, message: str, uptime: float | None, now: datetime) -> XidError | None:
        t = self.boot_time + timedelta(seconds=uptime) if (self.boot_time is not None and uptime is not None) else now
        return xid_event(message, min(t, now), self.source)

    def _read_char(self, now: datetime) -> list[Envelope]:
        assert self._fd is not None
        events: list[Envelope] = []
        while True:
            try:
                data = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring overwrote records we had not read yet
                    self.overruns += 1
                    continue
                if exc.errno == errno.EINVAL:
                    continue
                raise
            if not data:
                break
            _seq, uptime, msg = parse_kmsg_record(data.decode("utf-8", "replace"))
            ev = self._event(msg, uptime, now)
            if ev is not None:
                events.append(ev)
        return events

    def _read_file(self, now: datetime) -> list[Envelope]:
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._pos:  # truncated / rotated in place
            os.lseek(self._fd, 0, os.SEEK_SET)
            self._pos = 0
            self._partial = b""
        chunks = []
        while True:
            data = os.read(self._fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
            self._pos += len(data)
        data = self._partial + b"".join(chunks)
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for its end
        events: list[Envelope] = []
        for raw in lines:
            _seq, uptime, msg = parse_kmsg_record(raw.decode("utf-8", "replace"))
            ev = self._event(msg, uptime, now)
            if ev is not None:
                events.append(ev)
        return events

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
