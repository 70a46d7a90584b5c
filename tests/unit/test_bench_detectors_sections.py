"""``vigil bench detectors --sections``: one section refreshed into an existing result, the rest left as it was.

Sizes are cut down (10 traces of one seed, one out-of-family case per
family, no general section, one detector, a localizer bench of one case per
class): what is tested is where each section lands, not its figures.
"""

from __future__ import annotations

import functools
import json
import shlex

import pytest

from vigil.bench import detectors, localization

SMALL = dict(n_traces=10, n_out_of_family=1, general=False, detectors=("bocd",), evaluation_seeds=(2,))


@pytest.fixture
def small_localizer(monkeypatch):
    monkeypatch.setattr(localization, "score_localizer",
                        functools.partial(localization.score_localizer, n_cases=5, one_reporter_cases=2))
    monkeypatch.setattr(localization, "score_acf", functools.partial(localization.score_acf, n_cases=3))


def shape(obj):
    """The keys of every mapping, nested (lists by their first item): what a reader of the file relies on."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj and isinstance(obj[0], (dict, list)) else []
    return None


def test_the_localizer_section_alone_lands_where_a_full_run_puts_it(tmp_path, small_localizer):
    full_path = tmp_path / "full.json"
    detectors.run(str(full_path), **SMALL)
    full = json.loads(full_path.read_text())
    assert set(full["localizer"]["by_class"]) == {"worker", "stage", "link", "spread", "none"}
    assert set(full["localizer"]["by_class_hooks"]) == {"worker", "stage", "link", "spread", "none"}

    part_path = tmp_path / "part.json"
    part_path.write_text(json.dumps(dict(full, localizer={"stale": True}, acf={"stale": True})))
    detectors.run(str(part_path), sections=["localizer"], **SMALL)
    part = json.loads(part_path.read_text())
    assert set(part) == set(full) | {"refreshed"}
    assert shape(part["localizer"]) == shape(full["localizer"]) and shape(part["acf"]) == shape(full["acf"])
    for key in ("detectors", "floor", "out_of_family", "traces", "command", "load_avg_before"):
        assert part[key] == full[key]  # the other sections, and the full run's own record, as they were
    (refresh,) = part["refreshed"]
    assert refresh["sections"] == ["localizer"] and "sections=['localizer']" in shlex.split(refresh["command"])[-1]
    assert part["command"] == full["command"] != refresh["command"]

    fresh_path = tmp_path / "fresh.json"  # no file yet: the section alone, the others empty, same keys
    detectors.run(str(fresh_path), sections=["localizer"], **SMALL)
    fresh = json.loads(fresh_path.read_text())
    assert set(fresh) == set(full) and shape(fresh["localizer"]) == shape(full["localizer"])
    assert fresh["detectors"] == {} and fresh["floor"] is None


def test_sections_are_checked_and_a_file_of_other_seeds_is_not_mixed_into(tmp_path):
    with pytest.raises(ValueError, match="sections must be some of"):
        detectors.run(None, sections=["localiser"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"tuning_seeds": [0], "evaluation_seeds": [5, 6]}))
    with pytest.raises(ValueError, match="evaluation_seeds"):
        detectors.run(str(other), sections=["localizer"], **SMALL)


def test_the_cli_runs_the_sections_it_is_given_and_refuses_others(tmp_path, monkeypatch, small_localizer):
    from typer.testing import CliRunner

    from vigil.cli import app

    seen = {}
    real = detectors.run

    @functools.wraps(real)  # the run's signature, which its reproducing command is built from
    def run(json_path, **kw):
        seen.update(kw)
        return real(json_path, **dict(kw, n_traces=10, n_out_of_family=1, detectors=("bocd",)))

    monkeypatch.setattr(detectors, "run", run)
    out = tmp_path / "d.json"
    res = CliRunner().invoke(app, ["bench", "detectors", "--json", str(out), "--sections", "localizer",
                                   "--evaluation-seeds", "2", "--no-general"])
    assert res.exit_code == 0, res.output
    assert seen["sections"] == ["localizer"] and "localizer accuracy" in res.output
    assert set(json.loads(out.read_text())["localizer"]["by_class"]) == {"worker", "stage", "link", "spread", "none"}
    bad = CliRunner().invoke(app, ["bench", "detectors", "--json", str(out), "--sections", "localiser"])
    assert bad.exit_code != 0 and "--sections must be some of" in bad.output
