"""The GPU checks vigil cannot run on CPU machines, in one go (under 3 minutes); prints a JSON summary.

    .venv/bin/python tools/gpu_check.py [--sizes-mb 1,4,16,64,256] [--iters 20] [--json out.json]

On a machine with an NVIDIA GPU (torch with CUDA and NCCL, nvidia-ml-py):

``nvml``
    every GPU read once through the node agent's own collector
    (:class:`vigil.producers.agent.NvmlTelemetryCollector`), and the XID
    collector's event registration; what each GPU reported and any field
    NVML refused.
``allreduce``
    a world-size-1 NCCL process group; per size, the all-reduce timed by
    the hooks' CUDA-event path (a :class:`~vigil.producers.training.TrainingMonitor`
    with ``timing="auto"``, one all-reduce per step: the step's
    ``communication_s``) against torch.profiler's device time for the same
    all-reduce (the kernels and copies it ran, per call). With one rank NCCL
    runs no ring: the op is a pre-multiplied sum where torch offers it, so a
    kernel proportional to the size still runs (a plain in-place sum may run
    none). ``event_over_kernel`` is the ratio of the medians.
``overhead``
    the hooks' cost on the GPU path, briefly: a step of matmuls and one
    all-reduce, synchronised at its end (as a ``loss.item()`` does), in
    alternating blocks with and without the hooks (step, marked compute,
    instrumented collectives); :func:`vigil.bench.abtest.ab_overhead`'s
    median relative difference with its bootstrap interval: wall time, and
    the main thread's extra CPU over the step's wall and CPU time.

Exit status: 0 every section ran, 1 a section failed (its ``error`` says
why), 2 there is no GPU here (the message says what is missing) or torch
is not installed.

``--cpu`` runs the same code on the CPU with gloo (no NVML, no device
time: figures not worth reading), to check the script itself where there is
no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from typing import Any, Callable

BUDGET_S = 170.0  # the whole check stays under 3 minutes; a section that would start later is skipped


def _no_gpu() -> tuple[Any, str | None]:
    """(torch, None) when a CUDA device is usable; (None or torch, why not) otherwise."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed here ({exc}): the GPU checks need torch with CUDA"
    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU-only build of torch)"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return torch, (f"no NVIDIA GPU is visible here: torch {torch.__version__}, built for CUDA {built}; "
                       f"torch.cuda.is_available() is False"
                       + (f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "")
                       + ". Run this on a machine with an NVIDIA GPU and its driver.")
    return torch, None


def _section(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        out = dict(fn(), ok=True)
    except Exception as exc:  # a failed section is reported, the others still run
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc().splitlines()[-6:]}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def nvml_read() -> dict[str, Any]:
    from vigil.producers.agent import NvmlTelemetryCollector, NvmlXidCollector
    from vigil.schemas import Source

    src = Source(cluster="gpu-check", node=socket.gethostname())
    tel = NvmlTelemetryCollector(10.0, src)
    xid = NvmlXidCollector(1.0, src)
    try:
        t0 = time.perf_counter()
        samples = tel.collect(datetime.now(timezone.utc))
        read_ms = 1000 * (time.perf_counter() - t0)
        xids = xid.collect(datetime.now(timezone.utc))
        problems = {**tel.take_problems(), **xid.take_problems()}
    finally:
        tel.close()
        xid.close()
    keep = ("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_w", "sm_clock_mhz",
            "mem_clock_mhz", "throttle_reasons", "ecc_sbe", "ecc_dbe", "retired_pages", "remapped_rows", "pcie_replays")
    gpus = []
    for s in samples:
        d = s.model_dump(mode="json")
        # a node's sample in columns names its GPUs in ``gpus`` (source.gpu stays unset)
        gpus.append({"gpu": s.source.gpu if s.source.gpu is not None else d.get("gpus"), **{k: d.get(k) for k in keep if k in d},
                     "unset": sorted(k for k in keep if k in d and d[k] is None)})
    return {"gpus": len(samples), "read_ms": round(read_ms, 2), "per_gpu": gpus, "xid_events": len(xids),
            "problems": problems}


