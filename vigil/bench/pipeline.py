"""``vigil bench pipeline``: alert latency while a worker carries a large cluster's telemetry; capacity; throughput.

**Latency under load** (:func:`live`). A fresh tansu broker, ``W`` detection
workers (``vigil worker``'s code, with :class:`~vigil.streams.worker.WorkerStats`)
and the load generator (:class:`~vigil.sim.load.LoadGenerator`: a ``N``-GPU
cluster's node samples, job steps and states at their real rates, faults of every
kind at random times into random jobs and nodes). For each fault, the delay from
its injection to the first alert naming its root cause arriving on the alert topic
(read here with no consumer group); the worker's consumer lag (how long after a
message was produced the worker began to process it, every message counted) and
its RSS. Fail-slow delays are also given in iterations of the slowed job from the
onset (the start of its first slowed step); hang delays also as the excess over
``k x D_iter`` (k = 3).

**Where the cores go.** On a machine with 2 cores or more the generator (this
process) and the broker (every thread of it) are pinned to core 0 and the workers
to the other cores (``os.sched_setaffinity`` on each thread; a worker's
affinity is set before it starts, so its librdkafka threads share its core). The
CPU time each used is read from ``/proc`` and reported, so the generator's own cost
is known and kept off the workers' core.

**Capacity** (:func:`run` with several ``N``): the same at increasing ``N`` until
a target breaks; the largest ``N`` holding every target; from the worker's measured
CPU per record and RSS per GPU, a projection of workers and memory for 100k and 1M
GPUs.

**Throughput on a backlog** (:func:`throughput`): the generator writes ``seconds``
of a cluster's telemetry to the broker first (events stamped in the recent past),
then ``W`` workers start in one new group; records/s = records processed / the
time from the first to the last message processed, which must be at least 30 s.

Targets (p99; :data:`TARGETS`): exception <= 0.2 s, process exit <= 0.5 s,
xid <= 0.5 s, node lost <= 3 s, hang <= 3 x D_iter + 1 s, fail-slow <= 5
iterations after onset, with no fault missed; RSS <= 1 GiB; a p99 needs 100
samples (below, ``p99`` is null and ``max`` is given).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Producer

from vigil.bench.command import reproducing_command
from vigil.bench.machine import machine_info, measured
from vigil.broker import TansuBroker, die_with_parent, find_tansu
from vigil.schemas import Alert, decode, topic_name
from vigil.sim.load import KINDS, Injection, LoadGenerator
from vigil.stack import wait_for_file
from vigil.streams.config import StreamConfig
from vigil.streams.kafka import ensure_topics, reader

__all__ = ["TARGETS", "live", "match", "merge", "percentile", "project", "quantile_ci", "run", "summarize", "throughput"]

#: p99 targets in seconds (hang: excess over k x D_iter; fail-slow: iterations after onset).
TARGETS: dict[str, float] = {"exception": 0.2, "process_exit": 0.5, "xid": 0.5, "node_lost": 3.0, "hang": 1.0,
                             "fail_slow": 5.0}
#: The hang detector's multiple of the mean iteration time.
HANG_K = 3.0
RSS_TARGET_MB = 1024.0
MIN_P99_SAMPLES = 100
#: Alert kinds that name each fault's root cause.
_GPU_CAUSES = ("throttle", "clock_below_peers", "temperature_outlier")
_ALERT_KINDS: dict[str, tuple[str, ...]] = {"exception": ("cuda_error",), "process_exit": ("process_exit",),
                                            "xid": ("xid",), "node_lost": ("node_lost",), "hang": ("task_hang",),
                                            "fail_slow": (*_GPU_CAUSES, "fail_slow", "straggler")}
#: Event types a worker reads on its feedback reader, not through the detect stage (not in its record count).
_FEEDBACK_TYPES = frozenset({"job_state", "node_state"})
#: A worker whose newest message is this late is overloaded: the point is stopped.
OVERLOADED_LAG_S = 60.0


# -- scoring (pure) ---------------------------------------------------------------------------------------
def names_cause(inj: Injection, alert: Alert) -> bool:
    """Does ``alert`` name ``inj``'s root cause (its kind and subject)?"""
    if alert.status == "resolved" or alert.kind not in _ALERT_KINDS[inj.kind]:
        return False
    subject = alert.subject
    if inj.kind in ("exception", "process_exit", "hang"):
        return subject.job == inj.job
    if inj.kind in ("xid", "node_lost"):
        return subject.node == inj.fault.target
    # fail-slow: the slowed GPU, or the job's slowdown
    if alert.kind in _GPU_CAUSES:
        return subject.node == inj.fault.target and subject.gpu == inj.fault.gpu
    return subject.job == inj.job


def _job_fail_slow(inj: Injection, alert: Alert) -> bool:
    """The job-level change-point detection of a fail-slow: its own alert, or evidence in its cause's."""
    if alert.status == "resolved":
        return False
    if alert.kind == "fail_slow" and alert.subject.job == inj.job:
        return True
    return any(e.get("kind") == "fail_slow" and (e.get("subject") or {}).get("job") == inj.job for e in alert.evidence)


