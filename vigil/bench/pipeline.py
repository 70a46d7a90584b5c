"""``vigil bench pipeline``: records/s through the detection workers, and alert latency.

Throughput: a simulated 4,096-GPU cluster's telemetry (each job step as one
columnar message holding every rank's timing record, per-node GPU/NIC/heartbeat
samples; a record is one rank's timing or one sample) is produced to a
fresh tansu broker first; then N ``vigil worker`` processes start in one new
consumer group and the clock runs from the first worker's assignment until
the group has committed every offset produced (known exactly from the
delivery reports). Records/s = records / that time; decode, validation,
detection, findings and correlation all count. Offsets are committed every
second, so the figure is a slight underestimate.

Latency: one worker, a live simulated cluster with several faults of each
kind; latency is from the simulator injecting a fault to its alert (the
first one naming the root cause) arriving on the alert topic. Fail-slow
latency is also given in iterations of the slowed job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from vigil.producers.publisher import Publisher
from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import Alert, IterationStep, decode, encode, encode_batch, group_type, message_key, topic_name
from vigil.streams.config import StreamConfig
from vigil.streams.kafka import ensure_topics, reader
from vigil.broker import TansuBroker, die_with_parent, find_tansu
from vigil.stack import wait_for_file


def _workers(config: StreamConfig, n: int, workdir: Path) -> tuple[list[subprocess.Popen], list[Path]]:
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_GROUP_ID=config.group_id, VIGIL_STATE_DIR=str(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    procs, ready = [], []
    for i in range(n):
        r = workdir / f"ready-{i}"
        ready.append(r)
        log = open(workdir / f"worker-{i}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "vigil.cli", "worker", "--ready-file", str(r)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=die_with_parent))
        log.close()
    return procs, ready


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _dataset(seconds: float) -> tuple[list[tuple[str, bytes, bytes]], int]:
    """(topic's event type, key, value) messages of a 4,096-GPU cluster, and the record count."""
    nodes = [f"node-{i:03d}" for i in range(512)]
    jobs = [SimJob(f"job-{k}", tuple(nodes[k * 64:(k + 1) * 64]), dp=32, pp=2, tp=8, iteration_s=0.5)
            for k in range(8)]
    sim = ClusterSimulator(nodes, jobs, [], start=time.time() - seconds - 5, heartbeat_interval_s=1.0, seed=1,
                           telemetry_interval_s=1.0, step_batches=True, node_batches=True)
    out, records = [], 0
    for group in sim.advance(sim.start + seconds):
        first = group[0]
        value = encode(first) if len(group) == 1 else encode_batch(group)
        out.append((group_type(group), message_key(first), value))
        # A columnar step carries one timing record per rank.
        records += sum(len(e.ranks) if isinstance(e, IterationStep) else 1 for e in group)
    return out, records


def throughput(bootstrap: str, n_workers: int, dataset: list[tuple[str, bytes, bytes]], records: int,
               workdir: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    config = StreamConfig(bootstrap=bootstrap, topic_prefix=f"bench-{tag}", group_id=f"bench-{tag}")
    ensure_topics(config.kafka_conf(), config.topic_prefix)
    ends: dict[tuple[str, int], int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            key = (msg.topic(), msg.partition())
            ends[key] = max(ends.get(key, 0), msg.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 1000,
                         "queue.buffering.max.messages": 200_000, "log_level": 3})
    for event_type, key, value in dataset:
        while True:
            try:
                producer.produce(topic_name(event_type, config.topic_prefix), key=key, value=value,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    procs, ready = _workers(config, n_workers, workdir / f"tp-{n_workers}")
    committed: dict[tuple[str, int], int] = {}
    try:
        if not wait_for_file(ready[0], 120, alive=lambda: procs[0].poll() is None):
            raise RuntimeError(f"worker did not start; see {workdir}")
        t0 = time.time()
        watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": config.group_id, "log_level": 3})
        tps = [TopicPartition(t, p) for (t, p) in ends]
        done_at = None
        while time.time() - t0 < timeout_s:
            committed = {(tp.topic, tp.partition): tp.offset for tp in watcher.committed(tps, timeout=10)}
            if all(committed.get(k, -1) >= end for k, end in ends.items()):
                done_at = time.time()
                break
            time.sleep(0.1)  # polling the group's commits; there is no event to await
        watcher.close()
        both_ready = all(r.exists() for r in ready)
    finally:
        _stop(procs)
    if done_at is None:
        behind = sum(end - max(committed.get(k, 0), 0) for k, end in ends.items())
        raise RuntimeError(f"{n_workers} worker(s) did not finish in {timeout_s:.0f} s ({behind} messages behind)")
    elapsed = done_at - t0
    return {"workers": n_workers, "records": records, "messages": len(dataset), "seconds": round(elapsed, 3),
            "records_per_s": round(records / elapsed), "all_workers_assigned": both_ready}


def _latency_cluster(start: float) -> tuple[ClusterSimulator, dict[str, list[Fault]]]:
    nodes = [f"n{i:02d}" for i in range(24)]
    jobs = [SimJob(f"j{k}", tuple(nodes[k * 2:k * 2 + 2]), dp=2, pp=1, tp=8, iteration_s=0.25) for k in range(10)]
    faults: dict[str, list[Fault]] = {
        "exception": [Fault("exception", f"j{k}", at=14.0 + k, rank=3, category="cuda_error") for k in range(2)],
        "process_exit": [Fault("process_exit", f"j{k}", at=14.5 + k, rank=1) for k in range(2, 4)],
        "hang": [Fault("hang", f"j{k}", at=15.0 + k) for k in range(4, 6)],
        "fail_slow": [Fault("gpu_slow", nodes[2 * k], at=16.0, gpu=2, slowdown=0.5) for k in range(6, 8)],
        "xid": [Fault("xid", n, at=14.0 + i, code=79, gpu=1) for i, n in enumerate(nodes[20:22])],
        "node_lost": [Fault("node_loss", n, at=14.2 + i) for i, n in enumerate(nodes[22:24])],
    }
    sim = ClusterSimulator(nodes, jobs, [f for fs in faults.values() for f in fs], start=start,
                           heartbeat_interval_s=1.0, seed=3, telemetry_interval_s=1.0, step_batches=True,
                           node_batches=True)
    return sim, faults


def latency(bootstrap: str, workdir: Path, rounds: int = 2,
            progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    iterations: list[float] = []
    for r in range(rounds):
        if progress:
            progress(f"latency round {r + 1}/{rounds}")
        tag = uuid.uuid4().hex[:8]
        config = StreamConfig(bootstrap=bootstrap, topic_prefix=f"lat-{tag}", group_id=f"lat-{tag}")
        ensure_topics(config.kafka_conf(), config.topic_prefix)
        procs, ready = _workers(config, 1, workdir / f"lat-{r}")
        try:
            if not wait_for_file(ready[0], 120, alive=lambda: procs[0].poll() is None):
                raise RuntimeError(f"worker did not start; see {workdir}")
            start = time.time()
            sim, faults = _latency_cluster(start)
            publisher = Publisher(config.kafka_conf(), config.topic_prefix, linger_ms=0)
            alerts = reader(config.kafka_conf(), [config.topic("alert")])
            seen: list[tuple[Alert, float]] = []
            while time.time() < start + 32:
                for group in sim.advance(time.time()):
                    publisher.publish(group)
                msg = alerts.poll(0.005)
                if msg is not None and not msg.error():
                    now = time.time()
                    seen.extend((a, now) for a in decode(msg.value()).events if isinstance(a, Alert))
            alerts.close()
        finally:
            _stop(procs)
        for kind, fs in faults.items():
            for f in fs:
                kinds, _ = f.expected_alert
                want = f.expected_subject
                if kind == "fail_slow":  # the job's slowdown or its attributed cause, whichever first
                    job = next(j.name for j in sim.jobs.values() if f.target in j.nodes)
                    match = lambda a: (a.kind == "fail_slow" and a.subject.job == job) or (
                        a.kind in kinds and a.subject.node == f.target)
                else:
                    match = lambda a, kinds=kinds, want=want: a.kind in kinds and all(
                        a.subject.model_dump(exclude_none=True).get(k) == v for k, v in want.items())
                hit = next((at for a, at in seen if a.status != "resolved" and match(a)
                            and f.injected_at is not None and at >= f.injected_at), None)
                if hit is None:
                    samples.setdefault(kind, []).append(float("inf"))
                    continue
                samples.setdefault(kind, []).append(hit - f.injected_at)
                if kind == "fail_slow" and f.onset_at is not None:
                    # Falcon's measure: iterations of the slowed job from the onset (the
                    # first slowed step's start) to the alert.
                    job_spec = next(j for j in sim.jobs.values() if f.target in j.nodes)
                    slowed = job_spec.iteration_s * (1 + job_spec.compute_fraction * f.slowdown)
                    iterations.append((hit - f.onset_at) / slowed)

    def pct(values: list[float], q: float) -> float | None:
        finite = sorted(values)
        if not finite:
            return None
        k = min(len(finite) - 1, max(0, round(q * (len(finite) - 1))))
        v = finite[k]
        return None if v == float("inf") else round(v, 4)

    out = {kind: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v),
                  "missed": sum(1 for x in v if x == float("inf"))}
           for kind, v in samples.items() if kind != "fail_slow"}
    fail_slow = {"p50_iterations": pct(iterations, 0.5), "p99_iterations": pct(iterations, 0.99),
                 "p50_s": pct(samples.get("fail_slow", []), 0.5), "p99_s": pct(samples.get("fail_slow", []), 0.99),
                 "n": len(samples.get("fail_slow", [])),
                 "missed": sum(1 for x in samples.get("fail_slow", []) if x == float("inf"))}
    return {"latency": out, "fail_slow": fail_slow}


def run(json_path: str | None, seconds: float = 20.0, latency_rounds: int = 2,
        progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        workdir = Path(tmp)
        broker = TansuBroker(find_tansu(None), log_path=workdir / "tansu.log").start()
        try:
            if progress:
                progress("generating a 4,096-GPU cluster's telemetry")
            dataset, records = _dataset(seconds)
            result: dict[str, Any] = {"throughput": {}, "throughput_detail": {}}
            for n in (1, 2):
                if progress:
                    progress(f"throughput with {n} worker(s): {records:,} records")
                detail = throughput(broker.bootstrap, n, dataset, records, workdir)
                result["throughput"][str(n)] = detail["records_per_s"]
                result["throughput_detail"][str(n)] = detail
            result.update(latency(broker.bootstrap, workdir, latency_rounds, progress))
        finally:
            broker.stop()
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    result["wall_s"] = round(time.time() - started, 1)
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result
