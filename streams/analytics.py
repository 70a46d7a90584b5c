"""Analytics over the history: rollup tables fed by materialized views, and views.

Five rollups are filled by materialized views as the sink inserts, so they
outlive the raw telemetry's TTL and answer in milliseconds:

``incident_rollup``
    one row per incident (after merges), from every version of its alerts:
    kind, worst severity, first onset, first detection, resolution, subject,
    XID code and fail-slow size (from the evidence), first detector.
``job_steps``
    one row per executed training step of a job (from ``iteration_steps``, or
    rank 0's ``iterations``): what ETTR is computed from.
``node_days``
    first and last heartbeat of each node per day: the exposure (node-days in
    service) that failure rates are divided by.
``incident_slowdowns``
    per incident and job it slowed down: the largest relative slowdown and its
    class, from the alerts' ``slowdowns`` and from their ``fail_slow``
    evidence, whatever the incident's root (a throttled GPU, a congested link,
    a straggler or the fail-slow itself).
``job_step_blocks``
    per job and block of 1024 steps (fed from ``job_steps``): rows, distinct
    steps, summed duration, first/last start and end. ETTR adds up the blocks
    that lie inside its window with one execution per step, and reads single
    steps only for the rest (a few blocks per job: the window's edges and the
    steps re-run after a restart) instead of grouping every step.

Every aggregate in the first three is idempotent (min, max, argMin, argMax; the
step table is keyed by execution), so a row inserted twice (a backfill that
overlaps the view, a replay) never counts twice. ``job_step_blocks`` sums, but
a block where a row came twice has more rows than distinct steps, and is then
read step by step like a block with re-run steps: still exact, only slower.

The views on top are plain SQL, most of them parameterized by a window
``(since, until)``: ``SELECT * FROM vigil.ettr(since='2026-01-01', until=now64())``.

``incidents``
    one row per incident with ``domain`` (user_code / system_software /
    hardware / network), ``failure_class`` (fail_stop / fail_slow / warning /
    vigil) and ``detection_latency_s``.
``incident_taxonomy(since, until)``
    incidents by domain, kind, severity and XID code.
``job_runs``
    each job's span, GPUs and nodes from its published states (``job_states``)
    and its steps. The span starts at the first ``running`` state or the first
    step, whichever is first, and ends at the terminal state (``completed``,
    ``failed``, ``cancelled``); a job whose last state is not terminal still
    holds its GPUs, so its span runs to now; a job that never published a
    state is known by its steps only and spans its first to its last step.
``ettr(since, until)``
    Meta's effective training time ratio per job: productive time (each step's
    last execution; executions later redone after a restart are lost work) over
    available time (the job's span), both clipped to the window. A job that
    died and was failed by its scheduler later, or still holds its GPUs, has
    the time since its last step counted as available and unproductive.
``run_ettr(since, until)``
    the same per training run (the jobs sharing ``run``, a chain under a
    time limit): the jobs' times added up, and ``gap_s``, the time between
    them (queued for the next job), apart: unavailable, not a failure.
``mttf_by_size(since, until)`` / ``mttf_projection(since, until)``
    failures (fail-stop incidents of the job, or of a node it ran on) per
    GPU-count bucket with the observed MTTF; the fleet failure rate per
    node-day (Poisson maximum likelihood: failures / node-days of job runtime)
    and the MTTF it predicts for each bucket and for 1k-100k GPUs.
``mttr_by_action(since, until)``
    detection -> recovery per action; recovered is the first ``succeeded``
    action result of a decision answering the incident, or the incident's
    resolution, whichever came first.
``detection_latency(since, until)``
    detection - onset per first detector: count, mean, p50, p90, p99, max.
``failslow_lost(since, until)``
    time lost to fail-slows per job: slowed time x rel/(1 + rel), where rel
    is the relative slowdown the change-point detector measured for the job
    (``incident_slowdowns``) and the slowed time runs from the incident's
    onset to its resolution, clipped to the window and to the job's span.
``lemon_nodes(since, until)``
    fail-stop incidents per node (user-code failures excluded) against the
    fleet rate times the node's days in service: the Poisson tail probability
    P(X >= k); a lemon is a node with k >= 2 whose probability, corrected for
    the number of nodes (Bonferroni), is below 1%.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

from vigil.schemas import GPUS_PER_NODE

# --- taxonomy ---------------------------------------------------------------

#: Slowdowns: the job keeps running, slower.
FAIL_SLOW_KINDS = ("fail_slow", "straggler", "throttle", "clock_below_peers", "congestion")
#: Signs of trouble that interrupt nothing.
WARNING_KINDS = ("ecc_sbe", "nvlink_errors", "transport_errors", "temperature_outlier")
#: What vigil says about itself.
VIGIL_KINDS = ("recovery_failed", "actuator_circuit_open")

#: kind -> failure domain (Meta's attribution: user code, system software, hardware, network).
DOMAIN_OF_KIND: dict[str, str] = {
    **{k: "hardware" for k in ("node_lost", "ecc_dbe", "ecc_sbe", "nvlink_errors", "throttle",
                               "clock_below_peers", "straggler", "temperature_outlier")},
    **{k: "network" for k in ("congestion", "link_flap", "transport_errors", "nccl_timeout", "connection_reset",
                              "connection_refused", "network_error")},
    **{k: "user_code" for k in ("software_error", "illegal_memory_access")},
    **{k: "system_software" for k in ("process_exit", "task_hang", "cuda_error", "iteration_period_lost",
                                      "recovery_failed", "actuator_circuit_open")},
}
#: XID codes that an application causes, and those of drivers/firmware; the rest are hardware.
XID_USER_CODE = (13, 31, 43, 45, 68, 69)
XID_SYSTEM_SOFTWARE = (32, 38, 61, 109, 119, 120, 154)

#: Steps per row of ``job_step_blocks`` (all executions of a step fall in the same block).
STEP_BLOCK = 1024
#: Job sizes the MTTF projection is printed for.
PROJECTION_GPUS = (1000, 2000, 4000, 8000, 16000, 32000, 64000, 100000)
#: Lemon threshold: Bonferroni-corrected Poisson tail probability.
LEMON_ALPHA = 0.01


def _list(values: tuple) -> str:
    return ", ".join(repr(v) for v in values)


def _domain_sql() -> str:
    by_domain: dict[str, list[str]] = {}
    for kind, domain in DOMAIN_OF_KIND.items():
        by_domain.setdefault(domain, []).append(kind)
    arms = [f"kind = 'xid', multiIf(xid_code IN ({_list(XID_USER_CODE)}), 'user_code', "
            f"xid_code IN ({_list(XID_SYSTEM_SOFTWARE)}), 'system_software', 'hardware')",
            "kind = 'fail_slow', multiIf(slowdown_class = 'communication', 'network', "
            "slowdown_class = 'computation', 'hardware', 'system_software')"]
    arms += [f"kind IN ({_list(tuple(kinds))}), '{domain}'" for domain, kinds in by_domain.items()]
    return "multiIf(" + ", ".join(arms) + ", 'unknown')"


def _class_sql() -> str:
    return (f"multiIf(kind IN ({_list(FAIL_SLOW_KINDS)}), 'fail_slow', kind IN ({_list(VIGIL_KINDS)}), 'vigil', "
            f"kind IN ({_list(WARNING_KINDS)}) OR (kind = 'xid' AND severity = 3), 'warning', 'fail_stop')")


# --- the objects --------------------------------------------------------------

_T = "DateTime64(6, 'UTC')"
_W = f"toDateTime64({{since:{_T}}}, 6, 'UTC') AS w0, toDateTime64({{until:{_T}}}, 6, 'UTC') AS w1"


def _secs(x: str) -> str:
    return f"(toUnixTimestamp64Micro({x}) / 1e6)"


def _overlap(a: str, b: str) -> str:
    """Seconds of [a, b) inside the window [w0, w1)."""
    return f"greatest(0., {_secs(f'least({b}, w1)')} - {_secs(f'greatest({a}, w0)')})"


def _evidence_of(kind: str, key: str, ch_type: str) -> str:
    return (f"if(alert_kind = '{kind}', JSONExtract(arrayFirst(e -> JSONExtractString(e, 'kind') = '{kind}', "
            f"JSONExtractArrayRaw(evidence)), '{key}', '{ch_type}'), NULL)")


@dataclass(frozen=True)
class Rollup:
    """A table filled by a materialized view (or several) from an event table."""

    table: str
    ddl: str
    #: (view name, source table, SELECT that feeds the table from the source)
    feeds: tuple[tuple[str, str, str], ...]
    #: False for a table with sums (a row inserted twice counts twice): its backfill starts
    #: from an empty table and reads the source ``FINAL`` (without unmerged duplicates).
    idempotent: bool = True


ROLLUPS: tuple[Rollup, ...] = (
    Rollup(
        "incident_rollup",
        f"""(
    incident_id UUID,
    cluster SimpleAggregateFunction(max, String),
    first_version SimpleAggregateFunction(min, Int64),
    last_version SimpleAggregateFunction(max, Int64),
    kind AggregateFunction(argMax, String, Int64),
    first_kind AggregateFunction(argMin, String, Int64),
    detector AggregateFunction(argMin, String, Int64),
    severity SimpleAggregateFunction(min, Int64),
    onset_time SimpleAggregateFunction(min, {_T}),
    detection_time SimpleAggregateFunction(min, {_T}),
    opened_time SimpleAggregateFunction(min, {_T}),
    resolved_time SimpleAggregateFunction(min, Nullable({_T})),
    job AggregateFunction(argMax, String, Int64),
    node AggregateFunction(argMax, String, Int64),
    gpu AggregateFunction(argMax, Int64, Int64),
    rank AggregateFunction(argMax, Int64, Int64),
    link AggregateFunction(argMax, String, Int64),
    xid_code SimpleAggregateFunction(max, Nullable(Int64)),
    rel_change SimpleAggregateFunction(max, Nullable(Float64)),
    slowdown_class SimpleAggregateFunction(max, String)
) ENGINE = AggregatingMergeTree ORDER BY incident_id""",
        (("incident_rollup_mv", "alerts", f"""SELECT incident_id, max(cluster) AS cluster,
    min(incident_version) AS first_version, max(incident_version) AS last_version,
    argMaxState(alert_kind, incident_version) AS kind, argMinState(alert_kind, incident_version) AS first_kind,
    argMinState(toString(detector), incident_version) AS detector, min(severity) AS severity,
    min(onset_time) AS onset_time, min(detection_time) AS detection_time, min(event_time) AS opened_time,
    minIfOrNull(event_time, status = 'resolved') AS resolved_time,
    argMaxState(toString(ifNull(subject_job, '')), incident_version) AS job,
    argMaxState(toString(ifNull(subject_node, '')), incident_version) AS node,
    argMaxState(ifNull(subject_gpu, -1), incident_version) AS gpu,
    argMaxState(ifNull(subject_rank, -1), incident_version) AS rank,
    argMaxState(toString(ifNull(subject_link, '')), incident_version) AS link,
    max({_evidence_of('xid', 'code', 'Nullable(Int64)')}) AS xid_code,
    max({_evidence_of('fail_slow', 'rel_change', 'Nullable(Float64)')}) AS rel_change,
    max(ifNull({_evidence_of('fail_slow', 'slowdown_class', 'Nullable(String)')}, '')) AS slowdown_class
