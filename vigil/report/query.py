"""The report's data: every analytics view queried for a window (and a job), held in a :class:`Report`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from vigil.streams.analytics import window_args

#: Most points plotted per job; longer series are averaged into buckets (max kept too).
MAX_POINTS = 2000


class Queryable(Protocol):
    def query(self, sql: str) -> Any: ...


def parse_when(value: str | None, now: datetime) -> datetime | None:
    """``7d``, ``12h``, ``30m`` before ``now``, or an ISO 8601 time (UTC when no zone); None stays None."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return now - timedelta(**{unit: float(m.group(1))})
    moment = datetime.fromisoformat(value.strip())
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _ts(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


@dataclass(frozen=True)
class IncidentRow:
    """One incident as the report shows it."""

    onset: datetime
    resolved: datetime | None
    kind: str
    severity: int
    subject: str  #: the job, else the node, else the cluster
    job: str | None
    node: str | None
    #: jobs it slowed down (an incident rooted at a GPU or a link names the job in its slowdowns)
    slowed_jobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobRunRow:
    """A job's span and size as ``job_runs`` has them (from its published states and its steps)."""

    start: datetime | None
    end: datetime | None
    state: str
    gpus: int
    nodes: tuple[str, ...]


@dataclass
class Report:
    since: datetime
    until: datetime
    job: str | None
    tables: dict[str, tuple[list[str], list[tuple]]] = field(default_factory=dict)
    #: job -> (times, durations, max durations)
    series: dict[str, tuple[list[datetime], list[float], list[float]]] = field(default_factory=dict)
    #: job -> onsets of change points (fail-slow findings and incidents)
    change_points: dict[str, list[datetime]] = field(default_factory=dict)
    incidents: list[IncidentRow] = field(default_factory=list)
    runs: dict[str, JobRunRow] = field(default_factory=dict)

    def rows(self, name: str) -> list[dict[str, Any]]:
        cols, rows = self.tables.get(name, ([], []))
        return [dict(zip(cols, r)) for r in rows]

    def incidents_of(self, job: str) -> list[IncidentRow]:
        """Incidents that hit ``job``: about it, slowing it, or on one of its nodes while it ran."""
        run = self.runs.get(job)
        out = []
        for inc in self.incidents:
            on_its_node = run is not None and inc.job is None and inc.node in run.nodes and \
                (run.start is None or inc.onset >= run.start) and (run.end is None or inc.onset <= run.end)
            if inc.job == job or job in inc.slowed_jobs or on_its_node:
                out.append(inc)
        return out


TITLES = {
    "taxonomy": "Incidents by domain, kind, severity and XID code",
    "ettr": "ETTR per job (productive / available time)",
    "mttf": "MTTF by job size, observed and predicted by the fleet failure rate",
    "projection": "Expected MTTF at scale (fleet failure rate per node-day)",
    "mttr": "MTTR (detection to recovery) by action",
    "latency": "Detection latency by detector",
    "failslow": "Time lost to fail-slow",
    "lemons": "Lemon-node ranking (Poisson tail probability of the failure count)",
}

#: How each table is read (printed under it).
NOTES = {
    "ettr": "available = the job's span: its first running state or step to its terminal state (completed, "
            "failed, cancelled); not ended yet: to now; no state published: to its last step. productive = "
            "each step's last execution (work redone after a restart is lost).",
    "mttf": "failures = fail-stop incidents of the job or of a node it ran on; job sizes come from the jobs' "
            "published states (gpus 0: the job published none).",
    "failslow": "lost = slowed time x rel / (1 + rel): slowed time from the incident's onset to its resolution "
                "(or the job's end), rel the job's measured slowdown, whatever the incident's root (GPU, link, "
                "straggler).",
}


def collect(history: Queryable, db: str, since: datetime, until: datetime, job: str | None = None) -> Report:
    """Query every view for the window (and one job, when given)."""
    rep = Report(since, until, job)
    w = window_args(_ts(since), _ts(until))

    def table(name: str, sql: str) -> None:
        r = history.query(sql)
        rep.tables[name] = (list(r.columns), [tuple(row) for row in r.rows])

    jq = "" if job is None else f" WHERE job = '{_quote(job)}'"
    table("taxonomy", f"SELECT domain, kind, severity, xid_code, incidents, resolved FROM {db}.incident_taxonomy({w})")
    table("ettr", f"SELECT job, gpus, state, ettr, available_s, productive_s, recomputed_steps "
                  f"FROM {db}.ettr({w}){jq}")
    table("mttf", f"SELECT bucket_gpus, jobs, runtime_h, failures, observed_mttf_h, expected_mttf_h "
                  f"FROM {db}.mttf_by_size({w})")
    table("projection", f"SELECT gpus, fleet_rate_per_node_day, expected_mttf_h FROM {db}.mttf_projection({w})")
    table("mttr", f"SELECT action, incidents, mean_s, p50_s, p90_s, max_s FROM {db}.mttr_by_action({w})")
    table("latency", f"SELECT detector, incidents, mean_s, p50_s, p90_s, p99_s, max_s FROM {db}.detection_latency({w})")
    table("failslow", f"SELECT job, incidents, slowed_s, lost_s, worst_rel_change FROM {db}.failslow_lost({w}){jq}")
    table("lemons", f"SELECT node, failures, node_days, expected, p_value, lemon FROM {db}.lemon_nodes({w}) LIMIT 20")

    t0, t1 = _ts(since), _ts(until)
    window = f"start >= '{t0}' AND start < '{t1}'"
    jobs = [r[0] for r in history.query(
        f"SELECT job FROM {db}.job_steps WHERE {window}{'' if job is None else f' AND job = {_sq(job)}'} "
        f"GROUP BY job ORDER BY count() DESC LIMIT 12").rows]
    for j in jobs:
        n, lo, hi = history.query(f"SELECT count(), toUnixTimestamp64Micro(min(start)), "
                                  f"toUnixTimestamp64Micro(max(start)) FROM {db}.job_steps "
                                  f"WHERE job = {_sq(j)} AND {window}").rows[0]
        bucket_us = max(1, (int(hi) - int(lo)) // MAX_POINTS + 1) if n > MAX_POINTS else 1
        rows = history.query(
            f"SELECT intDiv(toUnixTimestamp64Micro(start), {bucket_us}) AS b, "
            f"min(toUnixTimestamp64Micro(start)) / 1e6, avg(duration_s), max(duration_s) "
            f"FROM {db}.job_steps WHERE job = {_sq(j)} AND {window} GROUP BY b ORDER BY b").rows
        rep.series[j] = ([_dt(r[1]) for r in rows], [float(r[2]) for r in rows], [float(r[3]) for r in rows])
        cps = history.query(
            f"SELECT toUnixTimestamp64Micro(onset_time) / 1e6 FROM {db}.findings WHERE subject_job = {_sq(j)} "
            f"AND kind IN ('fail_slow', 'recovery') AND status = 'raised' AND onset_time >= '{t0}' "
            f"AND onset_time < '{t1}' UNION DISTINCT SELECT toUnixTimestamp64Micro(onset_time) / 1e6 "
            f"FROM {db}.incidents WHERE job = {_sq(j)} AND kind = 'fail_slow' AND onset_time >= '{t0}' "
            f"AND onset_time < '{t1}'").rows
        rep.change_points[j] = sorted(_dt(r[0]) for r in cps)
    if jobs or job is not None:
        wanted = sorted(set(jobs) | ({job} if job is not None else set()))
        for r in history.query(
                f"SELECT job, toUnixTimestamp64Micro(start) / 1e6, toUnixTimestamp64Micro(end) / 1e6, state, gpus, "
                f"nodes FROM {db}.job_runs WHERE job IN ({', '.join(_sq(j) for j in wanted)})").rows:
            rep.runs[r[0]] = JobRunRow(None if r[1] is None else _dt(r[1]), None if r[2] is None else _dt(r[2]),
                                    r[3] or "", int(r[4] or 0), tuple(r[5] or ()))
    inc_filter = "" if job is None else (
        f" AND (i.job = {_sq(job)} OR has(ifNull((SELECT any(nodes) FROM {db}.job_runs WHERE job = {_sq(job)}), []), "
        f"ifNull(i.node, '')) OR i.incident_id IN (SELECT incident_id FROM {db}.incident_slowdowns "
        f"WHERE job = {_sq(job)}))")
    for r in history.query(
            f"SELECT toUnixTimestamp64Micro(i.onset_time) / 1e6, toUnixTimestamp64Micro(i.resolved_time) / 1e6, "
            f"i.kind, i.severity, coalesce(i.job, i.node, i.cluster), i.job, i.node, s.jobs "
            f"FROM {db}.incidents AS i LEFT JOIN (SELECT incident_id, groupUniqArray(job) AS jobs "
            f"FROM {db}.incident_slowdowns GROUP BY incident_id) AS s ON s.incident_id = i.incident_id "
            f"WHERE i.onset_time >= '{t0}' AND i.onset_time < '{t1}'{inc_filter} ORDER BY i.onset_time").rows:
        rep.incidents.append(IncidentRow(_dt(r[0]), None if r[1] is None else _dt(r[1]), r[2], int(r[3]), r[4], r[5],
                                      r[6], tuple(sorted(r[7] or ()))))
    return rep


def _dt(seconds: Any) -> datetime:
    return datetime.fromtimestamp(float(seconds), timezone.utc)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _sq(value: str) -> str:
    return f"'{_quote(value)}'"
