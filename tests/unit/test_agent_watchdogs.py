"""Watchdogs: levels with their trend and time to the limit; job liveness; log staleness."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from vigil.producers.agent import (
    Agent, DiskWatchdog, JobLivenessWatchdog, LogStalenessWatchdog, MemoryWatchdog, judge_level, trend,
)
from vigil.schemas import Source

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
SRC = Source(node="n1")
GIB = 1 << 30


class FakeFs:
    """statvfs of a filesystem being filled at a known rate (ground truth for the estimate)."""

    def __init__(self, total_gib: float, used_gib: float, rate_gib_s: float) -> None:
        self.total, self.used, self.rate = total_gib * GIB, used_gib * GIB, rate_gib_s * GIB
        self.files, self.ifree = 1_000_000, 900_000

    def advance(self, s: float) -> None:
        self.used += self.rate * s
        self.ifree -= int(10 * s)

    def __call__(self, path: str):
        bs = 4096
        return SimpleNamespace(f_frsize=bs, f_blocks=int(self.total // bs), f_bfree=int((self.total - self.used) // bs),
                               f_bavail=int((self.total - self.used) // bs) - 100, f_files=self.files,
                               f_ffree=self.ifree, f_favail=self.ifree)


def test_trend_is_the_least_squares_slope():
    assert trend([(0, 0.0), (1, 2.0), (2, 4.0), (3, 6.0)]) == pytest.approx(2.0)
    assert trend([(0, 1.0), (0, 2.0)]) is None


def test_disk_reports_write_rate_and_time_until_full():
    fs = FakeFs(total_gib=1000, used_gib=850, rate_gib_s=0.01)  # 150 GiB left at ~10 MiB/s: ~4 h
    wd = DiskWatchdog(60, SRC, ["/ckpt"], statvfs=fs)
    reports = []
    for i in range(5):
        reports = wd.collect(T0 + timedelta(seconds=60 * i))
        fs.advance(60)
    space = next(r for r in reports if r.check == "disk_space")
    inodes = next(r for r in reports if r.check == "disk_inodes")
    assert space.rate_per_s == pytest.approx(0.01 * GIB, rel=0.01)
    left = (1000 - 850 - 0.01 * 240) * GIB
    assert space.time_to_limit_s == pytest.approx(left / (0.01 * GIB), rel=0.02)
    assert space.status == "warning"  # full within 6 h but not within 1 h
    assert "full in" in space.summary and space.target == "/ckpt"
    assert inodes.rate_per_s == pytest.approx(10, rel=0.01) and inodes.status == "ok"


def test_disk_close_to_full_is_critical_and_a_static_disk_is_ok():
    crit = judge_level("disk_space", "/x", 99, 100, [(0, 90), (60, 99)], T0, SRC, warn_s=6 * 3600, critical_s=3600,
                       warn_fraction=0.9, critical_fraction=0.97)
    assert crit.status == "critical" and crit.time_to_limit_s == pytest.approx(1 / (9 / 60))
    flat = judge_level("disk_space", "/x", 50, 100, [(0, 50), (60, 50)], T0, SRC, warn_s=6 * 3600, critical_s=3600,
                       warn_fraction=0.9, critical_fraction=0.97)
    assert flat.status == "ok" and flat.time_to_limit_s is None and "not growing" in flat.summary


def test_disk_path_error_is_a_health_problem_once(tmp_path):
    wd = DiskWatchdog(60, SRC, [str(tmp_path), str(tmp_path / "missing")])
    agent = Agent([wd], publisher=None, source=SRC)
    out = agent.run_once(wd, T0)
    assert [e.event_type for e in out].count("agent_health") == 1
    assert [r.target for r in out if r.event_type == "watchdog"] == [str(tmp_path)] * 2
    assert [e.event_type for e in agent.run_once(wd, T0)].count("agent_health") == 0


def test_memory_leak_trend_and_time_to_exhaustion(tmp_path):
    meminfo = tmp_path / "meminfo"
    wd = MemoryWatchdog(60, SRC, meminfo=meminfo)
    total_kb = 64 * 1024 * 1024
    for i in range(6):  # available shrinks by 100 MiB per minute: a leak
        avail_kb = 32 * 1024 * 1024 - i * 100 * 1024
        meminfo.write_text(f"MemTotal: {total_kb} kB\nMemFree: 1 kB\nMemAvailable: {avail_kb} kB\n")
        (r,) = wd.collect(T0 + timedelta(minutes=i))
    assert r.check == "host_memory" and r.rate_per_s == pytest.approx(100 * 1024 * 1024 / 60, rel=1e-6)
    assert r.time_to_limit_s == pytest.approx((32 * 1024 - 500) * 1024 * 1024 / (100 * 1024 * 1024 / 60), rel=1e-3)
    assert r.status == "warning"  # ~5.3 h to exhaustion


def _job_cmd(tmp_path, output: str, code: int = 0, stderr: str = "") -> list[str]:
    script = tmp_path / "squeue.py"
    script.write_text(f"import sys\nsys.stdout.write({output!r})\nsys.stderr.write({stderr!r})\nsys.exit({code})\n")
    return [sys.executable, str(script)]


def test_job_liveness_running_pending_or_gone(tmp_path):
    ok = JobLivenessWatchdog(60, SRC, "123", command=_job_cmd(tmp_path, "RUNNING\n")).collect(T0)
    assert [(r.status, r.check, r.target) for r in ok] == [("ok", "job_liveness", "123")]
    queued = JobLivenessWatchdog(60, SRC, "123", command=_job_cmd(tmp_path, "PENDING\n")).collect(T0)
    assert queued[0].status == "ok"
    gone = JobLivenessWatchdog(60, SRC, "123", command=_job_cmd(tmp_path, "", 1, "slurm_load_jobs error: Invalid job id specified")).collect(T0)
    assert gone[0].status == "critical" and "neither running nor queued" in gone[0].summary
    failed = JobLivenessWatchdog(60, SRC, "123", command=_job_cmd(tmp_path, "FAILED\n")).collect(T0)
    assert failed[0].status == "critical"


def test_job_liveness_without_squeue_is_unavailable_once():
    wd = JobLivenessWatchdog(60, SRC, "123", command=["/nonexistent/squeue"])
    agent = Agent([wd], publisher=None, source=SRC)
    first = agent.run_once(wd, T0)
    assert [e.status for e in first] == ["failed"] and "not installed" in first[0].detail
    assert agent.run_once(wd, T0) == []


def test_log_staleness(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1\n")
    mtime = T0.timestamp()
    os.utime(log, (mtime, mtime))
    wd = LogStalenessWatchdog(30, SRC, {str(log): 60})
    assert wd.collect(T0 + timedelta(seconds=30))[0].status == "ok"
    assert wd.collect(T0 + timedelta(seconds=90))[0].status == "warning"
    r = wd.collect(T0 + timedelta(seconds=200))[0]
    assert r.status == "critical" and r.used == pytest.approx(200) and r.limit == 60