FROM (SELECT *, toString(kind) AS alert_kind FROM {{db}}.alerts) GROUP BY incident_id"""),),
    ),
    Rollup(
        "incident_slowdowns",
        """(
    incident_id UUID,
    job String,
    rel_change SimpleAggregateFunction(max, Nullable(Float64)),
    slowdown_class SimpleAggregateFunction(max, String)
) ENGINE = AggregatingMergeTree ORDER BY (incident_id, job)""",
        # Every version's slowdowns (JSON objects; rows stored before they were JSON hold other
        # strings, which name no job) and fail_slow evidence (present in every version since the
        # first): an incident rooted at a throttled GPU still names the job it slowed and by how much.
        (("incident_slowdowns_mv", "alerts", """SELECT incident_id, s.1 AS job, max(s.2) AS rel_change,
    max(s.3) AS slowdown_class
FROM {db}.alerts
ARRAY JOIN arrayConcat(
    arrayMap(x -> (JSONExtractString(x, 'job'), JSONExtract(x, 'rel_change', 'Nullable(Float64)'),
                   JSONExtractString(x, 'slowdown_class')), JSONExtractArrayRaw(slowdowns)),
    arrayMap(x -> (JSONExtractString(x, 'subject', 'job'), JSONExtract(x, 'rel_change', 'Nullable(Float64)'),
                   JSONExtractString(x, 'slowdown_class')),
             arrayFilter(x -> JSONExtractString(x, 'kind') = 'fail_slow', JSONExtractArrayRaw(evidence)))) AS s