def match(injections: list[Injection], alerts: list[tuple[Alert, float]], margin_s: float = 30.0) -> dict[str, Any]:
    """Each fault's first alert naming its cause, and the incidents no fault explains.

    ``alerts`` are ``(alert, arrival time)`` in arrival order. An incident
    answers one fault: a later fault of the same job or node is not credited
    with an update of an earlier fault's incident. A fault's ``incidents`` are
    the distinct incidents naming its cause from its injection until
    ``margin_s`` after it ended (1 when alerted once).
    """
    claimed: dict[Any, int] = {}
    out: list[dict[str, Any]] = []
    for idx, inj in sorted(enumerate(injections), key=lambda p: p[1].injected_at):
        t0 = inj.injected_at
        until = (inj.ended_at if inj.ended_at is not None else t0) + margin_s
        hits = [(a, at) for a, at in alerts if at >= t0 and at <= until and names_cause(inj, a)
                and claimed.get(a.incident_id, idx) == idx]
        row: dict[str, Any] = {"kind": inj.kind, "target": inj.fault.target, "job": inj.job, "injected_at": t0,
                               "d_iter": inj.iteration_s, "delay_s": None,
                               "incidents": len({a.incident_id for a, _ in hits})}
        if hits:
            first, at = hits[0]
            for a, _ in hits:
                claimed.setdefault(a.incident_id, idx)
            row.update(delay_s=at - t0, alert_kind=first.kind, incident=str(first.incident_id))
            if inj.kind == "hang" and inj.iteration_s:
                row["excess_s"] = at - t0 - HANG_K * inj.iteration_s
        if inj.kind == "fail_slow" and inj.fault.onset_at is not None and inj.slowed_iteration_s:
            onset, per = inj.fault.onset_at, inj.slowed_iteration_s
            if hits:
                row["iterations"] = (hits[0][1] - onset) / per
            job_hit = next((at for a, at in alerts if t0 <= at <= until and _job_fail_slow(inj, a)), None)
            row["job_iterations"] = None if job_hit is None else (job_hit - onset) / per
        out.append(row)
    explained = set(claimed)
    unexplained: dict[str, int] = {}
    seen: set[Any] = set()
    for a, _ in alerts:
        if a.incident_id in explained or a.incident_id in seen:
            continue
        seen.add(a.incident_id)
        unexplained[a.kind] = unexplained.get(a.kind, 0) + 1
    return {"faults": out, "unexplained_incidents": unexplained}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``math.inf`` counts as a value: a missed fault)."""
    if not values:
        return None
    ordered = sorted(values)
    v = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
    return None if math.isinf(v) else round(v, 4)


def quantile_ci(values: list[float], q: float, level: float = 0.95) -> list[float | None] | None:
    """A distribution-free interval for the ``q`` quantile: order statistics ``x(l) .. x(u)`` with
    ``P(l <= B < u) >= level``, ``B ~ Binomial(n, q)``, as near symmetric as the ranks allow.

    An end the sample cannot bound (too few values beyond the quantile) is None; a missed fault
    (``math.inf``) as an end is None too. None when there are no values.
    """
    n = len(values)
    if n == 0:
        return None
    ordered = sorted(values)
    cdf, acc = [], 0.0  # cdf[k] = P(B <= k)
    for k in range(n + 1):
        acc += math.comb(n, k) * q ** k * (1 - q) ** (n - k)
        cdf.append(acc)
    tail = (1 - level) / 2
    # lower rank l (1-based): the largest with P(B < l) <= tail; upper u: the smallest with P(B < u) >= 1 - tail
    lo = max((k for k in range(1, n + 1) if cdf[k - 1] <= tail), default=None)
    hi = min((k for k in range(1, n + 1) if cdf[k - 1] >= 1 - tail), default=None)

    def at(rank: int | None) -> float | None:
        if rank is None or math.isinf(ordered[rank - 1]):
            return None
        return round(ordered[rank - 1], 4)

    return [at(lo), at(hi)]


def _dist(values: list[float], n: int, missed: int) -> dict[str, Any]:
    """p50, p99 (only from >= 100 samples, else the max of n), n, missed; 95 % intervals of p50 and p99
    (:func:`quantile_ci`; an end the sample cannot bound is null)."""
    allv = values + [math.inf] * missed
    out: dict[str, Any] = {"p50": percentile(allv, 0.5), "p99": percentile(allv, 0.99) if n >= MIN_P99_SAMPLES else None,
                           "n": n, "missed": missed}
    if allv:
        out["p50_ci95"] = quantile_ci(allv, 0.5)
    if n >= MIN_P99_SAMPLES:
        out["p99_ci95"] = quantile_ci(allv, 0.99)
    if n < MIN_P99_SAMPLES:
        out["max"] = None if missed else (round(max(values), 4) if values else None)
    return out


def summarize(matched: dict[str, Any]) -> dict[str, Any]:
    """Per kind: the delay distribution; hang's excess over k x D_iter; fail-slow in iterations."""
    rows = matched["faults"]
    latency: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        delays = [r["delay_s"] for r in mine if r["delay_s"] is not None]
        missed = len(mine) - len(delays)
        entry = _dist(delays, len(mine), missed)
        entry["alerted_more_than_once"] = sum(1 for r in mine if r["incidents"] > 1)
        if kind == "hang":
            excess = _dist([r["excess_s"] for r in mine if "excess_s" in r], len(mine), missed)
            entry["excess_over_k_d_iter"] = {k: excess[k] for k in ("p50", "p99", "max") if k in excess}
            entry["d_iter_s"] = {"min": round(min(r_d for r_d in _d_iters(mine)), 3),
                                 "max": round(max(r_d for r_d in _d_iters(mine)), 3)} if _d_iters(mine) else None
        if kind == "fail_slow":
            its = [r["iterations"] for r in mine if r.get("iterations") is not None]
            entry["iterations"] = _dist(its, len(mine), len(mine) - len(its))
            job_its = [r["job_iterations"] for r in mine if r.get("job_iterations") is not None]
            entry["job_change_point_iterations"] = _dist(job_its, len(mine), len(mine) - len(job_its))
        latency[kind] = entry
    return latency


