"""``vigil bench history``: sink insert rate, and cookbook query latency over a large history.

1. **Sink insert rate**: one :class:`~vigil.streams.sink.HistorySink` joins its
   consumer group, ``sink_events`` GPU-telemetry events are published to an
   embedded tansu broker in batch messages (500 events each, as node agents
   send them), then the sink consumes, validates, deduplicates and inserts
   them into chDB. ``insert_rows_per_s`` is rows stored / wall time from the
   first poll after publishing to the last row stored (the group join, a
   one-off ~3 s with tansu, is in ``detail`` but not timed). The store's own
   insert rate (no Kafka, no decoding) is in ``detail``.
2. **Query latency**: a history of ``telemetry_rows`` raw telemetry rows
   (70 % GPU samples, 20 % heartbeats, 10 % job steps, in the proportions a
   cluster sends them) and ``incidents`` incidents (2 alert versions each for
   most, decisions and action results for half) is generated inside
   ClickHouse with ``INSERT ... SELECT ... FROM numbers(...)`` (the rollups'
   materialized views fill as it goes), then each cookbook query runs
   ``repeats`` times; the median is reported.

JSON: ``{"insert_rows_per_s", "queries": {NAME: seconds}, "targets", "met",
"command", "detail"}``; ``command`` reproduces the run (the ``vigil bench
history`` line, or the Python call when ``data_dir`` was given), and
``detail.machine`` holds the load average before and after it: others' work on
a shared machine makes these figures noisy.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from vigil.bench.command import reproducing_command
from vigil.bench.machine import measured
from vigil.schemas import GPUS_PER_NODE

TARGET_ROWS_PER_S = 100_000
TARGET_QUERY_S = 1.0
_T0 = "2026-03-02 00:00:00"  # the cookbook's window starts here
#: ``run`` arguments that ``vigil bench history`` takes, and its options.
CLI_OPTIONS = {"telemetry_rows": "--telemetry-rows", "incidents": "--incidents", "sink_events": "--sink-events",
               "repeats": "--repeats"}


def run(json_path: str | None, telemetry_rows: int = 100_000_000, incidents: int = 1_000_000,
        sink_events: int = 300_000, repeats: int = 3, progress: Callable[[str], Any] | None = None,
        data_dir: str | None = None) -> dict[str, Any]:
    command = reproducing_command(run, dict(locals()), "vigil bench history", CLI_OPTIONS)
    started = time.time()
    say = progress or (lambda _: None)
    machine: dict[str, Any] = {}
    with measured(machine), tempfile.TemporaryDirectory(prefix="vigil-bench-history-", dir=data_dir) as tmp:
        from vigil.streams.history import HistoryStore

        store = HistoryStore(f"chdb://{tmp}/history", "bench_sink")
        try:
            sink = sink_rate(store, sink_events, Path(tmp), say)
            big = store.with_database("vigil")
            big.migrate()
            gen = generate(big, telemetry_rows, incidents, say)
            queries = time_cookbook(big, repeats, say)
        finally:
            store.close()
    result = {
        "insert_rows_per_s": sink["rows_per_s"],
        "queries": {name: q["median_s"] for name, q in queries.items()},
        "targets": {"insert_rows_per_s": TARGET_ROWS_PER_S, "query_s": TARGET_QUERY_S},
        "met": {"insert_rows_per_s": sink["rows_per_s"] >= TARGET_ROWS_PER_S,
                "queries": {name: q["median_s"] < TARGET_QUERY_S for name, q in queries.items()}},
        "command": command,
        "detail": {"sink": sink, "generated": gen, "queries": queries, "machine": machine,
                   "wall_s": round(time.time() - started, 1)},
    }
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


# --- 1. the sink ------------------------------------------------------------------


def sink_rate(store: Any, n: int, workdir: Path, say: Callable[[str], Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    from vigil.schemas import GpuTelemetry, Source, encode_batch, from_seconds
    from vigil.streams.config import StreamConfig
    from vigil.streams.kafka import ensure_topics
    from vigil.streams.sink import HistorySink
    from vigil.broker import TansuBroker, find_tansu

    store.migrate()
    say(f"sink: publishing {n:,} GPU samples")
    t0 = time.time()
    events = [GpuTelemetry(event_time=from_seconds(t0 + i * 1e-4), source=Source(node=f"n{i % 512:04d}", gpu=i % GPUS_PER_NODE),
                           utilization_pct=90.0, temperature_c=60.0 + i % 20, sm_clock_mhz=1980.0, power_w=600.0,
                           memory_used_bytes=70 << 30, ecc_sbe=0, ecc_dbe=0) for i in range(n)]
    broker = TansuBroker(find_tansu(None), log_path=workdir / "tansu.log").start()
    try:
        config = StreamConfig(bootstrap=broker.bootstrap, topic_prefix="bench", group_id="bench-history")
        ensure_topics(config.kafka_conf(), config.topic_prefix)
        # The sink joins its consumer group first (seconds: the broker's session timeout),
        # so that the clock measures storing, not the one-off join.
        sink = HistorySink(config, store, group_id="bench-sink", batch_size=10_000)
        join_start = time.perf_counter()
        while not sink._consumer.assignment() and time.perf_counter() < join_start + 60:
            sink.poll_once()  # the topics are empty: nothing is consumed
        join_s = time.perf_counter() - join_start
        pool_start = time.perf_counter()
        sink.start_decoding_processes()  # (once per sink, like the join)
        pool_s = time.perf_counter() - pool_start
        producer = Producer(config.kafka_conf(**{"linger.ms": 20, "batch.num.messages": 1000,
                                                 "compression.type": "lz4"}))
        topic = config.topic("gpu_telemetry")
        for i in range(0, n, 500):
            producer.produce(topic, key=f"n{i % 512:04d}".encode(), value=encode_batch(events[i:i + 500]))
            producer.poll(0)
        producer.flush(120)
        del producer  # its threads would keep reconnecting to the stopped broker
        say(f"sink: storing {n:,} rows")
        start = time.perf_counter()
        deadline = start + 600
        while sink.stats.stored < n and time.perf_counter() < deadline:
            sink.poll_once()
        elapsed = time.perf_counter() - start
        sink.close()
    finally:
        broker.stop()
    stored = sink.stats.stored
    # The store alone: the same rows, fresh ids, no Kafka and no decoding.
    fresh = [e.model_copy(update={"event_id": __import__("uuid").uuid4()}) for e in events[:100_000]]
    t = time.perf_counter()
    store.insert_events(fresh)
    store_rate = len(fresh) / (time.perf_counter() - t)
    return {"events": n, "stored": stored, "seconds": round(elapsed, 2),
            "rows_per_s": round(stored / elapsed) if elapsed > 0 else 0,
            "store_only_rows_per_s": round(store_rate), "batch_messages_of": 500,
            "group_join_s_not_timed": round(join_s, 2), "decoding_processes": sink.decode_processes,
            "processes_start_s_not_timed": round(pool_s, 2), "batches": sink.stats.batches,
            "chunks_decoded_by_processes": sink.stats.pooled_chunks}


# --- 2. a big history, generated in ClickHouse ----------------------------------------


def generate(store: Any, telemetry_rows: int, incidents: int, say: Callable[[str], Any]) -> dict[str, Any]:
    db = store.database
    gpu_rows, hb_rows = int(telemetry_rows * 0.7), int(telemetry_rows * 0.2)
    step_rows = telemetry_rows - gpu_rows - hb_rows
    nodes, jobs = 1024, 256
    span = 2 * 86400  # two days, the cookbook's window
    cmd = store._client.command
    timings: dict[str, float] = {}

    def timed(name: str, sql: str) -> None:
        say(f"generating {name}")
        t = time.perf_counter()
        cmd(sql, settings={"max_partitions_per_insert_block": 1000})
        timings[name] = round(time.perf_counter() - t, 1)

    t0 = f"toDateTime64('{_T0}', 6, 'UTC')"
    # GPU samples: every node's GPUs sampled evenly over the span.
    per_gpu = max(1, gpu_rows // (nodes * GPUS_PER_NODE))
    timed(f"gpu_telemetry ({gpu_rows:,} rows)", f"""
        INSERT INTO {db}.gpu_telemetry (event_id, event_time, cluster, node, gpu, event_type, utilization_pct,
            temperature_c, sm_clock_mhz, power_w, ecc_sbe, ecc_dbe, nvlink_errors)
        SELECT generateUUIDv4(number), {t0} + toIntervalMicrosecond(intDiv(number, {nodes * GPUS_PER_NODE}) * {span * 1_000_000 // per_gpu}),
            'bench', concat('n', leftPad(toString(number % {nodes}), 4, '0')), intDiv(number, {nodes}) % {GPUS_PER_NODE},
            'gpu_telemetry', 90 + number % 10, 55 + number % 30, 1980 - number % 50, 600, 0, 0, '{{}}'
        FROM numbers({gpu_rows})""")
    per_node = max(1, hb_rows // nodes)
    timed(f"heartbeats ({hb_rows:,} rows)", f"""
        INSERT INTO {db}.heartbeats (event_id, event_time, cluster, node, event_type, seq, interval_s)
        SELECT generateUUIDv4(number), {t0} + toIntervalMicrosecond(intDiv(number, {nodes}) * {span * 1_000_000 // per_node}),
            'bench', concat('n', leftPad(toString(number % {nodes}), 4, '0')), 'heartbeat', intDiv(number, {nodes}),
            {span / per_node}
        FROM numbers({hb_rows})""")
    # Job steps: each job runs its steps back to back; every 40,000th step is rerun after a restart.
    per_job = max(1, step_rows // jobs)
    step_s = span / per_job
    timed(f"iteration_steps ({step_rows:,} rows)", f"""
        INSERT INTO {db}.iteration_steps (event_id, event_time, cluster, job, event_type, step, start, end,
            duration_s, ranks, nodes, gpus, compute_s, communication_s, dp, pp, tp)
        SELECT generateUUIDv4(number), e, 'bench', concat('job', toString(number % {jobs})), 'iteration_step',
            s, st, e, {step_s}, [0], ['n0000'], [0], [{step_s * 0.7}], [{step_s * 0.3}], [0], [0], [0]
        FROM (SELECT number, intDiv(number, {jobs}) AS i, i - if(i % 40000 >= 39000, 1000, 0) AS s,
                     {t0} + toIntervalMicrosecond(i * {int(step_s * 1_000_000)}) AS st,
                     st + toIntervalMicrosecond({int(step_s * 1_000_000)}) AS e
              FROM numbers({step_rows}))""")
    timed(f"job_states ({jobs} jobs)", f"""
        INSERT INTO {db}.job_states (event_id, event_time, cluster, job, event_type, state, nodes, gpus, dp, pp, tp,
            weight, min_gpus)
        SELECT generateUUIDv4(number), {t0} + toIntervalSecond(if(number < {jobs}, 0, {span})), 'bench',
            concat('job', toString(number % {jobs})), 'job_state', if(number < {jobs}, 'running', 'completed'),
            arrayMap(k -> concat('n', leftPad(toString(((number % {jobs}) * 4 + k) % {nodes}), 4, '0')), range(32)),
            {32 * GPUS_PER_NODE}, 32, 1, {GPUS_PER_NODE}, 1, 0
        FROM numbers({2 * jobs})""")
    # Incidents: kinds of every domain; node n0042 fails 20x as often (the lemon).
    kinds = ("node_lost", "xid", "xid", "process_exit", "task_hang", "nccl_timeout", "cuda_error", "software_error",
             "fail_slow", "congestion", "ecc_sbe", "connection_reset")
    kind_list = "[" + ", ".join(f"'{k}'" for k in kinds) + "]"
    timed(f"alerts ({incidents:,} incidents)", f"""
        INSERT INTO {db}.alerts (event_id, event_time, cluster, job, node, event_type, incident_id, incident_version,
            status, severity, kind, subject_job, subject_node, onset_time, detection_time, summary, evidence,
            evidence_count, detector, detector_version)
        SELECT generateUUIDv4(number), if(v = 1, det, det + toIntervalSecond(30 + h % 900)), 'bench', j, n, 'alert',
            toUUID(concat('00000000-0000-4000-8000-', leftPad(hex(toUInt64(inc)), 12, '0'))), v,
            if(v = 1, 'open', 'resolved'), toInt64(1 + h % 3), kind, j, n, onset, det, '',
            multiIf(kind = 'xid', concat('[{{"kind":"xid","code":', toString([79, 48, 13, 74, 94][1 + h % 5]), '}}]'),
                    kind = 'fail_slow', '[{{"kind":"fail_slow","rel_change":0.3,"slowdown_class":"computation"}}]',
                    '[]'), 1, concat(kind, '_detector'), '1'
        FROM (SELECT number, intDiv(number, 2) AS inc, number % 2 + 1 AS v, cityHash64(inc) AS h,
                     {kind_list}[1 + h % {len(kinds)}] AS kind,
                     if(kind IN ('node_lost', 'xid', 'ecc_sbe', 'congestion'),
                        toNullable(concat('n', leftPad(toString(if(h % 50 = 0, 42, intDiv(h, 7) % {nodes})), 4, '0'))),
                        NULL) AS n,
                     if(n IS NULL, toNullable(concat('job', toString(intDiv(h, 11) % {jobs}))), NULL) AS j,
                     {t0} + toIntervalMicrosecond(intDiv(h, 13) % {span * 1_000_000}) AS onset,
                     onset + toIntervalMicrosecond(100000 + h % 10000000) AS det
              FROM numbers({2 * incidents})
              WHERE v = 1 OR inc % 10 != 0)""")
    # Half the incidents get a decision; its action runs, then succeeds (or fails, 1 in 8).
    actions = "['restart_process', 'retry_in_place', 'reconfigure', 'isolate_node']"
    timed(f"decisions ({incidents // 2:,})", f"""
        INSERT INTO {db}.decisions (event_id, event_time, cluster, job, event_type, decision_id, idempotency_key,
            action, reason, answers, plan)
        SELECT generateUUIDv4(number), det + toIntervalMillisecond(500), 'bench', NULL, 'decision',
            toUUID(concat('00000000-0000-4000-9000-', leftPad(hex(toUInt64(inc)), 12, '0'))),
            toString(inc), {actions}[1 + h % 4], 'bench',
            [toUUID(concat('00000000-0000-4000-8000-', leftPad(hex(toUInt64(inc)), 12, '0')))], '{{}}'
        FROM (SELECT number, number * 2 AS inc, cityHash64(inc) AS h,
                     {t0} + toIntervalMicrosecond(intDiv(h, 13) % {span * 1_000_000})
                       + toIntervalMicrosecond(100000 + h % 10000000) AS det
              FROM numbers({incidents // 2}))""")
    timed(f"actions ({incidents:,})", f"""
        INSERT INTO {db}.actions (event_id, event_time, cluster, event_type, decision_id, state, backend, detail)
        SELECT generateUUIDv4(number), det + toIntervalSecond(if(r = 0, 1, 5 + h % 120)), 'bench', 'action_result',
            toUUID(concat('00000000-0000-4000-9000-', leftPad(hex(toUInt64(inc)), 12, '0'))),
            if(r = 0, 'running', if(h % 8 = 0, 'failed', 'succeeded')), 'slurm', ''
        FROM (SELECT number, intDiv(number, 2) * 2 AS inc, number % 2 AS r, cityHash64(inc) AS h,
                     {t0} + toIntervalMicrosecond(intDiv(h, 13) % {span * 1_000_000})
                       + toIntervalMicrosecond(100000 + h % 10000000) AS det
              FROM numbers({incidents}))""")
    counts = {t: store.query(f"SELECT count() FROM {db}.{t}").rows[0][0]
              for t in ("gpu_telemetry", "heartbeats", "iteration_steps", "alerts", "decisions", "actions",
                        "job_steps", "node_days")}
    counts["incidents"] = store.query(f"SELECT uniqExact(incident_id) FROM {db}.incident_rollup").rows[0][0]
    return {"rows": counts, "telemetry_rows": gpu_rows + hb_rows + step_rows, "seconds": timings}


def time_cookbook(store: Any, repeats: int, say: Callable[[str], Any]) -> dict[str, dict[str, Any]]:
    from vigil.streams.cookbook import COOKBOOK

    out: dict[str, dict[str, Any]] = {}
    for recipe in COOKBOOK:
        say(f"query {recipe.name}")
        sql = recipe.sql.replace("vigil.", f"{store.database}.")
        times, rows = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            rows = len(store.query(sql).rows)
            times.append(time.perf_counter() - t)
        out[recipe.name] = {"median_s": round(statistics.median(times), 4), "runs_s": [round(x, 4) for x in times],
                            "rows": rows}
    return out


def format_table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = [("sink insert rows/s", f"{result['insert_rows_per_s']:,}", f">= {TARGET_ROWS_PER_S:,}")]
    rows += [(f"query {name}", f"{s:.3f} s", f"< {TARGET_QUERY_S:g} s") for name, s in result["queries"].items()]
    return rows