WHERE s.1 != ''
GROUP BY incident_id, job"""),),
    ),
    Rollup(
        "job_steps",
        f"""(
    job String,
    cluster LowCardinality(String),
    step Int64,
    start {_T},
    end {_T},
    duration_s Float64,
    ranks UInt32
) ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(start) ORDER BY (job, step, start)
SETTINGS index_granularity = 1024""",
        (("job_steps_from_steps", "iteration_steps",
          "SELECT assumeNotNull(job) AS job, cluster, step, start, end, duration_s, toUInt32(length(ranks)) AS ranks "
          "FROM {db}.iteration_steps WHERE job IS NOT NULL"),
         ("job_steps_from_iterations", "iterations",
          "SELECT assumeNotNull(job) AS job, cluster, step, start, end, duration_s, toUInt32(1) AS ranks "
          "FROM {db}.iterations WHERE job IS NOT NULL AND rank = 0")),
    ),
    Rollup(
        "node_days",
        f"""(
    node String,
    day Date,
    first_seen SimpleAggregateFunction(min, {_T}),
    last_seen SimpleAggregateFunction(max, {_T})
) ENGINE = AggregatingMergeTree ORDER BY (node, day)""",
        (("node_days_mv", "heartbeats",
          "SELECT assumeNotNull(node) AS node, toDate(event_time) AS day, min(event_time) AS first_seen, "
          "max(event_time) AS last_seen FROM {db}.heartbeats WHERE node IS NOT NULL GROUP BY node, day"),),
    ),
    Rollup(
        "job_step_blocks",
        f"""(
    job String,
    block Int64,
    cluster SimpleAggregateFunction(max, LowCardinality(String)),
    rows SimpleAggregateFunction(sum, UInt64),
    steps AggregateFunction(groupBitmap, UInt64),
    duration_us SimpleAggregateFunction(sum, Int64),
    min_start SimpleAggregateFunction(min, {_T}),
    max_start SimpleAggregateFunction(max, {_T}),
    min_end SimpleAggregateFunction(min, {_T}),
    max_end SimpleAggregateFunction(max, {_T})
) ENGINE = AggregatingMergeTree ORDER BY (job, block)""",
        (("job_step_blocks_mv", "job_steps",
          f"SELECT job, intDiv(step, {STEP_BLOCK}) AS block, max(cluster) AS cluster, count() AS rows, "
          "groupBitmapState(toUInt64(step)) AS steps, "
          "sum(greatest(toInt64(0), toUnixTimestamp64Micro(end) - toUnixTimestamp64Micro(start))) AS duration_us, "
          "min(start) AS min_start, max(start) AS max_start, min(end) AS min_end, max(end) AS max_end "
          "FROM {db}.job_steps GROUP BY job, block"),),
        idempotent=False,
    ),
)

_INCIDENTS = f"""
SELECT incident_id, cluster, kind, first_kind, severity, detector, onset_time, detection_time, opened_time,
    resolved_time, job, node, gpu, rank, link, xid_code, rel_change, slowdown_class,
    {_domain_sql()} AS domain,
    {_class_sql()} AS failure_class,
    (toUnixTimestamp64Micro(detection_time) - toUnixTimestamp64Micro(onset_time)) / 1e6 AS detection_latency_s
