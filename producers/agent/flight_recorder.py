"""Torch's own flight-recorder dumps, written when a NCCL collective times out, published by the agent.

With ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` each rank's process group writes its
recorder to ``<prefix><global rank>`` when a collective times out (the prefix
is ``$TORCH_FR_DUMP_TEMP_FILE``, ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` before
torch 2.7, default ``/tmp/nccl_trace_rank_``;
:func:`~vigil.producers.training.flight_recorder.dump_file_prefix`). The rank
itself is usually torn down right after (the watchdog aborts it), so its
hooks cannot send it: :class:`FlightRecorderFileCollector` polls those files
for the ranks its agent runs and publishes each version of each file once, as
a :class:`~vigil.schemas.events.FlightRecorderDump` with ``trigger
"timeout_file"`` stamped with the file's modification time.

Files already there when the collector first looks are an earlier run's and
are left alone. A file seen while torch is still writing it (unreadable) is
read again at the next poll; one that stays unreadable and unchanged is a
problem (the agent's health event, said once while it lasts), not published. The
file is read without executing anything
(:func:`~vigil.producers.training.flight_recorder.read_dump_file`): its
writer is whoever can write the path.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from vigil.producers.agent.base import Collector
from vigil.producers.training.flight_recorder import dump_event, dump_file_prefix, fit_payload, payload_from_file
from vigil.schemas import Envelope, Source

__all__ = ["FlightRecorderFileCollector", "MAX_DUMP_FILE_BYTES", "MAX_EVENT_BYTES"]

#: A dump file larger than this is not read (torch's dumps with stack traces are a few MB).
MAX_DUMP_FILE_BYTES = 256 << 20
#: The entries kept per group are halved until the event's JSON fits this (a Kafka message's room).
MAX_EVENT_BYTES = 512 << 10


class FlightRecorderFileCollector(Collector):
    """Publish torch's on-timeout dump files of ``ranks()`` (see the module docstring).

    Parameters
    ----------
    interval_s : float
        How often to look.
    source : Source
        The agent's (its job and node stamp every dump; the rank comes from the file name).
    ranks : callable
        The global ranks whose files to read (the agent's supervised ranks, read at each poll).
    prefix : str, optional
        The files' prefix (default :func:`~vigil.producers.training.flight_recorder.dump_file_prefix`
        of the agent's environment, which its ranks inherit).
    """

    name = "flight_recorder_files"

    def __init__(self, interval_s: float, source: Source, ranks: Callable[[], Iterable[int]],
                 prefix: str | None = None) -> None:
        super().__init__(interval_s, source)
        self.ranks = ranks
        self.prefix = prefix or dump_file_prefix()
        self._seen: dict[int, tuple[int, int]] = {}  # rank -> (mtime_ns, size) of the version dealt with
        self._unreadable: dict[int, tuple[int, int]] = {}  # rank -> the version that failed to read last time
        self._broken: dict[int, tuple[str, str]] = {}  # rank -> (problem, detail) of the version seen, while it lasts
        self._started = False
        self.published = 0

    def _stat(self, rank: int) -> tuple[Path, tuple[int, int]] | None:
        path = Path(f"{self.prefix}{rank}")
        try:
            st = path.stat()
        except OSError:
            return None
        return path, (st.st_mtime_ns, st.st_size)

    def collect(self, now: datetime) -> list[Envelope]:
        ranks = sorted({int(r) for r in self.ranks()})
        if not self._started:  # what is there already is an earlier run's
            self._started = True
            for r in ranks:
                found = self._stat(r)
                if found is not None:
                    self._seen[r] = found[1]
        out: list[Envelope] = []
        for r in ranks:
            found = self._stat(r)
            if found is None:
                continue
            path, version = found
            if self._seen.get(r) == version:
                if r in self._broken:  # still there: the problem lasts (said once, counted)
                    self.problem(*self._broken[r])
                continue
            self._broken.pop(r, None)
            if version[1] > MAX_DUMP_FILE_BYTES:
                self._seen[r] = version
                self._broken[r] = (f"too_large:{r}", f"{path}: {version[1]} bytes, more than {MAX_DUMP_FILE_BYTES}; "
                                                     "not read")
                self.problem(*self._broken[r])
                continue
            try:
                payload = payload_from_file(path)
            except (OSError, ValueError) as exc:
                if self._unreadable.get(r) == version:  # unchanged since the last try: torch is done with it
                    self._seen[r] = version
                    self._broken[r] = (f"unreadable:{r}", str(exc)[:1000])
                    self.problem(*self._broken[r])
                else:
                    self._unreadable[r] = version
                continue
            self._unreadable.pop(r, None)
            self._seen[r] = version
            payload = fit_payload(payload, lambda p: len(json.dumps(p, default=str)) <= MAX_EVENT_BYTES)
            src = {"cluster": self.source.cluster, "node": self.source.node, "job": self.source.job, "rank": r}
            out.append(dump_event(payload, t=version[0] / 1e9, source=src))
            self.published += 1
        return out