def _d_iters(rows: list[dict[str, Any]]) -> list[float]:
    return [r["d_iter"] for r in rows if r.get("d_iter")]


def targets_met(latency: dict[str, Any], rss_mb: float | None) -> dict[str, bool]:
    """Each target: met only with >= 100 faults, none missed, and the p99 within it."""
    def ok(entry: dict[str, Any] | None, value: float | None, target: float) -> bool:
        return entry is not None and entry["n"] >= MIN_P99_SAMPLES and entry["missed"] == 0 and value is not None \
            and value <= target
    met = {}
    for kind, target in TARGETS.items():
        e = latency.get(kind)
        if kind == "hang":
            value = (e or {}).get("excess_over_k_d_iter", {}).get("p99")
        elif kind == "fail_slow":
            value = (e or {}).get("iterations", {}).get("p99")
        else:
            value = (e or {}).get("p99")
        met[kind] = ok(e, value, target)
    met["rss"] = rss_mb is not None and rss_mb <= RSS_TARGET_MB
    return met


# -- processes and cores ----------------------------------------------------------------------------------
def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def _cores() -> tuple[set[int], list[set[int]]]:
    """(the generator's and broker's core, each worker's core set)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), [set(cpus)]
    return {cpus[0]}, [{c} for c in cpus[1:]]


def _spawn_workers(config: StreamConfig, n: int, workdir: Path, cores: list[set[int]]) -> tuple[
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


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _read_stats(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _lag_between(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """p50/p99/max consumer lag (s) of the messages processed between two stats snapshots."""
    a = {int(k): v for k, v in ((after or {}).get("lag_ms") or {}).items()}
    b = {int(k): v for k, v in ((before or {}).get("lag_ms") or {}).items()}
    hist = sorted((k, v - b.get(k, 0)) for k, v in a.items() if v - b.get(k, 0) > 0)
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


class _Watch:
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
                rss = _rss_mb(pid)
            except OSError:
                continue
            self.rss_last[name] = rss
            self.rss_max[name] = max(self.rss_max[name], rss)

    def begin(self) -> None:
        self.t0 = time.time()
        self.cpu0 = {k: _cpu_s(p) for k, p in self.pids.items()}

    def cpu_share(self) -> dict[str, float]:
        """Cores used by each since :meth:`begin` (1.0 = one core busy)."""
        dt = max(1e-9, time.time() - self.t0)
        out = {}
        for k, p in self.pids.items():
            try:
                out[k] = round((_cpu_s(p) - self.cpu0[k]) / dt, 3)
            except OSError:
                pass
        return out


# -- one live point -----------------------------------------------------------------------------------------
def _producer(bootstrap: str, linger_ms: int = 100) -> Producer:
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


def _produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key=key)
            return
        except BufferError:
            producer.poll(0.01)


def live(gpus: int, workers: int = 1, faults_per_kind: int = 100, seed: int = 0, warmup_s: float = 30.0,
         node_loss_gap_s: float = 6.5, workdir: Path | None = None, progress: Callable[[str], Any] | None = None,
         kinds: tuple[str, ...] = tuple(KINDS), max_s: float = 3600.0, pin_cores: bool = True,
         keep_alerts: bool = False, load_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One capacity point: ``workers`` workers carrying a ``gpus``-GPU cluster with faults (module docstring).

    ``load_options`` go to :class:`~vigil.sim.load.LoadGenerator` (a test's faster steps, say).
    """
    say = progress or (lambda _m: None)
    own_tmp = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="vigil-load-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    gen_core, worker_cores = _cores()
    saved_affinity = os.sched_getaffinity(0)
    point: dict[str, Any] = {"gpus_per_worker": gpus // workers, "gpus": gpus, "workers": workers}
    broker = TansuBroker(find_tansu(None), log_path=workdir / "tansu.log").start()
    procs: list[subprocess.Popen] = []
    try:
        with measured(point.setdefault("machine", {})):
            if pin_cores:
                os.sched_setaffinity(0, gen_core)
                pin(broker.proc.pid, gen_core)  # type: ignore[union-attr]
            tag = uuid.uuid4().hex[:8]
            config = StreamConfig(bootstrap=broker.bootstrap, topic_prefix=f"load-{tag}", group_id=f"load-{tag}")
            ensure_topics(config.kafka_conf(), config.topic_prefix)
            procs, ready, stats_paths = _spawn_workers(config, workers, workdir / "workers",
                                                       worker_cores if pin_cores else [saved_affinity])
            for r, p in zip(ready, procs):
                if not wait_for_file(r, 120, alive=lambda p=p: p.poll() is None):
                    raise RuntimeError(f"a worker did not start; see {workdir}")
            watch = _Watch({**{f"worker-{i}": p.pid for i, p in enumerate(procs)}, "broker": broker.proc.pid,  # type: ignore[union-attr]
                            "generator": os.getpid()})
            producer = _producer(broker.bootstrap)
            urgent = _producer(broker.bootstrap, linger_ms=0)  # faults and states: sent at once
            telemetry = ("node_samples", "iteration_step")
            topics = {t: topic_name(t, config.topic_prefix) for t in
                      ("node_samples", "iteration_step", "job_state", "node_state", "training_exception",
                       "process_exit", "xid")}
            alerts_in = reader(config.kafka_conf(), [config.topic("alert")])
            start = time.time()
            gen = LoadGenerator(gpus, start, seed=seed, faults_per_kind=faults_per_kind, faults_from=warmup_s,
                                node_loss_gap_s=node_loss_gap_s, kinds=kinds, **(load_options or {}))
            point["cluster"] = {"nodes": len(gen.nodes), "jobs": len(gen.jobs),
                                "largest_job_gpus": max(j.spec.world_size for j in gen.jobs.values()),
                                "records_per_s_planned": round(gen.records_per_s()),
                                "messages_per_s_planned": round(gen.messages_per_s())}
            say(f"{gpus:,} GPUs: {len(gen.nodes):,} nodes, {len(gen.jobs)} jobs, "
                f"{gen.records_per_s():,.0f} records/s; {faults_per_kind} faults per kind")
            alerts: list[tuple[Alert, float]] = []
            late: list[float] = []  # how late the generator sent what was due (its own health)
            late_by_s: dict[int, float] = {}
            timeline: list[dict[str, Any]] = []
            stats_at_start: list[dict[str, Any] | None] = []
            records_at_start = 0
            measuring = False
            planned = faults_per_kind * len(kinds)
            next_sample = start
            stopped_early = None
            end_at = None
            while True:
                now = time.time()
                due = gen.next_due
                for m in gen.advance(now, now=now):
                    _produce(producer if m.event_type in telemetry else urgent, topics[m.event_type], m.key, m.value)
                if due is not None and due <= now and end_at is None:
                    late.append(now - due)
                    sec = int(now - start)
                    late_by_s[sec] = max(late_by_s.get(sec, 0.0), now - due)
                producer.poll(0)
                urgent.poll(0)
                for msg in alerts_in.consume(200, timeout=0):
                    if msg.error() is None and msg.value() is not None:
                        arrived = time.time()
                        alerts.extend((a, arrived) for a in decode(msg.value()).events if isinstance(a, Alert))
                if now >= next_sample:
                    next_sample = now + 1.0
                    watch.sample()
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"a worker died; see {workdir}")
                    if not measuring and now - start >= warmup_s:
                        measuring = True
                        watch.begin()
                        stats_at_start = [_read_stats(s) for s in stats_paths]
                        records_at_start = gen.records
                    newest = [_read_stats(s) for s in stats_paths]
                    if int(now - start) % 5 == 0:
                        timeline.append({"t": round(now - start), "generated": gen.records, "alerts": len(alerts),
                                         "workers": [{k: (s or {}).get(k) for k in ("records", "busy_s", "ticks_s",
                                                                                   "last_lag_s")} for s in newest]})
                    if measuring:
                        lags = [s.get("last_lag_s") for s in newest if s]
                        if lags and max(x or 0.0 for x in lags) > OVERLOADED_LAG_S:
                            stopped_early = f"a worker read {max(lags):.0f} s behind (overloaded)"
                    done = planned > 0 and len(gen.injections) >= planned and all(
                        i.ended_at is not None and i.ended_at + 15.0 < now for i in gen.injections)
                    if (done or stopped_early or now - start > max_s) and end_at is None:
                        end_at = now
                        say(f"{gpus:,} GPUs: load stopped after {now - start:.0f} s; reading the last alerts")
                        cpu = watch.cpu_share()
                        stats_at_end = [_read_stats(s) for s in stats_paths]
                        records = gen.records - records_at_start
                        for m in gen.finish(now):
                            _produce(urgent, topics[m.event_type], m.key, m.value)
                    if end_at is not None and now - end_at > 5.0:
                        break
                    if len(gen.injections) and int(now - start) % 30 == 0:
                        say(f"{gpus:,} GPUs: {now - start:.0f} s, {len(gen.injections)}/{planned} faults, "
                            f"{len(alerts)} alerts")
                # at least 2 ms: a loop per due message would spin a core at thousands of messages a second
                wait = 0.005 if gen.next_due is None else min(0.005, max(0.002, gen.next_due - time.time()))
                if wait > 0:
                    msgs = alerts_in.consume(200, timeout=wait)
                    arrived = time.time()
                    for msg in msgs:
                        if msg.error() is None and msg.value() is not None:
                            alerts.extend((a, arrived) for a in decode(msg.value()).events if isinstance(a, Alert))
            producer.flush(30)
            urgent.flush(30)
            alerts_in.close()
            elapsed = end_at - (watch.t0 or start)  # type: ignore[operator]
            final = [_read_stats(s) for s in stats_paths]
    finally:
        _stop(procs)
        broker.stop()
        os.sched_setaffinity(0, saved_affinity)
    matched = match(gen.injections, alerts)
    latency = summarize(matched)
    lag = [_lag_between(b, a) for b, a in zip(stats_at_start, stats_at_end)]
    worker_cpu = sum(v for k, v in cpu.items() if k.startswith("worker"))
    processed = sum((a or {}).get("records", 0) - (b or {}).get("records", 0)
                    for b, a in zip(stats_at_start, stats_at_end))
    rss = [watch.rss_max[f"worker-{i}"] for i in range(workers)]
    point.update({
        "records_per_s": round(records / elapsed) if elapsed > 0 else None,
        "measured_s": round(elapsed, 1),
        "latency": latency,
        "lag_p99_s": max((x["p99_s"] for x in lag if x["p99_s"] is not None), default=None),
        "lag_max_s": max((x["max_s"] for x in lag if x["max_s"] is not None), default=None),
        "lag": lag,
        "rss_mb": round(max(rss), 1) if rss else None,
        "rss_mb_per_worker": [round(x, 1) for x in rss],
        "cpu_cores": cpu,
        "worker_cpu_us_per_record": round(1e6 * worker_cpu * elapsed / processed, 2) if processed else None,
        "worker_busy_share": [round(((a or {}).get("busy_s", 0) - (b or {}).get("busy_s", 0)) / elapsed, 3)
                              for b, a in zip(stats_at_start, stats_at_end)],
        "gc": [(s or {}).get("gc") for s in final],
        "generator_late_s": {"p99": percentile(late, 0.99), "max": round(max(late), 4) if late else None,
                             "worst_seconds": sorted(((round(v, 3), k) for k, v in late_by_s.items()), reverse=True)[:5]},
        "broker_rss_mb": round(watch.rss_max["broker"], 1),
        "unexplained_incidents": matched["unexplained_incidents"],
        "timeline": timeline,
        "faults_injected": {k: sum(1 for i in gen.injections if i.kind == k) for k in KINDS},
    })
    if stopped_early:
        point["stopped_early"] = stopped_early
    met = targets_met(latency, point["rss_mb"])
    point["targets"] = met
    point["targets_met"] = all(met.values()) and not stopped_early
    point["faults"] = matched["faults"]
    if keep_alerts:
        point["alerts"] = [{"at": round(at - start, 3), "kind": a.kind, "status": a.status, "severity": a.severity,
                            "subject": a.subject.model_dump(exclude_none=True), "incident": str(a.incident_id),
                            "version": a.incident_version, "summary": a.summary[:200]} for a, at in alerts]
    if own_tmp:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return point