FROM (
    -- FINAL merges each incident's rows as the table's merges do (min, max, argMax...), in key
    -- order and only where parts overlap: far cheaper than GROUP BY incident_id.
    SELECT incident_id, cluster, finalizeAggregation(kind) AS kind, finalizeAggregation(first_kind) AS first_kind,
        severity, finalizeAggregation(detector) AS detector, onset_time, detection_time, opened_time, resolved_time,
        nullIf(finalizeAggregation(job), '') AS job, nullIf(finalizeAggregation(node), '') AS node,
        nullIf(finalizeAggregation(gpu), -1) AS gpu, nullIf(finalizeAggregation(rank), -1) AS rank,
        nullIf(finalizeAggregation(link), '') AS link,
        xid_code, rel_change, nullIf(slowdown_class, '') AS slowdown_class
    FROM {{db}}.incident_rollup FINAL
)"""

_TAXONOMY = f"""
WITH {_W}
SELECT domain, kind, severity, xid_code, count() AS incidents, countIf(resolved_time IS NOT NULL) AS resolved
FROM {{db}}.incidents WHERE onset_time >= w0 AND onset_time < w1
GROUP BY domain, kind, severity, xid_code ORDER BY incidents DESC, domain, kind, severity, xid_code"""

_JOB_RUNS = f"""
SELECT job, cluster,
    least(ifNull(fr, fs), ifNull(fs, fr)) AS start,
    multiIf(st IN ('completed', 'failed', 'cancelled', 'preempted', 'time_limit'), lt,
            lt IS NOT NULL, greatest(now64(6, 'UTC'), lt), le) AS end,
    st AS state, g AS gpus, ns AS nodes,
    greatest(toUInt64(length(ns)), toUInt64(ceil(g / {GPUS_PER_NODE}))) AS node_count, nullIf(rn, '') AS run
