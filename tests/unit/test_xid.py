"""XID parser, catalog and detector against real-format kernel lines."""

import pickle

import pytest

from vigil.detectors.base import DetectorError
from vigil.schemas import SchemaError
from vigil.detectors.xid import ACTIONS, CATALOG, XidDetector, XidRecord, classify, normalize_pci, parse_xid_line

REQUIRED = [13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 121,
            136, 140, 143, *range(144, 151), 154, 155, 156, 158]
SEV1 = [48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 155, 156, 158]
SEV2 = [13, 31, 32, 61, 68, 69, 94]
SEV3 = [38, 43, 45, 63, 92, 121]


def test_catalog_covers_required_codes_with_valid_entries():
    for code in REQUIRED:
        info = CATALOG[code]
        assert info.code == code and info.known
        assert info.action in ACTIONS
        assert info.severity in (1, 2, 3)
        assert info.meaning and info.mnemonic


@pytest.mark.parametrize("code,sev", [(c, 1) for c in SEV1] + [(c, 2) for c in SEV2] + [(c, 3) for c in SEV3])
def test_catalog_severity_classes(code, sev):
    assert classify(code)[1] == sev


def test_recommended_actions():
    assert CATALOG[79].action == "reboot_node"
    assert CATALOG[48].action == "reset_gpu"
    assert CATALOG[13].action == "restart_app"
    assert CATALOG[63].action == "none"


@pytest.mark.parametrize(
    "line,pci,code,pid,name,msg",
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
         "0000:3b:00", 79, 1234, "python", "GPU has fallen off the bus."),
        ("[1234567.891011] NVRM: Xid (PCI:0000:af:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
         "0000:af:00", 13, None, None, "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"),
        ("Mar 03 10:12:01 gpu-node-17 kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=20211, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
         "0000:18:00", 31, 20211, "pt_main_thread", "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
         "0000:01:00", 154, None, None, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
        ("NVRM: Xid (0000:5E:00.0): 48, pid=77, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
         "0000:5e:00", 48, 77, "python3", "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "0000:3b:00", 79, None, None, "GPU has fallen off the bus."),
    ],
)
def test_parse_real_lines(line, pci, code, pid, name, msg):
    r = parse_xid_line(line)
    assert isinstance(r, XidRecord)
    assert (r.pci, r.code, r.pid, r.process, r.message, r.raw) == (pci, code, pid, name, msg, line)
    assert not r.bare


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        "[ 5012.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "Jan 02 03:04:05 host kernel: NVRM: The NVIDIA GPU 0000:3b:00.0 has fallen off the bus and is not responding",
    ],
)
def test_bare_fallen_off_the_bus_is_79(line):
    r = parse_xid_line(line)
    assert r is not None and r.code == 79 and r.bare and r.pci == "0000:3b:00"


@pytest.mark.parametrize("line", ["", "eth0: link up", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module 550.54.15",
                                  "NVRM: GPU at PCI:0000:3b:00: GPU-5f4b3f5e-7a1c-11ee-b962-0242ac120002"])
def test_non_xid_lines(line):
    assert parse_xid_line(line) is None


def test_normalize_pci_rejects_garbage():
    assert normalize_pci("PCI:0000:3B:00.0") == "0000:3b:00"
    with pytest.raises(SchemaError):
        normalize_pci("GPU0")


@pytest.mark.parametrize(
    "code,msg,sev,fatal",
    [
        (144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)", 3, False),
        (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", 1, True),
        (145, "RLW_REMAP Non-fatal XC0 i0 Link 4 (0x00000004)", 3, False),
        (150, "", 1, None),  # undetermined: conservative
    ],
)
def test_nvlink5_fatal_vs_nonfatal(code, msg, sev, fatal):
    _, s, action, f = classify(code, msg)
    assert (s, f) == (sev, fatal)
    assert action == ("none" if sev == 3 else "reset_gpu")


@pytest.mark.parametrize(
    "msg,sev,action",
    [
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", 1, "reboot_node"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", 1, "reset_gpu"),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", 3, "none"),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", 2, "restart_app"),
        ("GPU recovery action changed from 0x0 to 0x4", 1, "reset_gpu"),
        ("something else", 2, "contact_support"),
    ],
)
def test_xid154_recovery_action(msg, sev, action):
    _, s, a, _ = classify(154, msg)
    assert (s, a) == (sev, action)


