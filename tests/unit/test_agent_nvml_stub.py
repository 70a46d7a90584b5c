"""The NVML collectors against a stub NVML module (no GPU on this machine): named as stubs."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from vigil.producers.agent import Agent, GpuMemoryWatchdog, NvmlTelemetryCollector, NvmlXidCollector
from vigil.schemas import GpuSamples, GpuTelemetry, Source, XidError
from vigil.schemas.events import AgentHealth, WatchdogReport

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
SRC = Source(node="gpu-node-1")


class StubNVMLError(Exception):
    pass


class StubNotSupported(StubNVMLError):
    pass


class StubTimeout(StubNVMLError):
    pass


class StubNvml:
    """Just enough of pynvml's surface, with two GPUs: GPU 0 (A100-like), GPU 1 (older, no remapping)."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 0, 1
    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY, NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 0, 1, 2, 3
    nvmlEventTypeXidCriticalError = 8
    NVMLError = StubNVMLError
    NVMLError_NotSupported = StubNotSupported
    NVMLError_Timeout = StubTimeout

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.events: list = []
        self.power_fails = False
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise StubNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97 if h == "h0" else 3, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=30 << 30, total=80 << 30, free=50 << 30)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1410 if clock == self.NVML_CLOCK_SM else 1593

    def nvmlDeviceGetPowerUsage(self, h):
        if self.power_fails:
            raise StubNVMLError("Unknown Error")
        return 312_500  # milliwatts

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4 if h == "h0" else 0  # SW power cap

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return 12 if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else (1 if h == "h1" else 0)

    def nvmlDeviceGetRetiredPages(self, h, cause):
        if h == "h0":
            raise StubNotSupported("Not Supported")  # Ampere: row remapping instead
        return [0x1000, 0x2000] if cause == 1 else [0x3000]

    def nvmlDeviceGetRemappedRows(self, h):
        if h == "h1":
            raise StubNotSupported("Not Supported")
        return (2, 1, False, False)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return 5

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h == "h1":
            raise StubNotSupported("Not Supported")
        return 1 if link < 2 else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return {0: 3, 1: 0, 2: 7, 3: 1}[counter] * (link + 1)

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, h, types, s):
        pass

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:3B:00.0" if h == "h0" else b"00000000:86:00.0")

    def nvmlDeviceGetIndex(self, h):
        return int(h[1:])

    def nvmlEventSetWait_v2(self, s, timeout_ms):
        if not self.events:
            raise StubTimeout("Timeout")
        return self.events.pop(0)

    def nvmlEventSetFree(self, s):
        pass


def test_stub_nvml_telemetry_reads_every_field():
    nv = StubNvml()
    col = NvmlTelemetryCollector(10, SRC, nvml=nv)
    [samples] = col.collect(T0)  # one event for the node's GPUs, in columns
    assert isinstance(samples, GpuSamples) and samples.gpus == [0, 1] and samples.source == SRC
    assert samples.retired_pages == [None, 3] and samples.nvlink_errors[1] == {}
    g0, g1 = samples.telemetry()
    assert isinstance(g0, GpuTelemetry) and g0.source.gpu == 0 and g1.source.gpu == 1
    assert g0.utilization_pct == 97 and g0.memory_used_bytes == 30 << 30 and g0.memory_total_bytes == 80 << 30
    assert (g0.temperature_c, g0.sm_clock_mhz, g0.mem_clock_mhz, g0.power_w) == (71, 1410, 1593, 312.5)
    assert g0.throttle_reasons == 4 and g0.ecc_sbe == 12 and g0.ecc_dbe == 0
    assert g0.retired_pages is None and g0.remapped_rows == 3  # not supported -> unset, not an error
    assert g1.retired_pages == 3 and g1.remapped_rows is None and g1.ecc_dbe == 1
    assert g0.pcie_replays == 5
    assert g0.nvlink_errors == {"l0.replay": 3, "l0.recovery": 0, "l0.crc_flit": 7, "l0.crc_data": 1,
                                "l1.replay": 6, "l1.recovery": 0, "l1.crc_flit": 14, "l1.crc_data": 2,
                                "replay": 9, "recovery": 0, "crc_flit": 21, "crc_data": 3}
    assert g1.nvlink_errors == {}
    assert col.take_problems() == {}
    col.close()
    assert nv.shutdowns == 1


def test_stub_nvml_field_error_is_one_health_event_and_the_rest_is_read():
    nv = StubNvml()
    nv.power_fails = True
    col = NvmlTelemetryCollector(10, SRC, nvml=nv)
    agent = Agent([col], publisher=None, source=SRC)
    out = agent.run_once(col, T0)
    health = [e for e in out if isinstance(e, AgentHealth)]
    assert sorted(h.problem for h in health) == ["gpu0.power", "gpu1.power"]
    [samples] = [e for e in out if isinstance(e, GpuSamples)]
    assert samples.gpus == [0, 1] and samples.power_w == [] and samples.temperature_c[0] == 71  # none read: no column
    assert [e for e in agent.run_once(col, T0) if isinstance(e, AgentHealth)] == []


def test_stub_nvml_missing_library_is_reported_once_and_the_agent_goes_on():
    col = NvmlTelemetryCollector(10, SRC, nvml=StubNvml(fail_init=True))
    xid = NvmlXidCollector(1, SRC, nvml=StubNvml(fail_init=True))
    agent = Agent([col, xid], publisher=None, source=SRC)
    for c in (col, xid):
        first = agent.run_once(c, T0)
        assert [(e.status, e.collector) for e in first] == [("failed", c.name)]
        assert "Library Not Found" in first[0].detail
        assert agent.run_once(c, T0) == []


def test_stub_nvml_xid_events_are_drained():
    nv = StubNvml()
    col = NvmlXidCollector(1, SRC, nvml=nv)
    assert col.collect(T0) == []
    nv.events = [SimpleNamespace(device="h0", eventType=8, eventData=79),
                 SimpleNamespace(device="h1", eventType=8, eventData=48)]
    a, b = col.collect(T0)
    assert isinstance(a, XidError) and (a.code, a.source.gpu, a.pci_bus_id) == (79, 0, "0000:3b:00")
    assert (b.code, b.source.gpu, b.pci_bus_id) == (48, 1, "0000:86:00")
    assert col.collect(T0) == []


def test_stub_nvml_gpu_memory_watchdog():
    wd = GpuMemoryWatchdog(60, SRC, nvml=StubNvml())
    out = wd.collect(T0)
    assert [(r.check, r.target, r.status) for r in out] == [("gpu_memory", "gpu0", "ok"), ("gpu_memory", "gpu1", "ok")]
    assert isinstance(out[0], WatchdogReport) and out[0].used_fraction == pytest.approx(30 / 80)


def test_real_pynvml_without_a_gpu_is_unavailable_not_a_crash():
    col = NvmlTelemetryCollector(10, SRC)
    agent = Agent([col], publisher=None, source=SRC)
    out = agent.run_once(col, T0)
    # On a machine with a GPU this reads telemetry; here (no driver) it is one health event.
    assert all(isinstance(e, (GpuSamples, AgentHealth)) for e in out)


def test_the_nvml_binding_imports_without_a_warning():
    """nvidia-ml-py's pynvml warns of nothing, so the agent filters no warning when it loads it (the deprecated
    pynvml distribution warned on import, in every process)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error", "-c",
                           "from vigil.producers.agent.gpu import load_nvml; print(load_nvml().__name__)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "pynvml", done.stderr[-2000:]
