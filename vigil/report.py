"""``vigil report``: the failure history as terminal tables and an HTML page with plots.

Everything comes from the analytics views (``streams/analytics.py``) through
whatever answers SQL: the ClickHouse store, or a running stack's query
service. Plots are matplotlib figures inlined as SVG, so the page is one
file with nothing to fetch.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from vigil.streams.analytics import window_args

#: Most points plotted per job; longer series are averaged into buckets (max kept too).
MAX_POINTS = 2000
SEVERITY_COLOURS = {1: "#d62728", 2: "#ff7f0e", 3: "#1f77b4"}


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
    #: (onset, resolved or None, kind, severity, subject, job)
    incidents: list[tuple] = field(default_factory=list)

    def rows(self, name: str) -> list[dict[str, Any]]:
        cols, rows = self.tables.get(name, ([], []))
        return [dict(zip(cols, r)) for r in rows]


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


def collect(history: Queryable, db: str, since: datetime, until: datetime, job: str | None = None) -> Report:
    """Query every view for the window (and one job, when given)."""
    rep = Report(since, until, job)
    w = window_args(_ts(since), _ts(until))

    def table(name: str, sql: str) -> None:
        r = history.query(sql)
        rep.tables[name] = (list(r.columns), [tuple(row) for row in r.rows])

    jq = "" if job is None else f" WHERE job = '{_quote(job)}'"
    table("taxonomy", f"SELECT domain, kind, severity, xid_code, incidents, resolved FROM {db}.incident_taxonomy({w})")
    table("ettr", f"SELECT job, gpus, ettr, available_s, productive_s, recomputed_steps FROM {db}.ettr({w}){jq}")
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
        rep.series[j] = ([datetime.fromtimestamp(float(r[1]), timezone.utc) for r in rows],
                         [float(r[2]) for r in rows], [float(r[3]) for r in rows])
        cps = history.query(
            f"SELECT toUnixTimestamp64Micro(onset_time) / 1e6 FROM {db}.findings WHERE subject_job = {_sq(j)} "
            f"AND kind IN ('fail_slow', 'recovery') AND status = 'raised' AND onset_time >= '{t0}' "
            f"AND onset_time < '{t1}' UNION DISTINCT SELECT toUnixTimestamp64Micro(onset_time) / 1e6 "
            f"FROM {db}.incidents WHERE job = {_sq(j)} AND kind = 'fail_slow' AND onset_time >= '{t0}' "
            f"AND onset_time < '{t1}'").rows
        rep.change_points[j] = sorted(datetime.fromtimestamp(float(r[0]), timezone.utc) for r in cps)
    inc_filter = "" if job is None else (
        f" AND (job = {_sq(job)} OR has(ifNull((SELECT any(nodes) FROM {db}.job_runs WHERE job = {_sq(job)}), []), "
        f"ifNull(node, '')))")
    for r in history.query(
            f"SELECT toUnixTimestamp64Micro(onset_time) / 1e6, toUnixTimestamp64Micro(resolved_time) / 1e6, kind, "
            f"severity, coalesce(job, node, cluster), job, node FROM {db}.incidents "
            f"WHERE onset_time >= '{t0}' AND onset_time < '{t1}'{inc_filter} ORDER BY onset_time").rows:
        onset = datetime.fromtimestamp(float(r[0]), timezone.utc)
        resolved = None if r[1] is None else datetime.fromtimestamp(float(r[1]), timezone.utc)
        rep.incidents.append((onset, resolved, r[2], int(r[3]), r[4], r[5], r[6]))
    return rep


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _sq(value: str) -> str:
    return f"'{_quote(value)}'"


# --- terminal -------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.1f}"
    return str(v)


def print_report(rep: Report, console: Any) -> None:
    from rich.table import Table

    console.print(f"[bold]vigil report[/bold] {_ts(rep.since)[:19]} .. {_ts(rep.until)[:19]} UTC"
                  + (f", job {rep.job}" if rep.job else ""))
    for name, title in TITLES.items():
        cols, rows = rep.tables[name]
        table = Table(*cols, title=title, title_justify="left")
        for row in rows:
            table.add_row(*(_fmt(v) for v in row))
        if not rows:
            table.add_row(*(["(none)"] + [""] * (len(cols) - 1)))
        console.print(table)


# --- HTML -------------------------------------------------------------------------


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _break_gaps(times: list, mean: list, peak: list) -> tuple[list, list, list]:
    """Insert a NaN where no step ran for over 3x the typical spacing (a restart, a hang): the line breaks."""
    if len(times) < 3:
        return times, mean, peak
    gaps = sorted((b - a).total_seconds() for a, b in zip(times, times[1:]))
    limit = 3 * gaps[len(gaps) // 2]
    t2, m2, p2 = [times[0]], [mean[0]], [peak[0]]
    for prev, t, m, p in zip(times, times[1:], mean[1:], peak[1:]):
        if (t - prev).total_seconds() > limit:
            t2.append(prev + (t - prev) / 2)
            m2.append(float("nan"))
            p2.append(float("nan"))
        t2.append(t)
        m2.append(m)
        p2.append(p)
    return t2, m2, p2


def _plots(rep: Report) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    plots: dict[str, str] = {}
    for job, (times, mean, peak) in rep.series.items():
        times, mean, peak = _break_gaps(times, mean, peak)
        fig, ax = plt.subplots(figsize=(10, 3.2))
        ax.plot(times, mean, lw=0.9, color="#333", label="iteration time (s)")
        if any(p > m for p, m in zip(peak, mean)):
            ax.plot(times, peak, lw=0.5, color="#999", label="max in bucket")
        for cp in rep.change_points.get(job, []):
            ax.axvline(cp, color="#9467bd", ls="--", lw=1.2)
        nodes_hit = [i for i in rep.incidents if i[5] == job]
        for onset, _, kind, sev, *_ in nodes_hit:
            ax.axvline(onset, color=SEVERITY_COLOURS.get(sev, "#777"), lw=1.5, alpha=0.8)
            ax.annotate(kind, (onset, ax.get_ylim()[1]), rotation=90, fontsize=7, va="top", ha="right")
        ax.set_title(f"{job}: iteration time, change points (dashed) and incidents (by severity)", fontsize=10)
        ax.set_ylabel("seconds")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
        ax.legend(loc="upper left", fontsize=8)
        plots[f"iterations-{job}"] = _svg(fig)

    if rep.incidents:
        kinds = sorted({i[2] for i in rep.incidents})
        fig, ax = plt.subplots(figsize=(10, 0.6 + 0.35 * len(kinds)))
        for onset, resolved, kind, sev, *_ in rep.incidents:
            y = kinds.index(kind)
            end = resolved or rep.until
            ax.plot([onset, end], [y, y], color=SEVERITY_COLOURS.get(sev, "#777"), lw=4, alpha=0.5,
                    solid_capstyle="butt")
            ax.plot([onset], [y], "o", color=SEVERITY_COLOURS.get(sev, "#777"), ms=5)
        ax.set_yticks(range(len(kinds)), kinds, fontsize=8)
        ax.set_title("Incidents: onset (dot) to resolution (bar); red sev1, orange sev2, blue sev3", fontsize=10)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
        plots["timeline"] = _svg(fig)

    ettr = rep.rows("ettr")
    if ettr:
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.35 * len(ettr)))
        ax.barh([r["job"] for r in ettr], [r["ettr"] or 0 for r in ettr], color="#2ca02c")
        ax.set_xlim(0, 1)
        ax.set_xlabel("ETTR")
        ax.set_title("ETTR per job", fontsize=10)
        plots["ettr"] = _svg(fig)

    lemons = [r for r in rep.rows("lemons") if r["failures"]]
    if lemons:
        import math

        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.35 * len(lemons)))
        score = [-math.log10(max(r["p_value"], 1e-300)) for r in lemons]
        ax.barh([r["node"] for r in lemons][::-1], score[::-1],
                color=["#d62728" if r["lemon"] else "#7f7f7f" for r in lemons][::-1])
        ax.set_xlabel("-log10 P(failures >= observed | fleet rate)")
        ax.set_title("Lemon nodes (red: improbable under the fleet rate)", fontsize=10)
        plots["lemons"] = _svg(fig)
    return plots


def _html_table(cols: list[str], rows: list[tuple]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or '<tr><td>(none)</td></tr>'}</tbody></table>"


def render_html(rep: Report) -> str:
    plots = _plots(rep)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vigil report</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1100px} table{border-collapse:collapse;margin:.5em 0 1.5em}",
        "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:right} th{background:#f3f3f3}",
        "figure{margin:0 0 1.5em} svg{max-width:100%;height:auto}",
        "</style></head><body>",
        f"<h1>vigil report</h1><p>Window {_ts(rep.since)[:19]} to {_ts(rep.until)[:19]} UTC"
        + (f", job <b>{html.escape(rep.job)}</b>" if rep.job else "") + f"; {len(rep.incidents)} incidents.</p>",
        "<h2>Iteration time per job</h2>",
    ]
    iteration_plots = [k for k in plots if k.startswith("iterations-")]
    for key in iteration_plots:
        parts.append(f"<figure class='plot' id='{html.escape(key)}' data-job='{html.escape(key[11:])}'>"
                     f"{plots[key]}</figure>")
    if not iteration_plots:
        parts.append("<p>(no iteration timings in the window)</p>")
    parts.append("<h2>Incidents on a timeline</h2>")
    parts.append(f"<figure class='plot' id='timeline'>{plots['timeline']}</figure>" if "timeline" in plots
                 else "<p>(no incidents)</p>")
    parts.append(f"<h2>{TITLES['ettr']}</h2>")
    if "ettr" in plots:
        parts.append(f"<figure class='plot' id='ettr'>{plots['ettr']}</figure>")
    parts.append(_html_table(*rep.tables["ettr"]))
    parts.append(f"<h2>{TITLES['lemons']}</h2>")
    if "lemons" in plots:
        parts.append(f"<figure class='plot' id='lemons'>{plots['lemons']}</figure>")
    parts.append(_html_table(*rep.tables["lemons"]))
    for name in ("taxonomy", "mttf", "projection", "mttr", "latency", "failslow"):
        parts.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        parts.append(_html_table(*rep.tables[name]))
    parts.append("</body></html>")
    return "\n".join(parts)
