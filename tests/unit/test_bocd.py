"""BOCD and BOCD + verification against change points the tests plant themselves."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from scipy import stats

from vigil.detectors import detect_changepoints
from vigil.detectors.base import DetectorError
from vigil.detectors.bocd import BOCD
from vigil.detectors.verification import BOCDVerify


def _feed(det, xs, t0=0.0, dt=1.0):
    """Feed values; return the change points as (index, onset_index, kind)."""
    out = []
    for i, x in enumerate(np.asarray(xs, dtype=float).tolist()):
        det.update(x, t=t0 + dt * i)
        if det.change_detected:
            c = det.last_change
            out.append((i, c.evidence["onset_index"], c.kind))
    return out


def _naive_posterior(xs, hazard, mu0, kappa0, alpha0, beta0):
    """Textbook Adams & MacKay recursion in linear space, no pruning, scipy's Student-t."""
    R = np.array([1.0])
    mu = np.array([mu0]); kappa = np.array([kappa0]); alpha = np.array([alpha0]); beta = np.array([beta0])
    for x in xs:
        scale = np.sqrt(beta * (kappa + 1) / (alpha * kappa))
        pred = stats.t.pdf(x, 2 * alpha, loc=mu, scale=scale)
        growth = R * pred * (1 - hazard)
        cp = np.sum(R * pred) * hazard
        R = np.r_[cp, growth]
        R /= R.sum()
        new_mu = (kappa * mu + x) / (kappa + 1)
        new_beta = beta + kappa * (x - mu) ** 2 / (2 * (kappa + 1))
        mu = np.r_[mu0, new_mu]; beta = np.r_[beta0, new_beta]
        kappa = np.r_[kappa0, kappa + 1]; alpha = np.r_[alpha0, alpha + 0.5]
    return R


# -- BOCD --------------------------------------------------------------------

def test_posterior_matches_the_textbook_recursion():
    rng = np.random.default_rng(0)
    xs = np.r_[rng.normal(0.0, 1.0, 40), rng.normal(3.0, 1.0, 30)]
    det = BOCD(hazard=1 / 50, max_run_length=200, window=10, warmup=2, standardize=False,
               mu0=0.0, kappa0=0.5, alpha0=2.0, beta0=1.5)
    _feed(det, xs)
    ours = det.run_length_posterior()
    ref = _naive_posterior(xs, 1 / 50, 0.0, 0.5, 2.0, 1.5)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=1e-12)


def test_detects_a_planted_step_with_its_onset():
    rng = np.random.default_rng(11)
    xs = np.r_[rng.normal(1.0, 0.02, 400), rng.normal(1.3, 0.02, 300)]
    changes = _feed(BOCD(), xs)
    hits = [c for c in changes if abs(c[1] - 400) <= 1]
    assert hits and hits[0][2] == "fail_slow" and 400 <= hits[0][0] <= 403
    det = BOCD(max_run_length=512)
    _feed(det, xs)
    assert det.map_run_length() == 300  # the run since the change
    capped = BOCD(max_run_length=128)
    _feed(capped, xs)
    assert capped.map_run_length() == 127  # truncated: "127 or more"


def test_change_probability_rises_at_the_change_and_falls_after():
    rng = np.random.default_rng(2)
    xs = np.r_[rng.normal(5.0, 0.1, 300), rng.normal(4.0, 0.1, 200)]
    det = BOCD(window=20)
    probs = []
    for i, x in enumerate(xs):
        det.update(float(x), t=float(i))
        probs.append(det.change_probability)
    assert max(probs[300:305]) > 0.99
    assert probs[-1] < 0.1
    assert det.last_change.kind == "recovery"  # the level went down


def test_memory_is_bounded_by_max_run_length():
    rng = np.random.default_rng(3)
    det = BOCD(max_run_length=64, window=16)
    _feed(det, rng.normal(2.0, 0.1, 5000))
    post = det.run_length_posterior()
    assert post.shape == (64,)
    assert math.isclose(post.sum(), 1.0)
    assert det._mu.shape[0] == 128  # fixed buffers, never grown


def test_scale_invariance_of_the_standardised_input():
    rng = np.random.default_rng(4)
    xs = np.r_[rng.normal(1.0, 0.03, 300), rng.normal(1.2, 0.03, 300)]
    a = _feed(BOCD(), xs)
    b = _feed(BOCD(), xs * 1000.0)
    assert [(i, o) for i, o, _ in a] == [(i, o) for i, o, _ in b]


def test_onset_time_is_the_timestamp_of_the_first_new_value():
    rng = np.random.default_rng(5)
    xs = np.r_[rng.normal(1.0, 0.01, 200), rng.normal(1.5, 0.01, 50)]
    det = BOCD()
    _feed(det, xs, t0=1000.0, dt=0.5)
    assert det.onset_index == 200
    assert det.onset == pytest.approx(1000.0 + 0.5 * 200)
    assert det.last_change.detected_at >= det.onset


