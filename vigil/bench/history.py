"""``vigil bench history``: sink insert rate sustained over a long run, and cookbook query latency over a large history.

1. **Sink insert rate**: one :class:`~vigil.streams.sink.HistorySink` joins its
   consumer group, then a backlog of GPU-telemetry events is published to an
   embedded tansu broker in batch messages (500 events each, as node agents
   send them; made as they are sent, so the backlog never sits in this
   process's memory: :func:`sample_batches`). Then the clock starts and the
   sink consumes, validates, deduplicates and inserts them into chDB for
   ``sink_seconds`` (30 s by default), or until the backlog is stored when
   it runs out first (``backlog_drained``; ``sustained_s`` says how long it
   ran). The backlog is ``sink_events`` events, by default
   ``sink_seconds * BACKLOG_ROWS_PER_S``: more than the sink stores on the
   machines measured, so that it never runs dry. ``insert_rows_per_s`` is
   rows stored / seconds from the first poll to the last; its 95 % interval
   (``insert_rows_per_s_ci95``) is a percentile bootstrap of the mean over
   the rates of consecutive ``SINK_WINDOW_S`` windows (``detail.sink``
   lists them: their spread shows whether the rate held). Consecutive windows
   are not independent (a busy minute on a shared machine slows several), so
   the interval is of this run's rate, not of the machine's. The group join
   and the publishing are timed apart (in ``detail``) and not counted; so is
   the store's own insert rate (no Kafka, no decoding).
2. **Query latency**: a history of ``telemetry_rows`` raw telemetry rows
   (70 % GPU samples, 20 % heartbeats, 10 % job steps, in the proportions a
   cluster sends them) and ``incidents`` incidents (2 alert versions each for
   most, decisions and action results for half) is generated inside
   ClickHouse with ``INSERT ... SELECT ... FROM numbers(...)`` (the rollups'
   materialized views fill as it goes), then each cookbook query runs
   ``repeats`` times; the median is reported, with its distribution-free
   95 % interval from the order statistics
   (:func:`vigil.bench.intervals.median_interval`: ``None`` below 6 runs).

JSON: ``{"insert_rows_per_s", "insert_rows_per_s_ci95", "insert_sustained_s",
"queries": {NAME: seconds}, "queries_ci95": {NAME: [lo, hi]}, "query_runs",
"targets", "met", "met_over_interval", "command", "detail"}``; ``met`` judges
the point estimates, ``met_over_interval`` the far end of each interval (the
rate's lower end, a query's upper end; None without an interval).
``command`` reproduces the run (the ``vigil bench history`` line, or the
Python call when ``data_dir`` was given), and ``detail.machine`` holds the
load average before and after it (``detail.sink.machine``: around the timed
sink run alone): others' work on a shared machine makes these figures noisy.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from vigil.bench.command import reproducing_command
from vigil.bench.cpscore import bootstrap_mean
from vigil.bench.intervals import median_interval, window_rates
from vigil.bench.machine import measured
from vigil.schemas import GPUS_PER_NODE

TARGET_ROWS_PER_S = 100_000
TARGET_QUERY_S = 1.0
#: The default backlog, in events per second of ``sink_seconds``: above what the sink stores on the
#: machines measured (120k..190k rows/s), so that it runs for the whole time.
BACKLOG_ROWS_PER_S = 200_000
#: Windows over which the sink's rate is taken for its interval.
SINK_WINDOW_S = 2.0
#: Events per published message (as node agents batch them).
PER_MESSAGE = 500
_T0 = "2026-03-02 00:00:00"  # the cookbook's window starts here
#: ``run`` arguments that ``vigil bench history`` takes, and its options.
CLI_OPTIONS = {"telemetry_rows": "--telemetry-rows", "incidents": "--incidents", "sink_seconds": "--sink-seconds",
               "sink_events": "--sink-events", "repeats": "--repeats"}


def run(json_path: str | None, telemetry_rows: int = 100_000_000, incidents: int = 1_000_000,
        sink_events: int | None = None, repeats: int = 10, progress: Callable[[str], Any] | None = None,
        data_dir: str | None = None, sink_seconds: float = 30.0) -> dict[str, Any]:
    command = reproducing_command(run, dict(locals()), "vigil bench history", CLI_OPTIONS)
    if sink_seconds <= 0:
        raise ValueError(f"sink_seconds must be > 0, got {sink_seconds!r}")
    backlog = sink_events if sink_events is not None else math.ceil(sink_seconds * BACKLOG_ROWS_PER_S)
    started = time.time()
    say = progress or (lambda _: None)
    machine: dict[str, Any] = {}
    with measured(machine), tempfile.TemporaryDirectory(prefix="vigil-bench-history-", dir=data_dir) as tmp:
        from vigil.streams.history import HistoryStore

        store = HistoryStore(f"chdb://{tmp}/history", "bench_sink")
        try:
            sink = sink_rate(store, backlog, Path(tmp), say, seconds=sink_seconds)
            big = store.with_database("vigil")
            big.migrate()
            gen = generate(big, telemetry_rows, incidents, say)
            queries = time_cookbook(big, repeats, say)
        finally:
            store.close()
    rate_ci = sink["rows_per_s_ci95"]
    result = {
        "insert_rows_per_s": sink["rows_per_s"],
        "insert_rows_per_s_ci95": rate_ci,
        "insert_sustained_s": sink["seconds"],
        "queries": {name: q["median_s"] for name, q in queries.items()},
        "queries_ci95": {name: q["ci95"] for name, q in queries.items()},
        "query_runs": repeats,
        "targets": {"insert_rows_per_s": TARGET_ROWS_PER_S, "query_s": TARGET_QUERY_S},
        "met": {"insert_rows_per_s": sink["rows_per_s"] >= TARGET_ROWS_PER_S,
                "queries": {name: q["median_s"] < TARGET_QUERY_S for name, q in queries.items()}},
        "met_over_interval": {
            "insert_rows_per_s": None if rate_ci is None else rate_ci[0] >= TARGET_ROWS_PER_S,
            "queries": {name: None if q["ci95"] is None else q["ci95"][1] < TARGET_QUERY_S
                        for name, q in queries.items()}},
        "command": command,
        "detail": {"sink": sink, "generated": gen, "queries": queries, "machine": machine,
                   "wall_s": round(time.time() - started, 1)},
    }
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


# --- 1. the sink ------------------------------------------------------------------

_GPU_SAMPLE = ('{"event_id":"%s","version":1,"event_time":"%s.%06dZ","source":{"cluster":"bench","node":"%s",'
               '"gpu":%d},"event_type":"gpu_telemetry","utilization_pct":90.0,"memory_used_bytes":75161927680,'
               '"temperature_c":%d.0,"sm_clock_mhz":1980.0,"power_w":600.0,"ecc_sbe":0,"ecc_dbe":0,'
               '"nvlink_errors":{}}')


def sample_batches(n: int, t0_us: int, per_message: int = PER_MESSAGE,
                   nodes: int = 512) -> Iterator[tuple[bytes, bytes]]:
    """``n`` GPU samples as ``(key, value)`` messages of ``per_message`` events (the last may hold fewer).

    Made as they are consumed, so a backlog of millions never sits in
    memory; written straight as JSON (building each event as a model would
    cost more than storing it). Event ``i``: node ``n{i % nodes:04d}``, GPU
    ``i % GPUS_PER_NODE``, time ``t0_us + 100 i`` microseconds since the epoch, a fresh
    id (random high bits, ``i`` in the low ones). The key is the first
    event's node.
    """
    high = uuid.uuid4().int >> 64 << 64
    names = [f"n{k:04d}" for k in range(nodes)]
    stamp_of: dict[int, str] = {}
    for first in range(0, n, per_message):
        parts = []
        for i in range(first, min(n, first + per_message)):
            sec, us = divmod(t0_us + 100 * i, 1_000_000)
            stamp = stamp_of.get(sec)
            if stamp is None:
                stamp_of.clear()
                stamp = stamp_of[sec] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
            parts.append(_GPU_SAMPLE % (uuid.UUID(int=high | i), stamp, us, names[i % nodes], i % GPUS_PER_NODE, 60 + i % 20))
        yield names[first % nodes].encode(), ("[" + ",".join(parts) + "]").encode()


def sustained_rate(samples: list[tuple[float, int]], window_s: float = SINK_WINDOW_S,
                   seed: int = 0) -> dict[str, Any]:
    """Rows/s over ``samples`` ``(seconds since the start, rows stored so far)``, with its interval.

    ``rows_per_s``: the last count over the last time; ``rows_per_s_ci95``:
    percentile bootstrap of the mean rate of consecutive ``window_s`` windows
    (:func:`vigil.bench.intervals.window_rates`); None from fewer than 2.

    >>> r = sustained_rate([(0.5 * k, 50 * k) for k in range(21)], window_s=2.0)
    >>> r["rows_per_s"], r["rows_per_s_ci95"], r["windows"]
    (100, [100.0, 100.0], 5)
    """
    seconds, stored = samples[-1] if samples else (0.0, 0)
    windows = window_rates(samples, window_s)
    rates = [r for _, r in windows]
    ci = bootstrap_mean(rates, seed=seed) if len(rates) >= 2 else None
    return {"seconds": round(seconds, 2), "stored": stored,
            "rows_per_s": round(stored / seconds) if seconds > 0 else 0,
            "rows_per_s_ci95": None if ci is None else [round(ci[0], 1), round(ci[1], 1)],
            "window_s": window_s, "windows": len(rates),
            "window_rows_per_s": [round(r) for r in rates]}


def sink_rate(store: Any, n: int, workdir: Path, say: Callable[[str], Any], seconds: float = 30.0) -> dict[str, Any]:
    from confluent_kafka import Producer

    from vigil.schemas import decode
    from vigil.streams.config import StreamConfig
    from vigil.streams.kafka import ensure_topics
    from vigil.streams.sink import HistorySink
    from vigil.broker import TansuBroker, find_tansu

    store.migrate()
    t0_us = int(time.time() * 1e6)
    broker = TansuBroker(find_tansu(None), log_path=workdir / "tansu.log").start()
    samples: list[tuple[float, int]] = [(0.0, 0)]
    around: dict[str, Any] = {}
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
        say(f"sink: publishing a backlog of {n:,} GPU samples")
        publish_start = time.perf_counter()
        producer = Producer(config.kafka_conf(**{"linger.ms": 20, "batch.num.messages": 1000,
                                                 "compression.type": "lz4"}))
        topic = config.topic("gpu_telemetry")
        for key, value in sample_batches(n, t0_us):
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    break
                except BufferError:  # its queue is full: let it send
                    producer.poll(0.1)
            producer.poll(0)
        unsent = producer.flush(600)
        del producer  # its threads would keep reconnecting to the stopped broker
        if unsent:
            raise RuntimeError(f"{unsent} backlog messages were not delivered to the broker")
        publish_s = time.perf_counter() - publish_start
        say(f"sink: storing for {seconds:g} s")
        with measured(around):
            start = time.perf_counter()
            until = start + seconds
            while sink.stats.stored < n and time.perf_counter() < until:
                sink.poll_once()
                samples.append((time.perf_counter() - start, sink.stats.stored))
        sink.close()
    finally:
        broker.stop()
    rate = sustained_rate(samples)
    # The store alone: rows of the same shape, fresh ids, no Kafka and no decoding (not timed).
    fresh = [e for _, value in sample_batches(min(n, 100_000), t0_us) for e in decode(value).events]
    t = time.perf_counter()
    store.insert_events(fresh)
    store_rate = len(fresh) / (time.perf_counter() - t)
    return {"events": n, **rate, "sink_seconds": seconds, "sustained_30s": rate["seconds"] >= 30.0,
            "backlog_drained": rate["stored"] >= n, "machine": around,
            "store_only_rows_per_s": round(store_rate), "batch_messages_of": PER_MESSAGE,
            "group_join_s_not_timed": round(join_s, 2), "publish_s_not_timed": round(publish_s, 2),
            "decoding_processes": sink.decode_processes,
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
        ci = median_interval(times)
        out[recipe.name] = {"median_s": round(statistics.median(times), 4), "n": len(times),
                            "ci95": None if ci is None else [round(ci["lo"], 4), round(ci["hi"], 4)],
                            "ci_coverage": None if ci is None else ci["coverage"],
                            "runs_s": [round(x, 4) for x in times], "rows": rows}
    return out


def format_table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    ci = result.get("insert_rows_per_s_ci95")
    rate = f"{result['insert_rows_per_s']:,}" + ("" if not ci else f" [{ci[0]:,.0f}, {ci[1]:,.0f}]")
    rows = [(f"sink insert rows/s over {result.get('insert_sustained_s', 0):g} s", rate, f">= {TARGET_ROWS_PER_S:,}")]
    for name, s in result["queries"].items():
        q = (result.get("queries_ci95") or {}).get(name)
        rows.append((f"query {name} (median of {result.get('query_runs', '?')})",
                     f"{s:.3f} s" + ("" if not q else f" [{q[0]:.3f}, {q[1]:.3f}]"), f"< {TARGET_QUERY_S:g} s"))
    return rows
