"""``vigil bench hooks``: what the training hooks cost, how well ACF finds the iteration, what the agent costs.

The workload (:func:`run_workload`) is a real multi-process torch training
step: ``world`` ranks (gloo on CPU, one process each) arranged as a dp x tp
grid, a small MLP trained with SGD; per step each rank does two tensor-parallel
all-reduces on its tp group (activations) and one data-parallel all-reduce of
its gradients on its dp group. Faults can be injected per rank and step range:

* ``compute``: the rank computes ``delay_s`` longer (a sleep inside the step);
* ``comm``: every collective of the rank is split in two halves with a
  ``delay_s`` pause between them, so its groups' transfers take longer for
  every member (a slow link/NIC of that rank).

Measurements (:func:`run`):

``overhead_pct``
    the CPU cost of the hooks' hot path per step (step context, the
    collective wrappers, the amortized encode-and-send of records), measured
    in isolation with ``perf_counter`` over 20k steps, divided by the median
    real step time of the workload below. On a 2-core machine running four
    ranks, the broker and the batcher, step times jitter by 10-30% from block
    to block, far more than 1%, so an A/B difference alone cannot resolve 1%.
``detail.ab_overhead_pct``
    the end-to-end check: the same training run alternates blocks of steps
    with and without the hooks (step API + collective instrumentation +
    records to the node batcher, which publishes to a real broker); rank 0
    times every step with ``perf_counter`` around the whole step. Median over
    adjacent (off, on) block pairs of ``mean(on) / mean(off) - 1``, with the
    spread of the pairs (``ab_pair_spread_pct``) as its noise.
``acf_rel_error``
    over a final contiguous hooks-on segment, rank 0's collective calls (as
    published) give the iteration period by ACF and the iteration time by
    :func:`detectors.period.iteration_time_from_period`; compared with the
    median of the measured step times.
``agent_cpu_pct``
    the node agent (``producers.agent``) at its default intervals (heartbeats,
    NIC counters on a fixture tree, kmsg on a file, disk/memory/log watchdogs;
    no NVML here) runs for ``agent_seconds`` in its own process; its CPU time
    (user + system, from /proc) over wall time, in percent of one core.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_workload", "run", "WorkloadResult"]


# -- the workload ---------------------------------------------------------------------------------


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
        from producers.training import TrainingMonitor, UnixDatagramSink

        mon = TrainingMonitor(UnixDatagramSink(cfg["socket"]), job=cfg["job"], rank=rank, node=cfg.get("node", "bench-node"),
                              dp=dp, pp=0, tp=tp, flush_interval_s=cfg.get("flush_interval_s", 0.5))
        mon.name_group(tp_group, f"tp:{dp}")
        mon.name_group(dp_group, f"dp:{tp}")

    def train_step(step: int) -> None:
        # forward with two "tensor-parallel" all-reduces of activations
        h = model[0](x)
        act.copy_(h.detach())
        dist.all_reduce(act, group=tp_group)
        out = model[2](model[1](h + 0.0 * act))
        loss = ((out - y) ** 2).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        dist.all_reduce(act, group=tp_group)
        delay = _fault_active(faults, "compute", rank, step)
        if delay > 0:
            time.sleep(delay)
        # data-parallel gradient all-reduce (one bucket)
        grads = torch.cat([p.grad.view(-1) for p in model.parameters()])
        dist.all_reduce(grads, group=dp_group)
        grads /= dp_size
        o = 0
        for p in model.parameters():
            n = p.numel()
            p.grad.copy_(grads[o:o + n].view_as(p))
            o += n
        opt.step()

    block = cfg.get("block", 0)
    times: list[tuple[int, bool, float]] = []
    instrumented = False
    dist.barrier()
    for step in range(cfg["steps"]):
        state["step"] = step
        on = hooks == "on" or (hooks == "alternate" and (step // block) % 2 == 1) or (
            hooks == "alternate" and step >= cfg.get("tail_on_from", 1 << 60))
        if mon is not None and on != instrumented:
            if on:
                mon.instrument_collectives(dist)
            else:
                mon.uninstrument_collectives()
            instrumented = on
        t0 = time.perf_counter()
        if on and mon is not None:
            with mon.step(step):
                train_step(step)
        else:
            train_step(step)
        times.append((step, on, time.perf_counter() - t0))
    dist.barrier()
    if mon is not None:
        mon.close()
    if rank == 0 and cfg.get("times_path"):
        Path(cfg["times_path"]).write_text(json.dumps(times))
    dist.destroy_process_group()


class WorkloadResult(dict):
    """``times``: rank 0's ``(step, hooks_on, seconds)``."""