FROM (
    SELECT job, max(cluster) AS cluster, min(first_running) AS fr, min(first_step) AS fs, max(last_step_end) AS le,
        max(last_state_time) AS lt, argMax(last_state, last_state_time) AS st, max(gpus) AS g,
        argMax(nodes, last_state_time) AS ns, max(run) AS rn
    FROM (
        SELECT assumeNotNull(job) AS job, max(cluster) AS cluster,
            minIfOrNull(event_time, state = 'running') AS first_running,
            CAST(NULL AS Nullable({_T})) AS first_step, CAST(NULL AS Nullable({_T})) AS last_step_end,
            toNullable(maxIf(event_time, state != 'pending')) AS last_state_time,
            toString(argMaxIf(state, event_time, state != 'pending')) AS last_state,
            max(gpus) AS gpus, argMaxIf(nodes, event_time, length(nodes) > 0) AS nodes,
            ifNull(max(run), '') AS run
        FROM {{db}}.job_states WHERE job IS NOT NULL GROUP BY job
        UNION ALL
        SELECT job, max(cluster), CAST(NULL AS Nullable({_T})), toNullable(min(min_start)), toNullable(max(max_end)),
            CAST(NULL AS Nullable({_T})), '', toInt64(0), CAST([] AS Array(String)), ''
        FROM {{db}}.job_step_blocks GROUP BY job
    ) GROUP BY job
)"""

# Blocks of steps (job_step_blocks merged) with where they lie in the window: ``clean`` (one row,
# so one execution, per step: no step re-executed or stored twice), ``inside`` (every execution
# starts and ends in the window, so each counts whole), ``outside`` (none can count).
_BLOCKS = """
    SELECT job, block, max_end, rows, duration_us, rows = distinct_steps AS clean,
        clean AND min_start >= w0 AND min_end > w0 AND max_start < w1 AND max_end <= w1 AS inside,
        max_end <= w0 OR min_start >= w1 AS outside
    FROM (
        SELECT job, block, sum(rows) AS rows, groupBitmapMerge(steps) AS distinct_steps, sum(duration_us) AS duration_us,
            min(min_start) AS min_start, max(max_start) AS max_start, min(min_end) AS min_end, max(max_end) AS max_end
        FROM {db}.job_step_blocks GROUP BY job, block
    )"""

# Productive time per job: the sums of blocks inside the window, plus, from the steps of the other
# blocks that reach into it, each step's last execution (the same as grouping every step; a block
# holds all executions of its steps).
_ETTR = f"""
WITH {_W}
SELECT r.job AS job, r.gpus AS gpus, {_overlap('r.start', 'r.end')} AS available_s,
    p.productive_s AS productive_s, if(available_s > 0, productive_s / available_s, NULL) AS ettr,
    p.steps AS steps, p.recomputed_steps AS recomputed_steps, r.state AS state
FROM (
    SELECT job, sum(productive_s) AS productive_s, sum(steps) AS steps, sum(recomputed_steps) AS recomputed_steps
    FROM (
        SELECT job, sumIf(duration_us, inside) / 1e6 AS productive_s, sumIf(rows, inside) AS steps,
            toInt64(0) AS recomputed_steps
        FROM ({_BLOCKS}) GROUP BY job HAVING max(max_end) > w0
        UNION ALL
        SELECT job, sum({_overlap('s', 'e')}) AS productive_s, countIf(e > w0 AND s < w1) AS steps,
            sumIf(executions - 1, e > w0 AND s < w1) AS recomputed_steps
        FROM (
            SELECT job, step, max(start) AS s, argMax(end, start) AS e, uniqExact(start) AS executions
            FROM {{db}}.job_steps
            WHERE end > w0 AND (job, intDiv(step, {STEP_BLOCK})) IN (
                SELECT job, block FROM ({_BLOCKS}) WHERE NOT inside AND NOT outside)
            GROUP BY job, step
        ) GROUP BY job
    ) GROUP BY job
) AS p
INNER JOIN {{db}}.job_runs AS r ON r.job = p.job
WHERE r.start < w1 AND r.end > w0
ORDER BY ettr, job"""

# A training run across its chain of jobs: the jobs' available and productive time added up, and the
# gaps between them (waiting in the queue for the next job) apart: unavailable, not a failure.
_RUN_ETTR = f"""
WITH {_W}
SELECT run, count() AS jobs, sum(job_available_s) AS available_s, sum(job_productive_s) AS productive_s,
    if(available_s > 0, productive_s / available_s, NULL) AS ettr,
    greatest(0., {_overlap('min(start)', 'max(end)')} - available_s) AS gap_s,
    sum(job_recomputed_steps) AS recomputed_steps, argMax(state, end) AS last_state
