"""Window fits (shift, kink, season) against the split points and periods the tests plant."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.detectors.segfit import hinge_split, seasonal_offsets, step_split


@pytest.mark.parametrize("at", [5, 20, 41])
def test_step_split_finds_a_planted_shift(at):
    rng = np.random.default_rng(at)
    y = np.r_[np.zeros(at), np.full(50 - at, 4.0)] + rng.normal(0, 0.5, 50)
    k, sse = step_split(y)
    assert k == at and sse < 50 * 0.5 ** 2 * 2


def test_step_split_respects_the_lower_bound_and_short_windows():
    y = np.r_[np.zeros(10), np.ones(10)]
    assert step_split(y, lo=12)[0] >= 12
    assert step_split(np.ones(5)) == (-1, float("inf"))


@pytest.mark.parametrize("at", [15, 30, 45])
def test_hinge_split_finds_a_planted_kink_and_the_slope_after_it(at):
    rng = np.random.default_rng(at)
    t = np.arange(60.0)
    y = 0.1 * t + np.where(t < at, 0.0, 0.8 * (t - at)) + rng.normal(0, 0.3, 60)
    c, sse, slope = hinge_split(y)
    assert abs(c - at) <= 1
    assert abs(slope - 0.9) < 0.05
    assert sse < 60 * 0.3 ** 2 * 1.5


def test_hinge_split_on_a_straight_line_gains_nothing():
    t = np.arange(40.0)
    _, sse, slope = hinge_split(2.0 + 0.5 * t)
    assert sse < 1e-9 and abs(slope - 0.5) < 1e-9
    assert hinge_split(np.ones(10))[0] == -1


@pytest.mark.parametrize("period", [7, 12, 30])
def test_seasonal_offsets_finds_a_seasonal_curve(period):
    rng = np.random.default_rng(period)
    i = np.arange(240)
    v = 2.0 * np.sin(2 * np.pi * (i + 1000) / period) + rng.normal(0, 1, 240)
    p, off = seasonal_offsets(v, 64, 0.35, first=1000)
    assert p % period == 0  # the period or a multiple of it (their autocorrelations are alike)
    # offsets are indexed by the absolute index modulo the period
    assert abs(int(np.argmax(off)) % period - round(period / 4)) <= 1
    assert seasonal_offsets(v, 64, 0.35, first=1000, known=p) == (p, [])


def test_seasonal_offsets_finds_spikes_at_their_phase():
    rng = np.random.default_rng(1)
    v = rng.normal(0, 1, 240)
    v[5::12] += 8.0
    p, off = seasonal_offsets(v, 64, 0.35, first=100)
    assert p % 12 == 0  # the spikes' period or a multiple of it
    assert int(np.argmax(off)) % 12 == (100 + 5) % 12


@pytest.mark.parametrize("seed", range(5))
def test_seasonal_offsets_finds_no_period_in_noise_or_a_random_walk(seed):
    rng = np.random.default_rng(seed)
    assert seasonal_offsets(rng.normal(0, 1, 256), 64, 0.35) is None
    assert seasonal_offsets(np.cumsum(rng.normal(0, 1, 256)), 64, 0.35) is None
