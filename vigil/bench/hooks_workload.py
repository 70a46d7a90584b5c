"""The hooks benchmark's workload: real multi-process torch (gloo) ranks training with or without vigil's hooks.

:func:`run_workload` spawns ``world`` ranks that train a small model with
real collectives, optionally instrumented (the hooks as deployed) and with
injected faults, and returns each rank's step records for the A/B
comparison in :mod:`vigil.bench.hooks`.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["WorkloadResult", "run_workload", "flush_interval"]


def flush_interval(cfg: dict[str, Any]) -> float:
    """The hooks' flush interval in a workload: the monitor's deployed default unless the config names one."""
    from vigil.producers.training.monitor import FLUSH_INTERVAL_S

    return float(cfg.get("flush_interval_s", FLUSH_INTERVAL_S))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fault_active(faults: list[dict], kind: str, rank: int, step: int) -> float:
    for f in faults:
        if f["kind"] == kind and f["rank"] == rank and f["start"] <= step < f["end"]:
            return float(f["delay_s"])
    return 0.0


def _rank_main(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    cores = cfg.get("pin_cores")
    if cores:  # one rank per core: the step's wall time is one rank's on one core
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    world = cfg["world"]
    dp_size, tp_size = cfg["grid"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world)
    dp, tp = rank // tp_size, rank % tp_size
    tp_groups = [dist.new_group([d * tp_size + t for t in range(tp_size)]) for d in range(dp_size)]
    dp_groups = [dist.new_group([d * tp_size + t for d in range(dp_size)]) for t in range(tp_size)]
    tp_group, dp_group = tp_groups[dp], dp_groups[tp]
    faults = cfg.get("faults", [])
    state = {"step": 0}

    # Fault: this rank's collectives are slow (installed *under* the hooks, like a slow NIC).
    real_all_reduce = dist.all_reduce

    def maybe_slow_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        # Every rank runs the same two halves (collectives must match across ranks);
        # the faulty rank pauses between them, so its peers wait inside the call too.
        flat = tensor.view(-1)
        half = flat.numel() // 2
        real_all_reduce(flat[:half], op=op, group=group)
        delay = _fault_active(faults, "comm", rank, state["step"])
        if delay > 0:
            time.sleep(delay)
        return real_all_reduce(flat[half:], op=op, group=group)

    if any(f["kind"] == "comm" for f in faults):
        dist.all_reduce = maybe_slow_all_reduce

    torch.manual_seed(1234 + rank)
    hidden, batch = cfg["hidden"], cfg["batch"]
    model = torch.nn.Sequential(torch.nn.Linear(hidden, 2 * hidden), torch.nn.ReLU(), torch.nn.Linear(2 * hidden, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, hidden)
    y = torch.randn(batch, hidden)
    act = torch.empty(batch, 2 * hidden)

    mon = None
    hooks = cfg["hooks"]  # "on", "off", or "alternate"
    if hooks != "off":
        from vigil.producers.training import TrainingMonitor, UnixDatagramSink

        mon = TrainingMonitor(UnixDatagramSink(cfg["socket"]), job=cfg["job"], rank=rank, node=cfg.get("node", "bench-node"),
                              dp=dp, pp=0, tp=tp, flush_interval_s=flush_interval(cfg))
        mon.name_group(tp_group, f"tp:{dp}")
        mon.name_group(dp_group, f"dp:{tp}")

    from contextlib import nullcontext

    marks = {"on": False}

    def compute() -> Any:  # the documented deployment marks compute; with the hooks off, nothing
        return mon.compute() if marks["on"] and mon is not None else nullcontext()

    def train_step(step: int) -> None:
        # forward with two "tensor-parallel" all-reduces of activations
        with compute():
            h = model[0](x)
            act.copy_(h.detach())
        dist.all_reduce(act, group=tp_group)
        with compute():
            out = model[2](model[1](h + 0.0 * act))
            loss = ((out - y) ** 2).mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
        dist.all_reduce(act, group=tp_group)
        delay = _fault_active(faults, "compute", rank, step)
        if delay > 0:
            with compute():  # the fault is compute: it runs inside the marked blocks
                time.sleep(delay)
        # data-parallel gradient all-reduce (one bucket)
        grads = torch.cat([p.grad.view(-1) for p in model.parameters()])
        dist.all_reduce(grads, group=dp_group)
        with compute():
            grads /= dp_size
            o = 0
            for p in model.parameters():
                n = p.numel()
                p.grad.copy_(grads[o:o + n].view_as(p))
                o += n
            opt.step()

    block = cfg.get("block", 0)
    # Per step: (step, hooks_on, wall s, process CPU s, main-thread CPU s, hooks' threads CPU s).
    rows: list[tuple[int, bool, float, float, float, float]] = []
    instrumented = False
    hook_clocks: list[int] = []  # CPU clocks of the threads the hooks started (the control channel)
    hook_cpu_last = 0.0
    control_dir = cfg.get("control_dir")

    def hook_threads_cpu() -> float:
        total = 0.0
        for clk in hook_clocks:
            try:
                total += time.clock_gettime(clk)
            except OSError:  # the thread has ended
                pass
        return total

    dist.barrier()
    for step in range(cfg["steps"]):
        state["step"] = step
        on = hooks == "on" or (hooks == "alternate" and (step // block) % 2 == 1) or (
            hooks == "alternate" and step >= cfg.get("tail_on_from", 1 << 60))
        if mon is not None and on != instrumented:
            if on:
                before = {t.ident for t in threading.enumerate()}
                mon.instrument_collectives(dist)
                if control_dir:
                    mon.start_control(Path(control_dir) / f"r{rank}.sock")
                if cfg.get("watchdog", True):
                    mon.start_hang_watchdog()
                hook_clocks = [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
                               if t.ident not in before and t.ident is not None]
                hook_cpu_last = hook_threads_cpu()
            else:
                mon.uninstrument_collectives()
                mon.stop_hang_watchdog()
                if mon.control is not None:
                    mon.control.close()
                    mon.control = None
                hook_clocks = []
            instrumented = on
        marks["on"] = on
        t0 = time.perf_counter()
        p0 = time.process_time()
        m0 = time.thread_time()
        if on and mon is not None:
            with mon.step(step):
                train_step(step)
        else:
            train_step(step)
        m1 = time.thread_time()
        p1 = time.process_time()
        hook_cpu = 0.0
        if hook_clocks:
            now_cpu = hook_threads_cpu()
            hook_cpu, hook_cpu_last = now_cpu - hook_cpu_last, now_cpu
        t1 = time.perf_counter()
        rows.append((step, on, t1 - t0, p1 - p0, m1 - m0, hook_cpu))
    dist.barrier()
    if mon is not None:
        mon.close()
    if cfg.get("times_path"):
        Path(f"{cfg['times_path']}.rank{rank}").write_text(json.dumps(rows))
    dist.destroy_process_group()


class WorkloadResult(dict):
    """``times``: rank 0's ``(step, hooks_on, seconds)``; ``ranks``: per rank, per step,
    ``(step, hooks_on, wall_s, process_cpu_s, main_thread_cpu_s, hook_threads_cpu_s)``."""


def run_workload(cfg: dict[str, Any], timeout_s: float = 300.0) -> WorkloadResult:
    """Run the workload in ``cfg["world"]`` fresh processes; return every rank's step times.

    ``cfg``: ``world``, ``grid`` (dp, tp), ``steps``, ``hidden``, ``batch``,
    ``hooks`` ("on" | "off" | "alternate"), ``block`` (alternate), ``socket``
    (the node batcher's), ``job``, ``faults`` (list of ``{kind, rank, start,
    end, delay_s}``), ``control_dir`` (optional: with the hooks on, each rank
    also listens on its control channel there, as a real job would).
    """
    import torch.multiprocessing as mp

    cfg = dict(cfg)
    cfg.setdefault("port", _free_port())
    with tempfile.TemporaryDirectory() as tmp:
        cfg["times_path"] = str(Path(tmp) / "times.json")
        ctx = mp.start_processes(_rank_main, args=(cfg,), nprocs=cfg["world"], join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"the workload did not finish within {timeout_s} s")
        ranks = [[(int(r[0]), bool(r[1]), *map(float, r[2:])) for r in json.loads(Path(f"{cfg['times_path']}.rank{k}").read_text())]
                 for k in range(cfg["world"])]
    return WorkloadResult(times=[(r[0], r[1], r[2]) for r in ranks[0]], ranks=ranks)


# -- the benchmark -------------------------------------------------------------------------------


class _Tee:
    """Publisher wrapper that keeps rank 0's collectives and iterations for the ACF check."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher
        self.collectives: list[Any] = []
        self.iterations: list[Any] = []

    def publish(self, events: Any) -> None:
        for e in events:
            if e.source.rank == 0:
                if e.event_type == "collective":
                    self.collectives.append(e)
                elif e.event_type == "iteration":
                    self.iterations.append(e)
        self.publisher.publish(events)

    def poll(self, timeout_s: float = 0.0) -> None:
        self.publisher.poll(timeout_s)
