"""Watchdogs against the avoidable failures of long runs.

Each check reports a :class:`~vigil.schemas.events.WatchdogReport` per target per
interval: the level, its limit, its trend over a window, the estimated time
until the limit at that trend, and a status:

``disk_space`` / ``disk_inodes`` (:class:`DiskWatchdog`)
    per configured path (checkpoint storage): bytes and inodes in use against
    what the filesystem offers (``statvfs``; the root-reserved blocks do not
    count as available), the write rate in bytes (inodes) per second and the
    time until full. Warning when full within ``warn_s`` (default 6 h) or
    above ``warn_fraction``; critical within ``critical_s`` (1 h) or above
    ``critical_fraction``.
``host_memory`` (:class:`MemoryWatchdog`)
    ``MemTotal - MemAvailable`` from ``/proc/meminfo``; a slow leak shows as a
    steady positive trend, and its time to exhaustion is what is judged.
``gpu_memory`` (:class:`GpuMemoryWatchdog`)
    per GPU, NVML's used/total: the headroom and its trend.
``job_liveness`` (:class:`JobLivenessWatchdog`)
    a job expected to run must be running or queued: the scheduler is asked
    (``squeue -h -j JOB -o %T`` by default; any command printing one state per
    line); no line, or a state other than running/pending, is critical.
``log_staleness`` (:class:`LogStalenessWatchdog`)
    a training log must be written at least every ``expected_s`` seconds: a
    hang signal for jobs without hooks. Warning past it, critical past twice.

The trend is the least-squares slope over the samples of the last
``window_s`` seconds (:func:`trend`); all judgement is pure
(:func:`judge_level`), with time as an argument.
"""

from __future__ import annotations

import os
import subprocess
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from vigil.producers.agent.base import Collector, CollectorUnavailable
from vigil.schemas import Envelope, Source
from vigil.schemas.events import WatchdogReport

__all__ = ["trend", "judge_level", "DiskWatchdog", "MemoryWatchdog", "GpuMemoryWatchdog", "JobLivenessWatchdog",
           "LogStalenessWatchdog"]


