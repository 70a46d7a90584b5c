"""The SQL of each analytics view (most take a window ``since``/``until``), by name in :data:`VIEWS`."""

from __future__ import annotations

from vigil.schemas import GPUS_PER_NODE
from vigil.streams.analytics.rollups import STEP_BLOCK
from vigil.streams.analytics.sql import _T, _W, _list, _overlap, _secs
from vigil.streams.analytics.taxonomy import _class_sql, _domain_sql

#: Job sizes the MTTF projection is printed for.
PROJECTION_GPUS = (1000, 2000, 4000, 8000, 16000, 32000, 64000, 100000)
#: Lemon threshold: Bonferroni-corrected Poisson tail probability.
LEMON_ALPHA = 0.01

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
