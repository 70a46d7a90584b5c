"""Latency under load (:func:`live`): one capacity point on a real broker with real workers.

A fresh tansu broker, ``W`` detection workers (``vigil worker``'s code, with
:class:`~vigil.streams.worker.WorkerStats`) and the load generator
(:class:`~vigil.sim.load.LoadGenerator`: a ``N``-GPU cluster's node samples,
job steps and states at their real rates, faults of every kind at random times
into random jobs and nodes). For each fault, the delay from its injection to
the first alert naming its root cause arriving on the alert topic (read here
with no consumer group); the worker's consumer lag (how long after a message
was produced the worker began to process it, every message counted) and its
RSS. Fail-slow delays are also given in iterations of the slowed job from the
onset (the start of its first slowed step); hang delays also as the excess
over ``k x D_iter``. Cores: :mod:`vigil.bench.pipeline.procs`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from vigil.bench.machine import measured
from vigil.bench.pipeline.procs import (
    Watch, fleet_producer, lag_hist_between, lag_quantiles, pin, produce, read_stats, spawn_workers, split_cores,
    stop_all,
)
from vigil.bench.pipeline.scoring import match, percentile, summarize, targets_met
from vigil.broker import TansuBroker, find_tansu
from vigil.schemas import Alert, decode, topic_name
from vigil.sim.load import KINDS, LoadGenerator
from vigil.stack import wait_for_file
from vigil.streams.config import StreamConfig
from vigil.streams.kafka import ensure_topics, reader

__all__ = ["OVERLOADED_LAG_S", "live"]

#: A worker whose newest message is this late is overloaded: the point is stopped.
OVERLOADED_LAG_S = 60.0


def live(gpus: int, workers: int = 1, faults_per_kind: int = 100, seed: int = 0, warmup_s: float = 30.0,
         node_loss_gap_s: float = 6.5, workdir: Path | None = None, progress: Callable[[str], Any] | None = None,
         kinds: tuple[str, ...] = tuple(KINDS), max_s: float = 3600.0, pin_cores: bool = True,
         keep_alerts: bool = False, load_options: dict[str, Any] | None = None,
         keep_lag_ms: bool = False) -> dict[str, Any]:
    """One capacity point: ``workers`` workers carrying a ``gpus``-GPU cluster with faults (module docstring).

    ``load_options`` go to :class:`~vigil.sim.load.LoadGenerator` (a test's faster steps, say).
    ``keep_lag_ms``: keep each worker's lag histogram of the measured messages (``lag_ms``, ms -> messages),
    which :func:`~vigil.bench.pipeline.runs.combine_runs` pools over the runs of one point.
    """
    say = progress or (lambda _m: None)
    own_tmp = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="vigil-load-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    gen_core, worker_cores = split_cores()
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
            procs, ready, stats_paths = spawn_workers(config, workers, workdir / "workers",
                                                       worker_cores if pin_cores else [saved_affinity])
            for r, p in zip(ready, procs):
                if not wait_for_file(r, 120, alive=lambda p=p: p.poll() is None):
                    raise RuntimeError(f"a worker did not start; see {workdir}")
            watch = Watch({**{f"worker-{i}": p.pid for i, p in enumerate(procs)}, "broker": broker.proc.pid,  # type: ignore[union-attr]
                            "generator": os.getpid()})
            producer = fleet_producer(broker.bootstrap)
            urgent = fleet_producer(broker.bootstrap, linger_ms=0)  # faults and states: sent at once
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
                    produce(producer if m.event_type in telemetry else urgent, topics[m.event_type], m.key, m.value)
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
                        stats_at_start = [read_stats(s) for s in stats_paths]
                        records_at_start = gen.records
                    newest = [read_stats(s) for s in stats_paths]
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
                        stats_at_end = [read_stats(s) for s in stats_paths]
                        records = gen.records - records_at_start
                        for m in gen.finish(now):
                            produce(urgent, topics[m.event_type], m.key, m.value)
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
            final = [read_stats(s) for s in stats_paths]
    finally:
        stop_all(procs)
        broker.stop()
        os.sched_setaffinity(0, saved_affinity)
    matched = match(gen.injections, alerts)
    latency = summarize(matched)
    lag_ms = [lag_hist_between(b, a) for b, a in zip(stats_at_start, stats_at_end)]
    lag = [lag_quantiles(h) for h in lag_ms]
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
        "unexplained": matched["unexplained"],
        "timeline": timeline,
        "faults_injected": {k: sum(1 for i in gen.injections if i.kind == k) for k in KINDS},
    })
    if stopped_early:
        point["stopped_early"] = stopped_early
    met = targets_met(latency, point["rss_mb"])
    point["targets"] = met
    point["targets_met"] = all(met.values()) and not stopped_early
    point["faults"] = matched["faults"]
    if keep_lag_ms:
        point["lag_ms"] = lag_ms
    if keep_alerts:
        point["alerts"] = [{"at": round(at - start, 3), "kind": a.kind, "status": a.status, "severity": a.severity,
                            "subject": a.subject.model_dump(exclude_none=True), "incident": str(a.incident_id),
                            "version": a.incident_version, "summary": a.summary[:200]} for a, at in alerts]
    if own_tmp:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return point