FROM (
    SELECT r.run AS run, r.start AS start, r.end AS end, r.state AS state, e.available_s AS job_available_s,
        e.productive_s AS job_productive_s, e.recomputed_steps AS job_recomputed_steps
    FROM {{db}}.job_runs AS r
    INNER JOIN ({_ETTR}) AS e ON e.job = r.job
    WHERE r.run IS NOT NULL
)
GROUP BY run ORDER BY ettr, run"""

# Jobs in the window with their runtime and the fail-stop incidents that hit them.
_JOB_FAILURES = f"""
WITH {_W}
SELECT r.job AS job, r.gpus AS gpus, r.node_count AS node_count, {_overlap('r.start', 'r.end')} AS runtime_s,
    ifNull(f.failures, 0) AS failures
FROM {{db}}.job_runs AS r
LEFT JOIN (
    SELECT job, uniqExact(incident_id) AS failures FROM (
        SELECT ifNull(job, '') AS job, incident_id FROM {{db}}.incidents
        WHERE failure_class = 'fail_stop' AND ifNull(job, '') != '' AND onset_time >= w0 AND onset_time < w1
        UNION ALL
        SELECT jr.job AS job, i.incident_id AS incident_id
        FROM (SELECT incident_id, ifNull(node, '') AS node, onset_time FROM {{db}}.incidents
              WHERE failure_class = 'fail_stop' AND job IS NULL AND ifNull(node, '') != ''
                AND onset_time >= w0 AND onset_time < w1) AS i
        INNER JOIN (SELECT job, start, end, arrayJoin(nodes) AS node FROM {{db}}.job_runs) AS jr ON jr.node = i.node
        WHERE i.onset_time >= jr.start AND i.onset_time <= jr.end
    ) GROUP BY job
) AS f ON f.job = r.job
WHERE r.start < w1 AND r.end > w0 AND runtime_s > 0"""

_MTTF_BY_SIZE = f"""
SELECT bucket_gpus, count() AS jobs, sum(rt) / 3600 AS runtime_h, sum(nf) AS failures,
    if(sum(nf) > 0, sum(rt) / 3600 / sum(nf), NULL) AS observed_mttf_h,
    any(rate) AS fleet_rate_per_node_day,
    if(any(rate) > 0, 24 / (any(rate) * bucket_gpus / {GPUS_PER_NODE}), NULL) AS expected_mttf_h
FROM (
    SELECT runtime_s AS rt, failures AS nf, toUInt64(pow(2, ceil(log2(greatest(gpus, 1))))) AS bucket_gpus,
        sum(failures) OVER () / nullIf(sum(node_count * runtime_s / 86400) OVER (), 0) AS rate
    FROM {{db}}.job_failures(since={{since:{_T}}}, until={{until:{_T}}})
) GROUP BY bucket_gpus ORDER BY bucket_gpus"""

_MTTF_PROJECTION = f"""
SELECT gpus, any(rate) AS fleet_rate_per_node_day,
    if(any(rate) > 0, 24 / (any(rate) * gpus / {GPUS_PER_NODE}), NULL) AS expected_mttf_h,
    anyIf(observed_mttf_h, bucket_gpus = toUInt64(pow(2, ceil(log2(gpus))))) AS observed_mttf_h_same_bucket
FROM (SELECT arrayJoin([{_list(PROJECTION_GPUS)}]) AS gpus) AS g
CROSS JOIN (
    SELECT bucket_gpus, observed_mttf_h, fleet_rate_per_node_day AS rate
    FROM {{db}}.mttf_by_size(since={{since:{_T}}}, until={{until:{_T}}})
) AS m
GROUP BY gpus ORDER BY gpus"""

_MTTR = f"""
WITH {_W}
SELECT action, count() AS incidents, avg(mttr_s) AS mean_s, quantileExact(0.5)(mttr_s) AS p50_s,
    quantileExact(0.9)(mttr_s) AS p90_s, max(mttr_s) AS max_s
