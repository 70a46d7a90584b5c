"""dcgm-exporter's exposition to vigil's ``GpuTelemetry`` and ``XidError`` events.

Metric names are the DCGM field names dcgm-exporter exposes (its
``etc/default-counters.csv`` lists them, one field per line: name, Prometheus
type, help); labels per series are ``gpu`` (the index), ``UUID``, ``device``
(``nvidia<N>``), ``modelName``, ``Hostname`` and, on newer versions,
``pci_bus_id``; MIG instances add ``GPU_I_ID``/``GPU_I_PROFILE`` and repeat the
device-level fields per instance (the first one read is kept).

==============================================  ==============================  ==========================
DCGM field (dcgm-exporter metric)               vigil ``GpuTelemetry`` field    unit / note
==============================================  ==============================  ==========================
``DCGM_FI_DEV_GPU_UTIL``                        ``utilization_pct``             %
``DCGM_FI_DEV_GPU_TEMP``                        ``temperature_c``               deg C
``DCGM_FI_DEV_SM_CLOCK``                        ``sm_clock_mhz``                MHz
``DCGM_FI_DEV_MEM_CLOCK``                       ``mem_clock_mhz``               MHz
``DCGM_FI_DEV_POWER_USAGE``                     ``power_w``                     W
``DCGM_FI_DEV_FB_USED`` / ``_FREE``             ``memory_used_bytes``/``_total``  MiB in, bytes out;
                                                                                total = used + free
                                                                                (+ ``_RESERVED``)
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``            ``throttle_reasons``            NVML bitmask; the field
(``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` before                                  was renamed with NVML's
DCGM 3.2)                                                                       "clocks event reasons"
``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``               ``ecc_sbe``                     volatile, corrected
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``               ``ecc_dbe``                     volatile, uncorrected
``DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS`` +     ``remapped_rows``               as NVML's (corr + unc)
``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``
``DCGM_FI_DEV_RETIRED_SBE`` + ``_DBE``          ``retired_pages``               pre-Ampere
``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``             ``pcie_replays``
``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``  ``nvlink_errors["crc_flit"]``   summed over links
``DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL``  ``nvlink_errors["crc_data"]``   (the agent's names)
``DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL``    ``nvlink_errors["replay"]``
``DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL``  ``nvlink_errors["recovery"]``
``DCGM_FI_DEV_XID_ERRORS``                      an ``XidError``                 see below
==============================================  ==============================  ==========================

The ECC, retired-page and NVLink error fields are commented out in
dcgm-exporter's default counters file: a site that wants vigil's ECC and
NVLink detectors enables them there (they are read when present).

XIDs
----
``DCGM_FI_DEV_XID_ERRORS`` is a gauge whose value is the *last* XID the GPU
raised (DCGM field 230), not a count; dcgm-exporter 3.3.6 and later add
``err_code`` (the same number) and ``err_msg`` (NVIDIA's description) labels
(dcgm-exporter pull request 309). It is not reset when the fault clears, only
when dcgm-exporter restarts (dcgm-exporter issues 190 and 500), so an XID is
an *edge*: :class:`XidTracker` publishes one ``XidError`` when the value
changes to a nonzero code, and remembers the last value per GPU in a state
file so that a restart of ``vigil scrape`` does not report it again. A value
seen when no earlier one is known (the first scrape ever) is a baseline, not a
new fault, unless ``report_existing`` is set. Limitation of the source: the
same XID twice in a row does not change the gauge and cannot be seen here
(the node agent's kernel-log reader sees every one).

References
----------
NVIDIA dcgm-exporter, ``etc/default-counters.csv`` and ``etc/dcp-metrics-included.csv``;
NVIDIA DCGM field identifiers (``dcgm_fields.h``: ``DCGM_FI_DEV_XID_ERRORS`` = 230,
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` = 112); NVML "Clocks Event Reasons".
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from vigil.producers.exporters.exposition import Sample
from vigil.schemas import GpuTelemetry, Source, XidError

log = logging.getLogger(__name__)

__all__ = ["DcgmReading", "XidTracker", "read_dcgm", "gpu_events"]

_DIRECT: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "utilization_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replays",
}
_INTEGER = {"throttle_reasons", "ecc_sbe", "ecc_dbe", "pcie_replays"}
_SUMMED: dict[str, str] = {
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages",
}
_NVLINK: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "crc_flit",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "recovery",
}
_FB = {"DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free", "DCGM_FI_DEV_FB_RESERVED": "reserved"}
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
_MIB = 1 << 20
_MAX_COUNTER = 2**63


@dataclass
class _Gpu:
    fields: dict[str, Any] = field(default_factory=dict)
    summed: dict[str, int] = field(default_factory=dict)
    nvlink: dict[str, int] = field(default_factory=dict)
    fb: dict[str, float] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # metric names read (MIG repeats are skipped)
    pci_bus_id: str | None = None


@dataclass
class DcgmReading:
    """One scrape of one dcgm-exporter: per ``(node, gpu)``, its fields and its last XID."""

    gpus: dict[tuple[str, int], _Gpu] = field(default_factory=dict)
    #: (node, gpu) -> (last XID value, the series' labels)
    xids: dict[tuple[str, int], tuple[int, dict[str, str]]] = field(default_factory=dict)

    @property
    def nodes(self) -> set[str]:
        return {n for n, _ in self.gpus} | {n for n, _ in self.xids}


def read_dcgm(samples: Iterable[Sample], node: str | None, fallback_node: str) -> DcgmReading:
    """Group dcgm-exporter samples by node and GPU.

    The node is ``node`` (the target's configuration) when given, else the
    series' ``Hostname`` label, else ``fallback_node`` (the target's host).
    Series without a ``gpu`` label (NVSwitch, CPU entities) are skipped.

    >>> from vigil.producers.exporters.exposition import parse
    >>> r = read_dcgm(parse('DCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="gpu-07"} 84\\n'
    ...                      'DCGM_FI_DEV_FB_USED{gpu="1",Hostname="gpu-07"} 1024\\n'
    ...                      'DCGM_FI_DEV_FB_FREE{gpu="1",Hostname="gpu-07"} 1024\\n'), None, "10.0.0.7")
    >>> [(k, g.fields) for k, g in r.gpus.items()]
    [(('gpu-07', 1), {'temperature_c': 84.0})]
    """
    out = DcgmReading()
    for s in samples:
        if s.name.endswith("_total"):  # added by the parser to a counter (DCGM names are upper case)
            s = Sample(s.name[:-len("_total")], s.labels, s.value)
        gpu_label = s.labels.get("gpu")
        if gpu_label is None or not gpu_label.isdigit():
            continue
        where = (node or s.labels.get("Hostname") or fallback_node, int(gpu_label))
        if s.name == XID_METRIC:
            if where not in out.xids and 0 <= s.value < _MAX_COUNTER:
                out.xids[where] = (int(s.value), dict(s.labels))
            continue
        g = out.gpus.get(where)
        if g is None:
            if not (s.name in _DIRECT or s.name in _SUMMED or s.name in _NVLINK or s.name in _FB):
                continue
            g = out.gpus[where] = _Gpu()
        if s.name in g.seen:  # a MIG instance repeating a device-level field
            continue
        if g.pci_bus_id is None and s.labels.get("pci_bus_id"):
            g.pci_bus_id = s.labels["pci_bus_id"]
        if s.name in _DIRECT:
            name = _DIRECT[s.name]
            if name in _INTEGER:
                if not 0 <= s.value < _MAX_COUNTER:
                    continue
                g.fields[name] = int(s.value)
            elif name == "utilization_pct":
                g.fields[name] = min(100.0, max(0.0, s.value))
            elif s.value >= 0 or name == "temperature_c":
                g.fields[name] = s.value
        elif s.name in _SUMMED:
            if 0 <= s.value < _MAX_COUNTER:
                g.summed[_SUMMED[s.name]] = g.summed.get(_SUMMED[s.name], 0) + int(s.value)
        elif s.name in _NVLINK:
            if 0 <= s.value < _MAX_COUNTER:
                g.nvlink[_NVLINK[s.name]] = int(s.value)
        elif s.name in _FB and s.value >= 0:
            g.fb[_FB[s.name]] = s.value
        else:
            continue
        g.seen.add(s.name)
    return out


def gpu_events(reading: DcgmReading, now: datetime, cluster: str) -> list[GpuTelemetry]:
    """One ``GpuTelemetry`` per GPU of the reading, sorted by node and GPU."""
    out: list[GpuTelemetry] = []
    for (node, gpu), g in sorted(reading.gpus.items()):
        fields = dict(g.fields)
        fields.update(g.summed)
        if "used" in g.fb:
            fields["memory_used_bytes"] = int(g.fb["used"] * _MIB)
            if "free" in g.fb:
                fields["memory_total_bytes"] = int((g.fb["used"] + g.fb["free"] + g.fb.get("reserved", 0.0)) * _MIB)
        out.append(GpuTelemetry(event_time=now, source=Source(cluster=cluster, node=node, gpu=gpu),
                                nvlink_errors=dict(g.nvlink), **fields))
    return out


class XidTracker:
    """Turns the last-XID gauge into XID *events*: one per change to a nonzero code.

    ``state_path`` (optional) keeps the last value per GPU across restarts
    (a small JSON file, replaced atomically); without it every start begins
    from a baseline.

    >>> from datetime import datetime, timezone
    >>> t = XidTracker(None)
    >>> now = datetime(2026, 3, 2, tzinfo=timezone.utc)
    >>> t.observe("gpu-07", 3, 0, {}, now, "c") is None        # baseline
    True
    >>> ev = t.observe("gpu-07", 3, 79, {"err_msg": "GPU has fallen off the bus"}, now, "c")
    >>> ev.code, ev.source.node, ev.source.gpu, ev.message
    (79, 'gpu-07', 3, 'GPU has fallen off the bus')
    >>> t.observe("gpu-07", 3, 79, {}, now, "c") is None       # unchanged: the same fault
    True
    """

    def __init__(self, state_path: str | os.PathLike | None, report_existing: bool = False) -> None:
        self.state_path = Path(state_path) if state_path is not None else None
        self.report_existing = report_existing
        self._last: dict[str, int] = {}
        self._dirty = False
        if self.state_path is not None and self.state_path.exists():
            try:
                loaded = json.loads(self.state_path.read_text())
                self._last = {str(k): int(v) for k, v in loaded.items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                log.warning("XID state %s unreadable (%s): starting from a baseline", self.state_path, exc)

    def observe(self, node: str, gpu: int, value: int, labels: dict[str, str], now: datetime,
                cluster: str) -> XidError | None:
        key = f"{node}/{gpu}"
        previous = self._last.get(key)
        if previous != value:
            self._last[key] = value
            self._dirty = True
        if value == 0 or value == previous:
            return None
        if previous is None and not self.report_existing:
            log.info("GPU %s of %s shows XID %d at the first scrape: taken as a baseline, not reported", gpu, node, value)
            return None
        pci = labels.get("pci_bus_id")
        try:
            from vigil.schemas.xid import normalize_pci

            pci = normalize_pci(pci) if pci else None
        except ValueError:
            pci = None
        return XidError(event_time=now, source=Source(cluster=cluster, node=node, gpu=gpu), code=value,
                        pci_bus_id=pci, message=labels.get("err_msg", "")[:1000],
                        raw_line=None)

    def save(self) -> None:
        """Write the state file if anything changed (atomically: a crash leaves the old one)."""
        if self.state_path is None or not self._dirty:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=".xid-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._last, f, sort_keys=True)
            os.replace(tmp, self.state_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._dirty = False