def test_silent_during_warmup():
    det = BOCD(warmup=50)
    for i, x in enumerate([1.0] * 25 + [5.0] * 24):
        det.update(x, t=float(i))
        assert not det.change_detected and det.finding is None


def test_snapshot_restore_continues_identically():
    rng = np.random.default_rng(6)
    xs = np.r_[rng.normal(1.0, 0.02, 300), rng.normal(1.4, 0.02, 300)]
    det = BOCD()
    _feed(det, xs[:250])
    clone = BOCD.restore(pickle.loads(det.to_bytes()))
    assert _feed(det, xs[250:]) == _feed(clone, xs[250:])


@pytest.mark.parametrize("kwargs", [
    {"hazard": 0.0}, {"hazard": 1.0}, {"max_run_length": 1}, {"window": 0}, {"window": 256},
    {"threshold": 1.5}, {"kappa0": 0.0}, {"alpha0": -1.0}, {"beta0": float("nan")}, {"warmup": 1},
    {"standardize": 1},
])
def test_rejects_bad_parameters(kwargs):
    with pytest.raises(DetectorError):
        BOCD(**kwargs)


@pytest.mark.parametrize("x,t", [(float("nan"), 0.0), ("1", 0.0), (1.0, float("inf")), (True, 0.0)])
def test_rejects_bad_input(x, t):
    with pytest.raises(DetectorError):
        BOCD().update(x, t=t)


# -- BOCD + verification -------------------------------------------------------

def _iteration_times(rng, n, base=0.8, jitter=0.015):
    return base * np.exp(jitter * rng.standard_normal(n))


def test_verified_slowdown_and_recovery_with_onsets():
    rng = np.random.default_rng(10)
    x = _iteration_times(rng, 1500)
    x[600:1100] *= 1.25
    det = BOCDVerify()
    changes = _feed(det, x[:900])
    assert [(o, k) for _, o, k in changes] == [(600, "fail_slow")]
    assert changes[0][0] - 600 <= 6
    f = det.finding
    assert f is not None and f.kind == "fail_slow" and f.evidence["onset_index"] == 600
    assert f.evidence["rel_change"] == pytest.approx(0.25, abs=0.03)
    more = _feed(det, x[900:])
    assert [(o + 0, k) for _, o, k in more] == [(1100, "recovery")]
    assert det.finding is None


def test_spikes_gc_pauses_and_checkpoints_are_not_changes():
    rng = np.random.default_rng(12)
    x = _iteration_times(rng, 3000, base=1.2, jitter=0.02)
    x[17::40] += 0.6 * 1.2  # GC
    x[500::700] += 30.0  # checkpoint pauses
    x[501::700] *= 1.12  # ... and the slower step after them
    spikes = rng.choice(np.arange(50, 3000), size=20, replace=False)
    x[spikes] *= 2.5
    assert _feed(BOCDVerify(), x) == []


def test_small_shift_is_not_verified_but_counts_with_a_lower_threshold():
    rng = np.random.default_rng(13)
    x = _iteration_times(rng, 1200, jitter=0.005)
    x[500:] *= 1.05
    assert _feed(BOCDVerify(), x) == []
    changes = _feed(BOCDVerify(min_rel_change=0.03), x)
    assert [(o, k) for _, o, k in changes] == [(500, "fail_slow")]


def test_a_sub_threshold_step_does_not_lend_its_size_to_the_next():
    rng = np.random.default_rng(14)
    x = _iteration_times(rng, 1500, jitter=0.005)
    x[500:] *= 1.06  # 6 %: not a change
    x[560:] *= 1.05  # another 5 %: 11 % over the old level, 5 % over the current one
    assert _feed(BOCDVerify(), x) == []


def test_overlapping_slowdowns_are_two_change_points():
    rng = np.random.default_rng(15)
    x = _iteration_times(rng, 1500)
    x[400:1200] *= 1.2
    x[700:1000] *= 1.3
    changes = _feed(BOCDVerify(), x)
    assert [(o, k) for _, o, k in changes] == [(400, "fail_slow"), (700, "fail_slow"), (1000, "recovery"),
                                               (1200, "recovery")]


def test_verify_rejects_bad_parameters():
    for kwargs in ({"min_rel_change": 0.0}, {"min_after": 0}, {"min_before": 200}, {"z_min": -1.0},
                   {"min_sustained": 1.5}, {"tolerance": -0.1}, {"band": 0.0}):
        with pytest.raises(DetectorError):
            BOCDVerify(**kwargs)


def test_detect_changepoints_on_any_series():
    rng = np.random.default_rng(16)
    series = np.r_[rng.normal(-20.0, 0.3, 300), rng.normal(-25.0, 0.3, 300), rng.normal(-20.0, 0.3, 300)]
    assert detect_changepoints(series) == [300, 600]
    assert detect_changepoints(rng.normal(3.0, 0.1, 800)) == []
    assert detect_changepoints([1.0, 2.0, 3.0]) == []
