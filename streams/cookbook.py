"""The SQL cookbook: questions operators ask of the failure history, each with its query.

The README's "SQL cookbook" section shows these queries verbatim (a test
checks it, and runs every one against a populated history with known
answers); ``vigil bench history`` times them. The window is written as
literal dates to edit; ``now64() - INTERVAL 7 DAY`` works as well.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    question: str
    sql: str


_W = "since = '2026-03-02 00:00:00', until = '2026-03-04 00:00:00'"

COOKBOOK: tuple[Recipe, ...] = (
    Recipe("lemon_nodes", "Which nodes keep failing more than chance allows (lemons to drain)?", f"""\
SELECT node, failures, round(expected, 3) AS expected, p_value, lemon
FROM vigil.lemon_nodes({_W})
ORDER BY p_value, failures DESC
LIMIT 10"""),
    Recipe("ettr", "What fraction of each job's time was productive training (ETTR)?", f"""\
SELECT job, gpus, round(ettr, 3) AS ettr, round(available_s / 3600, 2) AS available_h,
       round((available_s - productive_s) / 3600, 2) AS lost_h, recomputed_steps
FROM vigil.ettr({_W})
ORDER BY ettr"""),
    Recipe("domains", "What did we lose time to: failures by domain and kind?", f"""\
SELECT domain, kind, sum(incidents) AS incidents
FROM vigil.incident_taxonomy({_W})
GROUP BY domain, kind
ORDER BY incidents DESC, domain, kind"""),
    Recipe("mttf_by_size", "Is our MTTF what the fleet's failure rate predicts, by job size?", f"""\
SELECT bucket_gpus, jobs, failures, round(observed_mttf_h, 2) AS observed_mttf_h,
       round(expected_mttf_h, 2) AS expected_mttf_h, round(fleet_rate_per_node_day, 4) AS failures_per_node_day
FROM vigil.mttf_by_size({_W})"""),
    Recipe("mttf_projection", "What MTTF should a 1k to 100k GPU job expect at this failure rate?", f"""\
SELECT gpus, round(expected_mttf_h * 60, 1) AS expected_mttf_min
FROM vigil.mttf_projection({_W})"""),
    Recipe("mttr", "How fast do we recover, per action?", f"""\
SELECT action, incidents, round(mean_s, 1) AS mean_s, round(p50_s, 1) AS p50_s, round(p90_s, 1) AS p90_s
FROM vigil.mttr_by_action({_W})
ORDER BY mean_s"""),
    Recipe("detection_latency", "How fast do we detect, per detector?", f"""\
SELECT detector, incidents, round(p50_s, 2) AS p50_s, round(p99_s, 2) AS p99_s, round(max_s, 2) AS max_s
FROM vigil.detection_latency({_W})
ORDER BY p50_s DESC"""),
    Recipe("xid_codes", "Which XID codes hit us most, and on how many nodes?", """\
SELECT xid_code, count() AS incidents, uniqExact(node) AS nodes, groupUniqArray(node) AS which
FROM vigil.incidents
WHERE kind = 'xid' AND onset_time >= '2026-03-02 00:00:00' AND onset_time < '2026-03-04 00:00:00'
GROUP BY xid_code
ORDER BY incidents DESC, xid_code"""),
    Recipe("failslow", "How much time did slow (not failed) hardware cost each job?", f"""\
SELECT job, incidents, round(slowed_s / 60, 1) AS slowed_min, round(lost_s / 60, 1) AS lost_min
FROM vigil.failslow_lost({_W})"""),
    Recipe("open_incidents", "Which incidents are still open, worst first?", """\
SELECT severity, kind, coalesce(job, node) AS subject, onset_time,
       dateDiff('minute', onset_time, now64()) AS open_min
FROM vigil.incidents
WHERE resolved_time IS NULL AND failure_class != 'vigil'
ORDER BY severity, onset_time"""),
    Recipe("run_ettr", "Over a chain of jobs (a run under a time limit), how productive was it, and how long did it queue?", f"""\
SELECT run, jobs, round(ettr, 3) AS ettr, round(available_s / 3600, 2) AS available_h,
       round(gap_s / 3600, 2) AS queued_h, last_state
FROM vigil.run_ettr({_W})
ORDER BY ettr"""),
)
