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
``DCGM_FI_DEV_THERMAL_VIOLATION``               ``throttle_reasons`` bit 0x20   see below
                                                (``sw_thermal_slowdown``)
``DCGM_FI_DEV_POWER_VIOLATION``                 bit 0x4 (``sw_power_cap``)
``DCGM_FI_DEV_SYNC_BOOST_VIOLATION``            bit 0x10 (``sync_boost``)
``DCGM_FI_DEV_XID_ERRORS``                      an ``XidError``                 see below
==============================================  ==============================  ==========================

The ECC, retired-page and NVLink error fields are commented out in
dcgm-exporter's default counters file: a site that wants vigil's ECC and
NVLink detectors enables them there (they are read when present).

Violation counters
------------------
``DCGM_FI_DEV_{POWER,THERMAL,SYNC_BOOST}_VIOLATION`` (commented out in the
default counters file) count the time NVML says a limiter held the GPU below
its application clocks (``nvmlDeviceGetViolationStatus``), cumulative. Where the
clocks-event bitmask is one instant, they cover the whole interval: when a
counter moved by at least ``VIOLATION_MIN_FRACTION`` of the time since it last
moved, :class:`ViolationTracker` sets that limiter's clocks-event bit in
``throttle_reasons`` (OR'd with the bitmask's), so the GPU detector's throttle
rule reads them as it reads the bitmask (thermal is in its default mask, a
power cap is not: a GPU at its power limit under load is normal). The unit is
nanoseconds: NVML's ``violationTime`` is, DCGM passes it on, and DCGM's header
and dcgm-exporter's counters file say ns in their current versions (older ones
said usec); were it microseconds, reading ns under-reads, never over-reads. The
first move after a start is a baseline (when the counter moved before it is
unknown: dcgm-exporter refreshes its values every 30 s by default, not on each
scrape); a counter still for ``VIOLATION_HOLD_S`` means the limiter is off. The
board-limit, low-utilization and reliability counters have no clocks-event bit
and are not read.

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
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` = 112, ``DCGM_FI_DEV_POWER_VIOLATION`` = 240,
``DCGM_FI_DEV_THERMAL_VIOLATION`` = 241, ``DCGM_FI_DEV_SYNC_BOOST_VIOLATION`` = 242);
NVML "Clocks Event Reasons" and ``nvmlViolationTime_t``.
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

__all__ = ["DcgmReading", "XidTracker", "ViolationTracker", "read_dcgm", "gpu_events",
           "VIOLATION_MIN_FRACTION", "VIOLATION_HOLD_S"]

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
#: Violation counter -> the NVML clocks-event reason bit of the same limiter.
_VIOLATIONS: dict[str, int] = {
    "DCGM_FI_DEV_THERMAL_VIOLATION": 0x20,     # sw_thermal_slowdown
    "DCGM_FI_DEV_POWER_VIOLATION": 0x4,        # sw_power_cap
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 0x10,  # sync_boost
}
#: A limiter counts when it held the GPU below its clocks at least this much of the time since its counter
#: last moved: half, as a clocks-event bit seen at most sampling instants would say.
VIOLATION_MIN_FRACTION = 0.5
#: A violation counter that has not moved for this long means its limiter is off (dcgm-exporter refreshes
#: its values every 30 s by default: two refreshes and a scrape).
VIOLATION_HOLD_S = 65.0
_VIOLATION_NS = 1e-9
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
_MIB = 1 << 20
_MAX_COUNTER = 2**63


@dataclass
class _Gpu:
    fields: dict[str, Any] = field(default_factory=dict)
    summed: dict[str, int] = field(default_factory=dict)
    nvlink: dict[str, int] = field(default_factory=dict)
    fb: dict[str, float] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
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
            if not (s.name in _DIRECT or s.name in _SUMMED or s.name in _NVLINK or s.name in _FB
                    or s.name in _VIOLATIONS):
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
        elif s.name in _VIOLATIONS:
            if 0 <= s.value < _MAX_COUNTER:
                g.violations[s.name] = int(s.value)
        else:
            continue
        g.seen.add(s.name)
    return out


def gpu_events(reading: DcgmReading, now: datetime, cluster: str,
               violations: "ViolationTracker | None" = None) -> list[GpuTelemetry]:
    """One ``GpuTelemetry`` per GPU of the reading, sorted by node and GPU; ``violations`` turns the
    violation counters into clocks-event bits (it keeps their last values between scrapes)."""
    out: list[GpuTelemetry] = []
    for (node, gpu), g in sorted(reading.gpus.items()):
        fields = dict(g.fields)
        fields.update(g.summed)
        if violations is not None and g.violations:
            bits = violations.reasons(node, gpu, g.violations, now.timestamp())
            if bits is not None:
                fields["throttle_reasons"] = fields.get("throttle_reasons", 0) | bits
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


class ViolationTracker:
    """DCGM's violation counters to clocks-event reason bits (see "Violation counters" above).

    Per GPU and counter: its last value, when it last moved and the share of
    that time the limiter held the clocks down. Time is an argument.

    >>> t = ViolationTracker()
    >>> v = "DCGM_FI_DEV_THERMAL_VIOLATION"
    >>> [t.reasons("gpu-07", 1, {v: ns}, now) for ns, now in ((0, 0.0), (30e9, 30.0), (60e9, 60.0), (69e9, 90.0))]
    [None, None, 32, 0]
    """

    def __init__(self, min_fraction: float = VIOLATION_MIN_FRACTION, hold_s: float = VIOLATION_HOLD_S,
                 max_keys: int = 100_000) -> None:
        if not 0 < min_fraction <= 1:
            raise ValueError(f"min_fraction must be in (0, 1], got {min_fraction}")
        if not hold_s > 0:
            raise ValueError(f"hold_s must be > 0, got {hold_s}")
        self.min_fraction, self.hold_s, self.max_keys = min_fraction, hold_s, max_keys
        #: (node, gpu, metric) -> [value, moved_at, fraction or None, moved once since the baseline]
        self._last: dict[tuple[str, int, str], list] = {}

    def fraction(self, node: str, gpu: int, metric: str, value: int, now: float) -> float | None:
        """The share of the time since the counter last moved that its limiter held the clocks (None: unknown)."""
        key = (node, gpu, metric)
        st = self._last.get(key)
        if st is None or value < st[0]:  # first seen, or reset (the exporter or the driver restarted)
            if st is None and len(self._last) >= self.max_keys:
                self._last.pop(next(iter(self._last)))
            self._last[key] = [value, now, None, False]
            return None
        last, moved_at, frac, moved = st
        if value == last:
            if now - moved_at >= self.hold_s:
                st[2] = 0.0  # still this long: the limiter is off
            return st[2]
        elapsed = now - moved_at
        st[0], st[1], st[3] = value, now, True
        if not moved or elapsed <= 0:
            st[2] = None  # the first move: when it moved before is unknown
            return None
        share = (value - last) * _VIOLATION_NS / elapsed
        # a refresh lands up to a scrape apart from the last one: a limiter on all the time reads a little over 1;
        # far over it is no time in ns (a garbled or foreign counter), not evidence
        st[2] = min(1.0, share) if share <= 2.0 else None
        return st[2]

    def reasons(self, node: str, gpu: int, counters: dict[str, int], now: float) -> int | None:
        """The clocks-event bits of the limiters that held the GPU's clocks down (None: none known yet)."""
        bits, known = 0, False
        for metric, value in counters.items():
            share = self.fraction(node, gpu, metric, value, now)
            if share is None:
                continue
            known = True
            if share >= self.min_fraction:
                bits |= _VIOLATIONS[metric]
        return bits if known else None
