"""Kernel-log XIDs: real-format /dev/kmsg records and dmesg/syslog lines, followed like tail -f."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import pytest

from vigil.producers.agent import Agent, KmsgCollector, parse_kmsg_record
from vigil.schemas import Source, XidError
from vigil.schemas.events import AgentHealth

T0 = datetime(2025, 3, 1, 12, tzinfo=timezone.utc)
SRC = Source(node="gpu-node-7")

# As the driver writes them (kmsg record format: prio,seq,usec,flags;message)
KMSG = [
    "3,1001,8123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "6,1002,8123456800,-;eth0: renamed from veth1234",
    "4,1003,8123457000,-;NVRM: Xid (PCI:0000:86:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
    "4,1004,8123458000,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "3,1005,8123459000,-;NVRM: GPU at PCI:0000:af:00: GPU has fallen off the bus.",
    "4,1006,8123460000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=2211, name=train.py, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0",
]
DMESG = [
    "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "Mar  1 12:00:01 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=5678, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12345000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    "Mar  1 12:00:02 gpu-node-7 kernel: usb 1-1: new high-speed USB device",
]


def test_parse_kmsg_record_fields():
    seq, up, msg = parse_kmsg_record(KMSG[5])
    assert (seq, up) == (1006, 8123.46)
    assert msg.startswith("NVRM: Xid (PCI:0000:3b:00): 48") and "SUBSYSTEM" not in msg


def test_kmsg_format_lines_become_xid_events_with_raw_line(tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text("")
    boot = T0 - timedelta(seconds=9000)
    col = KmsgCollector(1, SRC, log, boot_time=boot)
    assert col.collect(T0) == []
    with open(log, "a") as f:
        f.write("\n".join(k.split("\n")[0] for k in KMSG) + "\n")
    events = col.collect(T0)
    assert [e.code for e in events] == [79, 13, 154, 79, 48]
    assert all(isinstance(e, XidError) and e.source == SRC for e in events)
    first = events[0]
    assert (first.pci_bus_id, first.pid, first.process_name) == ("0000:3b:00", 1234, "python")
    assert first.raw_line == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    assert first.event_time == boot + timedelta(seconds=8123.456789)
    assert events[1].pid is None and events[1].process_name is None
    assert events[3].message == "GPU has fallen off the bus." and events[3].pci_bus_id == "0000:af:00"
    assert col.collect(T0) == []  # nothing new


def test_dmesg_and_syslog_lines_and_partial_lines(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    col = KmsgCollector(1, SRC, log)
    col.collect(T0)
    with open(log, "a") as f:
        f.write(DMESG[0] + "\n" + DMESG[1][:40])  # the second line is still being written
    assert [e.code for e in col.collect(T0)] == [79]
    with open(log, "a") as f:
        f.write(DMESG[1][40:] + "\n" + DMESG[2] + "\n")
    ev = col.collect(T0)
    assert [e.code for e in ev] == [31] and ev[0].raw_line.endswith("ACCESS_TYPE_READ")
    assert ev[0].event_time == T0  # no boot time for a plain line: the read time


def test_starts_at_the_end_unless_asked(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(DMESG[0] + "\n")
    assert KmsgCollector(1, SRC, log).collect(T0) == []
    assert [e.code for e in KmsgCollector(1, SRC, log, from_start=True).collect(T0)] == [79]


def test_rotated_file_is_read_from_its_start(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("x" * 500 + "\n")
    col = KmsgCollector(1, SRC, log)
    col.collect(T0)
    log.write_text(DMESG[0] + "\n")  # truncated and rewritten: shorter than where we were
    assert [e.code for e in col.collect(T0)] == [79]


NOBODY = 65534  # the conventional unprivileged uid and gid; need not be in /etc/passwd


def _unprivileged(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child that, when this process is root, first drops to uid and gid 65534.

    CI runs the suite as root, and root reads any file. A fork rather than a new
    interpreter (``setpriv``, ``runuser`` or ``setuid`` in a ``preexec_fn``):
    the interpreter may live where 65534 cannot read it (here under a 0700
    ``/root``), while the forked child has every module it needs loaded
    already. Dropping every uid from 0 clears the capabilities
    (CAP_DAC_OVERRIDE included). Skips, saying why, only when the drop fails.
    """
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform: cannot run a child with dropped privileges")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            os.close(r)
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
            except OSError as exc:
                out: dict[str, Any] = {"cannot_drop": f"{type(exc).__name__}: {exc}"}
            else:
                try:
                    out = {"result": fn()}
                except BaseException:
                    out = {"error": traceback.format_exc()}
            with os.fdopen(w, "wb") as pipe:
                pipe.write(json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        raw = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and raw, f"the unprivileged child died (status {status})"
    out = json.loads(raw)
    if "cannot_drop" in out:
        pytest.skip(f"running as root and cannot drop to uid {NOBODY} ({out['cannot_drop']}): "
                    "root reads any file, so no permission error can be provoked")
    assert "error" not in out, out.get("error")
    return out["result"]


def test_permission_error_is_reported_once_not_fatal():
    # A directory anyone may enter (pytest's tmp_path sits under a 0700 directory of root's) holding a
    # file no one but root may read: the collector is denied by the file's mode, not by the path to it.
    where = Path(tempfile.mkdtemp(prefix="vigil-kmsg-"))
    try:
        where.chmod(0o755)
        log = where / "kmsg"
        log.write_text(DMESG[0] + "\n")
        log.chmod(0)

        def as_unprivileged() -> dict[str, Any]:
            try:
                open(log, "rb").close()
                denied = None
            except PermissionError as exc:
                denied = exc.errno
            col = KmsgCollector(1, SRC, log, from_start=True)
            agent = Agent([col], publisher=None, source=SRC)
            first = agent.run_once(col, T0)
            second = agent.run_once(col, T0)
            return {"euid": os.geteuid(), "denied": denied, "stat_ok": log.stat().st_mode & 0o777 == 0,
                    "first": [[type(e).__name__, getattr(e, "status", None), getattr(e, "detail", None)] for e in first],
                    "second": len(second)}

        got = _unprivileged(as_unprivileged)
    finally:
        shutil.rmtree(where)
    assert got["euid"] != 0
    assert got["stat_ok"] and got["denied"] == errno.EACCES  # ground truth: the file's mode refuses this user
    [(kind, status, detail)] = got["first"]
    assert (kind, status) == ("AgentHealth", "failed")
    assert detail.startswith("kmsg") and f"no permission to read {log}" in detail, detail
    assert got["second"] == 0  # reported once; the agent goes on


def test_missing_device_is_reported_once(tmp_path):
    col = KmsgCollector(1, SRC, tmp_path / "no-kmsg")
    agent = Agent([col], publisher=None, source=SRC)
    first = agent.run_once(col, T0)
    assert len(first) == 1 and first[0].status == "failed" and "does not exist" in first[0].detail
    assert agent.run_once(col, T0) == []


def test_real_dev_kmsg_opens_or_reports(tmp_path):
    """On this machine /dev/kmsg exists; reading it must not raise either way."""
    col = KmsgCollector(1, SRC)
    agent = Agent([col], publisher=None, source=SRC)
    out = agent.run_once(col, T0)
    assert all(isinstance(e, (XidError, AgentHealth)) for e in out)
    col.close()
