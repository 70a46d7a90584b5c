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

The end-to-end A/B
    one training run alternates blocks of steps with and without the hooks
    (step context, collective instrumentation, the control channel, records
    to the node batcher, which publishes to a real broker). Every rank times
    every step three ways: wall time (``perf_counter``), the CPU time of its
    main thread (``thread_time``) plus that of the threads the hooks started
    (read from their own CPU clocks), and the CPU time of the whole process
    (``process_time``). :func:`ab_overhead` compares each hooks-on block
    with its hooks-off neighbours and gives the median over the on blocks
    with a seeded percentile-bootstrap 95% interval, and the spread of the
    estimates. It runs twice: on the default short step (``hidden`` 256,
    ``batch`` 64: ~15 ms, most of it waiting for the CPU) and on a longer,
    more realistic one (``real_hidden`` 512, ``real_batch`` 768: ~100-200 ms
    here; real steps last 100s of ms to seconds).

    Why CPU time: on a 2-core machine running four ranks, the broker, the
    batcher and whatever else shares it, the wall time of a step jitters by
    10-30% from block to block (on the long step too), far more than 1%,
    so the wall A/B (``detail.end_to_end.*.wall``) cannot resolve 1%. The
    CPU a rank spends on its own step hardly depends on who else competes
    for the cores. The hooks do all their work on the calling thread (step
    context, wrappers, encoding, a non-blocking ``sendto``; there is no
    flush thread) plus one background thread, the control channel's
    listener; so the primary CPU measure (``cpu_main``) counts exactly
    those. ``process_time`` (``cpu_process``) also counts gloo's worker and
    transport threads, whose CPU is the same work in both arms but varies
    with how the ranks interleave: it adds noise and no signal, and is
    reported beside it. The hooks' cost is then the extra CPU per step with
    the hooks on over the step's wall time (``vs_wall``: on a machine with a
    core per rank, work added to the step's thread lengthens the step by as
    much) and over its CPU time (``vs_cpu``).

    Blocks are short (20 steps of the short step, 6 of the long one) so
    that slow drifts of the machine's load cancel between neighbours, and
    many (40 and 25 pairs by default, ~2 min of training): on the 2-core
    test machine at a load average of 4-7 the ``cpu_main.vs_wall`` interval
    is about +-0.3-0.6 percentage point on the short step and +-0.2 on the
    long one, while the wall A/B's is +-4-6 points (pair spread 11-14%).
    The in-situ cost (``cpu_main_extra_us``: real tensors, cold caches, the
    control channel's poll, the socket send) is ~50-90 us per short step,
    several times the isolated figure below, and ~0.25-0.4 ms per long step:
    it grows with the step's duration, most likely from the control
    channel's listener waking every 0.2 s (~40 us of its own CPU per
    wake-up here, plus its hand-overs of the GIL to and from the step's
    thread; a run without the control channel measured about half as much).

``python -m vigil.bench.hooks`` exposes every size (``--steps``, ``--block``,
``--hidden``, ``--batch``, ``--real-steps``, ``--real-block``,
``--real-hidden``, ``--real-batch``, ``--acf-steps``, ``--seed``).

``overhead_pct`` (with ``overhead_ci95`` and ``overhead_target_met``)
    the end-to-end measure ``cpu_main.vs_wall`` of the *realistic* step
    (:func:`headline`): the hooks' extra CPU per step over the wall time of
    a hooks-off step of one rank, each rank pinned to its own core (one rank
    per usable core, :func:`default_world`; ``--no-pin`` to not pin), so the
    denominator is the step one rank takes on one core, not a step inflated
    by ranks queueing for a core. Always this figure, whatever its interval;
    the target (<= 1 %) is met only when the upper end of its 95 % interval
    is <= 1 %. The hooks run as deployed on a CPU backend: host-clock
    timing, ``mon.compute()`` marks around forward/backward/optimizer, the
    per-step compute/communication/wait split, the control channel and the
    hang watchdog. The machine's load average before and after, and the
    command, are in the JSON. Other processes on the machine still share
    the cores: the JSON's load averages say how much.
``detail.isolated``
    the CPU cost of the hooks' hot path per step (step context, the
    collective wrappers, the amortized encode-and-send of records), measured
    in isolation with ``perf_counter`` over 20k steps with warm caches: a
    lower bound of the in-situ cost (``cpu_main_extra_us``), for reference
    only (never reported as the overhead).
