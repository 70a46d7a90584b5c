"""The change-point baselines (sliding window, ADWIN, Page-Hinkley) on planted changes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.baselines import ADWINDetector, PageHinkleyDetector, SlidingWindow

BASELINES = (SlidingWindow, ADWINDetector, PageHinkleyDetector)


def _feed(det, xs):
    out = []
    for i, x in enumerate(np.asarray(xs, dtype=float).tolist()):
        det.update(x, t=float(i))
        if det.change_detected:
            c = det.last_change
            out.append((i, c.evidence["onset_index"], c.kind))
    return out


def _step(seed, n0=400, n1=400, level0=1.0, level1=1.3, jitter=0.01):
    rng = np.random.default_rng(seed)
    return np.r_[rng.normal(level0, jitter, n0), rng.normal(level1, jitter, n1)]


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_detects_a_planted_slowdown_after_its_onset(cls):
    changes = _feed(cls(), _step(1))
    ups = [c for c in changes if c[2] == "fail_slow"]
    assert ups, changes
    index, onset, _ = ups[0]
    assert 400 <= index <= 480  # after the change, not before it
    assert onset <= index


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_detects_a_planted_recovery_as_recovery(cls):
    changes = _feed(cls(), _step(2, level0=1.3, level1=1.0))
    assert any(k == "recovery" and i >= 400 for i, _, k in changes), changes
    assert not any(k == "fail_slow" and i >= 400 for i, _, k in changes)


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_finding_holds_while_slowed(cls):
    det = cls()
    _feed(det, _step(3))
    assert det.finding is not None and det.finding.kind == "fail_slow"
    assert det.finding.onset <= det.finding.detected_at


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_silent_during_warmup(cls):
    det = cls(warmup=40)
    xs = [1.0] * 10 + [3.0] * 29
    for i, x in enumerate(xs):
        det.update(x, t=float(i))
        assert not det.change_detected and det.finding is None


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_snapshot_restore_continues_identically(cls):
    xs = _step(4)
    det = cls()
    _feed(det, xs[:300])
    clone = cls.restore(pickle.loads(det.to_bytes()))
    assert _feed(det, xs[300:]) == _feed(clone, xs[300:])


def test_sliding_window_ignores_single_spikes_and_reports_the_first_moved_value():
    rng = np.random.default_rng(5)
    x = rng.normal(2.0, 0.02, 600)
    x[[100, 230, 231 + 5, 400]] *= 3.0
    assert _feed(SlidingWindow(), x) == []
    x[500:] *= 1.2
    assert _feed(SlidingWindow(), x) == [(502, 500, "fail_slow")]


def test_sliding_window_literal_rule_fires_on_a_spike():
    x = np.full(200, 1.0)
    x[120] = 1.5
    assert _feed(SlidingWindow(persistence=1), x) == [(120, 120, "fail_slow")]


def test_sliding_window_threshold_is_relative():
    rng = np.random.default_rng(6)
    x = rng.normal(1.0, 0.005, 600)
    x[300:] *= 1.08
    assert _feed(SlidingWindow(), x) == []
    assert [k for _, _, k in _feed(SlidingWindow(min_rel_change=0.05), x)] == ["fail_slow"]


def test_page_hinkley_is_scale_free():
    xs = _step(7)
    a = _feed(PageHinkleyDetector(), xs)
    b = _feed(PageHinkleyDetector(), xs * 500.0)
    assert a == b and a


def test_adwin_onset_is_the_start_of_the_kept_window():
    det = ADWINDetector()
    changes = _feed(det, _step(8, jitter=0.05))
    i, onset, kind = next(c for c in changes if c[2] == "fail_slow")
    assert onset == i + 1 - det.last_change.evidence["width"]


@pytest.mark.parametrize("cls,kwargs", [
    (SlidingWindow, {"window": 0}), (SlidingWindow, {"min_rel_change": 0.0}),
    (SlidingWindow, {"persistence": 0}), (SlidingWindow, {"min_window": 100, "window": 50}),
    (ADWINDetector, {"delta": 1.5}), (ADWINDetector, {"clock": 0}), (ADWINDetector, {"warmup": -1}),
    (PageHinkleyDetector, {"threshold": 0.0}), (PageHinkleyDetector, {"alpha": 1.5}),
    (PageHinkleyDetector, {"warmup": 1}), (PageHinkleyDetector, {"delta": -0.1}),
])
def test_rejects_bad_parameters(cls, kwargs):
    with pytest.raises(DetectorError):
        cls(**kwargs)


@pytest.mark.parametrize("cls", BASELINES, ids=lambda c: c.name)
def test_rejects_bad_input(cls):
    with pytest.raises(DetectorError):
        cls().update(float("nan"), t=0.0)
    with pytest.raises(DetectorError):
        cls().update(1.0, t=float("nan"))
