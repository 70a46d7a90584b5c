"""Straggler localization against planted culprits (generator ground truth)."""

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.straggler import StragglerLocalizer, falcon_localize, falcon_rule, localize, localize_window
from vigil.sim.rank_traces import make_localization_case


def _rec(rank, d, p, t, c, ops=None):
    r = {"rank": rank, "dp": d, "pp": p, "tp": t, "compute": c, "comm": sum((ops or {}).values())}
    if ops is not None:
        r["ops"] = ops
    return r


@pytest.mark.parametrize("culprit,grid", [("worker", (4, 4, 2)), ("worker", (32, 1, 1)), ("worker", (8, 4, 1)),
                                          ("stage", (4, 4, 2)), ("stage", (8, 2, 4)),
                                          ("link", (8, 2, 4)), ("link", (16, 2, 2)), ("none", (4, 2, 8))])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_localizes_planted_culprit(culprit, grid, seed):
    its, truth = make_localization_case(np.random.default_rng(seed), culprit=culprit, grid=grid, severity=None)
    loc = localize_window(its)
    assert (loc.culprit, loc.location) == (truth["culprit"], truth["location"])
    if culprit != "none":
        assert loc.suspects[0].location == truth["location"] and loc.suspects[0].excess_s > 0


def test_slow_worker_hand_built_evidence():
    recs = []
    for d in range(4):
        for t in range(2):
            c = 1.0 if (d, t) != (2, 1) else 1.4
            recs.append(_rec(d * 2 + t, d, 0, t, c))
    loc = localize(recs)
    assert (loc.culprit, loc.location) == ("worker", ("rank", 5))
    ev = loc.suspects[0].evidence
    assert ev["dp"] == 2 and ev["tp"] == 1 and ev["rel_excess"] == pytest.approx(0.4)


def test_slow_link_needs_ops():
    its, truth = make_localization_case(np.random.default_rng(5), culprit="link", grid=(8, 2, 4))
    assert localize_window(its).culprit == "link"
    stripped = [[{k: v for k, v in r.items() if k != "ops"} for r in it] for it in its]
    assert localize_window(stripped).culprit == "none"


def test_two_equal_culprits_are_no_single_culprit():
    recs = []
    for d in range(8):
        c = 1.5 if d in (1, 6) else 1.0
        recs.append(_rec(d, d, 0, 0, c * (1 + 0.001 * d)))
    loc = localize(recs)
    assert loc.culprit == "none" and loc.location is None and len(loc.suspects) == 2


def test_falcon_rule_baseline():
    assert falcon_rule([1.0, 1.0, 1.2, 1.05]).tolist() == [2]
    recs = [_rec(i, i % 4, i // 4, 0, 1.3 if i // 4 == 1 else 1.0) for i in range(8)]
    assert falcon_localize(recs).culprit == "stage"
    with pytest.raises(DetectorError):
        falcon_rule([])


def test_online_detector_confirms_and_clears():
    rng = np.random.default_rng(4)
    its, truth = make_localization_case(rng, culprit="worker", grid=(4, 2, 2), n_iters=10)
    det = StragglerLocalizer(window=6, min_iterations=3, confirm=2)
    verdicts = []
    for i, recs in enumerate(its):
        det.update(recs, t=float(i))
        verdicts.append(det.finding)
    assert verdicts[2] is None  # first verdict: not yet confirmed
    f = verdicts[-1]
    assert f.kind == "straggler" and f.evidence["culprit"] == "worker" and f.evidence["location"] == truth["location"]
    assert f.onset == 0.0
    clean, _ = make_localization_case(rng, culprit="none", grid=(4, 2, 2), n_iters=10)
    for i, recs in enumerate(clean):
        det.update(recs, t=100.0 + i)
    assert det.finding is None


def test_validation():
    with pytest.raises(DetectorError):
        localize([])
    with pytest.raises(DetectorError):
        localize([_rec(0, 0, 0, 0, -1.0)])
    with pytest.raises(DetectorError):
        localize([_rec(0, 0, 0, 0, 1.0), _rec(0, 1, 0, 0, 1.0)])
    with pytest.raises(DetectorError):
        StragglerLocalizer(min_iterations=10, window=5)