def trend(samples: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope (units per second) of ``(t, value)`` samples; None with fewer than two times.

    >>> trend([(0, 10.0), (10, 20.0), (20, 30.0)])
    1.0
    >>> trend([(5, 1.0)]) is None
    True
    """
    n = len(samples)
    if n < 2:
        return None
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in samples) / var


def judge_level(check: str, target: str, used: float, limit: float, samples: Sequence[tuple[float, float]],
                now: datetime, source: Source, *, warn_s: float, critical_s: float, warn_fraction: float,
                critical_fraction: float, unit: str = "B") -> WatchdogReport:
    """Report on a level that must stay under ``limit``, with its trend and time to the limit."""
    rate = trend(samples)
    fraction = used / limit if limit > 0 else None
    ttl = (max(0.0, limit - used) / rate) if (rate is not None and rate > 0) else None
    status = "ok"
    why = []
    if fraction is not None and fraction >= critical_fraction or ttl is not None and ttl <= critical_s:
        status = "critical"
    elif fraction is not None and fraction >= warn_fraction or ttl is not None and ttl <= warn_s:
        status = "warning"
    if fraction is not None:
        why.append(f"{100 * fraction:.1f}% used")
    if rate is not None:
        why.append(f"{_human(rate, unit)}/s")
    why.append(f"full in {_duration(ttl)}" if ttl is not None else "not growing")
    return WatchdogReport(
        event_time=now, source=source, check=check, target=target, status=status,
        summary=f"{check} {target}: " + ", ".join(why), used=max(0.0, float(used)), limit=max(0.0, float(limit)),
        used_fraction=fraction, rate_per_s=rate, time_to_limit_s=ttl,
    )


def _human(v: float, unit: str) -> str:
    if unit != "B":
        return f"{v:.3g} {unit}"
    for u in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024:
            return f"{v:.1f} {u}"
        v /= 1024
    return f"{v:.1f} PiB"


def _duration(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


class _Windowed:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, key: str, t: float, v: float) -> list[tuple[float, float]]:
        d = self._samples.setdefault(key, deque())
        d.append((t, v))
        while d and d[0][0] < t - self.window_s:
            d.popleft()
        return list(d)


class DiskWatchdog(Collector):
    name = "watchdog.disk"

    def __init__(self, interval_s: float, source: Source, paths: Sequence[str | os.PathLike], *, window_s: float = 1800,
                 warn_s: float = 6 * 3600, critical_s: float = 3600, warn_fraction: float = 0.90,
                 critical_fraction: float = 0.97, statvfs: Callable[[str], Any] = os.statvfs) -> None:
        super().__init__(interval_s, source)
        self.paths = [str(p) for p in paths]
        self.kw = dict(warn_s=warn_s, critical_s=critical_s, warn_fraction=warn_fraction, critical_fraction=critical_fraction)
        self._win = _Windowed(window_s)
        self._statvfs = statvfs

    def collect(self, now: datetime) -> list[Envelope]:
        t = now.timestamp()
        out: list[Envelope] = []
        for path in self.paths:
            try:
                st = self._statvfs(path)
            except OSError as exc:
                self.problem(path, f"cannot statvfs {path}: {exc.strerror}")
                continue
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            limit = used + st.f_bavail * st.f_frsize  # what we may fill (root reserve excluded)
            out.append(judge_level("disk_space", path, used, limit, self._win.add("b:" + path, t, used), now, self.source, **self.kw))
            if st.f_files > 0:
                iused = st.f_files - st.f_ffree
                ilimit = iused + st.f_favail
                out.append(judge_level("disk_inodes", path, iused, ilimit, self._win.add("i:" + path, t, iused), now,
                                       self.source, unit="inodes", **self.kw))
        return out


def read_meminfo(path: str | os.PathLike = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` in bytes."""
    out = {}
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


class MemoryWatchdog(Collector):
    name = "watchdog.memory"

    def __init__(self, interval_s: float, source: Source, *, window_s: float = 1800, warn_s: float = 6 * 3600,
                 critical_s: float = 1800, warn_fraction: float = 0.92, critical_fraction: float = 0.97,
                 meminfo: str | os.PathLike = "/proc/meminfo") -> None:
        super().__init__(interval_s, source)
        self.kw = dict(warn_s=warn_s, critical_s=critical_s, warn_fraction=warn_fraction, critical_fraction=critical_fraction)
        self._win = _Windowed(window_s)
        self.meminfo = meminfo

    def collect(self, now: datetime) -> list[Envelope]:
        try:
            m = read_meminfo(self.meminfo)
            total, avail = m["MemTotal"], m["MemAvailable"]
        except (OSError, KeyError) as exc:
            raise CollectorUnavailable(f"cannot read MemTotal/MemAvailable from {self.meminfo}: {exc}") from None
        used = total - avail
        return [judge_level("host_memory", "host", used, total, self._win.add("m", now.timestamp(), used), now,
                            self.source, **self.kw)]


class GpuMemoryWatchdog(Collector):
    name = "watchdog.gpu_memory"

    def __init__(self, interval_s: float, source: Source, nvml: Any = None, *, window_s: float = 1800,
                 warn_s: float = 3600, critical_s: float = 600, warn_fraction: float = 0.95,
                 critical_fraction: float = 0.99) -> None:
        super().__init__(interval_s, source)
        from vigil.producers.agent.gpu import NvmlTelemetryCollector

        self._nv = NvmlTelemetryCollector(interval_s, source, nvml)  # reuses its NVML setup
        self.kw = dict(warn_s=warn_s, critical_s=critical_s, warn_fraction=warn_fraction, critical_fraction=critical_fraction)
        self._win = _Windowed(window_s)

    def collect(self, now: datetime) -> list[Envelope]:
        nv = self._nv._init()
        out: list[Envelope] = []
        for i, h in self._nv._handles or []:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception as exc:
                self.problem(f"gpu{i}", f"GPU {i}: memory info failed: {exc}")
                continue
            src = self.source.model_copy(update={"gpu": i})
            out.append(judge_level("gpu_memory", f"gpu{i}", int(mem.used), int(mem.total),
                                   self._win.add(str(i), now.timestamp(), int(mem.used)), now, src, **self.kw))
        return out

    def close(self) -> None:
        self._nv.close()


_ALIVE_STATES = {"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "R", "PD", "CF", "CG"}


class JobLivenessWatchdog(Collector):
    name = "watchdog.job"

    def __init__(self, interval_s: float, source: Source, job_id: str, command: Sequence[str] | None = None,
                 timeout_s: float = 20.0) -> None:
        super().__init__(interval_s, source)
        self.job_id = job_id
        self.command = list(command) if command else ["squeue", "-h", "-j", job_id, "-o", "%T"]
        self.timeout_s = timeout_s

    def collect(self, now: datetime) -> list[Envelope]:
        try:
            res = subprocess.run(self.command, capture_output=True, text=True, timeout=self.timeout_s)
        except FileNotFoundError:
            raise CollectorUnavailable(f"{self.command[0]} is not installed: cannot ask the scheduler about job {self.job_id}") from None
        except subprocess.TimeoutExpired:
            self.problem("timeout", f"{self.command[0]} did not answer within {self.timeout_s} s")
            return []
        states = [s.strip().upper() for s in res.stdout.splitlines() if s.strip()]
        if res.returncode != 0 and not states:
            # squeue exits 1 with "Invalid job id" once a job has left the queue: that is the answer.
            if "invalid job id" not in res.stderr.lower():
                self.problem(f"exit{res.returncode}", f"{' '.join(self.command)} failed ({res.returncode}): {res.stderr.strip()[:300]}")
                return []
        alive = [s for s in states if s in _ALIVE_STATES]
        status = "ok" if alive else "critical"
        summary = (f"job {self.job_id} is {', '.join(sorted(set(alive)))}" if alive else
                   f"job {self.job_id} is expected to run but is neither running nor queued"
                   + (f" ({', '.join(states)})" if states else " (the scheduler does not know it)"))
        return [WatchdogReport(event_time=now, source=self.source.model_copy(update={"job": self.source.job or self.job_id}),
                               check="job_liveness", target=self.job_id, status=status, summary=summary)]


class LogStalenessWatchdog(Collector):
    name = "watchdog.log"

    def __init__(self, interval_s: float, source: Source, logs: dict[str, float]) -> None:
        super().__init__(interval_s, source)
        for p, s in logs.items():
            if not s > 0:
                raise ValueError(f"expected interval of {p} must be > 0, got {s}")
        self.logs = dict(logs)

    def collect(self, now: datetime) -> list[Envelope]:
        out: list[Envelope] = []
        for path, expected in self.logs.items():
            try:
                mtime = os.stat(path).st_mtime
            except OSError as exc:
                self.problem(path, f"cannot stat log {path}: {exc.strerror}")
                continue
            age = max(0.0, now.timestamp() - mtime)
            status = "critical" if age > 2 * expected else "warning" if age > expected else "ok"
            out.append(WatchdogReport(
                event_time=now, source=self.source, check="log_staleness", target=path, status=status,
                summary=f"{path} last written {age:.0f} s ago (expected every {expected:.0f} s)",
                used=age, limit=expected, used_fraction=age / expected, rate_per_s=None, time_to_limit_s=max(0.0, expected - age),
            ))
        return out
