"""``vigil report``: the failure history as terminal tables and an HTML page with plots.

Everything comes from the analytics views (``streams/analytics/``) through
whatever answers SQL: the ClickHouse store, or a running stack's query
service. Plots are matplotlib figures inlined as SVG, so the page is one
file with nothing to fetch.
"""

from __future__ import annotations

import html
import io
import math
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
        if not cols:
            console.print(f"[italic]{title}[/italic]: (none)")
            continue
        table = Table(*cols, title=title, title_justify="left", caption=NOTES.get(name), caption_justify="left")
        for row in rows:
            table.add_row(*(_fmt(v) for v in row))
        if not rows:
            table.add_row(*(["(none)"] + [""] * (len(cols) - 1)))
        console.print(table)


# --- HTML -------------------------------------------------------------------------

#: Rows of the incident timeline at most (the worst and earliest subjects first).
MAX_TIMELINE_ROWS = 40


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    # Text as <text> (not glyph outlines): smaller, selectable, and what a test can read back.
    with plt.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


#: Tick steps (seconds) a time axis picks from: the first that gives at most ``MAX_TICKS`` ticks.
TICK_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600,
              6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400, 56 * 86400, 112 * 86400)
MAX_TICKS = 8


def time_ticks(t0: datetime, t1: datetime) -> list[tuple[datetime, str]]:
    """Ticks of a time axis over [t0, t1] (UTC) with labels that differ from each other.

    The step is the smallest of :data:`TICK_STEPS` that gives at most
    :data:`MAX_TICKS` ticks, aligned to whole multiples of it (midnight UTC
    for days); a label shows as much as its step needs: ``23:04:45`` for
    seconds, ``23:05`` for minutes within a day, ``Mar 03 06:00`` for hours
    across days, ``Mar 03`` for days.
    """
    a, b = t0.timestamp(), t1.timestamp()
    if b <= a:
        b = a + 1.0
    span = b - a
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])
    first = math.ceil(a / step - 1e-9) * step
    n = int(math.floor((b - first) / step + 1e-9)) + 1
    moments = [datetime.fromtimestamp(first + k * step, timezone.utc) for k in range(max(n, 0))]
    if step < 1:
        digits = 1 if step >= 0.1 else 3
        labels = [m.strftime("%H:%M:%S.%f")[:9 + digits] for m in moments]
    elif step < 60:
        labels = [m.strftime("%H:%M:%S") for m in moments]
    elif step < 86400:
        labels = [m.strftime("%H:%M" if span < 86400 else "%b %d %H:%M") for m in moments]
    else:
        labels = [m.strftime("%b %d" if span < 300 * 86400 else "%Y-%m-%d") for m in moments]
    return list(zip(moments, labels))


def time_axis(ax: Any, t0: datetime, t1: datetime) -> None:
    """Set the x axis of ``ax`` to [t0, t1] with :func:`time_ticks` and a label naming the date(s)."""
    import matplotlib.dates as mdates
    from matplotlib.ticker import FixedFormatter, FixedLocator

    if t1 <= t0:
        t1 = t0 + timedelta(seconds=1)
    ticks = time_ticks(t0, t1)
    ax.set_xlim(t0, t1)
    ax.xaxis.set_major_locator(FixedLocator([mdates.date2num(m) for m, _ in ticks]))
    ax.xaxis.set_major_formatter(FixedFormatter([label for _, label in ticks]))
    d0, d1 = (ticks[0][0], ticks[-1][0]) if ticks else (t0.astimezone(timezone.utc), t1.astimezone(timezone.utc))
    days = d0.strftime("%Y-%m-%d") + ("" if d0.date() == d1.date() else d1.strftime(" to %Y-%m-%d"))
    ax.set_xlabel(f"time (UTC), {days}", fontsize=8)


def _pad(t0: datetime, t1: datetime, frac: float = 0.02) -> tuple[datetime, datetime]:
    span = max((t1 - t0).total_seconds(), 1.0)
    return t0 - timedelta(seconds=span * frac), t1 + timedelta(seconds=span * frac)