def _nccl_version(torch: Any) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_nccl(torch: Any, device: str = "cuda") -> Any:
    import torch.distributed as dist

    kw: dict[str, Any] = dict(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    if device == "cpu":
        dist.init_process_group("gloo", **kw)
        return dist
    if not dist.is_nccl_available():
        raise RuntimeError("this torch has no NCCL backend")
    torch.cuda.set_device(0)
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda:0"), **kw)
    except TypeError:  # torch before device_id
        dist.init_process_group("nccl", **kw)
    return dist


def _op(dist: Any) -> tuple[Any, str]:
    make = getattr(dist, "_make_nccl_premul_sum", None)
    if make is not None and "nccl" in str(dist.get_backend()).lower():
        try:
            return make(1.0), "premul_sum"
        except Exception:
            pass
    return dist.ReduceOp.SUM, "sum"


def _device_us(prof: Any) -> tuple[float, dict[str, float]]:
    """Total device time (us) of the profiled GPU activity, and per name."""
    total, names = 0.0, {}
    for e in prof.events():
        if "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        tr = getattr(e, "time_range", None)
        us = tr.elapsed_us() if tr is not None else float(getattr(e, "device_time", 0) or getattr(e, "cuda_time", 0))
        total += us
        names[e.name] = names.get(e.name, 0.0) + us
    return total, names


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def allreduce_timing(torch: Any, dist: Any, sizes_mb: list[int], iters: int, device: str = "cuda") -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from vigil.producers.training import CallbackSink, TrainingMonitor

    op, op_name = _op(dist)
    tensors = {mb: torch.ones(mb * 2**20 // 4, device=device, dtype=torch.float32) for mb in sizes_mb}
    for x in tensors.values():  # NCCL's lazy set-up, and the first launch of each size
        for _ in range(3):
            dist.all_reduce(x, op=op)
    _sync(torch, device)
    kernel: dict[int, tuple[float, dict[str, float]]] = {}
    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    for mb, x in tensors.items():  # the profiler's view, hooks not installed
        with profile(activities=[activity]) as prof:
            for _ in range(iters):
                dist.all_reduce(x, op=op)
            _sync(torch, device)
        kernel[mb] = _device_us(prof)
    got: list[Any] = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="gpu-check", rank=0, flush_interval_s=0.0, timing="auto")
    mon.instrument_collectives(dist)
    path = mon.timing_path
    rows = []
    step = 0
    try:
        for mb, x in tensors.items():
            first = len(got)
            for _ in range(iters):
                with mon.step(step):
                    dist.all_reduce(x, op=op)
                step += 1
            _sync(torch, device)
            mon.flush()
            recs = [e for e in got[first:] if getattr(e, "event_type", None) == "iteration"]
            ev_ms = sorted(1000.0 * (r.communication_s or 0.0) for r in recs)
            k_total, k_names = kernel[mb]
            k_ms = k_total / 1000.0 / iters
            med = statistics.median(ev_ms) if ev_ms else None
            rows.append({
                "size_mb": mb, "steps": len(recs), "event_ms_median": None if med is None else round(med, 4),
                "event_ms_min": round(ev_ms[0], 4) if ev_ms else None,
                "event_ms_max": round(ev_ms[-1], 4) if ev_ms else None,
                "kernel_ms_per_call": round(k_ms, 4),
                "event_over_kernel": round(med / k_ms, 3) if med is not None and k_ms > 0 else None,
                "kernels": {n: round(us / iters, 2) for n, us in sorted(k_names.items(), key=lambda kv: -kv[1])[:4]},
                "measured": sorted({f"{k}={v}" for r in recs for k, v in r.measured.items()}),
            })
    finally:
        mon.uninstrument_collectives()
        mon.close()
    return {"timing_path": path, "op": op_name, "iters": iters, "sizes": rows,
            "note": "world size 1: NCCL runs no ring; the figures compare event timing with the device's own time "
                    "for the same call"}


def hooks_overhead(torch: Any, dist: Any, steps: int = 400, block: int = 20, device: str = "cuda",
                   n: int | None = None) -> dict[str, Any]:
    from vigil.bench.abtest import ab_overhead
    from vigil.producers.training import CallbackSink, TrainingMonitor

    op, _ = _op(dist)
    n = n or (4096 if device == "cuda" else 256)  # the matmuls' size: the step's length (the hooks' cost is per step)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    g = torch.ones(16 * 2**20 if device == "cuda" else 2**16, device=device, dtype=torch.float32)  # 64 MB of "gradients"
    mon = TrainingMonitor(CallbackSink(lambda events: None), job="gpu-check", rank=0, timing="auto")

    def train_step(marked: bool) -> None:
        ctx = mon.compute() if marked else None
        if ctx is not None:
            ctx.__enter__()
        y = a
        for _ in range(3):
            y = y @ a
        if ctx is not None:
            ctx.__exit__(None, None, None)
        dist.all_reduce(g, op=op)
        _sync(torch, device)  # the step's end, as loss.item() makes it

    for _ in range(10):
        train_step(False)
    rows = []
    on = False
    for step in range(steps):
        want = (step // block) % 2 == 1
        if want != on:
            if want:
                mon.instrument_collectives(dist)
            else:
                mon.uninstrument_collectives()
            on = want
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        if on:
            with mon.step(step):
                train_step(True)
        else:
            train_step(False)
        rows.append((step, on, time.perf_counter() - t0, time.process_time() - p0, time.thread_time() - c0, 0.0))
    mon.uninstrument_collectives()
    mon.close()
    ab = ab_overhead([rows], block)
    off = [r[2] for r in rows if not r[1]]
    return {"steps": steps, "block": block, "timing_path": mon.timing_path,
            "step_ms_off_median": round(1000 * statistics.median(off), 4),
            "pairs": ab["pairs"],
            "overhead_pct": {k: {"median": ab[k]["median"], "ci": ab[k]["ci"]}
                             for k in ("wall", "cpu_main_vs_wall", "cpu_main_vs_cpu")},
            "cpu_main_extra_us": {"median": ab["cpu_main_extra_us"]["median"], "ci": ab["cpu_main_extra_us"]["ci"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="1,4,16,64,256")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--overhead-steps", type=int, default=400)
    ap.add_argument("--overhead-n", type=int, default=None,
                    help="side of the overhead step's square matmuls (default 4096: a step under 1 ms on an H100; "
                         "16384 gives tens of ms, a real step's order)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    ap.add_argument("--cpu", action="store_true", help="run the code on the CPU with gloo (checks the script only)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    torch, why = _no_gpu()
    device = "cuda"
    if a.cpu and torch is not None:
        why, device = None, "cpu"
    if why is not None:
        print(f"gpu_check: {why}", file=sys.stderr)
        print(json.dumps({"ok": False, "gpu": False, "error": why}))
        return 2
    sizes = [int(v) for v in a.sizes_mb.split(",") if v.strip()]
    gpu = device == "cuda"
    summary: dict[str, Any] = {
        "ok": True, "gpu": gpu, "device": torch.cuda.get_device_name(0) if gpu else "cpu (--cpu: a check of the script)",
        "devices": torch.cuda.device_count() if gpu else 0,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": _nccl_version(torch),
        "command": " ".join([os.path.basename(sys.executable), "tools/gpu_check.py", *(argv or sys.argv[1:])]),
    }

    def timed(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if time.perf_counter() - t_start > BUDGET_S:
            summary[name] = {"ok": False, "error": f"skipped: the check's {BUDGET_S:.0f} s budget is spent"}
        else:
            summary[name] = _section(fn)

    timed("nvml", nvml_read) if gpu else summary.update(nvml={"ok": True, "skipped": "--cpu"})
    dist = None
    try:
        dist = _init_nccl(torch, device)
    except Exception as exc:
        summary["allreduce"] = summary["overhead"] = {"ok": False, "error": f"NCCL process group: "
                                                                             f"{type(exc).__name__}: {exc}"}
    if dist is not None:
        timed("allreduce", lambda: allreduce_timing(torch, dist, sizes, a.iters, device))
        timed("overhead", lambda: hooks_overhead(torch, dist, a.overhead_steps, device=device, n=a.overhead_n))
        dist.destroy_process_group()
    summary["ok"] = all(summary[k].get("ok") for k in ("nvml", "allreduce", "overhead"))
    summary["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(summary, indent=2, default=str)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
