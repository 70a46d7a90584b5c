"""The load runs' processes: cores, the workers (``vigil worker`` with its stats file), CPU, RSS, lag, producers.

**Where the cores go.** On a machine with 2 cores or more the generator (the
benchmark's process) and the broker (every thread of it) are pinned to core 0
and the workers to the other cores (``os.sched_setaffinity`` on each thread; a
worker's affinity is set before it starts, so its librdkafka threads share its
core). The CPU time each used is read from ``/proc`` and reported, so the
generator's own cost is known and kept off the workers' core.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from vigil.broker import die_with_parent
from vigil.streams.config import StreamConfig

__all__ = ["Watch", "fleet_producer", "lag_between", "lag_hist_between", "lag_quantiles", "pin", "produce",
           "read_stats", "spawn_workers", "split_cores", "stop_all", "worker_main"]


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def split_cores() -> tuple[set[int], list[set[int]]]:
    """(the generator's and broker's core, each worker's core set)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), [set(cpus)]
    return {cpus[0]}, [{c} for c in cpus[1:]]


def spawn_workers(config: StreamConfig, n: int, workdir: Path, cores: list[set[int]]) -> tuple[
        list[subprocess.Popen], list[Path], list[Path]]:
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_GROUP_ID=config.group_id, VIGIL_STATE_DIR=str(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    procs, ready, stats = [], [], []
    for i in range(n):
        r, s = workdir / f"ready-{i}", workdir / f"stats-{i}.json"
        ready.append(r)
        stats.append(s)
        cpus = cores[i % len(cores)]

        def start(cpus: set[int] = cpus) -> None:
            die_with_parent()
            os.sched_setaffinity(0, cpus)  # before exec: every thread the worker starts inherits it

        with open(workdir / f"worker-{i}.log", "ab") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "vigil.bench.pipeline", "worker", "--ready-file", str(r), "--stats-file",
                 str(s)], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=start))
    return procs, ready, stats


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def read_stats(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def lag_between(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """p50/p99/max consumer lag (s) of the messages processed between two stats snapshots."""
    return lag_quantiles(lag_hist_between(before, after))


def lag_hist_between(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[int, int]:
    """The messages processed between two stats snapshots, counted by their lag in ms."""
    a = {int(k): v for k, v in ((after or {}).get("lag_ms") or {}).items()}
    b = {int(k): v for k, v in ((before or {}).get("lag_ms") or {}).items()}
    return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0) > 0}


def lag_quantiles(lag_ms: dict[int, int]) -> dict[str, Any]:
    """p50/p99/max (s) and the count of a lag histogram (ms -> messages; keys may be strings, as in JSON)."""
    hist = sorted((int(k), v) for k, v in lag_ms.items() if v > 0)
    total = sum(v for _, v in hist)
    if not total:
        return {"p50_s": None, "p99_s": None, "max_s": None, "messages": 0}

    def q(frac: float) -> float:
        need, run_ = math.ceil(frac * total), 0
        for k, v in hist:
            run_ += v
            if run_ >= need:
                return k / 1000.0
        return hist[-1][0] / 1000.0

    return {"p50_s": q(0.5), "p99_s": q(0.99), "max_s": hist[-1][0] / 1000.0, "messages": total}


class Watch:
    """CPU seconds and RSS of the processes of one run, sampled every second."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.rss_max: dict[str, float] = {k: 0.0 for k in pids}
        self.rss_last: dict[str, float] = {k: 0.0 for k in pids}
        self.cpu0: dict[str, float] = {}
        self.t0 = 0.0

    def sample(self) -> None:
        for name, pid in self.pids.items():
            try:
                rss = proc_rss_mb(pid)
            except OSError:
                continue
            self.rss_last[name] = rss
            self.rss_max[name] = max(self.rss_max[name], rss)

    def begin(self) -> None:
        self.t0 = time.time()
        self.cpu0 = {k: proc_cpu_s(p) for k, p in self.pids.items()}

    def cpu_share(self) -> dict[str, float]:
        """Cores used by each since :meth:`begin` (1.0 = one core busy)."""
        dt = max(1e-9, time.time() - self.t0)
        out = {}
        for k, p in self.pids.items():
            try:
                out[k] = round((proc_cpu_s(p) - self.cpu0[k]) / dt, 3)
            except OSError:
                pass
        return out


def fleet_producer(bootstrap: str, linger_ms: int = 100) -> Producer:
    """The telemetry of the whole fleet as one producer: batched (``linger_ms``) and lz4-compressed.

    tansu (the embedded broker) keeps each partition's log in memory and its
    fetch cost grows with the batches stored: at 10,000 GPUs with 5 ms batches
    it used 0.09 core at first and 0.94 after 60 s; at 25,000 GPUs with 25 ms
    batches 0.36 after 20 s and 0.64 after 110 s, still growing; with 100 ms
    batches 0.33-0.39 over 150 s. A real agent sends its own messages; batching them here
    spares the broker that shares the generator's core. It delays telemetry
    by up to ``linger_ms`` and makes it arrive in bursts, which can only make
    the figures worse (node losses and hangs are judged on arrival, and a
    fault's event waits behind a burst). Fault events and job states go
    through an unbatched producer (``linger_ms=0``).
    """
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "compression.type": "lz4",
                     "acks": "all", "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000,
                     "queue.buffering.max.kbytes": 2_097_151, "batch.num.messages": 100_000,
                     "batch.size": 16_000_000, "log_level": 3})


def produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key=key)
            return
        except BufferError:
            producer.poll(0.01)


def worker_main(ready_file: Path, stats_file: Path) -> None:
    """The benchmark's worker: ``vigil worker`` with its stats (and its garbage collector's pauses) written
    to ``stats_file`` every second."""
    import logging

    from vigil.settings import Settings
    from vigil.stack import resolve_bootstrap, stream_config
    from vigil.streams.worker import Worker, WorkerStats

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    config = stream_config(settings, resolve_bootstrap(settings))
    stats = WorkerStats()
    pauses = {"collections": 0, "total_s": 0.0, "max_s": 0.0}
    began = [0.0]

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            d = time.perf_counter() - began[0]
            pauses["collections"] += 1
            pauses["total_s"] += d
            pauses["max_s"] = max(pauses["max_s"], d)

    gc.callbacks.append(on_gc)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def dump() -> None:
        snap = stats.snapshot()
        snap["gc"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in pauses.items()}
        snap["pid"] = os.getpid()
        snap["written_at"] = time.time()
        lag = stats.last_lag_ms
        snap["last_lag_s"] = None if lag is None else lag / 1000.0
        tmp = stats_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(snap))
        tmp.replace(stats_file)

    def dumper() -> None:
        while not stop.wait(1.0):
            dump()

    threading.Thread(target=dumper, name="vigil-bench-stats", daemon=True).start()
    Worker(config, ready_file=ready_file, stats=stats).run(stop)
    dump()

