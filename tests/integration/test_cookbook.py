"""The README's SQL cookbook: every query is shown verbatim and answers the scripted history correctly."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.streams.cookbook import COOKBOOK
from tests.integration import scripted_history as sh

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def answers(history_session):
    import uuid

    store = history_session.with_database(f"test_{uuid.uuid4().hex[:10]}")
    store.migrate()
    sh.populate(store)
    out = {}
    for recipe in COOKBOOK:
        r = store.query(recipe.sql.replace("vigil.", f"{store.database}."))
        out[recipe.name] = [dict(zip(r.columns, row)) for row in r.rows]
    return out


def test_the_readme_shows_every_recipe_verbatim():
    text = README.read_text()
    assert "## SQL cookbook" in text
    assert len(COOKBOOK) == 11
    for i, recipe in enumerate(COOKBOOK, 1):
        assert f"**{i}. {recipe.question}**" in text
        assert f"```sql\n{recipe.sql}\n```" in text, recipe.name


def test_every_recipe_answers_the_scripted_history(answers):
    exp = sh.expected()
    lemons = answers["lemon_nodes"]
    assert lemons[0]["node"] == sh.LEMON and lemons[0]["lemon"] == 1 and lemons[1]["lemon"] == 0

    assert answers["run_ettr"] == []  # no job of the scripted history names a run (a chain: test_history_analytics)
    ettr = {r["job"]: r for r in answers["ettr"]}
    assert ettr["ettr-small"]["ettr"] == round(sh.ETTR_SMALL, 3)
    assert ettr["ettr-small"]["lost_h"] == round(400 / 3600, 2)
    assert ettr["ettr-small"]["recomputed_steps"] == 10

    by_domain_kind: dict = {}
    for inc in sh.INCIDENTS:
        by_domain_kind[(inc.domain, inc.kind)] = by_domain_kind.get((inc.domain, inc.kind), 0) + 1
    assert {(r["domain"], r["kind"]): r["incidents"] for r in answers["domains"]} == by_domain_kind

    mttf = {r["bucket_gpus"]: r for r in answers["mttf_by_size"]}
    assert mttf[64]["observed_mttf_h"] == round(24 / exp.job_failures["big-a"], 2)
    assert mttf[128]["observed_mttf_h"] == round(24 / exp.job_failures["big-b"], 2)
    node_days = sum(len(n) * (e - s) / sh.DAY for _, n, s, e, _ in sh.JOBS.values())
    rate = sum(exp.job_failures.values()) / node_days
    assert mttf[64]["failures_per_node_day"] == round(rate, 4)
    projection = {r["gpus"]: r["expected_mttf_min"] for r in answers["mttf_projection"]}
    assert projection[100000] == round(24 / (rate * 100000 / 8) * 60, 1)

    mttr = {r["action"]: r for r in answers["mttr"]}
    assert {a: mttr[a]["incidents"] for a in mttr} == {a: len(t) for a, t in exp.mttr_by_action.items()}
    assert mttr["reconfigure"]["mean_s"] == round(sum(exp.mttr_by_action["reconfigure"]) / 2, 1)

    latency = {r["detector"]: r["p50_s"] for r in answers["detection_latency"]}
    assert latency == {d: round(sorted(v)[(len(v) - 1) // 2], 2) for d, v in exp.latency_by_detector.items()}

    xids = {r["xid_code"]: (r["incidents"], r["nodes"]) for r in answers["xid_codes"]}
    truth: dict = {}
    for inc in sh.INCIDENTS:
        if inc.xid is not None:
            truth.setdefault(inc.xid, []).append(inc.node)
    assert xids == {code: (len(nodes), len(set(nodes))) for code, nodes in truth.items()}

    assert [(r["job"], r["slowed_min"], r["lost_min"]) for r in answers["failslow"]] == [
        ("big-b", 30.0, round(sh.FAILSLOW_LOST_S / 60, 1)), ("dies-c", 5.0, round(sh.FAILSLOW_LOST_DIES_S / 60, 1))]

    still_open = [(i.severity, i.kind, i.job or i.node) for i in sh.INCIDENTS
                  if i.resolved_after_s is None and i.failure_class != "vigil"]
    assert [(r["severity"], r["kind"], r["subject"]) for r in answers["open_incidents"]] == still_open
