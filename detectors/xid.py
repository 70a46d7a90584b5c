"""XID classification: the kernel-log parser, NVIDIA's catalog, and a per-node detector.

The NVIDIA driver reports GPU faults to the kernel log as ``NVRM: Xid`` lines::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.      <- bare line, no number: XID 79

The parser (:func:`parse_xid_line`), NVIDIA's catalog (:data:`CATALOG`) and
the context-free rules (:func:`classify`) live in :mod:`vigil.schemas.xid`,
shared with the node agent; :class:`XidDetector` (registered as ``xid``)
applies them per node and keeps one incident per GPU.

Severity classes (Unicron's levels, see ``shared/DESIGN.md``):

* **sev1** — the GPU or node must leave the job: 48, 62, 64, 74, 79, 95, 109,
  119, 120, 136, 140, 143, fatal NVLink 144–150, 155, 156, 158.
* **sev2** — the process should restart: 13, 31, 32, 61, 68, 69, 94.
* **sev3** — record and trend: 38, 43, 45, 63, 92, 121, non-fatal NVLink 144–150.
* XID 45 (preemptive cleanup) *inherits* the severity of the XID it
  accompanies on the same GPU within ``xid45_window`` seconds (either order).
* XID 154 (recovery action changed) takes its severity from the action the
  driver names: ``None`` → sev3, ``Drain P2P`` → sev2, ``Drain and Reset`` /
  ``GPU Reset Required`` → sev1 (reset_gpu), ``Node Reboot Required`` → sev1
  (reboot_node); unparsable → sev2.
* Unknown codes are classified sev2 with ``known=False`` — never dropped.

**NVLink 144–150 (NVLink5, Blackwell)**: the driver prints the unit, then
``Fatal`` or ``Nonfatal`` (e.g. ``144, SAW_MVB Nonfatal XC0 i0 Link 0 (...)``,
``149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (...)``); NVIDIA's catalog sub-code
table lists the same split per error status. We decide by that word: ``Fatal``
→ sev1 / reset_gpu, ``Nonfatal``/``Non-fatal`` → sev3 / none. When neither word
is present (code given without its message, or a format we do not know) we
take the conservative reading, fatal (sev1), and say so in the evidence
(``nvlink_fatal: None``). XID 74 (NVLink error, pre-Blackwell) is always sev1.

References
----------
NVIDIA, "XID Errors" and "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/ (resolution buckets: RESTART_APP,
RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, IGNORE, ...).
He et al., "Unicron: Economizing Self-Healing LLM Training at Scale" (2023),
for the severity levels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from vigil.detectors.base import Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register
from vigil.schemas import XidError, to_seconds
from vigil.schemas.xid import (  # noqa: F401  (re-exported: the detector's vocabulary)
    ACTIONS, CATALOG, NVLINK5_CODES, XidInfo, XidRecord, classify as _classify, normalize_pci, parse_xid_line,
)

__all__ = ["ACTIONS", "CATALOG", "XidInfo", "XidRecord", "XidEvent", "XidDetector", "parse_xid_line", "classify",
           "normalize_pci"]


def classify(code: int, message: str = "") -> tuple[XidInfo, int, str, bool | None]:
    """:func:`vigil.schemas.xid.classify`, raising :class:`DetectorError` on a bad code.

    >>> info, sev, action, fatal = classify(145, "RLW_REMAP Nonfatal XC0 i0 Link 3 (0x1 0x0)")
    >>> (info.mnemonic, sev, action, fatal)
    ('NVLINK_RLW_ERROR', 3, 'none', False)
    """
    try:
        return _classify(code, message)
    except ValueError as exc:
        raise DetectorError(str(exc)) from None


@dataclass(frozen=True)
class XidEvent:
    """A classified XID occurrence on one GPU at time ``t``."""

    t: float
    gpu: str
    code: int
    info: XidInfo
    severity: int
    action: str
    record: XidRecord | None = None
    nvlink_fatal: bool | None = None
    inherited_from: int | None = None

    @property
    def known(self) -> bool:
        return self.info.known


# -- the detector --------------------------------------------------------------


@register
class XidDetector(Detector):
    """Per-node XID classifier: one incident per GPU, at the worst severity seen.

    Feed it kernel-log lines (non-XID lines are counted and ignored), parsed
    :class:`XidRecord` objects, or bare codes with the GPU they hit. Each GPU
    with an XID in the last ``hold`` seconds has an open incident whose
    severity is the most severe (lowest number) of its events; XID 45 takes the
    severity of an XID on the same GPU within ``xid45_window`` seconds.

    Parameters
    ----------
    hold : float, default 600.0
        Seconds an incident stays open after its GPU's last XID.
    xid45_window : float, default 10.0
        Window (seconds, either side) in which XID 45 inherits another XID's
        severity on the same GPU.
    node : str, default ""
        Node name carried in the evidence.
    history : int, default 256
        Classified events kept in :attr:`events`.

    Attributes
    ----------
    finding : Finding or None
        The most severe open incident (ties: the most recent), kind ``"xid"``.
        Evidence keys: ``node, gpu, code, codes, mnemonic, meaning, action,
        known, count, pid, process, message, nvlink_fatal, inherited_from``.
    findings : list of Finding
        Every open incident, most severe first.

    Update signature: ``update(event, gpu=None, *, t, message="")`` where
    ``event`` is a kernel-log line (str), an :class:`XidRecord`, or an int code
    (then ``gpu`` names the GPU: PCI bus id or index, and ``message`` may carry
    the driver text used for NVLink / XID 154 decisions).

    References
    ----------
    NVIDIA XID catalog, https://docs.nvidia.com/deploy/xid-errors/ ;
    Unicron (He et al., 2023) severity levels.

    Examples
    --------
    >>> det = XidDetector(node="node-7")
    >>> det.update("kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=991, name=python, "
    ...            "An uncorrectable double bit error (DBE) has been detected on GPU.", t=10.0)
    >>> det.update("NVRM: Xid (PCI:0000:3b:00): 45, pid=991, name=python, Ch 00000010", t=10.5)
    >>> f = det.finding
    >>> (f.kind, f.severity, f.evidence["gpu"], f.evidence["codes"], f.evidence["action"])
    ('xid', 1, '0000:3b:00', [48, 45], 'reset_gpu')
    >>> det.events[-1].inherited_from
    48
    >>> det.tick(10.5 + 601.0); det.finding is None
    True
    """

    name = "xid"
    version = "1"
    consumes = ("xid",)
    per = "node"

    @classmethod
    def for_key(cls, key: str, **params: Any) -> "XidDetector":
        return cls(node=key, **params)

    def __init__(self, hold: float = 600.0, xid45_window: float = 10.0, node: str = "", history: int = 256):
        self.hold = _check_positive(hold, "hold")
        self.xid45_window = _check_positive(xid45_window, "xid45_window")
        if not isinstance(node, str):
            raise DetectorError(f"node must be a str, got {node!r}")
        self.node = node
        _check_positive_ints(history=history)
        self.history = history
        self._reset()

    def _reset(self) -> None:
        self._incidents: dict[str, dict[str, Any]] = {}
        self._events: list[XidEvent] = []
        self._recent: dict[str, list[XidEvent]] = {}  # per GPU, within xid45_window
        self._now: float | None = None
        self.lines_ignored = 0

    # -- input ---------------------------------------------------------------
    def observe(self, item: XidError, *, t: float, context: KeyContext | None = None) -> None:
        """An XID event: its code and message on the GPU named by PCI bus id (else by index)."""
        gpu: str | int | None = item.pci_bus_id if item.pci_bus_id else item.source.gpu
        self.update(item.code, gpu, t=to_seconds(item.event_time), message=item.message)

    def update(self, event: str | int | XidRecord, gpu: str | int | None = None, *, t: float, message: str = "") -> None:
        t = _check_time(t, "t")
        record: XidRecord | None
        if isinstance(event, XidRecord):
            record = event
        elif isinstance(event, str):
            record = parse_xid_line(event)
            if record is None:
                self.lines_ignored += 1
                self._advance(t)
                return
        elif isinstance(event, int) and not isinstance(event, bool):
            record = None
        else:
            raise DetectorError(f"update takes a log line, an XidRecord or an int code, got {type(event).__name__}")
        if record is not None:
            code, gpu_id, msg = record.code, record.pci, record.message
        else:
            code, msg = int(event), message or ""
            if gpu is None:
                gpu_id = "unknown"
            elif isinstance(gpu, int) and not isinstance(gpu, bool):
                gpu_id = str(gpu)
            elif isinstance(gpu, str):
                try:
                    gpu_id = normalize_pci(gpu)
                except DetectorError:
                    gpu_id = gpu
            else:
                raise DetectorError(f"gpu must be a PCI bus id (str) or an index (int), got {gpu!r}")
        info, sev, action, fatal = classify(code, msg)
        inherited = None
        recent = [e for e in self._recent.get(gpu_id, []) if t - e.t <= self.xid45_window]
        if code == 45:
            primaries = [e for e in recent if e.code != 45]
            if primaries:
                best = min(primaries, key=lambda e: (e.severity, -e.t))
                sev, action, inherited = best.severity, best.action, best.code
        ev = XidEvent(t, gpu_id, code, info, sev, action, record, fatal, inherited)
        if code != 45:
            # a pending XID 45 on this GPU inside the window inherits from this one
            for i, old in enumerate(self._events):
                if old.gpu == gpu_id and old.code == 45 and t - old.t <= self.xid45_window and (
                    old.inherited_from is None or sev < old.severity
                ):
                    self._events[i] = replace(old, severity=sev, action=action, inherited_from=code)
        recent.append(ev)
        self._recent[gpu_id] = recent
        self._events.append(ev)
        if len(self._events) > self.history:
            del self._events[: len(self._events) - self.history]
        self._open(ev)
        self._advance(t)

    def _open(self, ev: XidEvent) -> None:
        inc = self._incidents.get(ev.gpu)
        if inc is None:
            inc = {"onset": ev.t, "detected_at": ev.t, "last_t": ev.t, "severity": ev.severity, "codes": [], "count": 0, "worst": ev}
            self._incidents[ev.gpu] = inc
        inc["last_t"] = max(inc["last_t"], ev.t)
        inc["count"] += 1
        if ev.code not in inc["codes"]:
            inc["codes"].append(ev.code)
        if ev.severity < inc["severity"] or inc["count"] == 1:
            inc["severity"] = ev.severity
            inc["detected_at"] = ev.t
            inc["worst"] = ev
        elif ev.severity == inc["severity"] and ev.code == 45 and inc["worst"].code != 45:
            pass  # keep the primary XID as the incident's headline

    def tick(self, now: float) -> None:
        self._advance(_check_time(now, "now"))

    def _advance(self, now: float) -> None:
        if self._now is None or now > self._now:
            self._now = now
        for gpu in [g for g, inc in self._incidents.items() if self._now - inc["last_t"] > self.hold]:
            del self._incidents[gpu]
        for gpu in list(self._recent):
            kept = [e for e in self._recent[gpu] if self._now - e.t <= self.xid45_window]
            if kept:
                self._recent[gpu] = kept
            else:
                del self._recent[gpu]

    # -- results -------------------------------------------------------------
    def _finding_of(self, gpu: str, inc: dict[str, Any]) -> Finding:
        w: XidEvent = inc["worst"]
        rec = w.record
        return Finding(
            kind="xid",
            severity=inc["severity"],
            onset=inc["onset"],
            detected_at=inc["detected_at"],
            evidence={
                "node": self.node,
                "gpu": gpu,
                "code": w.code,
                "codes": list(inc["codes"]),
                "mnemonic": w.info.mnemonic,
                "meaning": w.info.meaning,
                "action": w.action,
                "known": w.info.known,
                "count": inc["count"],
                "pid": rec.pid if rec else None,
                "process": rec.process if rec else None,
                "message": rec.message if rec else "",
                "nvlink_fatal": w.nvlink_fatal,
                "inherited_from": w.inherited_from,
            },
        )

    @property
    def findings(self) -> list[Finding]:
        out = [self._finding_of(g, inc) for g, inc in self._incidents.items()]
        out.sort(key=lambda f: (f.severity, -f.detected_at, f.evidence["gpu"]))
        return out

    @property
    def finding(self) -> Finding | None:
        fs = self.findings
        return fs[0] if fs else None

    @property
    def events(self) -> list[XidEvent]:
        """The last ``history`` classified events, oldest first."""
        return list(self._events)

    @property
    def last_event(self) -> XidEvent | None:
        return self._events[-1] if self._events else None

    # -- conformance ---------------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"hold": 60.0, "node": "node-0"}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        import random

        rng = random.Random(seed)
        healthy = [
            "[{ts:.6f}] mlx5_core 0000:0c:00.0: mlx5_fw_tracer_handle_traces:770: FW tracer event",
            "[{ts:.6f}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
            "[{ts:.6f}] nvidia-nvswitch: Probing device 0000:05:00.0",
            "[{ts:.6f}] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
        ]
        calls: list[tuple[str, tuple, dict]] = []
        t = 0.0
        for _ in range(60):
            t += rng.uniform(0.5, 5.0)
            if rng.random() < 0.7:
                calls.append(("update", (rng.choice(healthy).format(ts=t),), {"t": t}))
            else:
                calls.append(("tick", (t,), {}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 60