def run_workload(cfg: dict[str, Any], timeout_s: float = 300.0) -> WorkloadResult:
    """Run the workload in ``cfg["world"]`` fresh processes; return rank 0's step times.

    ``cfg``: ``world``, ``grid`` (dp, tp), ``steps``, ``hidden``, ``batch``,
    ``hooks`` ("on" | "off" | "alternate"), ``block`` (alternate), ``socket``
    (the node batcher's), ``job``, ``faults`` (list of ``{kind, rank, start,
    end, delay_s}``).
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
        times = json.loads(Path(cfg["times_path"]).read_text())
    return WorkloadResult(times=[(s, bool(on), float(t)) for s, on, t in times])


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


def overhead_from_times(times: list[tuple[int, bool, float]], block: int, skip: int) -> tuple[float, list[float]]:
    """Median over adjacent (off, on) block pairs of mean(on)/mean(off) - 1, in percent."""
    blocks: dict[int, list[float]] = {}
    kind: dict[int, bool] = {}
    for step, on, t in times:
        if step < skip:
            continue
        b = step // block
        blocks.setdefault(b, []).append(t)
        kind[b] = on
    ratios = []
    ids = sorted(blocks)
    for b in ids:
        if kind[b] and (b - 1) in blocks and not kind[b - 1]:
            ratios.append(statistics.fmean(blocks[b]) / statistics.fmean(blocks[b - 1]) - 1.0)
        if kind[b] and (b + 1) in blocks and not kind[b + 1]:
            ratios.append(statistics.fmean(blocks[b]) / statistics.fmean(blocks[b + 1]) - 1.0)
    if not ratios:
        raise ValueError("no adjacent on/off blocks to compare")
    return 100.0 * statistics.median(ratios), [100.0 * r for r in ratios]


def acf_error(collectives: list[Any], iterations: list[Any]) -> dict[str, Any]:
    """ACF iteration time from collective calls vs the measured iteration time."""
    import numpy as np

    from detectors.period import _codes, acf_period, iteration_time_from_period

    calls = sorted(collectives, key=lambda e: e.start)
    symbols = [f"{e.op.value}|{e.group}" for e in calls]
    codes = _codes(symbols)
    times = np.array([e.start.timestamp() for e in calls])
    period = acf_period(codes)
    if period is None:
        return {"period": None, "acf_iteration_s": None, "true_iteration_s": None, "rel_error": None}
    est = iteration_time_from_period(codes, times, period)
    # Truth: the time between consecutive step starts (what one iteration takes, end to end).
    starts = sorted(e.start.timestamp() for e in iterations)
    true = float(np.median(np.diff(starts)))
    return {"period": int(period), "acf_iteration_s": est, "true_iteration_s": true,
            "rel_error": abs(est - true) / true if est is not None else None}


def _make_nic_tree(root: Path) -> None:
    """A sysfs-like RDMA tree (the real layout) for the agent's NIC collector."""
    for dev in ("mlx5_0", "mlx5_1"):
        port = root / dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (port / "state").write_text("4: ACTIVE\n")
        for name in ("port_xmit_wait", "port_xmit_data", "port_rcv_data", "symbol_error", "link_downed", "link_error_recovery"):
            (port / "counters" / name).write_text("12345\n")
        for name in ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets", "out_of_sequence", "packet_seq_err"):
            (port / "hw_counters" / name).write_text("678\n")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def measure_agent_cpu(bootstrap: str, topic_prefix: str, seconds: float, workdir: Path, warmup_s: float = 6.0) -> dict[str, Any]:
    """Run ``vigil agent`` at its default intervals in its own process; its CPU share of one core.

    CPU is sampled from /proc after ``warmup_s`` (imports, NVML probing) and
    again ``seconds`` later, so the figure is the steady state.
    """
    import subprocess

    nic = workdir / "infiniband"
    _make_nic_tree(nic)
    kmsg = workdir / "kern.log"
    kmsg.write_text("")
    log = workdir / "train.log"
    log.write_text("step 0\n")
    code = ("import typer, sys; from vigil.agent_cli import agent; app = typer.Typer(add_completion=False); "
            "app.command()(agent); app(sys.argv[1:])")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=bootstrap, VIGIL_TOPIC_PREFIX=topic_prefix, VIGIL_STATE_DIR=str(workdir / "state"))
    args = ["--node", "bench-node", "--nic-root", str(nic), "--kmsg", str(kmsg), "--disk", str(workdir),
            "--log-stale", f"{log}:60", "--duration", str(seconds + warmup_s + 30)]
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(warmup_s)  # the outer layer: a wall-clock measurement
        if p.poll() is not None:
            raise RuntimeError(f"the agent exited early: {p.stderr.read().decode()[-2000:] if p.stderr else ''}")
        tck = os.sysconf("SC_CLK_TCK")
        c0, t0 = _cpu_ticks(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _cpu_ticks(p.pid), time.monotonic()
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    cpu_s = (c1 - c0) / tck
    return {"cpu_pct": round(100.0 * cpu_s / (t1 - t0), 3), "cpu_s": cpu_s, "wall_s": round(t1 - t0, 2),
            "collectors": "heartbeat 5 s, kmsg 1 s, nic 10 s (2 ports), memory/disk/log watchdogs 60/60/30 s, "
                          "nvml 10 s + xid 1 s (unavailable here: no GPU), node batcher idle",
            "exit_code": p.returncode}


def hook_cost_per_step(n_steps: int = 20000, collectives_per_step: int = 3) -> dict[str, float]:
    """CPU cost of the hooks' hot path per step, measured in isolation (microseconds).

    One step context, ``collectives_per_step`` calls through the collective
    wrapper (around a no-op collective) and the amortized flush (records
    encoded to the datagram format, as the Unix-socket sink does); the
    encoding and socket send are included, the node batcher's work (in
    another process) is not.
    """
    import types

    from producers.training import TrainingMonitor
    from producers.training.wire import Sink, encode_datagram

    class EncodeOnly(Sink):
        def send(self, source, records, urgent=False):
            encode_datagram(source, records)

    fake = types.SimpleNamespace(all_reduce=lambda tensor, op=None, group=None, async_op=False: None,
                                 get_process_group_ranks=lambda g: [0], get_world_size=lambda: 1)

    class T:
        nbytes = 4096

    t = T()

    def plain() -> float:
        t0 = time.perf_counter()
        for _ in range(n_steps):
            for _ in range(collectives_per_step):
                fake.all_reduce(t, group=None)
        return time.perf_counter() - t0

    mon = TrainingMonitor(EncodeOnly(), job="bench", rank=0, dp=0, pp=0, tp=0)
    base = min(plain() for _ in range(3))
    mon.instrument_collectives(fake)
    try:
        def hooked() -> float:
            t0 = time.perf_counter()
            for i in range(n_steps):
                with mon.step(i):
                    for _ in range(collectives_per_step):
                        fake.all_reduce(t, group=None)
            mon.flush()
            return time.perf_counter() - t0

        with_hooks = min(hooked() for _ in range(3))
    finally:
        mon.uninstrument_collectives()
    return {"us_per_step": round(1e6 * (with_hooks - base) / n_steps, 2), "collectives_per_step": collectives_per_step}


def run(json_path: str | os.PathLike, *, steps: int = 600, block: int = 50, world: int = 4, hidden: int = 256,
        batch: int = 64, acf_steps: int = 150, agent_seconds: float = 20.0, bootstrap: str | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Run the whole benchmark; write JSON to ``json_path`` and return it."""
    from producers.publisher import Publisher
    from producers.training import NodeBatcher
    from streams.kafka import ensure_topics

    say = progress or (lambda what: None)
    broker = None
    if bootstrap is None:
        from vigil.broker import TansuBroker, find_tansu

        broker = TansuBroker(find_tansu(None)).start()
        bootstrap = broker.bootstrap
    prefix = f"bench-hooks-{os.getpid()}"
    conf = {"bootstrap.servers": bootstrap}
    ensure_topics(conf, prefix)
    result: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
            sock = str(Path(tmp) / "hooks.sock")
            publisher = Publisher(conf, prefix, spool_dir=Path(tmp) / "spool")
            tee = _Tee(publisher)
            batcher = NodeBatcher(sock, tee).start()
            say(f"training {world} ranks x {steps + acf_steps} steps (hooks alternating every {block} steps)")
            t0 = time.monotonic()
            wl = run_workload({
                "world": world, "grid": (world // 2, 2), "steps": steps + acf_steps, "hidden": hidden, "batch": batch,
                "hooks": "alternate", "block": block, "tail_on_from": steps, "socket": sock, "job": "bench-hooks",
            })
            wall = time.monotonic() - t0
            batcher.stop()
            publisher.flush(10)
            times = [t for t in wl["times"] if t[0] < steps]
            overhead, ratios = overhead_from_times(times, block, skip=block)
            off = [t for s, on, t in times if not on and s >= block]
            on = [t for s, on, t in times if on]
            tail_start = steps + 10
            acf = acf_error([c for c in tee.collectives if c.start.timestamp() >= _step_start(tee.iterations, tail_start)],
                            [i for i in tee.iterations if i.step >= tail_start])
            say("hook cost per step in isolation")
            cost = hook_cost_per_step()
            step_s = statistics.median([t for s_, o, t in times if not o and s_ >= block])
            say(f"agent at default intervals for {agent_seconds:.0f} s")
            agent = measure_agent_cpu(bootstrap, prefix, agent_seconds, Path(tmp))
            cost_pct = 100.0 * cost["us_per_step"] * 1e-6 / step_s
            result = {
                # The hot-path cost over the measured step time: a precise figure. The A/B figure
                # (``detail.ab_overhead_pct``) is the end-to-end check, and its spread is the noise.
                "overhead_pct": round(cost_pct, 3),
                "acf_rel_error": None if acf["rel_error"] is None else round(acf["rel_error"], 5),
                "agent_cpu_pct": agent.get("cpu_pct"),
                "detail": {
                    "world": world, "grid": [world // 2, 2], "steps": steps, "block": block,
                    "hook_cost_us_per_step": cost["us_per_step"],
                    "ab_overhead_pct": round(overhead, 3),
                    "ab_pair_spread_pct": round(statistics.pstdev(ratios), 3) if len(ratios) > 1 else None,
                    "step_ms_off_median": round(1000 * statistics.median(off), 3),
                    "step_ms_on_median": round(1000 * statistics.median(on), 3),
                    "pair_overheads_pct": [round(r, 3) for r in ratios],
                    "acf": acf, "agent": agent, "workload_wall_s": round(wall, 1),
                    "hook_events_published": batcher.published_events,
                    "hook_messages_published": batcher.published_messages,
                    "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                },
            }
    finally:
        if broker is not None:
            broker.stop()
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _step_start(iterations: list[Any], step: int) -> float:
    for it in iterations:
        if it.step == step:
            return it.start.timestamp()
    return 0.0
