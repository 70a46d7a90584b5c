"""The report's figures (matplotlib, inlined as SVG): iteration time per job with its change points and
incidents, the incidents on a timeline, ETTR per job, lemon nodes; and the time axes they share."""

from __future__ import annotations

import io
import math
from datetime import datetime, timedelta, timezone
from typing import Any

from vigil.report.query import IncidentRow, Report

SEVERITY_COLOURS = {1: "#d62728", 2: "#ff7f0e", 3: "#1f77b4"}

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
