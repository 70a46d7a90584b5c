"""GPU degradation on one node: throttling, slow or hot GPUs among their peers, ECC and NVLink errors.

One call per node per interval carries one sample of every GPU of the node
(what a DCGM/NVML collector reads in one sweep; the engine gives it the
per-GPU events of one message, or the node's ``gpu_samples`` in columns), so each GPU is compared with
its peers *in the same instant and chassis*: the same job, the same airflow,
the same power budget. Fields of a GPU sample (all optional):

=====================  ==========================================================
``sm_clock``           SM clock, MHz (``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``)
``temperature``        GPU temperature, deg C
``power``              power draw, W (evidence only)
``utilization``        GPU utilization, % — peers below ``min_util`` are idle and
                       not compared on clock
``throttle_reasons``   NVML clocks-event/throttle reason bitmask
                       (``nvmlDeviceGetCurrentClocksEventReasons``)
``ecc_sbe``            cumulative corrected (single-bit) ECC errors
``ecc_dbe``            cumulative uncorrected (double-bit) ECC errors
``nvlink_errors``      cumulative NVLink errors (or ``nvlink_crc_errors``,
                       ``nvlink_replay_errors``, ``nvlink_recovery_errors``,
                       which are summed)
=====================  ==========================================================

Findings, per GPU (``finding`` is the most severe open one):

* ``throttle`` (sev3): a reason in ``throttle_mask`` (default HW slowdown,
  SW/HW thermal slowdown, HW power brake) for ``min_samples`` consecutive samples.
  SW power cap and idle/app-clock/sync-boost reasons are normal under load.
* ``clock_below_peers`` (sev3): SM clock below ``(1 - clock_rel)`` x the median
  of the busy peers for ``min_samples`` consecutive samples.
* ``temperature_outlier`` (sev3): temperature above the peer median by more
  than ``max(temp_margin, z * 1.4826 * MAD)``, or at/above ``temp_limit``, for
  ``min_samples`` consecutive samples.
* ``ecc_dbe`` (sev1): any increase of the uncorrected ECC count (the GPU must
  leave the job); open for ``hold`` seconds after the last increase.
* ``ecc_sbe`` (sev3): at least ``sbe_threshold`` corrected errors within ``window`` seconds.
* ``nvlink_errors`` (sev3): at least ``nvlink_threshold`` NVLink errors within ``window`` seconds.

Counters that go down were reset (driver reload, ``nvidia-smi -p 0``): the new
value is the increase.

References
----------
NVIDIA NVML API reference, "Clocks Event Reasons" (nvmlClocksEventReasons);
NVIDIA DCGM health and diagnostics documentation; Wu et al., "Falcon" (2024)
and Meta's "Revisiting Reliability in Large-Scale ML Research Clusters" (2024)
on throttled GPUs as the commonest computation fail-slow.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Iterable

import numpy as np

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.schemas import GpuSamples, GpuTelemetry

__all__ = ["GpuDegradation", "THROTTLE_REASONS", "DEFAULT_THROTTLE_MASK", "decode_throttle_reasons"]

#: NVML clock-event (throttle) reason bits.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: Reasons that mean degradation: HW slowdown, SW/HW thermal, HW power brake.
DEFAULT_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80
_NUMERIC = ("sm_clock", "temperature", "power", "utilization")
_NVLINK_FIELDS = ("nvlink_errors", "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
_COUNTERS = ("ecc_sbe", "ecc_dbe") + _NVLINK_FIELDS


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the NVML throttle reason bits set in ``mask``.

    >>> decode_throttle_reasons(0x44)
    ['sw_power_cap', 'hw_thermal_slowdown']
    """
    return [name for bit, name in sorted(THROTTLE_REASONS.items()) if mask & bit]


