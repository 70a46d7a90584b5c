"""Hang detector against planted hangs on a simulated clock."""

from __future__ import annotations

import random

import pytest

from vigil.detectors import DetectorError, HangDetector


def feed(det, n, mean=1.0, jitter=0.05, seed=0, t0=0.0):
    rng = random.Random(seed)
    t = t0
    for _ in range(n):
        d = mean * (1 + rng.uniform(-jitter, jitter))
        t += d
        det.update(d, t=t)
    return t


def scan(det, start, stop, step=0.01):
    """Tick from start to stop; return the first time the detector fired."""
    t = start
    while t <= stop:
        det.tick(t)
        if det.finding is not None:
            return t
        t += step
    return None


@pytest.mark.parametrize("mean", [0.2, 1.0, 7.5])
def test_fires_just_after_k_times_the_mean(mean):
    det = HangDetector(k=3, warmup=5)
    last = feed(det, 100, mean=mean, jitter=0.0)
    fired = scan(det, last, last + 10 * mean, step=mean / 100)
    assert fired == pytest.approx(last + 3 * mean, abs=mean / 50)
    assert det.finding.onset == last and det.finding.severity == 2


def test_no_false_alarm_with_jitter_and_normal_gaps():
    det = HangDetector(k=3, warmup=5)
    rng = random.Random(1)
    t = 0.0
    for _ in range(2000):
        d = rng.lognormvariate(0, 0.2)
        det.tick(t + d * 0.99)  # the timer runs while the iteration is in flight
        t += d
        det.update(d, t=t)
        assert det.finding is None


def test_silent_during_warmup():
    det = HangDetector(k=3, warmup=10)
    last = feed(det, 9)
    det.tick(last + 1000)
    assert det.finding is None


def test_progress_clears_the_hang():
    det = HangDetector(k=3, warmup=5)
    last = feed(det, 20)
    det.tick(last + 100)
    assert det.finding is not None
    det.update(1.0, t=last + 101)
    assert det.finding is None


def test_max_mode_tolerates_rare_long_steps():
    det = HangDetector(mode="max", safety_factor=2.0, warmup=5)
    t = feed(det, 50, jitter=0.0)
    det.update(10.0, t=t + 10)  # a checkpoint step
    det.tick(t + 10 + 15)       # 15 s of silence < 2 x 10 s
    assert det.finding is None
    det.tick(t + 10 + 21)
    assert det.finding is not None


def test_out_of_order_completions_keep_the_latest_progress():
    det = HangDetector(k=3, warmup=2)
    det.update(1.0, t=10.0)
    det.update(1.0, t=12.0)
    det.update(1.0, t=11.0)
    assert det.last_progress == 12.0


@pytest.mark.parametrize("kwargs", [{"k": 1.0}, {"warmup": 0}, {"mode": "median"}, {"window": 0},
                                    {"min_timeout_s": -1}, {"safety_factor": 0.5}])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(DetectorError):
        HangDetector(**kwargs)


def test_bad_inputs_raise():
    det = HangDetector()
    with pytest.raises(DetectorError):
        det.update(-1.0, t=0.0)
    with pytest.raises(DetectorError):
        det.update(1.0, t=float("nan"))
