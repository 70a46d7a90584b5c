"""The tuning search of the residual CUSUM: its objective, its draws, and that the defaults are its choice."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from vigil.bench.changepoints import zero_targets
from vigil.bench.tune_changepoints import CHOSEN, MARGIN, SPACE, START, objective, sample
from vigil.detectors.residual_cusum import ResidualCUSUM


def _scores(fams):
    f1 = float(np.mean([v[0] for v in fams.values()]))
    cover = float(np.mean([v[1] for v in fams.values()]))
    return {"f1": f1, "cover": cover, "families": {f: {"f1": a, "cover": b} for f, (a, b) in fams.items()}}


def test_objective_charges_a_tie_with_zero_but_not_equality_where_zero_is_perfect():
    zero = _scores({"level": (0.6, 0.5), "random_walk": (1.0, 1.0)})
    clear = _scores({"level": (0.8, 0.7), "random_walk": (1.0, 1.0)})
    assert objective(clear, zero) == pytest.approx(clear["f1"] + clear["cover"])
    tie = _scores({"level": (0.6, 0.7), "random_walk": (1.0, 1.0)})
    assert objective(tie, zero) == pytest.approx(tie["f1"] + tie["cover"] - MARGIN)
    one_false = _scores({"level": (0.8, 0.7), "random_walk": (0.9, 0.95)})
    assert objective(one_false, zero) == pytest.approx(one_false["f1"] + one_false["cover"] - 0.1 - 0.05)


def test_zero_targets_ask_for_more_than_zero_except_where_zero_is_perfect():
    zero = {"level": {"f1": 0.6, "cover": 0.5}, "random_walk": {"f1": 1.0, "cover": 1.0}}
    met, perfect = zero_targets({"level": {"f1": 0.6, "cover": 0.9}, "random_walk": {"f1": 1.0, "cover": 1.0}}, zero)
    assert perfect == ["random_walk"] and met == {"level": False, "random_walk": True}
    met, _ = zero_targets({"level": {"f1": 0.7, "cover": 0.6}, "random_walk": {"f1": 0.99, "cover": 1.0}}, zero)
    assert met == {"level": True, "random_walk": False}


def test_draws_stay_in_the_space_and_repeat_with_the_seed():
    a = [sample(np.random.default_rng(3), START) for _ in range(20)]
    b = [sample(np.random.default_rng(3), START) for _ in range(20)]
    assert a == b
    rng = np.random.default_rng(4)
    for _ in range(200):
        cfg = sample(rng, START)
        assert set(cfg) == set(SPACE)
        for name, (kind, lo, hi) in SPACE.items():
            assert lo * 0.999 <= cfg[name] <= hi * 1.001, name
            assert isinstance(cfg[name], int) == (kind == "i"), name
        ResidualCUSUM(**cfg)  # every draw is a valid configuration


def test_the_defaults_are_the_configuration_the_search_chose():
    defaults = {k: p.default for k, p in inspect.signature(ResidualCUSUM.__init__).parameters.items()
                if k in SPACE}
    assert CHOSEN["params"] == defaults
    assert CHOSEN["budget"] >= 1 and CHOSEN["seeds"]