def _median(values: list[float]) -> float:
    """Median of a handful of peers (a node's GPUs): sorting beats numpy's overhead here."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _peer_medians(values: dict[str, float]) -> dict[str, float]:
    """For each key, the median of the *other* values, from one sort (not one per key)."""
    ordered = sorted(values.values())
    n = len(ordered) - 1  # peers per key
    if n < 1:
        return {}
    position: dict[float, int] = {}
    for i, v in enumerate(ordered):
        position.setdefault(v, i)  # equal values: removing any one of them leaves the same list

    def kth(k: int, p: int) -> float:  # k-th of the list without index p
        return ordered[k] if k < p else ordered[k + 1]

    out = {}
    for key, v in values.items():
        p = position[v]
        mid = n // 2
        out[key] = float(kth(mid, p)) if n % 2 else (kth(mid - 1, p) + kth(mid, p)) / 2.0
    return out


_REAL = (int, float)


@register
class GpuDegradation(Detector):
    """Per-node GPU degradation detector over one sample of all GPUs per interval.

    Parameters
    ----------
    min_samples : int, default 3
        Consecutive samples that open (and, normal, close) a throttle / clock / temperature finding.
    throttle_mask : int, default ``DEFAULT_THROTTLE_MASK``
        NVML reason bits that count as throttling.
    clock_rel : float, default 0.1
        A busy GPU is slow when its SM clock is below ``(1 - clock_rel)`` x the peer median.
    min_util : float, default 50.0
        Utilization (%) below which a GPU is idle and left out of clock comparisons.
    temp_margin : float, default 10.0
        Minimum excess over the peer median temperature, deg C.
    temp_limit : float, default 90.0
        Absolute temperature that is an outlier whatever the peers do.
    z : float, default 5.0
        Robust z (vs 1.4826 * MAD of the peers) for temperature outliers.
    min_peers : int, default 3
        GPUs needed in a sample for peer comparisons.
    hold : float, default 3600.0
        Seconds an ``ecc_dbe`` finding stays open after the last increase.
    window : float, default 3600.0
        Window for the SBE and NVLink error counts.
    sbe_threshold, nvlink_threshold : int, default 100, 10
        Errors within ``window`` that open ``ecc_sbe`` / ``nvlink_errors``.
    node : str, default ""
        Node name carried in the evidence.

    Update signature: ``update(samples, *, t)`` with ``samples`` a mapping GPU
    id (index or PCI bus id) -> mapping of the fields in the module docstring.

    Evidence keys: always ``node, gpu``; ``throttle``: ``reasons, mask``;
    ``clock_below_peers``: ``sm_clock, peer_median, ratio``;
    ``temperature_outlier``: ``temperature, peer_median, peer_mad, excess``;
    ``ecc_dbe`` / ``ecc_sbe`` / ``nvlink_errors``: ``increase, in_window``.

    References
    ----------
    NVIDIA NVML "Clocks Event Reasons"; NVIDIA DCGM health checks; Falcon
    (Wu et al., 2024).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> det = GpuDegradation(node="n3")
    >>> for i in range(6):
    ...     s = {g: {"sm_clock": 1980 - abs(rng.normal(0, 10)), "temperature": 65 + rng.normal(0, 2),
    ...              "utilization": 99, "throttle_reasons": 0x4} for g in range(8)}
    ...     if i >= 2:   # GPU 5 overheats and throttles from sample 2 on
    ...         s[5].update(sm_clock=1410.0, temperature=92.0, throttle_reasons=0x4 | 0x40)
    ...     det.update(s, t=10.0 * i)
    >>> sorted((f.kind, f.severity, f.onset, f.evidence["gpu"]) for f in det.findings)
    [('clock_below_peers', 3, 20.0, '5'), ('temperature_outlier', 3, 20.0, '5'), ('throttle', 3, 20.0, '5')]
    """

    name = "gpu_degradation"
    version = "1"
    consumes = ("gpu_telemetry", "gpu_samples")
    per = "node"
    batch = True

    @classmethod
    def for_key(cls, key: str, **params: Any) -> "GpuDegradation":
        return cls(node=key, **params)

    def observe_batch(self, items: list[GpuTelemetry], *, t: float, context: KeyContext | None = None) -> None:
        """One node's GPU samples of one message: compared with each other as one sampling round.

        The samples are validated events (finite numbers, non-negative counts),
        so their rows go straight to the detector's state, without
        :meth:`update`'s checks of arbitrary input; a healthy round on a healthy
        node (:meth:`_quiet`) changes nothing but the time.
        """
        if len(items) == 1 and type(items[0]) is GpuSamples:  # a node's sample in columns: the common case
            if self._quiet_columns(items[0], t):
                return
        if any(type(s) is GpuSamples for s in items):
            items = [r for s in items for r in (s.rows() if type(s) is GpuSamples else (s,))]  # type: ignore[union-attr]
        elif self._quiet(items, t):
            return
        clean: dict[str, dict[str, Any]] = {}
        bad: str | None = None
        for s in items:
            gpu = s.source.gpu
            if gpu is None:
                continue
            row: dict[str, Any] = {}
            if s.sm_clock_mhz is not None:
                row["sm_clock"] = float(s.sm_clock_mhz)
            if s.temperature_c is not None:
                row["temperature"] = float(s.temperature_c)
            if s.power_w is not None:
                row["power"] = float(s.power_w)
            if s.utilization_pct is not None:
                row["utilization"] = float(s.utilization_pct)
            if s.throttle_reasons is not None:
                row["throttle_reasons"] = s.throttle_reasons
            if s.ecc_sbe is not None:
                row["ecc_sbe"] = s.ecc_sbe
            if s.ecc_dbe is not None:
                row["ecc_dbe"] = s.ecc_dbe
            if s.nvlink_errors:
                total = sum(s.nvlink_errors.values())
                if total < 0:  # the schema allows any int per link; a count cannot go below zero
                    bad = f"GPU {gpu!r}: nvlink_errors must be a non-negative int, got {total!r}"
                row["nvlink_errors"] = total
            clean[str(gpu)] = row
        if not clean:
            return
        t = _check_time(t, "t")  # the latest stamp of the items (the engine read their times already)
        if self._last_t is not None:  # in update()'s order: the time first, then the rows
            if t == self._last_t:
                return  # duplicate delivery
            if t < self._last_t:
                raise DetectorError(f"sample at t={t} is older than the previous one at t={self._last_t}")
        if bad is not None:
            raise DetectorError(bad)
        self._apply(clean, t, checked=True)
        for s in items:  # what each GPU's counters are now, for _quiet
            if s.source.gpu is not None:
                nvl = s.nvlink_errors
                self._counted[s.source.gpu] = (s.ecc_sbe, s.ecc_dbe, sum(nvl.values()) if nvl else None)

    def _quiet(self, items: list[GpuTelemetry], t: float) -> bool:
        """A round that would change nothing but the time, taken as such (most rounds of most nodes).

        Nothing is under way (no condition seen, no finding open, no count in a window), the round is
        newer than the last, every GPU is known with the same counts as last time, none throttles, and
        no GPU can be slow or hot (the slowest busy one within ``clock_rel`` of the fastest; the hottest
        below ``temp_limit`` and within ``temp_margin`` of the coolest): then :meth:`_apply` would only
        have moved the time. Anything else takes the full path.
        """
        if not self._may_be_quiet(t):
            return False
        counted, mask, min_util = self._counted, self.throttle_mask, self.min_util
        seen: set[int] = set()
        clocks: list[float] = []
        temps: list[float] = []
        for s in items:
            gpu = s.source.gpu
            if gpu is None:
                continue
            nvl = s.nvlink_errors
            if gpu in seen or counted.get(gpu) != (s.ecc_sbe, s.ecc_dbe, sum(nvl.values()) if nvl else None):
                return False
            seen.add(gpu)
            reasons = s.throttle_reasons
            if reasons is not None and reasons & mask:
                return False
            clock = s.sm_clock_mhz
            if clock is not None:
                util = s.utilization_pct
                if util is None or util >= min_util:
                    clocks.append(clock)
            if s.temperature_c is not None:
                temps.append(s.temperature_c)
        return bool(seen) and self._peers_quiet(clocks, temps, t)

    def _may_be_quiet(self, t: float) -> bool:
        """A round at ``t`` can be quiet: newer than the last, nothing under way, nothing held."""
        last = self._last_t
        return not (last is None or not t > last or self._active or self._queued or not math.isfinite(t))

    def _peers_quiet(self, clocks: list[float], temps: list[float], t: float) -> bool:
        """No GPU slow or hot among its peers (the busy GPUs' ``clocks``, the ``temps``): then the round
        only moves the time to ``t``, and this says True."""
        if len(clocks) - 1 >= self.min_peers and min(clocks) < (1.0 - self.clock_rel) * max(clocks):
            return False
        if temps:
            hottest = max(temps)
            if hottest >= self.temp_limit or (len(temps) - 1 >= self.min_peers and
                                              hottest - min(temps) > self.temp_margin):
                return False
        self._last_t = t
        self._now = t if self._now is None else max(self._now, t)
        return True

    def _quiet_columns(self, s: GpuSamples, t: float) -> bool:
        """:meth:`_quiet` on a node's sample in columns, column by column (no object per GPU)."""
        if not self._may_be_quiet(t):
            return False
        gpus = s.gpus
        n = len(gpus)
        none = [None] * n
        nvl = s.nvlink_errors
        sums = [sum(d.values()) if d else None for d in nvl] if nvl else none
        counted = self._counted
        if list(zip(s.ecc_sbe or none, s.ecc_dbe or none, sums)) != [counted.get(g) for g in gpus]:
            return False  # a count moved, or a GPU is new (gpus are unique: the schema says so)
        mask = self.throttle_mask
        for reasons in s.throttle_reasons:
            if reasons is not None and reasons & mask:
                return False
        min_util = self.min_util
        util = s.utilization_pct
        clocks = [c for c, u in zip(s.sm_clock_mhz, util or none) if c is not None and (u is None or u >= min_util)]
        return self._peers_quiet(clocks, [x for x in s.temperature_c if x is not None], t)

    def observe(self, item: GpuTelemetry, *, t: float, context: KeyContext | None = None) -> None:
        self.observe_batch([item], t=t, context=context)

    def __init__(
        self,
        min_samples: int = 3,
        throttle_mask: int = DEFAULT_THROTTLE_MASK,
        clock_rel: float = 0.1,
        min_util: float = 50.0,
        temp_margin: float = 10.0,
        temp_limit: float = 90.0,
        z: float = 5.0,
        min_peers: int = 3,
        hold: float = 3600.0,
        window: float = 3600.0,
        sbe_threshold: int = 100,
        nvlink_threshold: int = 10,
        node: str = "",
    ):
        _check_positive_ints(min_samples=min_samples, min_peers=min_peers, sbe_threshold=sbe_threshold, nvlink_threshold=nvlink_threshold)
        self.min_samples = min_samples
        self.min_peers = min_peers
        self.sbe_threshold = sbe_threshold
        self.nvlink_threshold = nvlink_threshold
        if isinstance(throttle_mask, bool) or not isinstance(throttle_mask, int) or throttle_mask <= 0:
            raise DetectorError(f"throttle_mask must be a positive int bitmask, got {throttle_mask!r}")
        self.throttle_mask = throttle_mask
        self.clock_rel = _check_positive(clock_rel, "clock_rel")
        if self.clock_rel >= 1:
            raise DetectorError(f"clock_rel must be below 1, got {clock_rel!r}")
        if isinstance(min_util, bool) or not isinstance(min_util, (int, float)) or not 0 <= min_util <= 100:
            raise DetectorError(f"min_util must be a percentage in [0, 100], got {min_util!r}")
        self.min_util = float(min_util)
        self.temp_margin = _check_positive(temp_margin, "temp_margin")
        self.temp_limit = _check_positive(temp_limit, "temp_limit")
        self.z = _check_positive(z, "z")
        self.hold = _check_positive(hold, "hold")
        self.window = _check_positive(window, "window")
        if not isinstance(node, str):
            raise DetectorError(f"node must be a str, got {node!r}")
        self.node = node
        self._reset()

    def _reset(self) -> None:
        self._gpus: dict[str, dict[str, Any]] = {}
        self._last_t: float | None = None
        self._now: float | None = None
        # what is going on (the common case: nothing), so that healthy samples, ticks and findings stay cheap
        self._active = 0  # runs under way (a condition seen, or a finding open)
        self._queued = 0  # counter increases held in the windows
        self._counted: dict[int, tuple[Any, Any, Any]] = {}  # GPU -> its counts as the events path last saw them

    def _gpu(self, gpu: str) -> dict[str, Any]:
        g = self._gpus.get(gpu)
        if g is None:
            g = {
                "runs": {k: {"on": 0, "off": 0, "start": None, "open": None, "evidence": {}} for k in ("throttle", "clock_below_peers", "temperature_outlier")},
                "counters": {},
                "events": {k: deque() for k in ("ecc_dbe", "ecc_sbe", "nvlink_errors")},  # (t, increase)
                "first": {},
            }
            self._gpus[gpu] = g
        return g

    # -- input ---------------------------------------------------------------
    def update(self, samples: Mapping[Any, Mapping[str, Any]], *, t: float) -> None:
        t = _check_time(t, "t")
        self._counted.clear()  # the general path may change the counts _quiet relies on
        if not isinstance(samples, Mapping):
            raise DetectorError(f"samples must be a mapping gpu -> fields, got {type(samples).__name__}")
        if self._last_t is not None:
            if t == self._last_t:
                return  # duplicate delivery
            if t < self._last_t:
                raise DetectorError(f"sample at t={t} is older than the previous one at t={self._last_t}")
        clean: dict[str, dict[str, Any]] = {}
        for gid, fields in samples.items():
            if not isinstance(fields, Mapping):
                raise DetectorError(f"GPU {gid!r}: fields must be a mapping, got {type(fields).__name__}")
            row: dict[str, Any] = {}
            for k, v in fields.items():
                if v is None:
                    continue
                if k in _NUMERIC:
                    if type(v) in _REAL and math.isfinite(v):  # the common case, checked cheaply
                        row[k] = float(v)
                        continue
                    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                        raise DetectorError(f"GPU {gid!r}: {k} must be a finite number, got {v!r}")
                    row[k] = float(v)
                elif k == "throttle_reasons" or k in _COUNTERS:
                    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                        raise DetectorError(f"GPU {gid!r}: {k} must be a non-negative int, got {v!r}")
                    row[k] = int(v)
            clean[str(gid)] = row
        self._apply(clean, t, checked=True)

    def _apply(self, clean: dict[str, dict[str, Any]], t: float, checked: bool = False) -> None:
        """One sampling round of valid rows (GPU id -> fields) at ``t``."""
        if not checked and self._last_t is not None:
            if t == self._last_t:
                return  # duplicate delivery
            if t < self._last_t:
                raise DetectorError(f"sample at t={t} is older than the previous one at t={self._last_t}")
        prev_t = self._last_t
        self._last_t = t
        self._now = t if self._now is None else max(self._now, t)
        self._counters(clean, t)
        self._peer_conditions(clean, t, prev_t)
        self._expire()

    def _counters(self, clean: dict[str, dict[str, Any]], t: float) -> None:
        for gid, row in clean.items():
            g = self._gpu(gid)
            counters = g["counters"]
            inc: dict[str, int] | None = None
            for k in _COUNTERS:
                v = row.get(k)
                if v is None:
                    continue
                old = counters.get(k)
                counters[k] = v
                if old is None or v == old:
                    continue
                d = v - old if v >= old else v  # decrease: reset
                if d:
                    inc = inc if inc is not None else {}
                    kind = "nvlink_errors" if k in _NVLINK_FIELDS else k
                    inc[kind] = inc.get(kind, 0) + d
            if inc:
                for k in ("ecc_dbe", "ecc_sbe", "nvlink_errors"):  # the order the events were always appended in
                    d = inc.get(k, 0)
                    if d > 0:
                        g["events"][k].append((t, d))
                        self._queued += 1

    def _peer_conditions(self, clean: dict[str, dict[str, Any]], t: float, prev_t: float | None) -> None:
        # Evidence is built only for a condition that holds: most samples of most GPUs are healthy. So are
        # most nodes: no GPU is slow when the slowest busy one is within clock_rel of the fastest (a peer
        # median is at most the fastest), none hot when the hottest is below temp_limit and within
        # temp_margin of the coolest; then the medians are not needed, and a run with nothing under way is
        # not stepped (a condition that does not hold changes nothing there).
        busy = {g: r["sm_clock"] for g, r in clean.items() if "sm_clock" in r and r.get("utilization", 100.0) >= self.min_util}
        temps = {g: r["temperature"] for g, r in clean.items() if "temperature" in r}
        clock_peers = len(busy) - 1 >= self.min_peers
        temp_peers = len(temps) - 1 >= self.min_peers
        clock_quiet = not clock_peers or min(busy.values()) >= (1.0 - self.clock_rel) * max(busy.values())
        temp_quiet = bool(temps) and max(temps.values()) < self.temp_limit and (
            not temp_peers or max(temps.values()) - min(temps.values()) <= self.temp_margin)
        clock_medians = _peer_medians(busy) if clock_peers and not clock_quiet else {}
        temp_medians = _peer_medians(temps) if temp_peers and not temp_quiet else {}
        for gid, row in clean.items():
            g = self._gpu(gid)
            runs = g["runs"]
            # throttle
            if "throttle_reasons" in row:
                mask = row["throttle_reasons"]
                bad = mask & self.throttle_mask
                run = runs["throttle"]
                if bad or run["on"] or run["open"] is not None:
                    self._step(run, bool(bad), t,
                               (lambda: {"reasons": decode_throttle_reasons(bad), "mask": mask}) if bad else None)
            # clock below peers
            if clock_peers and gid in busy:
                run = runs["clock_below_peers"]
                if clock_quiet:
                    if run["on"] or run["open"] is not None:
                        self._step(run, False, t, None)
                else:
                    med = clock_medians[gid]
                    clk = busy[gid]
                    slow = med > 0 and clk < (1.0 - self.clock_rel) * med
                    if slow or run["on"] or run["open"] is not None:
                        self._step(run, slow, t,
                                   (lambda: {"sm_clock": clk, "peer_median": med, "ratio": clk / med}) if slow else None)
            # temperature
            if gid in temps:
                run = runs["temperature_outlier"]
                if temp_quiet:
                    if run["on"] or run["open"] is not None:
                        self._step(run, False, t, None)
                    continue
                temp = temps[gid]
                hot = temp >= self.temp_limit
                ev: dict[str, Any] = {"temperature": temp}
                if gid in temp_medians:
                    med = temp_medians[gid]
                    excess = temp - med
                    if hot or excess > self.temp_margin:  # below the margin no spread can make it hot
                        peers = [v for p, v in temps.items() if p != gid]
                        mad = _median([abs(v - med) for v in peers])
                        hot = hot or excess > max(self.temp_margin, self.z * 1.4826 * mad)
                        ev.update(peer_median=med, peer_mad=mad, excess=excess)
                if hot or run["on"] or run["open"] is not None:
                    self._step(run, hot, t, (lambda: ev) if hot else None)

    def _step(self, run: dict[str, Any], cond: bool, t: float, evidence: Any) -> None:
        """One sample of one condition; ``evidence()`` builds its evidence when it holds."""
        was = bool(run["on"]) or run["open"] is not None
        if cond:
            run["on"] += 1
            run["off"] = 0
            if run["on"] == 1:
                run["start"] = t
            run["evidence"] = evidence()
            if run["open"] is None and run["on"] >= self.min_samples:
                run["open"] = {"onset": run["start"], "detected_at": t}
        else:
            run["off"] += 1
            run["on"] = 0
            if run["open"] is not None and run["off"] >= self.min_samples:
                run["open"] = None
        self._active += (bool(run["on"]) or run["open"] is not None) - was

    def tick(self, now: float) -> None:
        now = _check_time(now, "now")
        self._now = now if self._now is None else max(self._now, now)
        self._expire()

    def _expire(self) -> None:
        if not self._queued:
            return
        horizon = max(self.hold, self.window)
        for g in self._gpus.values():
            for q in g["events"].values():
                while q and self._now - q[0][0] > horizon:
                    q.popleft()
                    self._queued -= 1

    # -- results -------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        if not self._active and not self._queued:
            return out  # a healthy node, the common case
        for gid, g in self._gpus.items():
            runs, events = g["runs"], g["events"]
            if not (events["ecc_dbe"] or events["ecc_sbe"] or events["nvlink_errors"]) and \
                    runs["throttle"]["open"] is None and runs["clock_below_peers"]["open"] is None and \
                    runs["temperature_outlier"]["open"] is None:
                continue  # a healthy GPU, the common case: nothing to report
            for kind, run in g["runs"].items():
                if run["open"] is not None:
                    out.append(Finding(kind, 3, run["open"]["onset"], run["open"]["detected_at"], {"node": self.node, "gpu": gid, **run["evidence"]}))
            dbe = [e for e in g["events"]["ecc_dbe"] if self._now - e[0] <= self.hold]
            if dbe:
                out.append(Finding("ecc_dbe", 1, dbe[0][0], dbe[0][0], {"node": self.node, "gpu": gid, "increase": dbe[-1][1], "in_window": sum(d for _, d in dbe)}))
            for kind, thr in (("ecc_sbe", self.sbe_threshold), ("nvlink_errors", self.nvlink_threshold)):
                evs = [e for e in g["events"][kind] if self._now - e[0] <= self.window]
                total, onset, detected = 0, None, None
                for et, d in evs:
                    total += d
                    if onset is None:
                        onset = et
                    if detected is None and total >= thr:
                        detected = et
                if detected is not None:
                    out.append(Finding(kind, 3, onset, detected, {"node": self.node, "gpu": gid, "increase": evs[-1][1], "in_window": total}))
        out.sort(key=lambda f: (f.severity, f.onset, f.kind, f.evidence["gpu"]))
        return out

    @property
    def finding(self) -> Finding | None:
        fs = self.findings
        return fs[0] if fs else None

    # -- conformance ---------------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"node": "node-0"}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        rng = np.random.default_rng(seed)
        sbe = {g: int(rng.integers(0, 5)) for g in range(8)}
        nvl = {g: int(rng.integers(0, 3)) for g in range(8)}
        calls: list[tuple[str, tuple, dict]] = []
        for i in range(40):
            sample = {}
            for g in range(8):
                if rng.random() < 0.02:
                    sbe[g] += 1
                sample[g] = {
                    "sm_clock": float(1980 - abs(rng.normal(0, 15))),
                    "temperature": float(62 + rng.normal(0, 3)),
                    "power": float(650 + rng.normal(0, 20)),
                    "utilization": float(min(100, 95 + rng.normal(0, 2))),
                    "throttle_reasons": int(rng.choice([0x0, 0x4])),
                    "ecc_sbe": sbe[g],
                    "ecc_dbe": 0,
                    "nvlink_errors": nvl[g],
                }
            calls.append(("update", (sample,), {"t": 100.0 + 15.0 * i}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 40
