"""The node agent (``vigil agent``): collectors, watchdogs, process supervision, and the runner.

Collectors (each on its own interval and thread, each failing on its own):
:mod:`~vigil.producers.agent.gpu` (NVML telemetry and XID events),
:mod:`~vigil.producers.agent.kmsg` (kernel-log XIDs), :mod:`~vigil.producers.agent.nic`
(RDMA port counters from sysfs), :mod:`~vigil.producers.agent.heartbeat`,
:mod:`~vigil.producers.agent.process` (launch ranks like torchrun, or watch PIDs),
:mod:`~vigil.producers.agent.watchdogs` (disk, memory, GPU memory, job liveness,
log staleness), :mod:`~vigil.producers.agent.flight_recorder` (torch's on-timeout
flight-recorder dump files). :mod:`~vigil.producers.agent.runner` runs them.
"""

from vigil.producers.agent.base import Collector, CollectorUnavailable, HealthTracker
from vigil.producers.agent.flight_recorder import FlightRecorderFileCollector
from vigil.producers.agent.gpu import NvmlTelemetryCollector, NvmlXidCollector
from vigil.producers.agent.heartbeat import HeartbeatCollector
from vigil.producers.agent.kmsg import KmsgCollector, parse_kmsg_record
from vigil.producers.agent.nic import NicCollector
from vigil.producers.agent.process import PidWatcher, ProcessSupervisor
from vigil.producers.agent.runner import Agent
from vigil.producers.agent.watchdogs import (
    DiskWatchdog, GpuMemoryWatchdog, JobLivenessWatchdog, LogStalenessWatchdog, MemoryWatchdog, judge_level, trend,
)

__all__ = [
    "Collector", "CollectorUnavailable", "HealthTracker", "FlightRecorderFileCollector", "NvmlTelemetryCollector", "NvmlXidCollector",
    "HeartbeatCollector", "KmsgCollector", "parse_kmsg_record", "NicCollector", "PidWatcher", "ProcessSupervisor",
    "Agent", "DiskWatchdog", "GpuMemoryWatchdog", "JobLivenessWatchdog", "LogStalenessWatchdog", "MemoryWatchdog",
    "judge_level", "trend",
]
