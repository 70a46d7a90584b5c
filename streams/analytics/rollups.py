"""The rollup tables, each with the materialized views that fill it as the sink inserts."""

from __future__ import annotations

from dataclasses import dataclass

from vigil.streams.analytics.sql import _T, _evidence_of

#: Steps per row of ``job_step_blocks`` (all executions of a step fall in the same block).
STEP_BLOCK = 1024


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
