"""The residual CUSUM and its fail-slow variant against change points the tests plant themselves."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.residual_cusum import ResidualCUSUM
from vigil.detectors.verification import ResidualCUSUMVerify


def _feed(det, xs):
    out = []
    for i, x in enumerate(np.asarray(xs, dtype=float).tolist()):
        det.update(x, t=float(i))
        if det.change_detected:
            c = det.last_change
            out.append((i, c.evidence["onset_index"], c.kind, c.evidence.get("statistic")))
    return out


@pytest.mark.parametrize("scale", [1e-9, 1.0, 3600.0])
def test_level_shift_found_with_its_onset_on_any_scale(scale):
    rng = np.random.default_rng(0)
    x = scale * (10 + np.r_[rng.normal(0, 1, 300), rng.normal(5, 1, 300)])
    out = _feed(ResidualCUSUM(), x)
    assert len(out) == 1
    i, onset, kind, stat = out[0]
    assert abs(onset - 300) <= 2 and 300 <= i <= 330 and kind == "fail_slow" and stat == "level_up"


def test_downward_shift_is_a_recovery():
    rng = np.random.default_rng(1)
    out = _feed(ResidualCUSUM(), np.r_[rng.normal(10, 1, 300), rng.normal(4, 1, 300)])
    assert [(abs(o - 300) <= 2, k) for _, o, k, _ in out] == [(True, "recovery")]


def test_random_walks_raise_fewer_than_one_false_change_per_thousand_values():
    # a random walk has no change point; the detector mistakes some early wander for one
    # (see the module docstring), a segmentation by level and variance finds dozens
    false = sum(len(_feed(ResidualCUSUM(), np.cumsum(np.random.default_rng(s).standard_normal(1000))))
                for s in range(20))
    assert false < 20


def test_at_most_one_short_drifting_random_walk_in_twenty_raises_a_change_point():
    # a random walk of 100..600 values with a drift has no change point; its first few dozen values
    # are where a model that has not learnt the wander yet takes it for a shift (issue 19: 5 of these
    # 60 walks did before the lag-1 test of the differences, 2 still do; see the module docstring)
    walks_with_false = 0
    for s in range(100, 160):
        rng = np.random.default_rng(s)
        n = int(rng.integers(100, 601))
        x = np.cumsum(rng.standard_normal(n) + rng.uniform(-0.2, 0.2))
        walks_with_false += bool(_feed(ResidualCUSUM(), x))
    assert walks_with_false <= 3


def test_a_shift_in_noise_is_no_wander_even_after_a_missed_jump():
    # the segment holds a jump the onset does not sit on (a shift placed a few values early): the
    # differences, clipped, still say "noise", so the later shift needs no random-walk jump
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(0, 1, 200), rng.normal(6, 1, 200)]
    det = ResidualCUSUM()
    _feed(det, x)
    assert det._walk_scale(190, 399) == 0.0
    assert det._walk_scale(100, 150) == 0.0
    walk = ResidualCUSUM()
    _feed(walk, np.cumsum(rng.standard_normal(400)))
    assert walk._walk_scale(300, 399) > 0.0


@pytest.mark.parametrize("seed", range(3))
def test_silent_on_a_linear_trend_and_a_season(seed):
    rng = np.random.default_rng(seed)
    i = np.arange(800)
    x = 0.02 * i + 3 * np.sin(2 * np.pi * i / 16) + rng.normal(0, 1, 800)
    det = ResidualCUSUM()
    assert _feed(det, x) == []
    assert det.period == 16


@pytest.mark.parametrize("scale", [1e-9, 1.0, 3600.0])
def test_a_sharp_kink_is_a_slope_change_at_its_bend_not_a_scale_change(scale):
    # a line that bends at 160 (slope 0.02 -> -0.10 per step, noise sd 1): the local line follows the
    # bend, so the scale CUSUM sees it first, ~30 values late; one bending line explains those errors
    onsets = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        i = np.arange(320)
        x = scale * (50 + 0.02 * i + np.where(i < 160, 0.0, -0.12 * (i - 160)) + rng.normal(0, 1, 320))
        out = _feed(ResidualCUSUM(), x)
        assert len(out) == 1 and out[0][3] == "slope", out
        onsets.append(out[0][1])
    assert all(abs(o - 160) <= 12 for o in onsets), onsets
    assert sum(abs(o - 160) <= 5 for o in onsets) >= 6, onsets  # the benchmark's margin


@pytest.mark.parametrize("seed", range(6))
def test_silent_on_a_slowly_curving_trend(seed):
    # a parabola over the whole series (the "trend" family's curvature, no change point): one bending
    # line fits a window of it, but a parabola over the segment fits better
    rng = np.random.default_rng(seed)
    n = 400
    i = np.arange(n)
    x = 10 * i / n + 32 * ((i - n / 2) / n) ** 2 + rng.normal(0, 1, n)
    assert _feed(ResidualCUSUM(), x) == []


def test_silent_on_isolated_heavy_outliers():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, 800)
    x[rng.choice(800, 16, replace=False)] += 50
    assert _feed(ResidualCUSUM(), x) == []


def test_variance_increase_is_a_scale_change():
    rng = np.random.default_rng(3)
    out = _feed(ResidualCUSUM(), np.r_[rng.normal(0, 1, 300), rng.normal(0, 4, 300)])
    assert len(out) == 1 and out[0][3] == "scale_up" and abs(out[0][1] - 300) <= 10


def test_short_series_of_twenty_points():
    x = np.r_[np.full(10, 1.0), np.full(10, 2.0)] + np.random.default_rng(4).normal(0, 0.02, 20)
    out = _feed(ResidualCUSUM(), x)
    assert [o for _, o, _, _ in out] == [10]


def test_bad_parameters_and_input():
    with pytest.raises(DetectorError):
        ResidualCUSUM(h=0)
    with pytest.raises(DetectorError):
        ResidualCUSUM(confirm=2)
    with pytest.raises(DetectorError):
        ResidualCUSUM(max_replay=10_000)
    det = ResidualCUSUM()
    with pytest.raises(DetectorError):
        det.update(float("nan"), t=0.0)
    with pytest.raises(DetectorError):
        det.update(1.0, t=float("inf"))


def test_snapshot_round_trip_mid_series():
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(0, 1, 200), rng.normal(6, 1, 200)]
    a = ResidualCUSUM()
    _feed(a, x[:250])
    b = ResidualCUSUM.restore(pickle.loads(pickle.dumps(a.snapshot())))
    rest = x[250:]
    assert [e[:3] for e in _feed(a, rest)] == [e[:3] for e in _feed(b, rest)]


# -- the fail-slow variant --------------------------------------------------------------------------

def _steps(levels, n=300, jitter=0.01, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([lv * np.exp(jitter * rng.standard_normal(n)) for lv in levels])


def test_failslow_variant_runs_without_the_kink_tests():
    # a change of slope is no slowdown of its own; the fail-slow figures are those of the detector without them
    assert ResidualCUSUMVerify()._inner.kink_every == 0


def test_failslow_variant_reports_slowdown_and_recovery_and_holds_the_finding():
    x = _steps([1.0, 1.2, 1.0])
    det = ResidualCUSUMVerify()
    seen = []
    for i, v in enumerate(x.tolist()):
        det.update(v, t=float(i))
        if det.change_detected:
            seen.append((det.last_change.kind, det.last_change.evidence["onset_index"], i))
        if 310 <= i < 600:
            assert det.finding is not None and det.finding.kind == "fail_slow"
    # reported within 8 values of the onset: a value out of the jitter band among the last five after it
    # (here the 4th, 4.5 jitter scales low) holds the verdict back until it has left them
    assert [(k, abs(o - e) <= 1, i - o <= 8) for (k, o, i), e in zip(seen, (300, 600))] == [
        ("fail_slow", True, True), ("recovery", True, True)]
    assert det.finding is None
    ev = det.last_change.evidence
    assert {"onset_index", "rel_change", "before", "after"} <= set(ev)


def test_failslow_variant_ignores_small_shifts_and_calls_a_speedup_no_recovery():
    assert [c for c in _feed(ResidualCUSUMVerify(), _steps([1.0, 1.05]))] == []  # 5 %: below 10 %
    out = _feed(ResidualCUSUMVerify(), _steps([1.3, 1.0]))
    assert [k for _, _, k, _ in out] == ["speedup"]


@pytest.mark.parametrize("seed", range(5))
def test_failslow_variant_ignores_a_checkpoint_between_a_spike_and_upward_jitter(seed):
    # a clean job with 4 % heavy-tailed jitter: a spike, a checkpoint pause, the slower steps while the
    # checkpoint is written and upward jitter after it. Nothing changed: no alarm. (Passed as a 15 %
    # slowdown once the pause sat among the values after the onset and the rest just above the midpoint.)
    rng = np.random.default_rng(seed)
    x = 0.575 * np.exp(0.039 * rng.standard_t(4, 1600) / np.sqrt(2))
    x[1500:1508] = 0.575 * np.array([1.182, 2.61, 1.061, 1.155, 1.078, 1.057, 1.015, 1.007])
    assert _feed(ResidualCUSUMVerify(), x) == []
