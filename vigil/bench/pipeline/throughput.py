"""Throughput on a backlog (:func:`throughput`).

The generator writes ``seconds`` of a cluster's telemetry to the broker first
(events stamped in the recent past), then ``W`` workers start in one new
group; records/s = records processed / the time from the first to the last
message processed, which must be at least 30 s.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from vigil.bench.machine import measured
from vigil.bench.pipeline.procs import fleet_producer, produce, read_stats, spawn_workers, split_cores, stop_all
from vigil.broker import TansuBroker, find_tansu
from vigil.schemas import topic_name
from vigil.sim.load import LoadGenerator
from vigil.streams.config import StreamConfig
from vigil.streams.kafka import ensure_topics

__all__ = ["BACKLOG_SECONDS", "throughput"]

#: Seconds of the cluster's telemetry in the backlog by default: long enough that one worker on a fast host
#: drains it for more than the 30 s a sustained figure needs (120 s of 25,000 GPUs drained in ~28 s at
#: 192,000 records/s), and two workers for about that.
BACKLOG_SECONDS = 300.0

#: Event types a worker reads on its feedback reader, not through the detect stage (not in its record count).
_FEEDBACK_TYPES = frozenset({"job_state", "node_state"})


def throughput(workers: int, gpus: int = 25_000, seconds: float = BACKLOG_SECONDS, seed: int = 1,
               workdir: Path | None = None, progress: Callable[[str], Any] | None = None,
               timeout_s: float = 600.0) -> dict[str, Any]:
    """Records/s of ``workers`` workers draining ``seconds`` of a ``gpus``-GPU cluster's telemetry."""
    say = progress or (lambda _m: None)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-tp-")) if workdir is None else workdir
    gen_core, worker_cores = split_cores()
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
            producer = fleet_producer(broker.bootstrap)
            t = now - seconds
            records = 0  # those the detect stage reads (job and node states go to every worker's feedback reader)
            while t < now:
                t = min(now, t + 1.0)
                for m in gen.advance(t):
                    produce(producer, topic_name(m.event_type, config.topic_prefix), m.key, m.value)
                    if m.event_type not in _FEEDBACK_TYPES:
                        records += m.records
                producer.poll(0)
            producer.flush(120)
            messages = gen.messages
            out.update(records=records, messages=messages, written_in_s=round(time.time() - now, 1))
            say(f"throughput: {records:,} records written; {workers} worker(s) draining")
            procs, ready, stats_paths = spawn_workers(config, workers, workdir / f"w{workers}", cores)
            t0 = time.time()
            final: list[dict[str, Any] | None] = []
            while time.time() - t0 < timeout_s:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker died; see {workdir}")
                final = [read_stats(s) for s in stats_paths]
                if sum((s or {}).get("records", 0) for s in final) >= records:
                    break
                time.sleep(0.5)  # polling the workers' stats files; there is no event to await
            else:
                raise RuntimeError(f"{workers} worker(s) did not drain {records:,} records in {timeout_s:.0f} s")
            time.sleep(1.5)  # one more stats write: the last message's time
            final = [read_stats(s) for s in stats_paths]
    finally:
        stop_all(procs)
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

