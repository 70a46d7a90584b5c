"""Real multi-process torch jobs (gloo, CPU) instrumented with the hooks, with injected delays.

Each scenario runs ``world`` spawned processes; every rank's hook records
(the events its sink received, as JSON) come back per rank. Delays are
sleeps inside the rank's compute, so the truth is known: the delayed rank
computes longer, and the ranks that wait for it wait (in a collective, or in
a point-to-point receive) that much longer.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["run_scenario", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _monitor(rank: int, cfg: dict[str, Any], coords: tuple[int, int, int], got: list):
    from vigil.producers.training import CallbackSink, TrainingMonitor

    dp, pp, tp = coords
    return TrainingMonitor(CallbackSink(got.extend), job=cfg["job"], rank=rank, node=f"node{rank // 2}",
                           dp=dp, pp=pp, tp=tp, flush_interval_s=0.0, timing="cpu")


def _delay(cfg: dict[str, Any], rank: int, step: int) -> float:
    d = cfg.get("delay") or {}
    return float(d["seconds"]) if d and d["rank"] == rank and step >= d["from_step"] else 0.0


def _ddp(rank: int, cfg: dict[str, Any], got: list) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    ddp = DDP(model, bucket_cap_mb=0.02)  # ~5k floats per bucket: several buckets per backward
    mon = _monitor(rank, cfg, (rank, 0, 0), got)
    mon.instrument_collectives(dist)
    mon.register_ddp_comm_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    dist.barrier()
    for step in range(cfg["steps"]):
        with mon.step(step):
            with mon.compute():
                out = ddp(x)
                time.sleep(_delay(cfg, rank, step))  # the slow rank's forward
                loss = ((out - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    mon.close()


def _fsdp2(rank: int, cfg: dict[str, Any], got: list) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    mon = _monitor(rank, cfg, (rank, 0, 0), got)
    mon.instrument_collectives(dist)  # before fully_shard: FSDP2 calls torch.distributed.*_single
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    dist.barrier()
    for step in range(cfg["steps"]):
        with mon.step(step):
            out = model(x)
            time.sleep(_delay(cfg, rank, step))
            loss = ((out - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    mon.close()


def _pipeline(rank: int, cfg: dict[str, Any], got: list) -> None:
    """dp 2 x pp 2, one micro-batch: stage 0 forward -> send; stage 1 recv -> forward, backward -> send grad.

    Megatron order with tp 1: rank = pp * 2 + dp. Lane 0 uses plain send/recv
    (timed as wait by the wrappers), lane 1 ``batch_isend_irecv`` for the
    gradients and ``mon.pipeline_wait()`` around its activations' receive
    (the documented way to mark a pipeline wait).
    """
    import torch
    import torch.distributed as dist

    dp, pp = rank % 2, rank // 2
    dp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mon = _monitor(rank, cfg, (dp, pp, 0), got)
    mon.instrument_collectives(dist)
    mon.name_group(dp_groups[pp], f"dp:{pp}")
    torch.manual_seed(pp)
    layer = torch.nn.Linear(64, 64)
    peer = rank + 2 if pp == 0 else rank - 2
    act = torch.empty(32, 64)
    grad = torch.empty(32, 64)
    x = torch.randn(32, 64)
    dist.barrier()
    for step in range(cfg["steps"]):
        with mon.step(step):
            if pp == 0:
                with mon.compute():
                    out = layer(x)
                    time.sleep(cfg["work_s"] + _delay(cfg, rank, step))
                dist.send(out.detach().contiguous(), peer)
                if dp == 0:
                    dist.recv(grad, peer)
                else:
                    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, grad, peer)])
                    for r in reqs:
                        r.wait()
                with mon.compute():
                    out.backward(grad)
                    time.sleep(cfg["work_s"])
            else:
                if dp == 0:
                    dist.recv(act, peer)
                else:
                    with mon.pipeline_wait():
                        dist.recv(act, peer)
                with mon.compute():
                    a = act.clone().requires_grad_(True)
                    loss = layer(a).pow(2).mean()
                    loss.backward()
                    time.sleep(2 * cfg["work_s"])
                if dp == 0:
                    dist.send(a.grad.contiguous(), peer)
                else:
                    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a.grad.contiguous(), peer)])
                    for r in reqs:
                        r.wait()
            g = torch.cat([p.grad.view(-1) for p in layer.parameters()])
            dist.all_reduce(g, group=dp_groups[pp])
            layer.zero_grad()
    mon.close()


def _hang(rank: int, cfg: dict[str, Any], got: list) -> None:
    """Four ranks, a world group and two pair groups; rank ``skip`` never issues world all-reduce number 3."""
    import torch
    import torch.distributed as dist

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mon = _monitor(rank, cfg, (rank, 0, 0), got)
    mon.instrument_collectives(dist)
    mon.start_hang_watchdog(factor=3.0, min_timeout_s=1.0, poll_s=0.1, warmup_steps=2)
    t = torch.ones(8)
    dist.barrier()  # world collective 1
    try:
        for step in range(3):
            with mon.step(step):
                if step == 2 and rank == cfg["skip"]:
                    time.sleep(cfg["stall_s"])  # stuck in its own code: never enters the all-reduce
                    continue
                time.sleep(0.05)
                dist.all_reduce(t)  # world collectives 2, 3, 4
                dist.all_reduce(t, group=pairs[rank // 2])
    except RuntimeError as exc:  # gloo: the peers' collective times out, or the peer that left closed it
        got.append({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    mon.stop_hang_watchdog()
    mon.flush()


_SCENARIOS = {"ddp": _ddp, "fsdp2": _fsdp2, "pipeline": _pipeline, "hang": _hang}


def _main(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    for k, v in (cfg.get("env") or {}).items():
        os.environ[k] = v
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=cfg["world"], timeout=timedelta(seconds=cfg.get("timeout_s", 60)))
    got: list = []
    try:
        _SCENARIOS[cfg["scenario"]](rank, cfg, got)
    finally:
        out = [e if isinstance(e, dict) else e.model_dump(mode="json") for e in got]
        Path(cfg["out"], f"rank{rank}.json").write_text(json.dumps(out))
        if cfg["scenario"] == "hang":
            os._exit(0)  # a hung gloo group cannot be destroyed cleanly
        dist.destroy_process_group()


def run_scenario(scenario: str, world: int = 4, timeout_s: float = 120.0, **cfg: Any) -> list[list[dict[str, Any]]]:
    """Run a scenario in ``world`` fresh processes; every rank's events (as JSON dicts)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(cfg, scenario=scenario, world=world, port=free_port(), out=tmp, job=f"gloo-{scenario}")
        ctx = mp.start_processes(_main, args=(cfg,), nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"scenario {scenario} did not finish within {timeout_s} s")
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