def test_unknown_code_is_sev2_not_dropped():
    det = XidDetector()
    det.update("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, something new", t=1.0)
    f = det.finding
    assert f is not None and f.severity == 2 and f.evidence["known"] is False and f.evidence["code"] == 999


def test_xid45_inherits_from_preceding_and_following_primary():
    det = XidDetector(xid45_window=10.0)
    det.update("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.", t=100.0)
    det.update("NVRM: Xid (PCI:0000:3b:00): 45, pid=1, name=python, Ch 00000010", t=101.0)
    assert det.events[-1].severity == 1 and det.events[-1].inherited_from == 79
    # 45 first, then 94 on another GPU within the window: inherits sev2 retroactively
    det.update("NVRM: Xid (PCI:0000:86:00): 45, pid=2, name=python, Ch 00000011", t=200.0)
    assert det.events[-1].severity == 3 and det.events[-1].inherited_from is None
    det.update("NVRM: Xid (PCI:0000:86:00): 94, pid=2, name=python, Contained: SM (0x1).", t=203.0)
    ev45 = [e for e in det.events if e.gpu == "0000:86:00" and e.code == 45][0]
    assert ev45.severity == 2 and ev45.inherited_from == 94
    # outside the window, or on another GPU: no inheritance
    det.update("NVRM: Xid (PCI:0000:86:00): 45, pid=2, name=python, Ch 00000011", t=300.0)
    assert det.events[-1].severity == 3
    det.update("NVRM: Xid (PCI:0000:18:00): 45, pid=3, name=python, Ch 00000011", t=301.0)
    assert det.events[-1].severity == 3


def test_detector_incident_per_gpu_worst_severity_and_hold():
    det = XidDetector(hold=60.0, node="n1")
    assert det.finding is None
    det.update("NVRM: Xid (PCI:0000:18:00): 63, pid=1, name=python, Row remapper: new row marked for remapping", t=0.0)
    det.update(13, "0000:af:00", t=5.0)
    det.update(48, 3, t=6.0)
    fs = det.findings
    assert [f.severity for f in fs] == [1, 2, 3]
    assert fs[0].evidence["gpu"] == "3" and fs[0].evidence["action"] == "reset_gpu" and fs[0].evidence["node"] == "n1"
    det.update(13, "0000:18:00", t=10.0)  # same GPU as the 63: its incident is now sev2
    inc = [f for f in det.findings if f.evidence["gpu"] == "0000:18:00"][0]
    assert inc.severity == 2 and inc.onset == 0.0 and inc.detected_at == 10.0 and inc.evidence["codes"] == [63, 13]
    det.tick(66.5)  # GPU 3 (last XID at 6.0) and af:00 expire, 18:00 stays until 70
    assert [f.evidence["gpu"] for f in det.findings] == ["0000:18:00"]
    det.tick(71.0)
    assert det.finding is None


def test_non_xid_lines_are_counted_and_ignored():
    det = XidDetector()
    det.update("eth0: link up", t=1.0)
    assert det.finding is None and det.lines_ignored == 1


def test_bad_input_and_params():
    with pytest.raises(DetectorError):
        XidDetector(hold=0)
    with pytest.raises(DetectorError):
        XidDetector(xid45_window=-1)
    det = XidDetector()
    with pytest.raises(DetectorError):
        det.update(3.5, t=1.0)
    with pytest.raises(DetectorError):
        det.update(13, t=float("nan"))


def test_snapshot_roundtrip():
    det = XidDetector()
    det.update("NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=python, NVLink: fatal error detected on link 5", t=1.0)
    again = XidDetector.restore(pickle.loads(pickle.dumps(det.snapshot())))
    assert again.finding == det.finding
