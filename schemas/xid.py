"""NVIDIA XID errors as data: the kernel-log parser and NVIDIA's catalog.

Shared by the node agent (which parses kernel-log lines into
:class:`~vigil.schemas.XidError` events) and the XID detector (which
classifies them), so it lives in the lowest layer both import.

The NVIDIA driver reports GPU faults to the kernel log as ``NVRM: Xid`` lines::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.      <- bare line, no number: XID 79

:func:`parse_xid_line` turns such a line (with or without a dmesg/syslog
prefix) into an :class:`XidRecord`; :data:`CATALOG` maps each code to its
meaning, NVIDIA's recommended immediate action and a vigil severity class;
:func:`classify` applies the context-dependent rules (NVLink fatal/non-fatal,
XID 154's recovery action). The severity classes and their references are in
:mod:`vigil.detectors.xid`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vigil.schemas.errors import SchemaError

__all__ = ["ACTIONS", "CATALOG", "NVLINK5_CODES", "XidInfo", "XidRecord", "parse_xid_line", "classify",
           "normalize_pci"]

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
        raise SchemaError(f"not a PCI bus id: {pci!r} (expected e.g. 'PCI:0000:3b:00')")
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
        raise SchemaError(f"a kernel log line must be a str, got {type(line).__name__}")
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
        raise SchemaError(f"an XID code must be a non-negative int, got {code!r}")
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


