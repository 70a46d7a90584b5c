"""XID classification: the kernel-log parser, NVIDIA's catalog, and a per-node detector.

The NVIDIA driver reports GPU faults to the kernel log as ``NVRM: Xid`` lines::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.      <- bare line, no number: XID 79

:func:`parse_xid_line` turns such a line (with or without a dmesg/syslog
prefix) into an :class:`XidRecord`; :data:`CATALOG` maps each code to its
meaning, NVIDIA's recommended immediate action and a vigil severity class;
:func:`classify` applies the context-dependent rules (NVLink fatal/non-fatal,
XID 154's recovery action); :class:`XidDetector` (registered as ``xid``) keeps
one incident per GPU of a node.

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

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from detectors.base import Detector, DetectorError, Finding, _check_positive, _check_positive_ints, _check_time, register

__all__ = [
    "ACTIONS",
    "CATALOG",
    "XidInfo",
    "XidRecord",
    "XidEvent",
    "XidDetector",
    "parse_xid_line",
    "classify",
    "normalize_pci",
]

#: NVIDIA's immediate actions, reduced to what an actuator can do.
ACTIONS = ("restart_app", "reset_gpu", "reboot_node", "contact_support", "none")


@dataclass(frozen=True)
class XidInfo:
    """One catalog entry: what the code means and what to do about it."""

    code: int
    mnemonic: str
    meaning: str
    action: str
    severity: int
    known: bool = True


def _e(code: int, mnemonic: str, meaning: str, action: str, severity: int) -> tuple[int, XidInfo]:
    assert action in ACTIONS and severity in (1, 2, 3)
    return code, XidInfo(code, mnemonic, meaning, action, severity)


#: code -> :class:`XidInfo`. Actions follow NVIDIA's "Resolution Bucket (Immediate
#: Action)" column (RESTART_BM -> reboot_node, IGNORE -> none, the ECC/NVLink
#: workflows -> reset_gpu); severities follow issue 3 / Unicron.
CATALOG: dict[int, XidInfo] = dict(
    [
        _e(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception (e.g. illegal instruction/address in a kernel)", "restart_app", 2),
        _e(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (MMU fault, usually an application bug)", "restart_app", 2),
        _e(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream (PCIe quality or driver)", "restart_app", 2),
        _e(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error (FECS watchdog timeout)", "none", 3),
        _e(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing: the application hit a fault and was torn down; GPU healthy", "none", 3),
        _e(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup due to previous errors (follows the accompanying XID)", "none", 3),
        _e(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double-bit (uncorrectable) ECC error", "reset_gpu", 1),
        _e(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning", "contact_support", 2),
        _e(62, "PMU_HALT_ERROR", "Internal micro-controller halt", "reset_gpu", 1),
        _e(63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement / row remapping recorded", "none", 3),
        _e(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement / row remapping failure", "reset_gpu", 1),
        _e(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 (video decoder) exception", "restart_app", 2),
        _e(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error", "restart_app", 2),
        _e(74, "NVLINK_ERROR", "NVLink error (a GPU reset or node reboot is needed to clear it)", "reset_gpu", 1),
        _e(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus (not reachable over PCIe)", "reboot_node", 1),
        _e(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "none", 3),
        _e(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error: only the affected application must restart", "restart_app", 2),
        _e(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error: the GPU must be reset", "reset_gpu", 1),
        _e(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timeout", "reset_gpu", 1),
        _e(119, "GSP_RPC_TIMEOUT", "GSP (GPU System Processor) RPC timeout", "reset_gpu", 1),
        _e(120, "GSP_ERROR", "GSP (GPU System Processor) error", "reset_gpu", 1),
        _e(121, "C2C_ERROR", "Corrected error on the C2C NVLink to the Grace CPU", "none", 3),
        _e(136, "ALI_TRAINING_FAIL", "NVLink link training failed", "reset_gpu", 1),
        _e(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC error escaped page offlining / row remapping", "reset_gpu", 1),
        _e(143, "GPU_INIT_ERROR", "GPU initialization error", "reset_gpu", 1),
        _e(144, "NVLINK_SAW_ERROR", "NVLink SAW error", "reset_gpu", 1),
        _e(145, "NVLINK_RLW_ERROR", "NVLink RLW error", "reset_gpu", 1),
        _e(146, "NVLINK_TLW_ERROR", "NVLink TLW error", "reset_gpu", 1),
        _e(147, "NVLINK_TREX_ERROR", "NVLink TREX error", "reset_gpu", 1),
        _e(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW_CTRL error", "reset_gpu", 1),
        _e(149, "NVLINK_NETIR_ERROR", "NVLink NETIR error", "reset_gpu", 1),
        _e(150, "NVLINK_MSE_ERROR", "NVLink MSE error", "reset_gpu", 1),
        _e(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed (summarises the action other XIDs need)", "contact_support", 2),
        _e(155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error (link down flagged intentional)", "reset_gpu", 1),
        _e(156, "RESOURCE_RETIREMENT_EVENT", "Resource retirement event", "reset_gpu", 1),
        _e(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", "reset_gpu", 1),
    ]
)

#: NVLink5 codes whose severity depends on the Fatal/Nonfatal word of the message.
NVLINK5_CODES = frozenset(range(144, 151))

# XID 154's recovery actions, by the driver's label and by its number.
_RECOVERY_BY_LABEL = {
    "none": ("none", 3),
    "drain p2p": ("restart_app", 2),
    "drain and reset": ("reset_gpu", 1),
    "gpu reset required": ("reset_gpu", 1),
    "pf flr": ("reset_gpu", 1),
    "node reboot required": ("reboot_node", 1),
}
_RECOVERY_BY_NUMBER = {0: "none", 1: "gpu reset required", 2: "node reboot required", 3: "drain p2p", 4: "drain and reset"}


# -- parsing -----------------------------------------------------------------

_PCI = r"(?:PCI:)?[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID_RE = re.compile(r"NVRM: Xid \((?P<pci>" + _PCI + r")\):\s*(?P<code>\d+)\s*(?:,\s*(?P<rest>.*?))?\s*$")
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+)\s*,\s*name=(?P<name>[^,]*?)\s*(?:,\s*(?P<msg>.*))?$")
_BARE_RE = re.compile(r"NVRM:.*?(?P<pci>" + _PCI + r").*fallen off the bus", re.IGNORECASE)
_PCI_RE = re.compile(r"^(?:PCI:)?(?P<dom>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})(?:\.[0-7])?$")
_NONFATAL_RE = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)
_FATAL_RE = re.compile(r"\bfatal\b", re.IGNORECASE)
_RECOVERY_RE = re.compile(r"recovery action changed from .*?to\s+0x(?P<num>[0-9A-Fa-f]+)\s*(?:\((?P<label>[^)]*)\))?", re.IGNORECASE)


def normalize_pci(pci: str) -> str:
    """Canonical PCI bus id ``dddd:bb:dd`` (lower case, no ``PCI:`` prefix, no function).

    >>> normalize_pci("PCI:0000:3B:00")
    '0000:3b:00'
    >>> normalize_pci("00000000:3b:00.0")
    '0000:3b:00'
    """
    m = _PCI_RE.match(pci.strip())
    if m is None:
        raise DetectorError(f"not a PCI bus id: {pci!r} (expected e.g. 'PCI:0000:3b:00')")
    return f"{int(m['dom'], 16):04x}:{m['bus'].lower()}:{m['dev'].lower()}"


@dataclass(frozen=True)
class XidRecord:
    """One parsed kernel-log XID line.

    ``pid``/``process`` are None when the driver printed ``<unknown>`` or
    nothing; ``bare`` is True for the numberless "fallen off the bus" line.
    """

    pci: str
    code: int
    pid: int | None
    process: str | None
    message: str
    raw: str
    bare: bool = False


def parse_xid_line(line: str) -> XidRecord | None:
    """Parse one kernel-log line; return None when it is not an XID report.

    Accepts any prefix (dmesg ``[  123.4]``, syslog ``Jan 01 ... kernel:``).

    >>> r = parse_xid_line("[ 8.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    >>> (r.pci, r.code, r.pid, r.process, r.message)
    ('0000:3b:00', 79, 1234, 'python', 'GPU has fallen off the bus.')
    >>> parse_xid_line("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.").code
    79
    >>> parse_xid_line("eth0: link up") is None
    True
    """
    if not isinstance(line, str):
        raise DetectorError(f"a kernel log line must be a str, got {type(line).__name__}")
    raw = line.rstrip("\r\n")
    m = _XID_RE.search(raw)
    if m is not None:
        rest = (m["rest"] or "").strip()
        pid: int | None = None
        process: str | None = None
        message = rest
        pm = _PID_RE.match(rest)
        if pm is not None:
            pid = int(pm["pid"]) if pm["pid"].isdigit() else None
            name = pm["name"].strip().strip("'\"")
            process = None if name in ("", "<unknown>") else name
            message = (pm["msg"] or "").strip()
        return XidRecord(normalize_pci(m["pci"]), int(m["code"]), pid, process, message, raw)
    if "Xid" not in raw:
        b = _BARE_RE.search(raw)
        if b is not None:
            return XidRecord(normalize_pci(b["pci"]), 79, None, None, "GPU has fallen off the bus.", raw, bare=True)
    return None


# -- classification ----------------------------------------------------------


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


def classify(code: int, message: str = "") -> tuple[XidInfo, int, str, bool | None]:
    """Classify one XID code (with its message, when known).

    Returns ``(info, severity, action, nvlink_fatal)``; ``nvlink_fatal`` is
    None except for NVLink5 codes 144–150. XID 45's inheritance needs the GPU's
    history and is applied by :class:`XidDetector`, not here.

    >>> info, sev, action, fatal = classify(145, "RLW_REMAP Nonfatal XC0 i0 Link 3 (0x1 0x0)")
    >>> (info.mnemonic, sev, action, fatal)
    ('NVLINK_RLW_ERROR', 3, 'none', False)
    >>> classify(999)[0].known, classify(999)[1]
    (False, 2)
    """
    if isinstance(code, bool) or not isinstance(code, int) or code < 0:
        raise DetectorError(f"an XID code must be a non-negative int, got {code!r}")
    info = CATALOG.get(code)
    if info is None:
        info = XidInfo(code, "UNKNOWN", f"XID {code} is not in the catalog", "contact_support", 2, known=False)
        return info, 2, info.action, None
    message = message or ""
    if code in NVLINK5_CODES:
        if _NONFATAL_RE.search(message):
            return info, 3, "none", False
        if _FATAL_RE.search(message):
            return info, 1, "reset_gpu", True
        return info, 1, "reset_gpu", None  # undetermined: conservative
    if code == 154:
        m = _RECOVERY_RE.search(message)
        if m is not None:
            label = (m["label"] or "").strip().lower()
            if label not in _RECOVERY_BY_LABEL:
                label = _RECOVERY_BY_NUMBER.get(int(m["num"], 16), "")
            if label in _RECOVERY_BY_LABEL:
                action, sev = _RECOVERY_BY_LABEL[label]
                return info, sev, action, None
        return info, info.severity, info.action, None
    return info, info.severity, info.action, None


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
