"""Every Grafana panel's SQL (infra/grafana/dashboards/vigil.json) runs against the embedded
ClickHouse on the scripted history, with the ClickHouse plugin's time macros expanded."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration import scripted_history as sh

DASHBOARD = Path(__file__).resolve().parents[2] / "infra/grafana/dashboards/vigil.json"


def expand(sql: str, t0: int, t1: int, db: str, job: str = "'__all'", node: str = "'__all'") -> str:
    """The grafana-clickhouse-datasource macros and the dashboard's variables, as Grafana expands them.

    ``job``/``node`` are what Grafana puts for ``${job:singlequote}``: the custom all value ``'__all'``
    for All, else the selected values quoted and comma-separated.
    """
    sql = sql.replace("${database}", db).replace("${job:singlequote}", job).replace("${node:singlequote}", node)
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)", lambda m: f"{m.group(1)} >= toDateTime({t0}) AND "
                                                          f"{m.group(1)} <= toDateTime({t1})", sql)
    sql = sql.replace("$__fromTime", f"toDateTime({t0})").replace("$__toTime", f"toDateTime({t1})")
    assert "$__" not in sql and "${" not in sql and "vigil." not in sql, sql
    return sql


def history_panels(dashboard: dict) -> list[dict]:
    """The panels on the history (ClickHouse); vigil's own health row is on Prometheus."""
    return [p for p in dashboard["panels"] if p.get("datasource", {}).get("type") == "grafana-clickhouse-datasource"]


def test_every_dashboard_panel_query_runs_and_answers(history):
    sh.populate(history)
    t0, t1 = int(sh.at(0).timestamp()), int(sh.at(2 * sh.DAY).timestamp())
    panels = history_panels(json.loads(DASHBOARD.read_text()))
    answers = {}
    for panel in panels:
        r = history.query(expand(panel["targets"][0]["rawSql"], t0, t1, history.database))
        assert r.rows, f"panel {panel['title']!r} is empty on the scripted history"
        answers[panel["title"]] = [dict(zip(r.columns, row)) for row in r.rows]
    assert answers["Lemon nodes"][0]["node"] == sh.LEMON
    assert {r["job"]: round(r["ettr"], 3) for r in answers["ETTR per job"]}["ettr-small"] == round(sh.ETTR_SMALL, 3)
    assert answers["Fail-slow time lost (minutes)"] == [{"job": "big-b", "lost_min": sh.FAILSLOW_LOST_S / 60},
                                                        {"job": "dies-c", "lost_min": sh.FAILSLOW_LOST_DIES_S / 60}]
    assert sum(r["sev1"] + r["sev2"] + r["sev3"] for r in answers["Incidents per hour by severity"]) == len(sh.INCIDENTS)


def test_dashboard_variables_pick_database_job_and_node(history):
    sh.populate(history)
    t0, t1 = int(sh.at(0).timestamp()), int(sh.at(2 * sh.DAY).timestamp())
    dashboard = json.loads(DASHBOARD.read_text())
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"database", "job", "node", "prometheus"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}  # the history's
    assert set(variables) == {"database", "job", "node"}
    assert history.database in [r[0] for r in history.query(variables["database"]["query"]).rows]
    jobs = [r[0] for r in history.query(expand(variables["job"]["query"], t0, t1, history.database)).rows]
    nodes = [r[0] for r in history.query(expand(variables["node"]["query"], t0, t1, history.database)).rows]
    assert "ettr-small" in jobs and sh.LEMON in nodes
    for v in ("job", "node"):
        assert variables[v]["includeAll"] and variables[v]["allValue"] == "'__all'" and variables[v]["multi"]
    panels = {p["title"]: p["targets"][0]["rawSql"] for p in history_panels(dashboard)}
    one_job = history.query(expand(panels["ETTR per job"], t0, t1, history.database, job="'ettr-small'"))
    assert [r[0] for r in one_job.rows] == ["ettr-small"]
    lemon_only = history.query(expand(panels["Lemon nodes"], t0, t1, history.database, node=f"'{sh.LEMON}'"))
    assert [r[0] for r in lemon_only.rows] == [sh.LEMON]
    other = [n for n in nodes if n != sh.LEMON][0]
    per_hour = expand(panels["Incidents per hour by severity"], t0, t1, history.database, node=f"'{other}'")
    everything = expand(panels["Incidents per hour by severity"], t0, t1, history.database)
    count = lambda sql: sum(r[1] + r[2] + r[3] for r in history.query(sql).rows)  # noqa: E731
    assert 0 < count(per_hour) < count(everything)