``acf_rel_error``
    over a final contiguous hooks-on segment of the short-step run
    (``acf_steps``: both figures are medians of step times that jitter by
    tens of percent here, so a few hundred steps), rank 0's collective calls (as
    published) give the iteration period by ACF and the iteration time by
    :func:`vigil.detectors.period.iteration_time_from_period`; compared with the
    median of the measured step times.
``agent_cpu_pct``
    the node agent (``vigil.producers.agent``) at its default intervals (heartbeats,
    NIC counters on a fixture tree, kmsg on a file, disk/memory/log watchdogs;
    no NVML here) runs for ``agent_seconds`` in its own process; its CPU time
    (user + system, from /proc) over wall time, in percent of one core.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vigil.bench.abtest import ab_overhead
from vigil.bench.command import reproducing_command
from vigil.bench.hooks_workload import WorkloadResult, _free_port, _Tee, flush_interval, run_workload  # noqa: F401 - re-exported

__all__ = ["WorkloadResult", "ab_overhead", "headline", "run", "run_workload"]


def acf_error(collectives: list[Any], iterations: list[Any]) -> dict[str, Any]:
    """ACF iteration time from collective calls vs the measured iteration time."""
    import numpy as np

    from vigil.detectors.period import _codes, acf_period, iteration_time_from_period

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
    code = ("import typer, sys; from vigil.cli.agent import agent; app = typer.Typer(add_completion=False); "
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

    from vigil.producers.training import TrainingMonitor
    from vigil.producers.training.wire import Sink, encode_datagram

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


def _thread_cpu(thread: threading.Thread | None) -> float:
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except OSError:
        return 0.0


def _ab_run(label: str, *, world: int, steps: int, block: int, hidden: int, batch: int, sock: str, batcher: Any,
            tmp: Path, seed: int, tail_steps: int = 0, say: Any, pin_cores: list[int] | None = None) -> tuple[dict[str, Any], Any]:
    """One alternating run; its A/B on wall and CPU time, the load around it, the batcher's CPU."""
    say(f"{label} step: {world} ranks x {steps + tail_steps} steps, hidden {hidden}, batch {batch} "
        f"(hooks alternating every {block} steps)")
    load0 = os.getloadavg()
    b0 = _thread_cpu(getattr(batcher, "_thread", None))
    t0 = time.monotonic()
    wl = run_workload({
        "world": world, "grid": (world // 2, 2), "steps": steps + tail_steps, "hidden": hidden, "batch": batch,
        "hooks": "alternate", "block": block, "tail_on_from": steps, "socket": sock, "job": f"bench-hooks-{label}",
        "control_dir": str(tmp / f"control-{label}"), "pin_cores": pin_cores,
    }, timeout_s=max(300.0, 2.0 * steps))
    wall = time.monotonic() - t0
    b1 = _thread_cpu(getattr(batcher, "_thread", None))
    load1 = os.getloadavg()
    ranks = [[r for r in rows if r[0] < steps] for rows in wl["ranks"]]
    ab = ab_overhead(ranks, block, seed=seed)
    ab.update({
        "hidden": hidden, "batch": batch, "steps": steps, "block": block, "workload_wall_s": round(wall, 1),
        "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in load1],
        # The node batcher (the agent's, in production: not on the ranks' threads) decodes and publishes
        # what the hooks send; its thread's CPU over the run (it also wakes every 50 ms when idle).
        "batcher_cpu_s": round(b1 - b0, 3), "batcher_cpu_pct_of_core": round(100.0 * (b1 - b0) / wall, 3),
        "hook_threads": "the control channel's listener and the hang watchdog (daemon threads per rank, started "
                        "with the hooks); the sink has none (sends on the step's thread)",
        "pinned": bool(pin_cores), "pin_cores": pin_cores,
    })
    return ab, wl


def headline(runs: dict[str, dict[str, Any]], target_pct: float = 1.0) -> dict[str, Any]:
    """The reported overhead: the realistic step's extra hook CPU over its wall time, with the interval.

    Taken from the ``realistic`` run when there is one, else the ``short``
    one; always the end-to-end measure (``cpu_main_vs_wall``: extra CPU of
    the rank's main thread and of the hooks' threads per step, over the
    hooks-off step's wall time), whatever its interval: never a figure
    measured in isolation. The target is met only when the upper end of the
    95 % interval is at most ``target_pct``.

    >>> r = headline({"realistic": {"cpu_main_vs_wall": {"median": 0.4, "ci": [0.1, 0.8]},
    ...                             "step_ms": {"wall_off": 150.0}}})
    >>> r["overhead_pct"], r["ci95"], r["target_met"]
    (0.4, [0.1, 0.8], True)
    >>> headline({"short": {"cpu_main_vs_wall": {"median": 0.4, "ci": [-2.0, 3.0]},
    ...                     "step_ms": {"wall_off": 15.0}}})["target_met"]
    False
    """
    label = "realistic" if "realistic" in runs else "short"
    ab = runs[label]
    m = ab["cpu_main_vs_wall"]
    return {"overhead_pct": m["median"], "ci95": list(m["ci"]), "target_pct": target_pct,
            "target_met": m["ci"][1] <= target_pct, "run": label,
            "measure": ("extra CPU time of the rank's main thread + the hooks' threads per step (hooks on vs the "
                        "neighbouring hooks-off blocks), over the hooks-off step's wall time; median over the "
                        "block pairs, percentile-bootstrap 95 % interval"),
            "denominator_ms": ab["step_ms"]["wall_off"],
            "denominator": ("median wall time of a hooks-off step of one rank" + (
                " pinned to its own core (one rank per core)" if ab.get("pinned") else " (ranks not pinned)"))}


def default_world() -> tuple[int, list[int] | None]:
    """Ranks and their cores: one rank per usable core (an even number, 2 to 4), pinned."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 2))
    world = max(2, min(4, len(cores)) // 2 * 2)
    return world, (cores[:world] if len(cores) >= world else None)


#: ``run`` arguments that ``vigil bench hooks`` takes, and its options.
CLI_OPTIONS = {"steps": "--steps", "block": "--block", "acf_steps": "--acf-steps", "world": "--world",
               "pin": "--pin/--no-pin", "real_steps": "--real-steps", "real_block": "--real-block",
               "real_hidden": "--real-hidden", "real_batch": "--real-batch", "seed": "--seed",
               "agent_seconds": "--agent-seconds"}


def run(json_path: str | os.PathLike, *, steps: int = 1600, block: int = 20, world: int | None = None,
        hidden: int = 256, batch: int = 64, acf_steps: int = 400, agent_seconds: float = 20.0, real_steps: int = 300,
        real_block: int = 6, real_hidden: int = 512, real_batch: int = 768, seed: int = 0, pin: bool = True,
        bootstrap: str | None = None, progress: Any = None) -> dict[str, Any]:
    """Run the whole benchmark; write JSON to ``json_path`` and return it.

    ``steps``/``block``/``hidden``/``batch``: the default (short) step's
    alternating run, followed by ``acf_steps`` hooks-on steps for the ACF
    check; ``real_*``: the same A/B on a longer ("realistic") step
    (``real_steps=0`` skips it; the headline then comes from the short
    step); ``seed``: the bootstrap's. ``world`` defaults to one rank per
    usable core, each pinned to its core (``pin``) when there are enough.
    The JSON's ``command`` reproduces the run: the ``vigil bench hooks`` line
    with every option spelled out, or the Python call when an argument that
    command does not take (``hidden``, ``batch``, ``bootstrap``) was changed.
    """
    command = reproducing_command(run, dict(locals()), "vigil bench hooks", CLI_OPTIONS)
    from vigil.producers.publisher import Publisher
    from vigil.producers.training import NodeBatcher
    from vigil.streams.kafka import ensure_topics

    say = progress or (lambda what: None)
    auto_world, auto_cores = default_world()
    if world is None:
        world = auto_world
    pin_cores = None
    if pin:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        pin_cores = cores[:world] if len(cores) >= world else None
    load_start = [round(x, 2) for x in os.getloadavg()]
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
        with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp_s:
            tmp = Path(tmp_s)
            sock = str(tmp / "hooks.sock")
            publisher = Publisher(conf, prefix, spool_dir=tmp / "spool")
            tee = _Tee(publisher)
            batcher = NodeBatcher(sock, tee).start()
            t_all = time.monotonic()
            short, wl = _ab_run("short", world=world, steps=steps, block=block, hidden=hidden, batch=batch, sock=sock,
                                batcher=batcher, tmp=tmp, seed=seed, tail_steps=acf_steps, say=say, pin_cores=pin_cores)
            tail_start = steps + 10
            acf = acf_error([c for c in tee.collectives if c.start.timestamp() >= _step_start(tee.iterations, tail_start)],
                            [i for i in tee.iterations if i.step >= tail_start])
            runs = {"short": short}
            if real_steps > 0:
                runs["realistic"], _ = _ab_run("realistic", world=world, steps=real_steps, block=real_block,
                                               hidden=real_hidden, batch=real_batch, sock=sock, batcher=batcher,
                                               tmp=tmp, seed=seed, say=say, pin_cores=pin_cores)
            ab_wall = time.monotonic() - t_all
            batcher.stop()
            publisher.flush(10)
            its = list(tee.iterations)
            say("hook cost per step in isolation")
            cost = hook_cost_per_step()
            times = wl["times"]
            off = [t for s_, o, t in times if not o and block <= s_ < steps]
            on = [t for s_, o, t in times if o and s_ < steps]
            step_s = statistics.median(off)
            head = headline(runs)
            say(f"agent at default intervals for {agent_seconds:.0f} s")
            agent = measure_agent_cpu(bootstrap, prefix, agent_seconds, Path(tmp))
            load_end = [round(x, 2) for x in os.getloadavg()]
            result = {
                "overhead_pct": head["overhead_pct"],
                "overhead_ci95": head["ci95"],
                "overhead_target_met": head["target_met"],
                "acf_rel_error": None if acf["rel_error"] is None else round(acf["rel_error"], 5),
                "agent_cpu_pct": agent.get("cpu_pct"),
                "command": command,
                "loadavg_before": load_start, "loadavg_after": load_end,
                "detail": {
                    "overhead": head,
                    "overhead_source": f"end-to-end: {head['run']} step, {head['measure']}",
                    "timing": "CPU path (gloo): host clock, compute from marked mon.compute() blocks, the "
                              "compute/communication/wait split per step; hang watchdog and control channel on",
                    "gpu": "no GPU here: the CUDA path's overhead is not measured",
                    "flush_interval_s": flush_interval({}),  # the monitor's deployed default
                    "world": world, "grid": [world // 2, 2], "pin_cores": pin_cores, "steps": steps, "block": block,
                    "end_to_end": runs,
                    # The hot path timed alone with warm caches: a lower bound of the in-situ cost, for
                    # reference only; never the reported figure.
                    "isolated": {"hook_cost_us_per_step": cost["us_per_step"],
                                 "pct_of_short_step": round(100.0 * cost["us_per_step"] * 1e-6 / step_s, 3),
                                 "step_ms_off_median": round(1000 * step_s, 3)},
                    "hook_cost_us_per_step": cost["us_per_step"],
                    "ab_overhead_pct": short["wall"]["median"],
                    "ab_pair_spread_pct": short["wall"]["spread"],
                    "step_ms_off_median": round(1000 * step_s, 3),
                    "step_ms_on_median": round(1000 * statistics.median(on), 3),
                    "measured_as": sorted({f"{k}={v}" for e in its for k, v in e.measured.items()}),
                    "acf": acf, "agent": agent, "ab_wall_s": round(ab_wall, 1),
                    "hook_events_published": batcher.published_events,
                    "hook_messages_published": batcher.published_messages,
                    "loadavg_end": load_end,
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


def main(argv: list[str] | None = None) -> None:
    """``python -m vigil.bench.hooks``: the benchmark with every size exposed."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vigil.bench.hooks", description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="bench/results/hooks.json")
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--acf-steps", type=int, default=400)
    ap.add_argument("--real-steps", type=int, default=300, help="0 skips the realistic step")
    ap.add_argument("--real-block", type=int, default=6)
    ap.add_argument("--real-hidden", type=int, default=512)
    ap.add_argument("--real-batch", type=int, default=768)
    ap.add_argument("--world", type=int, default=None, help="default: one rank per usable core, 2 to 4")
    ap.add_argument("--no-pin", action="store_true", help="do not pin each rank to its own core")
    ap.add_argument("--agent-seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    result = run(a.json, steps=a.steps, block=a.block, world=a.world, hidden=a.hidden, batch=a.batch,
                 acf_steps=a.acf_steps, agent_seconds=a.agent_seconds, real_steps=a.real_steps,
                 real_block=a.real_block, real_hidden=a.real_hidden, real_batch=a.real_batch, seed=a.seed,
                 pin=not a.no_pin, bootstrap=os.environ.get("VIGIL_KAFKA_BOOTSTRAP") or None,
                 progress=lambda what: print(what, file=sys.stderr, flush=True))
    print(json.dumps({k: result[k] for k in ("overhead_pct", "overhead_ci95", "overhead_target_met", "acf_rel_error",
                                            "agent_cpu_pct")}))


if __name__ == "__main__":
    main()
