"""The localization benchmark's scoring code, on hand-made cases of known answer (issue 23)."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.bench.localization import _cases, _grids_for, _section, tally, wilson
from vigil.detectors.straggler import Localization
from vigil.sim.rank_traces import CULPRIT_CLASSES

TRUTHS = [{"culprit": "worker", "location": ("rank", 5)}, {"culprit": "stage", "location": ("stage", 1)},
          {"culprit": "none", "location": None}, {"culprit": "spread", "location": None}]


def test_wilson_interval_known_values():
    assert wilson(100, 100)[0] == pytest.approx(0.963, abs=1e-3)
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)  # no cases: the vacuous interval


def test_a_perfect_localizer_scores_one_everywhere():
    r = tally(TRUTHS, [(t["culprit"], t["location"]) for t in TRUTHS])
    assert r["accuracy"] == 1.0 and all(c["accuracy"] == 1.0 and c["n"] == 1 for c in r["by_class"].values())


def test_a_localizer_that_always_says_none_scores_only_the_healthy_class():
    r = tally(TRUTHS, [("none", None)] * len(TRUTHS))
    assert r["accuracy"] == 0.25
    assert {c: v["accuracy"] for c, v in r["by_class"].items()} == {"none": 1.0, "spread": 0.0, "stage": 0.0,
                                                                     "worker": 0.0}
    assert r["confusion"]["spread"] == {"none": 1}


def test_right_class_wrong_place_is_wrong():
    r = tally(TRUTHS[:1], [("worker", ("rank", 6))])
    assert r["accuracy"] == 0.0 and r["confusion"]["worker"] == {"worker@wrong_location": 1}
    with pytest.raises(ValueError):
        tally(TRUTHS, [])


def test_sections_skip_cases_a_method_does_not_apply_to_and_subsample():
    cases = [([], t) for t in TRUTHS]
    out = _section(cases, {"all": lambda its, t: Localization(t["culprit"], t["location"], ()),
                           "stage_only": lambda its, t: Localization("stage", ("stage", 1), ()) if t["culprit"] == "stage" else False,
                           "half": lambda its, t: None}, every={"half": 2})
    assert out["all"]["accuracy"] == 1.0 and out["all"]["n"] == 4
    assert out["stage_only"]["n"] == 1 and out["stage_only"]["accuracy"] == 1.0
    assert out["half"]["n"] == 2 and out["half"]["by_class"]["none"]["accuracy"] == 1.0  # None = no verdict = none


def test_cases_are_class_balanced_and_grids_fit_the_class():
    cases = _cases(np.random.default_rng(0), 10, 4, one_reporter=False)
    assert [t["planted"] for _, t in cases] == list(CULPRIT_CLASSES) * 2
    assert all(g[1] >= 2 for g in _grids_for("stage", False))
    assert all(g[2] >= 2 for g in _grids_for("worker", True))
    one = _cases(np.random.default_rng(0), 5, 4, one_reporter=True)
    assert all(r["tp"] == 0 for its, _ in one for it in its for r in it)