def _gaps(times: list[datetime]) -> tuple[list[tuple[datetime, datetime]], float]:
    """Where no step started for over 3x the typical spacing (a hang, a restart), and that spacing."""
    if len(times) < 3:
        return [], 0.0
    spacing = sorted((b - a).total_seconds() for a, b in zip(times, times[1:]))[(len(times) - 1) // 2]
    return [(a, b) for a, b in zip(times, times[1:]) if (b - a).total_seconds() > 3 * spacing], spacing


def _break_gaps(times: list, mean: list, peak: list) -> tuple[list, list, list]:
    """Insert a NaN where no step ran for over 3x the typical spacing (a restart, a hang): the line breaks."""
    gaps, _ = _gaps(times)
    if not gaps:
        return times, mean, peak
    starts = {a for a, _ in gaps}
    t2, m2, p2 = [], [], []
    for i, (t, m, p) in enumerate(zip(times, mean, peak)):
        t2.append(t)
        m2.append(m)
        p2.append(p)
        if t in starts and i + 1 < len(times):
            t2.append(t + (times[i + 1] - t) / 2)
            m2.append(float("nan"))
            p2.append(float("nan"))
    return t2, m2, p2


def timeline_rows(incidents: list[IncidentRow], end: datetime) -> list[tuple[str, list[IncidentRow]]]:
    """Rows of the incident timeline: one per subject, labelled with it, worst subjects first.

    Incidents of one subject share its row unless their bars (onset to
    resolution, or ``end`` while open) overlap: an overlapping one opens a
    further row for that subject, so no two bars ever overlap. Rows are
    ordered by the subject's worst severity, then its first onset.
    """
    by_subject: dict[str, list[IncidentRow]] = {}
    for inc in sorted(incidents, key=lambda i: (i.onset, i.severity, i.kind)):
        by_subject.setdefault(inc.subject, []).append(inc)
    order = sorted(by_subject, key=lambda s: (min(i.severity for i in by_subject[s]), by_subject[s][0].onset, s))
    rows: list[tuple[str, list[IncidentRow]]] = []
    for subject in order:
        lanes: list[list[IncidentRow]] = []
        for inc in by_subject[subject]:
            lane = next((ln for ln in lanes if (ln[-1].resolved or end) < inc.onset), None)
            if lane is None:
                lanes.append([inc])
            else:
                lane.append(inc)
        rows += [(subject if k == 0 else f"{subject} ({k + 1})", lane) for k, lane in enumerate(lanes)]
    return rows


def _data_end(rep: Report) -> datetime:
    """The last moment the window holds data for: what an open incident's bar runs to."""
    moments = [t for times, _, _ in rep.series.values() for t in times[-1:]]
    moments += [i.resolved or i.onset for i in rep.incidents]
    moments += [r.end for r in rep.runs.values() if r.end is not None and r.state]
    return min(max(moments), rep.until) if moments else rep.until


def _iteration_plot(rep: Report, job: str, plt: Any) -> str:
    times, mean, peak = rep.series[job]
    run = rep.runs.get(job)
    gaps, spacing = _gaps(times)
    start = times[0]
    end = times[-1]
    if run is not None and run.start is not None:
        start = max(min(start, run.start), rep.since)
    if run is not None and run.end is not None:
        end = min(max(end, run.end), rep.until)
    fig, ax = plt.subplots(figsize=(10, 3.4))
    t2, m2, p2 = _break_gaps(times, mean, peak)
    ax.plot(t2, m2, lw=0.9, color="#333", label="iteration time")
    if any(p > m for p, m in zip(peak, mean)):
        ax.plot(t2, p2, lw=0.5, color="#999", label="max in bucket")
    idle = list(gaps)
    if (end - times[-1]).total_seconds() > 3 * spacing:
        idle.append((times[-1], end))  # held its GPUs after its last step (dead, hung, or waiting)
    if (times[0] - start).total_seconds() > 3 * spacing:
        idle.append((start, times[0]))
    for k, (a, b) in enumerate(idle):
        ax.axvspan(a, b, color="#d62728", alpha=0.08, lw=0, label="no steps" if k == 0 else None)
    for k, cp in enumerate(rep.change_points.get(job, [])):
        ax.axvline(cp, color="#9467bd", ls="--", lw=1.2, label="change point" if k == 0 else None)
    hits = rep.incidents_of(job)
    top = max([v for v in m2 if v == v] or [1.0])
    for inc in hits[:30]:
        ax.axvline(inc.onset, color=SEVERITY_COLOURS.get(inc.severity, "#777"), lw=1.4, alpha=0.85)
        where = "" if inc.subject == job else f" {inc.subject}"
        ax.annotate(f"sev{inc.severity} {inc.kind}{where}", (inc.onset, top), rotation=90, fontsize=7, va="top",
                    ha="right", xytext=(-2, 0), textcoords="offset points")
    state = f", {run.state}" if run is not None and run.state else ""
    size = f", {run.gpus} GPUs" if run is not None and run.gpus else ""
    ax.set_title(f"{job}{size}{state}: iteration time; change points dashed, incidents by severity "
                 f"(red sev1, orange sev2, blue sev3)", fontsize=9)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    time_axis(ax, *_pad(start, end))
    ax.legend(loc="lower left", fontsize=7, ncol=4)
    return _svg(fig)


def _timeline_plot(rep: Report, plt: Any) -> tuple[str, int]:
    end = _data_end(rep)
    rows = timeline_rows(rep.incidents, end)
    hidden = max(0, len(rows) - MAX_TIMELINE_ROWS)
    rows = rows[:MAX_TIMELINE_ROWS]
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.32 * len(rows)))
    first = min(i.onset for _, lane in rows for i in lane)
    t0, t1 = _pad(first, end)
    span = (t1 - t0).total_seconds()
    # A kind's label is drawn where it does not run into another on its row (~7 pt characters
    # 0.6 em wide, over ~0.78 of the figure's 10 inches): open and severe incidents first.
    char_frac = 7 * 0.6 / (0.78 * 10 * 72)
    for y, (_, lane) in enumerate(rows):
        for inc in lane:
            colour = SEVERITY_COLOURS.get(inc.severity, "#777")
            stop = inc.resolved or end
            ax.plot([inc.onset, stop], [y, y], color=colour, lw=5, alpha=0.45, solid_capstyle="butt")
            ax.plot([inc.onset], [y], "o", color=colour, ms=5)
            if inc.resolved is None:
                ax.plot([stop], [y], ">", color=colour, ms=5)
        taken: list[tuple[float, float]] = []
        for inc in sorted(lane, key=lambda i: (i.resolved is not None, i.severity, i.onset)):
            label = inc.kind + ("" if inc.resolved is not None else " (open)")
            a = (inc.onset - t0).total_seconds() / span
            b = a + (len(label) + 2) * char_frac
            if all(b <= lo or a >= hi for lo, hi in taken):
                taken.append((a, b))
                ax.annotate(label, (inc.onset, y), xytext=(4, 4), textcoords="offset points", fontsize=7,
                            va="bottom")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.7)
    ax.grid(axis="x", color="#eee")
    ax.set_title("Incidents by subject: onset (dot) to resolution (bar), \u25b6 still open; "
                 "red sev1, orange sev2, blue sev3", fontsize=9)
    time_axis(ax, t0, t1)
    return _svg(fig), hidden