# -- throughput on a backlog ----------------------------------------------------------------------------------
def throughput(workers: int, gpus: int = 25_000, seconds: float = 120.0, seed: int = 1, workdir: Path | None = None,
               progress: Callable[[str], Any] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Records/s of ``workers`` workers draining ``seconds`` of a ``gpus``-GPU cluster's telemetry."""
    say = progress or (lambda _m: None)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-tp-")) if workdir is None else workdir
    gen_core, worker_cores = _cores()
    # one worker on a core of its own; more: one per core (the broker is not pinned: nothing else runs)
    cores = worker_cores if workers == 1 else [gen_core] + worker_cores
    out: dict[str, Any] = {"workers": workers, "gpus": gpus, "cluster_seconds": seconds}
    broker = TansuBroker(find_tansu(None), log_path=workdir / "tansu.log").start()
    procs: list[subprocess.Popen] = []
    try:
        with measured(out.setdefault("machine", {})):
            tag = uuid.uuid4().hex[:8]
            config = StreamConfig(bootstrap=broker.bootstrap, topic_prefix=f"tp-{tag}", group_id=f"tp-{tag}")
            ensure_topics(config.kafka_conf(), config.topic_prefix)
            now = time.time()
            gen = LoadGenerator(gpus, now - seconds, seed=seed)
            say(f"throughput: writing {seconds:.0f} s of a {gpus:,}-GPU cluster ({gen.records_per_s() * seconds:,.0f} "
                f"records)")
            producer = _producer(broker.bootstrap)
            t = now - seconds
            records = 0  # those the detect stage reads (job and node states go to every worker's feedback reader)
            while t < now:
                t = min(now, t + 1.0)
                for m in gen.advance(t):
                    _produce(producer, topic_name(m.event_type, config.topic_prefix), m.key, m.value)
                    if m.event_type not in _FEEDBACK_TYPES:
                        records += m.records
                producer.poll(0)
            producer.flush(120)
            messages = gen.messages
            out.update(records=records, messages=messages, written_in_s=round(time.time() - now, 1))
            say(f"throughput: {records:,} records written; {workers} worker(s) draining")
            procs, ready, stats_paths = _spawn_workers(config, workers, workdir / f"w{workers}", cores)
            t0 = time.time()
            final: list[dict[str, Any] | None] = []
            while time.time() - t0 < timeout_s:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker died; see {workdir}")
                final = [_read_stats(s) for s in stats_paths]
                if sum((s or {}).get("records", 0) for s in final) >= records:
                    break
                time.sleep(0.5)  # polling the workers' stats files; there is no event to await
            else:
                raise RuntimeError(f"{workers} worker(s) did not drain {records:,} records in {timeout_s:.0f} s")
            time.sleep(1.5)  # one more stats write: the last message's time
            final = [_read_stats(s) for s in stats_paths]
    finally:
        _stop(procs)
        broker.stop()
    first = min(s["first_at"] for s in final if s and s.get("first_at"))
    last = max(s["last_at"] for s in final if s and s.get("last_at"))
    took = last - first
    out.update({
        "seconds": round(took, 2),
        "records_per_s": round(records / took),
        "records_per_s_per_worker": round(records / took / workers),
        "per_worker": [{"records": s.get("records"), "busy_s": s.get("busy_s"),
                        "records_per_s": round(s["records"] / max(1e-9, s["last_at"] - s["first_at"]))}
                       for s in final if s],
        "sustained_30s": took >= 30.0,
        "cores": [sorted(c) for c in cores],
    })
    return out


# -- projection -------------------------------------------------------------------------------------------------
def project(capacity: list[dict[str, Any]], max_gpus: int | None, sizes: tuple[int, ...] = (100_000, 1_000_000)) -> dict[str, Any]:
    """Workers and memory for large clusters, from the points measured.

    Workers: the cluster divided by the largest per-worker load that held every
    target (the measured capacity of one worker on one core). Memory: RSS per
    worker fitted linearly on the GPUs it carried (least squares over the
    points), at that load, times the workers. CPU: the worker's measured CPU
    per record times the records a GPU sends per second.
    """
    pts = [(p["gpus_per_worker"], p["rss_mb"]) for p in capacity if p.get("rss_mb")]
    out: dict[str, Any] = {}
    if not pts:
        return out
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else 0.0
    base = my - slope * mx
    per_gpu = [p["records_per_s"] / p["gpus_per_worker"] / p["workers"] for p in capacity if p.get("records_per_s")]
    costs = [p["worker_cpu_us_per_record"] for p in capacity if p.get("worker_cpu_us_per_record")]
    out["model"] = {"rss_mb": f"{base:.0f} + {slope * 1000:.2f} per 1,000 GPUs carried",
                    "records_per_gpu_s": round(sum(per_gpu) / len(per_gpu), 3) if per_gpu else None,
                    "worker_cpu_us_per_record": round(sum(costs) / len(costs), 2) if costs else None,
                    "capacity_gpus_per_worker": max_gpus}
    for size in sizes:
        row: dict[str, Any] = {}
        if max_gpus:
            w = math.ceil(size / max_gpus)
            row["workers"] = w
            row["rss_gb"] = round(w * (base + slope * size / w) / 1024.0, 2)
            row["rss_gb_per_worker"] = round((base + slope * size / w) / 1024.0, 3)
        if per_gpu and costs:
            row["worker_cores_at_full_use"] = round(size * out["model"]["records_per_gpu_s"] *
                                                    out["model"]["worker_cpu_us_per_record"] / 1e6, 1)
        out[str(size)] = row
    return out


# -- the whole benchmark -------------------------------------------------------------------------------------------
#: ``run`` arguments that ``vigil bench pipeline`` takes, and its options.
CLI_OPTIONS = {"load_gpus": "--load-gpus", "workers": "--workers", "faults_per_kind": "--faults-per-kind",
               "throughput_workers": "--throughput-workers", "throughput_gpus": "--throughput-gpus",
               "throughput_seconds": "--throughput-seconds", "seed": "--seed",
               "stop_at_first_miss": "--stop-at-first-miss/--keep-going"}


def run(json_path: str | None, load_gpus: tuple[int, ...] = (2000, 5000, 10_000, 25_000, 50_000), workers: int = 1,
        faults_per_kind: int = 100, throughput_workers: tuple[int, ...] = (1, 2), throughput_gpus: int = 25_000,
        throughput_seconds: float = 120.0, seed: int = 0, stop_at_first_miss: bool = True,
        progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    command = reproducing_command(run, dict(locals()), "vigil bench pipeline", CLI_OPTIONS)
    started = time.time()
    result: dict[str, Any] = {"command": command, "throughput": {}, "throughput_detail": {}, "capacity": []}
    with measured(result.setdefault("machine", {})):
        for w in throughput_workers:
            detail = throughput(w, gpus=throughput_gpus, seconds=throughput_seconds, seed=seed + 1, progress=progress)
            result["throughput"][str(w)] = detail["records_per_s"]
            result["throughput_detail"][str(w)] = detail
            _write(json_path, result, started)
        for gpus in sorted(load_gpus):
            point = live(gpus * workers, workers=workers, faults_per_kind=faults_per_kind, seed=seed, progress=progress)
            result["capacity"].append(point)
            _write(json_path, result, started)
            if stop_at_first_miss and not point["targets_met"]:
                break
    held = [p["gpus_per_worker"] for p in result["capacity"] if p["targets_met"]]
    result["max_gpus_per_worker_meeting_targets"] = max(held) if held else None
    result["projection"] = project(result["capacity"], result["max_gpus_per_worker_meeting_targets"])
    _write(json_path, result, started)
    return result


def _write(json_path: str | None, result: dict[str, Any], started: float) -> None:
    result["wall_s"] = round(time.time() - started, 1)
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")


def merge(parts: list[dict[str, Any]], json_path: str | None = None, notes: list[str] | None = None,
          merge_command: str | None = None) -> dict[str, Any]:
    """One result from several runs of :func:`run` (each short enough to hold a shared machine's benchmark
    lock): their throughputs and capacity points (a later part's point replaces an earlier one of the
    same load), the largest load meeting every target and the projection recomputed; each part's command,
    machine and load average kept under ``parts``; ``wall_s`` the sum of theirs. ``merge_command``: the
    line that merged them (``python -m vigil.bench.pipeline merge ...``), kept beside the parts' commands."""
    result: dict[str, Any] = {"command": [p.get("command") for p in parts], "throughput": {},
                              "throughput_detail": {}, "capacity": []}
    points: dict[int, dict[str, Any]] = {}
    for part in parts:
        result["throughput"].update(part.get("throughput") or {})
        result["throughput_detail"].update(part.get("throughput_detail") or {})
        for point in part.get("capacity") or []:
            points[point["gpus_per_worker"]] = point
    result["capacity"] = [points[g] for g in sorted(points)]
    held = [p["gpus_per_worker"] for p in result["capacity"] if p["targets_met"]]
    result["max_gpus_per_worker_meeting_targets"] = max(held) if held else None
    result["projection"] = project(result["capacity"], result["max_gpus_per_worker_meeting_targets"])
    result["machine"] = {**machine_info(), "load_before": parts[0]["machine"].get("load_before") if parts else None,
                         "load_after": parts[-1]["machine"].get("load_after") if parts else None}
    result["parts"] = [{"command": p.get("command"), "machine": p.get("machine"), "wall_s": p.get("wall_s")}
                       for p in parts]
    result["wall_s"] = round(sum(p.get("wall_s") or 0.0 for p in parts), 1)
    if merge_command is not None:
        result["merge_command"] = merge_command
    if notes:
        result["notes"] = list(notes)
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


# -- in one process: the detect stage's CPU per record, and where it goes ----------------------------------------------
#: ``inprocess`` arguments that ``python -m vigil.bench.pipeline inprocess`` takes, and its options.
INPROCESS_OPTIONS = {"gpus": "--gpus", "seconds": "--seconds", "warmup_s": "--warmup-seconds", "repeats": "--repeats",
                     "profile_lines": "--profile-lines"}


def inprocess(gpus: int = 25_000, seconds: float = 10.0, seed: int = 1, repeats: int = 3, profile_lines: int = 0,
              json_path: str | None = None, warmup_s: float = 5.0) -> dict[str, Any]:
    """CPU seconds per record of the detect stage alone (decode, engine, detectors, timers) on the
    generator's messages, on a simulated clock (no Kafka, no correlation); optionally cProfile's top lines.

    The messages are made first; each repeat runs a fresh stage over them (the best of ``repeats`` is the
    figure: the least disturbed by the rest of the machine). The first ``warmup_s`` of the cluster's
    telemetry builds the state (every job's and node's detectors) untimed, and what survived it is then
    frozen out of the collector's sight as the worker does (``gc.freeze``): the figure is the steady
    state's, the profile too. The result's ``command`` reproduces it (``python -m vigil.bench.pipeline
    inprocess ...``, or the Python call when ``seed``, which that command does not take, was changed).
    """
    command = reproducing_command(inprocess, dict(locals()), "python -m vigil.bench.pipeline inprocess",
                                  INPROCESS_OPTIONS)
    import cProfile
    import io
    import pstats

    from vigil.streams.config import StreamConfig
    from vigil.streams.engine.detection import DetectionEngine, EngineParams
    from vigil.streams.stages import DetectStage, Place, key_of_topics
    from vigil.streams.worker import TELEMETRY

    gen = LoadGenerator(gpus, 1e9, seed=seed)
    warm = int(warmup_s)
    msgs = [(m, 1e9 + t) for t in range(1, warm + int(seconds) + 1) for m in gen.advance(1e9 + t)
            if m.event_type != "job_state"]
    first = next((i for i, (_, due) in enumerate(msgs) if due > 1e9 + warm), len(msgs))
    records = sum(m.records for m, _ in msgs[first:])
    topics = {t: topic_name(t, "vigil") for t in ("node_samples", "iteration_step")}

    def once(profiler: Any = None) -> float:
        stage = DetectStage(DetectionEngine(EngineParams()), key_of_topics(StreamConfig(bootstrap="-"), TELEMETRY))
        next_tick = 0.0
        began = 0.0
        gc.unfreeze()
        for offset, (m, due) in enumerate(msgs):
            if offset == first:  # the state is built: from here it is timed
                gc.collect(1)
                gc.freeze()
                began = time.process_time()
                if profiler is not None:
                    profiler.enable()
            now = due + 0.02
            stage.on_message(Place(topics[m.event_type], 0, offset, now), m.value, now)
            if now >= next_tick:
                stage.tick(now)
                next_tick = now + 0.1
        if profiler is not None:
            profiler.disable()
        took = time.process_time() - began
        del stage
        gc.unfreeze()
        gc.collect()
        return took

    out: dict[str, Any] = {"command": command, "gpus": gpus, "cluster_seconds": seconds, "warmup_s": warm,
                           "records": records, "messages": len(msgs) - first}
    with measured(out.setdefault("machine", {})):
        cpu = [once() for _ in range(repeats)]
    best = min(cpu)
    out.update(cpu_s=[round(c, 3) for c in cpu], us_per_record=round(1e6 * best / records, 2),
               records_per_cpu_s=round(records / best), cores_to_keep_up=round(best / seconds, 3))
    if profile_lines:
        prof = cProfile.Profile()
        once(prof)
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(profile_lines)
        out["profile_tottime"] = [line for line in text.getvalue().splitlines() if line.strip()][-profile_lines - 1:]
        text = io.StringIO()
        stats.stream = text
        stats.sort_stats("cumulative").print_stats(profile_lines)
        out["profile_cumulative"] = [line for line in text.getvalue().splitlines() if line.strip()][-profile_lines - 1:]
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return out


# -- the benchmark's worker: `vigil worker` with its stats written every second --------------------------------------
def _worker_main(ready_file: Path, stats_file: Path) -> None:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vigil.bench.pipeline")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="a detection worker that writes its stats every second")
    w.add_argument("--ready-file", type=Path, required=True)
    w.add_argument("--stats-file", type=Path, required=True)
    ip = sub.add_parser("inprocess", help="the detect stage's CPU per record in one process, and its profile")
    ip.add_argument("--gpus", type=int, default=25_000)
    ip.add_argument("--seconds", type=float, default=10.0)
    ip.add_argument("--warmup-seconds", type=float, default=5.0, help="cluster seconds building the state, untimed")
    ip.add_argument("--repeats", type=int, default=3)
    ip.add_argument("--profile-lines", type=int, default=0)
    ip.add_argument("--json", dest="json_path")
    mg = sub.add_parser("merge", help="one pipeline.json from the JSON of several `vigil bench pipeline` runs")
    mg.add_argument("parts", nargs="+", type=Path)
    mg.add_argument("--json", dest="json_path", required=True)
    mg.add_argument("--note", action="append", default=[], help="a line of explanation kept in the JSON")
    args = parser.parse_args(argv)
    if args.cmd == "merge":
        line = shlex.join(["python", "-m", "vigil.bench.pipeline", "merge", *map(str, args.parts),
                           "--json", str(args.json_path), *(a for n in args.note for a in ("--note", n))])
        merged = merge([json.loads(p.read_text()) for p in args.parts], args.json_path, args.note, merge_command=line)
        print(json.dumps({k: merged[k] for k in ("throughput", "max_gpus_per_worker_meeting_targets", "wall_s")}))
    elif args.cmd == "worker":
        _worker_main(args.ready_file, args.stats_file)
    elif args.cmd == "inprocess":
        out = inprocess(args.gpus, args.seconds, repeats=args.repeats, profile_lines=args.profile_lines,
                        json_path=args.json_path, warmup_s=args.warmup_seconds)
        print(json.dumps({k: v for k, v in out.items() if not k.startswith("profile")}))


if __name__ == "__main__":
    main()
