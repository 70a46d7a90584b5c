"""The node agent (``vigil agent``): collectors, watchdogs, process supervision, and the runner.

Collectors (each on its own interval and thread, each failing on its own):
:mod:`~producers.agent.gpu` (NVML telemetry and XID events),
:mod:`~producers.agent.kmsg` (kernel-log XIDs), :mod:`~producers.agent.nic`
(RDMA port counters from sysfs), :mod:`~producers.agent.heartbeat`,
:mod:`~producers.agent.process` (launch ranks like torchrun, or watch PIDs),
:mod:`~producers.agent.watchdogs` (disk, memory, GPU memory, job liveness,
log staleness). :mod:`~producers.agent.runner` runs them.
"""

from producers.agent.base import Collector, CollectorUnavailable, HealthTracker
from producers.agent.gpu import NvmlTelemetryCollector, NvmlXidCollector
from producers.agent.heartbeat import HeartbeatCollector
from producers.agent.kmsg import KmsgCollector, parse_kmsg_record
from producers.agent.nic import NicCollector
from producers.agent.process import PidWatcher, ProcessSupervisor
from producers.agent.runner import Agent
from producers.agent.watchdogs import (
    DiskWatchdog, GpuMemoryWatchdog, JobLivenessWatchdog, LogStalenessWatchdog, MemoryWatchdog, judge_level, trend,
)

__all__ = [
    "Collector", "CollectorUnavailable", "HealthTracker", "NvmlTelemetryCollector", "NvmlXidCollector",
    "HeartbeatCollector", "KmsgCollector", "parse_kmsg_record", "NicCollector", "PidWatcher", "ProcessSupervisor",
    "Agent", "DiskWatchdog", "GpuMemoryWatchdog", "JobLivenessWatchdog", "LogStalenessWatchdog", "MemoryWatchdog",
    "judge_level", "trend",
]
