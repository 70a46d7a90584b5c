"""NIC congestion and link flaps from RoCE ``hw_counters`` and IB port ``counters``.

A node agent reads, per RDMA port, the cumulative counters under
``/sys/class/infiniband/<dev>/ports/<port>/hw_counters/`` (RoCE: ``np_cnp_sent``,
``rp_cnp_handled``, ``np_ecn_marked_roce_packets``, ``out_of_sequence``,
``packet_seq_err``, ``local_ack_timeout_err``) and ``.../counters/`` (IB:
``port_xmit_wait``, ``symbol_error``, ``link_downed``, ``link_error_recovery``)
and passes one reading per port per interval to :class:`NicCongestion`.

Counters to rates
-----------------
Each counter's increase between two readings, divided by the elapsed time,
is its rate. A value that goes *down* is either a wrap or a reset:

* **wrap** — the previous value sat in the top quarter of the counter's range
  (``2**bits``) and the new one in the bottom quarter: the increase is
  ``new + 2**bits - old``. Widths come from ``widths`` (defaults below); a
  counter declared 64-bit whose previous value fits in 32 bits is also tried
  as a 32-bit wrap (some drivers expose 32-bit hardware counters).
* **reset** — anything else (driver reload, ``perfquery -R``): the counter
  restarted from zero, so the increase is ``new``.
* **saturation** — InfiniBand PMA counters do not wrap, they stick at their
  maximum (``symbol_error`` 16 bits, ``link_downed``/``link_error_recovery``
  8 bits, legacy ``port_xmit_wait`` 32 bits). A counter at its maximum gives
  no increase and is reported in ``saturated``.

Congestion episodes
-------------------
For each congestion signal (CNP sent/handled, ECN-marked packets, xmit wait)
a robust baseline is kept over the last ``baseline_window`` healthy intervals:
the median and the MAD. An interval is *in excess* when its rate exceeds
``median + max(z * 1.4826 * MAD, rel_excess * median, min_rate)``. An episode
begins after ``min_intervals`` consecutive excess intervals (its onset is the
start of the first of them: a change point on the rate) and ends after
``min_intervals`` consecutive normal ones. The baseline does not learn from
intervals in excess, so a sustained episode does not become its own baseline.
This is a deliberately simple change-point rule (median/MAD + persistence):
robust to the heavy-tailed, bursty CNP rates of healthy RoCE fabrics.

Link flaps
----------
An increase of ``link_downed`` or ``link_error_recovery`` is a link flap:
a ``link_flap`` finding (sev3) that stays open for ``flap_hold`` seconds; when
flaps were seen in at least ``flap_escalate`` distinct intervals within
``flap_window`` seconds the finding escalates to sev2 (a flapping link keeps
breaking NCCL connections and needs the node out of the ring).

Transport errors (``out_of_sequence``, ``packet_seq_err``,
``local_ack_timeout_err``, ``symbol_error``) at a combined rate above
``error_rate`` per second give a ``transport_errors`` finding (sev3) while it
lasts.

References
----------
Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (DCQCN,
SIGCOMM 2015) for CNP/ECN semantics; NVIDIA MLNX_OFED "Understanding mlx5 Linux
Counters and Status Parameters"; InfiniBand Architecture Specification vol. 1,
PortCounters (saturating counters); Wu et al., "Falcon: Pinpointing and
Mitigating Stragglers for Large-Scale Hybrid-Parallel Training" (2024) for
communication fail-slows caused by congestion.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Any, Iterable, Mapping

import numpy as np

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.schemas import NicCounters, to_seconds

__all__ = ["NicCongestion", "counter_delta", "DEFAULT_WIDTHS", "CONGESTION_SIGNALS", "FLAP_COUNTERS", "ERROR_COUNTERS"]

#: Counter widths in bits (default 64); IB PMA counters saturate at 2**bits - 1.
DEFAULT_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_xmit_wait": 32,
}
#: Counters that saturate instead of wrapping (IB PortCounters).
SATURATING = frozenset({"symbol_error", "link_error_recovery", "link_downed", "port_xmit_wait"})
CONGESTION_SIGNALS = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets", "port_xmit_wait")
FLAP_COUNTERS = ("link_downed", "link_error_recovery")
ERROR_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "symbol_error")


def counter_delta(old: int, new: int, bits: int = 64, saturating: bool = False) -> tuple[int, str]:
    """Increase of a cumulative counter from ``old`` to ``new``.

    Returns ``(delta, how)`` with ``how`` one of ``"ok"``, ``"wrap"``,
    ``"reset"``, ``"saturated"``.

    >>> counter_delta(10, 25)
    (15, 'ok')
    >>> counter_delta(2**32 - 5, 10, bits=32)
    (15, 'wrap')
    >>> counter_delta(2**32 - 5, 10, bits=64)      # a 32-bit counter behind a 64-bit name
    (15, 'wrap')
    >>> counter_delta(5_000_000, 120)
    (120, 'reset')
    >>> counter_delta(65535, 65535, bits=16, saturating=True)
    (0, 'saturated')
    """
    top = (1 << bits) - 1
    if new >= old:
        if saturating and new == top:
            return new - old, "saturated"
        return new - old, "ok"
    if not saturating:
        for b in sorted({bits, 32} if bits > 32 else {bits}):
            size = 1 << b
            if old < size and old >= (3 * size) // 4 and new < size // 4:
                return new + size - old, "wrap"
    return new, "reset"


class _Baseline:
    """Median/MAD over a bounded window of healthy rates (picklable).

    The statistics are recomputed once every ``refresh`` new values: one value
    barely moves the median of a long window, and a node agent reports every
    port of every node each interval, so this is the NIC detector's hot path.
    The window is also kept sorted as values come and go (``ordered``), so a
    recomputation is a lookup and a binary search, not two sorts.
    """

    def __init__(self, window: int, refresh: int = 8):
        self.values: deque[float] = deque(maxlen=window)
        self.ordered: list[float] = []  # self.values, sorted
        self.refresh = refresh
        self._cached: tuple[float, float] | None = None
        self._added = 0

    def _ordered(self) -> list[float]:
        ordered = self.__dict__.get("ordered")
        if ordered is None:  # a snapshot from before it was kept
            ordered = self.ordered = sorted(self.values)
        return ordered

    def add(self, value: float) -> None:
        values = self.values
        ordered = self._ordered()
        if len(values) == values.maxlen:
            del ordered[bisect_left(ordered, values[0])]
        values.append(value)
        insort(ordered, value)
        self._added += 1

    def stats(self) -> tuple[float, float]:
        if self._cached is None or self._added >= self.refresh:
            ordered = self._ordered()
            med = _median(ordered)
            self._cached = (med, _mad(ordered, med))
            self._added = 0
        return self._cached


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _mad(ordered: list[float], med: float) -> float:
    """The median of ``|v - med|`` over a sorted, non-empty list, to the bit what sorting the deviations gives.

    The deviations are two sorted runs, ``med - v`` going left from ``med`` and ``v - med`` going right (the
    same floats as ``abs(v - med)``: IEEE subtraction is exact under negation); their middle one(s) are found
    by a binary search over how many come from the left run.
    """
    n = len(ordered)
    split = bisect_left(ordered, med)  # ordered[:split] < med <= ordered[split:]

    def kth(k: int) -> float:
        """The k-th (from 0) smallest deviation."""
        a, b = split, n - split  # left run: med - ordered[split - 1 - i]; right run: ordered[split + j] - med
        lo, hi = max(0, k + 1 - b), min(k + 1, a)
        while lo < hi:  # i = how many of the k + 1 smallest come from the left run
            i = (lo + hi) // 2
            if med - ordered[split - 1 - i] < ordered[split + k - i] - med:
                lo = i + 1
            else:
                hi = i
        i = lo
        left = med - ordered[split - i] if i > 0 else None
        right = ordered[split + k - i] - med if k - i >= 0 else None
        return left if right is None else right if left is None else max(left, right)

    mid = n // 2
    return float(kth(mid)) if n % 2 else (kth(mid - 1) + kth(mid)) / 2.0


@register
class NicCongestion(Detector):
    """RoCE/IB congestion episodes, link flaps and transport errors for one node.

    Parameters
    ----------
    baseline_window : int, default 120
        Healthy intervals in each signal's robust baseline.
    warmup : int, default 10
        Intervals per port before a congestion episode can be declared.
    z : float, default 6.0
        Excess threshold in robust standard deviations (1.4826 * MAD).
    rel_excess : float, default 1.0
        Minimum excess relative to the baseline median (1.0: rate doubled).
    min_rate : float, default 200.0
        Minimum excess in events per second (so an idle port's 0 -> 5 CNP/s is not congestion).
    min_intervals : int, default 3
        Consecutive excess (normal) intervals that open (close) an episode.
    flap_hold, flap_window : float, default 300.0, 600.0
        Seconds a link-flap finding stays open; window for escalation.
    flap_escalate : int, default 3
        Flapping intervals within ``flap_window`` that escalate sev3 -> sev2.
    error_rate : float, default 1.0
        Transport errors per second that open a ``transport_errors`` finding.
    widths : dict, optional
        Counter widths in bits overriding :data:`DEFAULT_WIDTHS`.
    node : str, default ""
        Node name carried in the evidence.

    Update signature: ``update(counters, *, t, port="0")`` with ``counters`` a
    mapping counter-name -> cumulative int read at time ``t`` for one port
    (e.g. ``"mlx5_0/1"``); missing counters are fine. A reading at the same
    ``t`` as the previous one is a duplicate and ignored; an earlier ``t`` is
    an error.

    Findings (:attr:`findings`; :attr:`finding` is the most severe):
    ``congestion`` sev3, evidence ``port, signals, rates, baseline_median,
    baseline_mad, ratio, error_rates``; ``link_flap`` sev3 -> sev2, evidence
    ``port, flaps_in_window, counters, last_flap``; ``transport_errors`` sev3,
    evidence ``port, error_rates``.

    References
    ----------
    DCQCN (Zhu et al., SIGCOMM 2015); InfiniBand spec PortCounters; NVIDIA
    mlx5 counters documentation; Falcon (Wu et al., 2024).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> det = NicCongestion(node="n1")
    >>> c = {"np_cnp_sent": 0, "rp_cnp_handled": 0, "link_downed": 0}
    >>> for i in range(60):
    ...     cnp = rng.poisson(50) if i < 40 else rng.poisson(5000)   # congestion from i = 40
    ...     c = {"np_cnp_sent": c["np_cnp_sent"] + int(cnp), "rp_cnp_handled": c["rp_cnp_handled"] + int(rng.poisson(30)),
    ...          "link_downed": c["link_downed"]}
    ...     det.update(c, t=float(i), port="mlx5_0/1")
    >>> f = det.finding
    >>> (f.kind, f.severity, f.onset, f.evidence["signals"])
    ('congestion', 3, 39.0, ['np_cnp_sent'])
    """

    name = "nic_congestion"
    version = "1"
    consumes = ("nic_counters",)
    per = "node"

    @classmethod
    def for_key(cls, key: str, **params: Any) -> "NicCongestion":
        return cls(node=key, **params)

    def __init__(
        self,
        baseline_window: int = 120,
        warmup: int = 10,
        z: float = 6.0,
        rel_excess: float = 1.0,
        min_rate: float = 200.0,
        min_intervals: int = 3,
        flap_hold: float = 300.0,
        flap_window: float = 600.0,
        flap_escalate: int = 3,
        error_rate: float = 1.0,
        widths: Mapping[str, int] | None = None,
        node: str = "",
    ):
        _check_positive_ints(baseline_window=baseline_window, warmup=warmup, min_intervals=min_intervals, flap_escalate=flap_escalate)
        self.baseline_window = baseline_window
        self.warmup = warmup
        self.min_intervals = min_intervals
        self.flap_escalate = flap_escalate
        if warmup > baseline_window:
            raise DetectorError(f"warmup ({warmup}) must not exceed baseline_window ({baseline_window})")
        self.z = _check_positive(z, "z")
        self.rel_excess = _check_positive(rel_excess, "rel_excess")
        self.min_rate = _check_positive(min_rate, "min_rate")
        self.flap_hold = _check_positive(flap_hold, "flap_hold")
        self.flap_window = _check_positive(flap_window, "flap_window")
        self.error_rate = _check_positive(error_rate, "error_rate")
        w = dict(DEFAULT_WIDTHS)
        for k, b in dict(widths or {}).items():
            if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 64:
                raise DetectorError(f"widths[{k!r}] must be an int in 1..64, got {b!r}")
            w[k] = b
        self.widths = w
        if not isinstance(node, str):
            raise DetectorError(f"node must be a str, got {node!r}")
        self.node = node
        self._reset()

    def _reset(self) -> None:
        self._ports: dict[str, dict[str, Any]] = {}
        self._now: float | None = None

    def _port(self, port: str) -> dict[str, Any]:
        p = self._ports.get(port)
        if p is None:
            p = {
                "last_t": None,
                "last": {},
                "intervals": 0,
                "baselines": {s: _Baseline(self.baseline_window) for s in CONGESTION_SIGNALS},
                "excess_run": 0,
                "normal_run": 0,
                "excess_start": None,
                "episode": None,  # dict(onset, detected_at, peak...)
                "flaps": deque(),  # times of intervals with flaps
                "flap_counts": {},
                "flap_onset": None,
                "flap_detected": None,
                "errors": None,  # dict(onset, detected_at)
                "rates": {},
                "saturated": set(),
                "anomalies": {"wrap": 0, "reset": 0},
            }
            self._ports[port] = p
        return p

    def observe(self, item: NicCounters, *, t: float, context: KeyContext | None = None) -> None:
        """One port's cumulative counters, the port named ``device:port``: a validated event (names and
        non-negative ints), so its counters go straight to the detector's state without :meth:`update`'s
        checks of arbitrary input."""
        self._update(item.counters, _check_time(to_seconds(item.event_time), "t"), f"{item.device}:{item.port}")

    def update(self, counters: Mapping[str, int], *, t: float, port: str = "0") -> None:
        t = _check_time(t, "t")
        if not isinstance(counters, Mapping):
            raise DetectorError(f"counters must be a mapping name -> cumulative int, got {type(counters).__name__}")
        if not isinstance(port, str):
            raise DetectorError(f"port must be a str, got {port!r}")
        vals: dict[str, int] = {}
        for k, v in counters.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise DetectorError(f"counter {k!r} on port {port!r} must be a non-negative int, got {v!r}")
            vals[str(k)] = int(v)
        self._update(vals, t, port)

    def _update(self, vals: Mapping[str, int], t: float, port: str) -> None:
        p = self._port(port)
        if p["last_t"] is not None:
            if t == p["last_t"]:
                return  # duplicate reading (at-least-once delivery)
            if t < p["last_t"]:
                raise DetectorError(f"port {port!r}: reading at t={t} is older than the previous one at t={p['last_t']}")
        prev_t, prev = p["last_t"], p["last"]
        p["last_t"], p["last"] = t, vals
        self._advance(t)
        if prev_t is None:
            return
        dt = t - prev_t
        deltas: dict[str, int] = {}
        widths = self.widths
        for k, v in vals.items():
            old = prev.get(k)
            if old is None:
                continue
            if v >= old and (k not in SATURATING or v != (1 << widths.get(k, 64)) - 1):
                deltas[k] = v - old  # counter_delta's "ok", the common case, inlined
                continue
            bits = widths.get(k, 64)
            d, how = counter_delta(old, v, bits, saturating=k in SATURATING)
            if how == "saturated":
                p["saturated"].add(k)
            elif how in ("wrap", "reset"):
                p["anomalies"][how] += 1
                p["saturated"].discard(k)
            deltas[k] = d
        rates = {k: d / dt for k, d in deltas.items()}
        p["rates"] = rates
        p["intervals"] += 1
        self._congestion(p, port, rates, prev_t, t)
        self._flaps(p, deltas, t)
        self._errors(p, rates, prev_t, t)

    # -- the three conditions -------------------------------------------------
    def _congestion(self, p: dict[str, Any], port: str, rates: dict[str, float], start: float, t: float) -> None:
        excess_signals = []
        stats = {}
        for s in CONGESTION_SIGNALS:
            if s not in rates:
                continue
            b: _Baseline = p["baselines"][s]
            if len(b.values) >= self.warmup:
                med, mad = b.stats()
                thr = med + max(self.z * 1.4826 * mad, self.rel_excess * med, self.min_rate)
                stats[s] = (med, mad)
                if rates[s] > thr:
                    excess_signals.append(s)
        if excess_signals:
            p["excess_run"] += 1
            p["normal_run"] = 0
            if p["excess_run"] == 1:
                p["excess_start"] = start
        else:
            p["normal_run"] += 1
            p["excess_run"] = 0
            for s in CONGESTION_SIGNALS:
                if s in rates:
                    p["baselines"][s].add(rates[s])
        ep = p["episode"]
        if ep is None and p["excess_run"] >= self.min_intervals:
            ep = p["episode"] = {"onset": p["excess_start"], "detected_at": t, "peak": {}}
        elif ep is not None and p["normal_run"] >= self.min_intervals:
            p["episode"] = ep = None
        if ep is not None and excess_signals:
            ep["signals"] = excess_signals
            ep["rates"] = {s: rates[s] for s in excess_signals}
            ep["baseline_median"] = {s: stats[s][0] for s in excess_signals}
            ep["baseline_mad"] = {s: stats[s][1] for s in excess_signals}
            for s in excess_signals:
                ep["peak"][s] = max(ep["peak"].get(s, 0.0), rates[s])

    def _flaps(self, p: dict[str, Any], deltas: dict[str, int], t: float) -> None:
        inc = {k: deltas[k] for k in FLAP_COUNTERS if deltas.get(k, 0) > 0}
        if not inc:
            return
        if not p["flaps"] or t - p["flaps"][-1] > self.flap_hold:
            p["flap_onset"] = t
            p["flap_detected"] = t
            p["flap_counts"] = {}
        p["flaps"].append(t)
        for k, d in inc.items():
            p["flap_counts"][k] = p["flap_counts"].get(k, 0) + d
        if self._flap_severity(p) == 2 and p.get("flap_sev") != 2:
            p["flap_detected"] = t
        p["flap_sev"] = self._flap_severity(p)

    def _flap_severity(self, p: dict[str, Any]) -> int:
        recent = [x for x in p["flaps"] if self._now - x <= self.flap_window]
        return 2 if len(recent) >= self.flap_escalate else 3

    def _errors(self, p: dict[str, Any], rates: dict[str, float], start: float, t: float) -> None:
        er = {k: rates[k] for k in ERROR_COUNTERS if k in rates}
        total = sum(er.values())
        if total > self.error_rate:
            if p["errors"] is None:
                p["errors"] = {"onset": start, "detected_at": t}
            p["errors"]["error_rates"] = er
        else:
            p["errors"] = None

    def tick(self, now: float) -> None:
        self._advance(_check_time(now, "now"))

    def _advance(self, now: float) -> None:
        if self._now is None or now > self._now:
            self._now = now
        for p in self._ports.values():
            while p["flaps"] and self._now - p["flaps"][0] > max(self.flap_window, self.flap_hold):
                p["flaps"].popleft()

    # -- results -------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for port, p in self._ports.items():
            ep = p["episode"]
            if ep is not None and "signals" in ep:
                ratio = {
                    s: (ep["rates"][s] / ep["baseline_median"][s]) if ep["baseline_median"][s] > 0 else float("inf")
                    for s in ep["signals"]
                }
                out.append(
                    Finding(
                        "congestion",
                        3,
                        ep["onset"],
                        ep["detected_at"],
                        {
                            "node": self.node,
                            "port": port,
                            "signals": list(ep["signals"]),
                            "rates": dict(ep["rates"]),
                            "peak_rates": dict(ep["peak"]),
                            "baseline_median": dict(ep["baseline_median"]),
                            "baseline_mad": dict(ep["baseline_mad"]),
                            "ratio": ratio,
                            "error_rates": {k: p["rates"][k] for k in ERROR_COUNTERS if k in p["rates"]},
                        },
                    )
                )
            if p["flaps"] and self._now - p["flaps"][-1] <= self.flap_hold:
                recent = [x for x in p["flaps"] if self._now - x <= self.flap_window]
                out.append(
                    Finding(
                        "link_flap",
                        self._flap_severity(p),
                        p["flap_onset"],
                        p["flap_detected"],
                        {
                            "node": self.node,
                            "port": port,
                            "flaps_in_window": len(recent),
                            "counters": dict(p["flap_counts"]),
                            "last_flap": p["flaps"][-1],
                        },
                    )
                )
            if p["errors"] is not None:
                out.append(
                    Finding(
                        "transport_errors",
                        3,
                        p["errors"]["onset"],
                        p["errors"]["detected_at"],
                        {"node": self.node, "port": port, "error_rates": dict(p["errors"]["error_rates"])},
                    )
                )
        out.sort(key=lambda f: (f.severity, f.onset, f.kind, f.evidence["port"]))
        return out

    @property
    def finding(self) -> Finding | None:
        fs = self.findings
        return fs[0] if fs else None

    def rates(self, port: str = "0") -> dict[str, float]:
        """The latest per-second rates of ``port`` (empty before two readings)."""
        p = self._ports.get(port)
        return dict(p["rates"]) if p else {}

    def counter_anomalies(self, port: str = "0") -> dict[str, Any]:
        """Wraps and resets seen on ``port``, and the counters now saturated."""
        p = self._ports.get(port)
        if p is None:
            return {"wrap": 0, "reset": 0, "saturated": []}
        return {**p["anomalies"], "saturated": sorted(p["saturated"])}

    # -- conformance ---------------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"node": "node-0"}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        rng = np.random.default_rng(seed)
        names = CONGESTION_SIGNALS + FLAP_COUNTERS + ERROR_COUNTERS
        c = {k: int(rng.integers(0, 10_000)) for k in names}
        c["port_xmit_wait"] = 2**32 - 3_000  # near the top: saturates (IB PMA)
        calls: list[tuple[str, tuple, dict]] = []
        t = 1000.0
        for i in range(80):
            t += 10.0
            c["np_cnp_sent"] += int(rng.poisson(400))
            c["rp_cnp_handled"] += int(rng.poisson(300))
            c["np_ecn_marked_roce_packets"] += int(rng.poisson(450))
            c["port_xmit_wait"] = min(2**32 - 1, c["port_xmit_wait"] + int(rng.poisson(500)))
            if i == 40:  # a driver reload resets the RoCE counters
                for k in ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets"):
                    c[k] = int(rng.poisson(400))
            calls.append(("update", (dict(c),), {"t": t, "port": "mlx5_0/1"}))
            if i % 7 == 0:
                calls.append(("tick", (t + 5.0,), {}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 20