def _plots(rep: Report) -> tuple[dict[str, str], int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: dict[str, str] = {}
    for job in rep.series:
        plots[f"iterations-{job}"] = _iteration_plot(rep, job, plt)
    hidden = 0
    if rep.incidents:
        plots["timeline"], hidden = _timeline_plot(rep, plt)

    ettr = [r for r in rep.rows("ettr") if r["ettr"] is not None]
    if ettr:
        fig, ax = plt.subplots(figsize=(8, 0.7 + 0.35 * len(ettr)))
        labels = [r["job"] for r in ettr]
        values = [float(r["ettr"]) for r in ettr]
        ax.barh(labels, values, color="#2ca02c")
        for y, r in enumerate(ettr):
            ax.annotate(f"{float(r['ettr']):.3f} ({r['state'] or 'no state'})", (float(r["ettr"]), y),
                        xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlim(0, 1.25)
        ax.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.invert_yaxis()
        ax.set_xlabel("ETTR")
        ax.set_title("ETTR per job (worst first)", fontsize=10)
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
    return plots, hidden


def _html_table(cols: list[str], rows: list[tuple]) -> str:
    if not cols:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or '<tr><td>(none)</td></tr>'}</tbody></table>"


def _note(name: str) -> str:
    return f"<p class='note'>{html.escape(NOTES[name])}</p>" if name in NOTES else ""


def render_html(rep: Report) -> str:
    plots, hidden = _plots(rep)
    still_open = sum(1 for i in rep.incidents if i.resolved is None)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vigil report</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1100px} table{border-collapse:collapse;margin:.5em 0 1.5em}",
        "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:right} th{background:#f3f3f3}",
        "figure{margin:0 0 1.5em} svg{max-width:100%;height:auto} .note{color:#555;font-size:12px;max-width:60em}",
        "</style></head><body>",
        f"<h1>vigil report</h1><p>Window {_ts(rep.since)[:19]} to {_ts(rep.until)[:19]} UTC"
        + (f", job <b>{html.escape(rep.job)}</b>" if rep.job else "")
        + f"; {len(rep.incidents)} incidents, {still_open} still open.</p>",
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
    if hidden:
        parts.append(f"<p class='note'>{hidden} more row(s) not shown: run with --job, or narrow the window.</p>")
    parts.append(f"<h2>{TITLES['ettr']}</h2>")
    if "ettr" in plots:
        parts.append(f"<figure class='plot' id='ettr'>{plots['ettr']}</figure>")
    parts.append(_html_table(*rep.tables["ettr"]) + _note("ettr"))
    parts.append(f"<h2>{TITLES['lemons']}</h2>")
    if "lemons" in plots:
        parts.append(f"<figure class='plot' id='lemons'>{plots['lemons']}</figure>")
    parts.append(_html_table(*rep.tables["lemons"]))
    for name in ("taxonomy", "mttf", "projection", "mttr", "latency", "failslow"):
        parts.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        parts.append(_html_table(*rep.tables[name]) + _note(name))
    parts.append("</body></html>")
    return "\n".join(parts)