FROM (
    SELECT i.incident_id AS incident_id,
        if(d.first_success IS NOT NULL, d.success_action, if(d.last_action != '', d.last_action, 'none')) AS action,
        least(ifNull(d.first_success, i.resolved_time), ifNull(i.resolved_time, d.first_success)) AS recovered,
        {_secs('recovered')} - {_secs('i.detection_time')} AS mttr_s
    FROM (SELECT incident_id, detection_time, resolved_time FROM {{db}}.incidents
          WHERE onset_time >= w0 AND onset_time < w1 AND failure_class IN ('fail_stop', 'fail_slow')) AS i
    LEFT JOIN (
        SELECT incident_id, min(succeeded) AS first_success,
            argMinIf(action, succeeded, succeeded IS NOT NULL) AS success_action,
            argMax(action, decided) AS last_action
        FROM (
            SELECT dd.incident_id AS incident_id, dd.action AS action, dd.decided AS decided, a.succeeded AS succeeded
            FROM (SELECT arrayJoin(answers) AS incident_id, decision_id, toString(action) AS action, event_time AS decided
                  FROM {{db}}.decisions) AS dd
            LEFT JOIN (SELECT decision_id, minIf(event_time, state = 'succeeded') AS succeeded
                       FROM {{db}}.actions GROUP BY decision_id HAVING countIf(state = 'succeeded') > 0) AS a
                ON a.decision_id = dd.decision_id
        ) GROUP BY incident_id
    ) AS d ON d.incident_id = i.incident_id
    WHERE recovered IS NOT NULL
) GROUP BY action ORDER BY action
SETTINGS join_use_nulls = 1"""

_DETECTION_LATENCY = f"""
WITH {_W}
SELECT detector, count() AS incidents, avg(detection_latency_s) AS mean_s,
    quantileExact(0.5)(detection_latency_s) AS p50_s, quantileExact(0.9)(detection_latency_s) AS p90_s,
    quantileExact(0.99)(detection_latency_s) AS p99_s, max(detection_latency_s) AS max_s
FROM {{db}}.incidents WHERE onset_time >= w0 AND onset_time < w1 AND failure_class != 'vigil'
GROUP BY detector ORDER BY detector"""

_FAILSLOW = f"""
WITH {_W}, least(w1, now64(6, 'UTC')) AS w_end
SELECT job, count() AS incidents, sum(slowed) AS slowed_s, sum(slowed * rel / (1 + rel)) AS lost_s,
    max(rel) AS worst_rel_change
FROM (
    SELECT s.job AS job, s.rel AS rel,
        greatest(0., {_secs('least(ifNull(i.resolved_time, w_end), w1, ifNull(r.end, w1))')}
                     - {_secs('greatest(i.onset_time, w0)')}) AS slowed
    FROM (SELECT incident_id, job, max(rel_change) AS rel FROM {{db}}.incident_slowdowns
          GROUP BY incident_id, job HAVING rel > 0) AS s
    INNER JOIN (SELECT incident_id, onset_time, resolved_time FROM {{db}}.incidents) AS i
        ON i.incident_id = s.incident_id
    LEFT JOIN (SELECT job, end FROM {{db}}.job_runs) AS r ON r.job = s.job
    WHERE i.onset_time < w1 AND ifNull(i.resolved_time, w_end) > w0
)
GROUP BY job ORDER BY lost_s DESC, job
SETTINGS join_use_nulls = 1"""

_LEMON = f"""
WITH {_W}
SELECT node, failures, node_days, expected, p_value,
    failures >= 2 AND p_value * nodes_seen < {LEMON_ALPHA} AS lemon
