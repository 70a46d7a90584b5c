"""``vigil report``: the failure history as terminal tables and an HTML page with plots.

Everything comes from the analytics views (``streams/analytics/``) through
whatever answers SQL: the ClickHouse store, or a running stack's query
service. Plots are matplotlib figures inlined as SVG, so the page is one
file with nothing to fetch.

The package, by what each module holds: :mod:`.query` (the report's data:
:func:`collect` queries every view for a window, :class:`Report` holds the
answers), :mod:`.plots` (the matplotlib figures: iteration times with
change points and incidents, the incident timeline, ETTR, lemon nodes) and
:mod:`.render` (terminal tables, the HTML page).
"""

from __future__ import annotations

from vigil.report.plots import (MAX_TICKS, MAX_TIMELINE_ROWS, SEVERITY_COLOURS, TICK_STEPS, time_axis, time_ticks,
                                timeline_rows)
from vigil.report.query import (MAX_POINTS, NOTES, TITLES, IncidentRow, JobRunRow, Queryable, Report, collect,
                                parse_when)
from vigil.report.render import print_report, render_html

__all__ = ["IncidentRow", "JobRunRow", "MAX_POINTS", "MAX_TICKS", "MAX_TIMELINE_ROWS", "NOTES", "Queryable", "Report",
           "SEVERITY_COLOURS", "TICK_STEPS", "TITLES", "collect", "parse_when", "print_report", "render_html",
           "time_axis", "time_ticks", "timeline_rows"]
