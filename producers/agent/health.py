"""The checks a node passes before it counts as healthy capacity (on joining, and back from repair).

Whatever the agent can run without disturbing a job: the GPUs answer NVML
and none reports a pending retirement or an uncorrected ECC error; the RDMA
ports are up; the disks it watches have headroom; optionally a gloo
all-reduce on the loopback (torch must be installed). Each check says
``ok`` or what failed; a node with any failure publishes ``unhealthy`` and
stays out of re-planning until a later start passes (operators of gpud and
NVSentinel gate re-admission the same way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["health_checks", "passed"]


def passed(results: dict[str, str]) -> bool:
    return all(v == "ok" for v in results.values())


def health_checks(*, disks: Sequence[str | os.PathLike] = (), min_free_bytes: int = 1 << 30,
                  nic_root: str | os.PathLike | None = None, nvml: Callable[[], Any] | None = None,
                  gloo: bool = False, timeout_s: float = 60.0) -> dict[str, str]:
    """Run the checks; ``{name: "ok" | what failed}``."""
    out: dict[str, str] = {}
    for disk in disks:
        out[f"disk:{disk}"] = _disk(Path(disk), min_free_bytes)
    if nic_root is not None:
        out["nic"] = _nic(Path(nic_root))
    if nvml is not None:
        out["gpu"] = _gpus(nvml)
    if gloo:
        out["gloo"] = _gloo(timeout_s)
    return out


def _disk(path: Path, min_free: int) -> str:
    try:
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    if free < min_free:
        return f"{free / 2**30:.1f} GiB free on {path}, below the {min_free / 2**30:.1f} GiB needed"
    return "ok"


def _nic(root: Path) -> str:
    if not root.exists():
        return "ok"  # no RDMA devices on this node: nothing to check
    down = []
    for state in sorted(root.glob("*/ports/*/state")):
        try:
            text = state.read_text().strip()
        except OSError:
            continue
        if "ACTIVE" not in text.upper():
            down.append(f"{state.parts[-4]}:{state.parts[-2]} {text}")
    return "ok" if not down else "ports not active: " + ", ".join(down[:8])


def _gpus(load_nvml: Callable[[], Any]) -> str:
    try:
        nvml = load_nvml()
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - a missing driver is what this check is for
        return f"NVML unavailable: {exc}"
    try:
        problems = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    problems.append(f"GPU {i}: retired pages pending (reset needed)")
            except Exception:  # noqa: BLE001 - not every GPU supports it
                pass
            try:
                # since the driver last loaded (volatile): a GPU whose bad pages a reset retired keeps
                # its lifetime (aggregate) count forever, and must pass once repaired
                dbe = nvml.nvmlDeviceGetTotalEccErrors(handle, getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                                                       getattr(nvml, "NVML_VOLATILE_ECC", 0))
                if dbe:
                    problems.append(f"GPU {i}: {dbe} uncorrected ECC errors")
            except Exception:  # noqa: BLE001
                pass
        return "ok" if not problems else "; ".join(problems)
    except Exception as exc:  # noqa: BLE001
        return f"NVML query failed: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


_GLOO = """
import os, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "0")
store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(1 << 16); dist.all_reduce(t); assert float(t[0]) == 1.0
dist.destroy_process_group()
"""


def _gloo(timeout_s: float) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", _GLOO], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"gloo all-reduce did not finish within {timeout_s:g} s"
    if done.returncode != 0:
        return "gloo all-reduce failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return "ok"