FROM (
    SELECT node, failures, node_days, ifNull(rate, 0.) * node_days AS expected, nodes_seen,
        multiIf(expected <= 0, if(failures > 0, 0., 1.), failures = 0, 1.,
            failures > expected,
            arraySum(arrayMap(i -> exp(-expected + i * log(expected) - lgamma(i + 1)),
                              range(toUInt64(failures), toUInt64(failures + 50 + ceil(10 * sqrt(expected)))))),
            greatest(0., 1 - arraySum(arrayMap(i -> exp(-expected + i * log(expected) - lgamma(i + 1)),
                                               range(toUInt64(failures)))))) AS p_value
    FROM (
        SELECT node, failures, node_days, sum(failures) OVER () / nullIf(sum(node_days) OVER (), 0) AS rate,
            count() OVER () AS nodes_seen
        FROM (
        -- a node with failures but no heartbeats is taken as in service all along (the longest exposure seen)
        SELECT node, failures, if(days > 0, days, max(days) OVER ()) AS node_days
        FROM (
            SELECT node, sum(failures) AS failures, sum(days) AS days FROM (
                SELECT ifNull(node, '') AS node, toUInt64(count()) AS failures, 0. AS days FROM {{db}}.incidents
                WHERE failure_class = 'fail_stop' AND domain != 'user_code' AND ifNull(node, '') != ''
                  AND onset_time >= w0 AND onset_time < w1 GROUP BY node
                UNION ALL
                SELECT node, toUInt64(0), sum({_overlap('fs', 'ls')}) / 86400 FROM (
                    SELECT node, day, min(first_seen) AS fs, max(last_seen) AS ls FROM {{db}}.node_days
                    WHERE day >= toDate32(w0) AND day <= toDate32(w1) GROUP BY node, day
                ) GROUP BY node
            ) GROUP BY node
        ))
    )
)
ORDER BY p_value, failures DESC, node"""

#: name -> (SELECT with {db}, parameterized by since/until?)
VIEWS: dict[str, str] = {
    "incidents": _INCIDENTS,
    "incident_taxonomy": _TAXONOMY,
    "job_runs": _JOB_RUNS,
    "ettr": _ETTR,
    "run_ettr": _RUN_ETTR,
    "job_failures": _JOB_FAILURES,
    "mttf_by_size": _MTTF_BY_SIZE,
    "mttf_projection": _MTTF_PROJECTION,
    "mttr_by_action": _MTTR,
    "detection_latency": _DETECTION_LATENCY,
    "failslow_lost": _FAILSLOW,
    "lemon_nodes": _LEMON,
}
WINDOWED = frozenset(name for name, sql in VIEWS.items() if "{since:" in sql)


def migrate_analytics(command: Callable[[str], Any], query: Callable[[str], list[tuple]], db: str,
                      rebuilt: set[str] = frozenset()) -> list[str]:
    """Create the rollups, their views (backfilled from the event tables once) and the views.

    ``rebuilt`` names event tables just rebuilt by a layout migration: their
    materialized views are created anew (a view follows the table it was
    created on). Returns what was done, for the log.
    """
    done: list[str] = []
    existing = dict(query(f"SELECT name, comment FROM system.tables WHERE database = '{db}'"))
    refilled: set[str] = set()  # rollups backfilled in this run
    for rollup in ROLLUPS:
        command(f"CREATE TABLE IF NOT EXISTS {db}.{rollup.table} {rollup.ddl}")
        created = False
        for view, source, select in rollup.feeds:
            sql = select.replace("{db}", db)
            # The comment records the definition, so a changed feed is replaced. (A feed
            # whose meaning changes should fill a new table: old rows are not recomputed.)
            tag = "vigil:" + hashlib.sha1(select.encode()).hexdigest()[:16]
            if view in existing and (source in rebuilt or existing[view] != tag):
                command(f"DROP VIEW IF EXISTS {db}.{view}")
                del existing[view]
            if view not in existing:
                command(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{view} TO {db}.{rollup.table} AS {sql} "
                        f"COMMENT '{tag}'")
                created = True
                if rollup.idempotent:
                    # Rows stored before the view existed; idempotent aggregates make an overlap harmless.
                    command(f"INSERT INTO {db}.{rollup.table} {sql}")
                    refilled.add(rollup.table)
                    done.append(f"created {view} and backfilled {rollup.table} from {source}")
                else:
                    done.append(f"created {view}")
        if not rollup.idempotent and (created or any(source in refilled for _, source, _ in rollup.feeds)):
            # Sums: start from empty (a rollup it is fed from may just have been backfilled through
            # its views) and read the sources without their unmerged duplicates.
            command(f"TRUNCATE TABLE {db}.{rollup.table}")
            for _, source, select in rollup.feeds:
                src = f"FROM {db}.{source}"
                command(f"INSERT INTO {db}.{rollup.table} {select.replace('{db}', db).replace(src, src + ' FINAL')}")
            refilled.add(rollup.table)
            done.append(f"backfilled {rollup.table} from {', '.join(sorted({s for _, s, _ in rollup.feeds}))}")
    for name, sql in VIEWS.items():
        body = sql.replace("{db}", db)
        command(f"CREATE OR REPLACE VIEW {db}.{name} AS {body}")
    return done


def _time_literal(value: str | None, default: str) -> str:
    if value is None:
        return default
    quoted = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"parseDateTime64BestEffort('{quoted}', 6, 'UTC')"


def window_args(since: str | None = None, until: str | None = None) -> str:
    """``since=..., until=...`` arguments of a windowed view (defaults: all time).

    Values are ClickHouse date-time literals as ``parseDateTime64BestEffort``
    reads them (``2026-01-31``, ``2026-01-31 12:00:00``, ISO 8601).
    """
    s = _time_literal(since, "toDateTime64(0, 6, 'UTC')")
    u = _time_literal(until, "toDateTime64('2261-12-31 00:00:00', 6, 'UTC')")
    return f"since={s}, until={u}"
