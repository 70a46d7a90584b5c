"""Every Grafana panel's SQL (infra/grafana/dashboards/vigil.json) runs against the embedded
ClickHouse on the scripted history, with the ClickHouse plugin's time macros expanded."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration import scripted_history as sh

DASHBOARD = Path(__file__).resolve().parents[2] / "infra/grafana/dashboards/vigil.json"


def expand(sql: str, t0: int, t1: int, db: str) -> str:
    """The grafana-clickhouse-datasource macros used by the dashboard, as the plugin expands them."""
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)", lambda m: f"{m.group(1)} >= toDateTime({t0}) AND "
                                                          f"{m.group(1)} <= toDateTime({t1})", sql)
    sql = sql.replace("$__fromTime", f"toDateTime({t0})").replace("$__toTime", f"toDateTime({t1})")
    assert "$__" not in sql, sql
    return sql.replace("vigil.", f"{db}.")


def test_every_dashboard_panel_query_runs_and_answers(history):
    sh.populate(history)
    t0, t1 = int(sh.at(0).timestamp()), int(sh.at(2 * sh.DAY).timestamp())
    panels = json.loads(DASHBOARD.read_text())["panels"]
    answers = {}
    for panel in panels:
        r = history.query(expand(panel["targets"][0]["rawSql"], t0, t1, history.database))
        assert r.rows, f"panel {panel['title']!r} is empty on the scripted history"
        answers[panel["title"]] = [dict(zip(r.columns, row)) for row in r.rows]
    assert answers["Lemon nodes"][0]["node"] == sh.LEMON
    assert {r["job"]: round(r["ettr"], 3) for r in answers["ETTR per job"]}["ettr-small"] == round(sh.ETTR_SMALL, 3)
    assert answers["Fail-slow time lost (minutes)"] == [{"job": "big-b", "lost_min": sh.FAILSLOW_LOST_S / 60}]
    assert sum(r["sev1"] + r["sev2"] + r["sev3"] for r in answers["Incidents per hour by severity"]) == len(sh.INCIDENTS)
