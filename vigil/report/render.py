"""The report rendered: tables on a terminal (rich), and one HTML page with the figures inlined."""

from __future__ import annotations

import html
from typing import Any

from vigil.report.plots import _plots
from vigil.report.query import NOTES, TITLES, Report, _ts


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
