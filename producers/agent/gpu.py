"""GPU telemetry and XID events through NVML (``pynvml`` / nvidia-ml-py).

:class:`NvmlTelemetryCollector` samples, per GPU: utilization, memory,
temperature, SM and memory clocks, power, the clocks-event (throttle) reason
mask, volatile ECC single/double-bit counts, retired pages (pre-Ampere) and
remapped rows (Ampere+), the PCIe replay counter and the NVLink error
counters of active links (summed per counter over links, and per link as
``l<N>.<counter>``), and sends them as one :class:`~vigil.schemas.GpuSamples`
per sample (the node's GPUs in columns). Each field is read on its own: a field the GPU does not
support stays unset; any other NVML error on a field is reported once as a
health problem keyed ``gpu<i>.<field>``.

:class:`NvmlXidCollector` registers every GPU for NVML's critical XID events
and drains the event set each interval (``nvmlEventSetWait_v2`` with a zero
timeout, so it never blocks the agent).

``nvml`` is the module to use (default: ``import pynvml``); tests pass a stub.
No NVML library (no GPU, no driver) makes both collectors unavailable:
reported once, the agent keeps running. NVML is initialised once per
collector and shut down on ``close``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from vigil.producers.agent.base import Collector, CollectorUnavailable
from vigil.schemas import Envelope, GpuSamples, Source, XidError
from vigil.schemas.events import GPU_FIGURES

__all__ = ["NvmlTelemetryCollector", "NvmlXidCollector", "load_nvml"]


def load_nvml() -> Any:
    import pynvml  # nvidia-ml-py's module: it warns of nothing (the deprecated pynvml distribution did)

    return pynvml


class _NvmlBase(Collector):
    def __init__(self, interval_s: float, source: Source, nvml: Any = None) -> None:
        super().__init__(interval_s, source)
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] | None = None

    def _init(self) -> Any:
        if self._handles is not None:
            return self._nvml
        try:
            nv = self._nvml if self._nvml is not None else load_nvml()
        except ImportError as exc:
            raise CollectorUnavailable(f"pynvml is not installed: {exc}") from None
        try:
            nv.nvmlInit()
            n = nv.nvmlDeviceGetCount()
            self._handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise CollectorUnavailable(f"NVML is not usable here: {exc} ({type(exc).__name__})") from None
        self._nvml = nv
        self._on_init(nv)
        return nv

    def _on_init(self, nv: Any) -> None:
        pass

    def close(self) -> None:
        if self._handles is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._handles = None


class NvmlTelemetryCollector(_NvmlBase):
    name = "nvml"

    def _read(self, nv: Any, gpu: int, field: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            not_supported = getattr(nv, "NVMLError_NotSupported", None)
            if not_supported is not None and isinstance(exc, not_supported):
                return None
            self.problem(f"gpu{gpu}.{field}", f"GPU {gpu}: reading {field} failed: {exc} ({type(exc).__name__})")
            return None

    def collect(self, now: datetime) -> list[Envelope]:
        nv = self._init()
        assert self._handles is not None
        rows: list[dict[str, Any]] = []
        for i, h in self._handles:
            r = lambda field, fn, *a: self._read(nv, i, field, fn, *a)  # noqa: E731
            util = r("utilization", nv.nvmlDeviceGetUtilizationRates, h)
            mem = r("memory", nv.nvmlDeviceGetMemoryInfo, h)
            temp = r("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            sm = r("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            memclk = r("mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            power = r("power", nv.nvmlDeviceGetPowerUsage, h)
            reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
            throttle = r("throttle_reasons", reasons_fn, h)
            sbe = r("ecc_sbe", nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
            dbe = r("ecc_dbe", nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
            retired = None
            pages_sbe = r("retired_pages", nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            pages_dbe = r("retired_pages", nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            if pages_sbe is not None or pages_dbe is not None:
                retired = len(pages_sbe or []) + len(pages_dbe or [])
            remap = r("remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
            remapped = int(remap[0]) + int(remap[1]) if remap is not None else None
            replays = r("pcie_replays", nv.nvmlDeviceGetPcieReplayCounter, h)
            rows.append(dict(
                gpu=i,
                utilization_pct=None if util is None else float(min(100, max(0, util.gpu))),
                memory_used_bytes=None if mem is None else int(mem.used),
                memory_total_bytes=None if mem is None else int(mem.total),
                temperature_c=None if temp is None else float(temp),
                sm_clock_mhz=None if sm is None else float(sm),
                mem_clock_mhz=None if memclk is None else float(memclk),
                power_w=None if power is None else power / 1000.0,
                throttle_reasons=None if throttle is None else int(throttle),
                ecc_sbe=None if sbe is None else int(sbe), ecc_dbe=None if dbe is None else int(dbe),
                retired_pages=retired, remapped_rows=remapped,
                pcie_replays=None if replays is None else int(replays),
                nvlink_errors=self._nvlink(nv, i, h),
            ))
        if not rows:
            return []
        # One event for the node's GPUs, in columns: a figure no GPU reported is an empty column.
        columns = {f: [row[f] for row in rows] for f in GPU_FIGURES}
        for f, values in columns.items():
            if all(v is None or v == {} for v in values):
                values.clear()
        return [GpuSamples(event_time=now, source=self.source, gpus=[row["gpu"] for row in rows], **columns)]

    _NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY"), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
                        ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"))

    def _nvlink(self, nv: Any, gpu: int, h: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0))):
            try:
                active = nv.nvmlDeviceGetNvLinkState(h, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1)
            except Exception:
                break  # no NVLink (or no more links) on this GPU
            if not active:
                continue
            for name, const in self._NVLINK_COUNTERS:
                v = self._read(nv, gpu, f"nvlink{link}.{name}", nv.nvmlDeviceGetNvLinkErrorCounter, h, link, getattr(nv, const))
                if v is not None:
                    out[f"l{link}.{name}"] = int(v)
                    out[name] = out.get(name, 0) + int(v)
        return out


class NvmlXidCollector(_NvmlBase):
    name = "nvml_xid"

    def __init__(self, interval_s: float, source: Source, nvml: Any = None) -> None:
        super().__init__(interval_s, source, nvml)
        self._set: Any = None
        self._bus: dict[int, str] = {}

    def _on_init(self, nv: Any) -> None:
        assert self._handles is not None
        try:
            self._set = nv.nvmlEventSetCreate()
        except Exception as exc:
            raise CollectorUnavailable(f"NVML event sets are not available: {exc}") from None
        for i, h in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._set)
            except Exception as exc:
                self.problem(f"gpu{i}.register", f"GPU {i}: cannot register for XID events: {exc}")
            try:
                bus = nv.nvmlDeviceGetPciInfo(h).busId
                self._bus[i] = bus.decode() if isinstance(bus, bytes) else str(bus)
            except Exception:
                pass

    def _index_of(self, nv: Any, device: Any) -> int | None:
        for i, h in self._handles or []:
            if h == device:
                return i
        try:
            return int(nv.nvmlDeviceGetIndex(device))
        except Exception:
            return None

    def collect(self, now: datetime) -> list[Envelope]:
        nv = self._init()
        out: list[Envelope] = []
        timeout_err = getattr(nv, "NVMLError_Timeout", ())
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        for _ in range(1000):  # drain, bounded
            try:
                data = wait(self._set, 0)
            except timeout_err:
                break
            if not (int(data.eventType) & int(nv.nvmlEventTypeXidCriticalError)):
                continue
            gpu = self._index_of(nv, data.device)
            pci = self._bus.get(gpu) if gpu is not None else None
            out.append(XidError(
                event_time=now, source=self.source.model_copy(update={"gpu": gpu}), code=int(data.eventData),
                pci_bus_id=_short_pci(pci), message="NVML critical XID event", raw_line=None,
            ))
        return out

    def close(self) -> None:
        if self._set is not None and self._nvml is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except Exception:
                pass
            self._set = None
        super().close()


def _short_pci(bus: str | None) -> str | None:
    """NVML's ``00000000:3B:00.0`` -> ``0000:3b:00`` (the kernel log's form)."""
    if not bus:
        return None
    try:
        from vigil.schemas.xid import normalize_pci

        return normalize_pci(bus)
    except Exception:
        return bus
