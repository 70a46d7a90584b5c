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
    det = HangDetector(k=3, warmup=5, min_timeout_s=0.0)  # the rule alone (the floor is tested below)
    last = feed(det, 100, mean=mean, jitter=0.0)
    fired = scan(det, last, last + 10 * mean, step=mean / 100)
    assert fired == pytest.approx(last + 3 * mean, abs=mean / 50)
    assert det.finding.onset == last and det.finding.severity == 2


def test_fast_steps_wait_for_the_floor():
    """0.2 s steps: 3 x the mean is 0.6 s, less than a busy host stalls a healthy process; the floor holds."""
    det = HangDetector(k=3, warmup=5, min_timeout_s=0.8)
    last = feed(det, 100, mean=0.2, jitter=0.0)
    fired = scan(det, last, last + 5, step=0.002)
    assert fired == pytest.approx(last + 0.8, abs=0.004)


def test_too_few_steps_learned_keep_the_startup_timeout():
    """Past warm-up, the longest of three steps says little about the next: the start-up timeout holds until
    min_steps step times were learned, then the learned one does."""
    det = HangDetector(k=3, warmup=5, min_steps=10, startup_timeout_s=60.0)
    last = feed(det, 5 + 9, mean=1.0, jitter=0.0)  # 9 learned
    assert scan(det, last, last + 30, step=0.5) is None
    det = HangDetector(k=3, warmup=5, min_steps=10, startup_timeout_s=60.0)
    last = feed(det, 5 + 10, mean=1.0, jitter=0.0)  # 10 learned
    assert scan(det, last, last + 30, step=0.01) == pytest.approx(last + 3.0, abs=0.02)


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


def test_during_warmup_only_the_startup_timeout_applies():
    det = HangDetector(k=3, warmup=10, startup_timeout_s=600)
    last = feed(det, 9)
    det.tick(last + 599)
    assert det.finding is None
    det.tick(last + 601)
    assert det.finding is not None and det.finding.evidence["timeout_from"] == "startup"


def test_warmup_steps_and_checkpoint_steps_do_not_teach_the_step_time():
    det = HangDetector(k=3, warmup=3)
    det.update(15.0, t=15.0)                    # the first step compiles: 15x the others
    t = feed(det, 20, jitter=0.0, t0=15.0)
    assert det.learned_timeout_s == pytest.approx(3.0)
    det.checkpoint("started", t=t + 1, step=21)
    det.tick(t + 100)                           # a long checkpoint: not a hang
    assert det.finding is None
    det.checkpoint("completed", t=t + 110, step=21, duration_s=109)
    det.update(110.0, t=t + 110.5)              # the step that held it
    assert det.learned_timeout_s == pytest.approx(3.0)
    det.tick(t + 110.5 + 3.1)
    assert det.finding is not None and det.finding.onset == t + 110.5


def test_a_stuck_checkpoint_is_a_hang_after_its_own_timeout():
    det = HangDetector(k=3, warmup=2, checkpoint_timeout_s=60)
    t = feed(det, 10, jitter=0.0)
    det.checkpoint("started", t=t + 0.5, step=10)
    det.tick(t + 60)
    assert det.finding is None
    det.tick(t + 61)
    assert det.finding is not None and det.finding.evidence["timeout_from"] == "checkpoint"


def test_delivery_delay_is_not_silence():
    det = HangDetector(k=3, warmup=2, min_timeout_s=0.0)
    t = 0.0
    for i in range(50):                         # 0.2 s steps, heard up to 0.5 s late (batched)
        t += 0.2
        det.update(0.2, t=t, lag_s=0.5 * (i % 3) / 2)
    det.tick(t + 0.6 + 0.45)                    # 3 x 0.2 s, plus less than the longest delay seen
    assert det.finding is None
    det.tick(t + 0.6 + 0.55)
    assert det.finding is not None


def test_a_restart_warms_up_again():
    det = HangDetector(k=3, warmup=3, startup_timeout_s=120)
    t = feed(det, 30, jitter=0.0)
    det.restart(t + 1)
    det.tick(t + 60)                            # loading the checkpoint again: fine
    assert det.finding is None
    det.update(1.0, t=t + 70, step=5)
    det.tick(t + 75)
    assert det.finding is None


def test_progress_clears_the_hang():
    det = HangDetector(k=3, warmup=5)
    last = feed(det, 20)
    det.tick(last + 100)
    assert det.finding is not None
    det.update(1.0, t=last + 101)
    assert det.finding is None


def test_rare_long_steps_are_tolerated_once_seen():
    det = HangDetector(max_factor=2.0, warmup=5)
    t = feed(det, 50, jitter=0.0)
    det.update(10.0, t=t + 10)  # a long evaluation step, unmarked
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


@pytest.mark.parametrize("kwargs", [{"k": 1.0}, {"warmup": 0}, {"window": 0}, {"min_timeout_s": -1},
                                    {"max_factor": 0.5}, {"startup_timeout_s": 0}])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(DetectorError):
        HangDetector(**kwargs)


def test_bad_inputs_raise():
    det = HangDetector()
    with pytest.raises(DetectorError):
        det.update(-1.0, t=0.0)
    with pytest.raises(DetectorError):
        det.update(1.0, t=float("nan"))


def _periodic_job(det, steps, step_s=0.2, every=8, pause_x=10.0, marked=True):
    """Steps of ``step_s`` s, and after every ``every``-th a save of ``pause_x`` steps between two steps
    (marked as a checkpoint, as the hooks mark torch.save, or not); ticks every 10 ms. The first time
    the detector fires, or None; and the end of the last step."""
    t = 0.0
    for step in range(steps):
        fired = scan(det, t, t + step_s)
        if fired is not None:
            return fired, t
        t += step_s
        det.update(step_s, t=t, step=step)
        if step and step % every == 0:
            if marked:
                det.checkpoint("started", t=t, step=step)
            fired = scan(det, t, t + pause_x * step_s)
            if fired is not None:
                return fired, t
            t += pause_x * step_s
            if marked:
                det.checkpoint("completed", t=t, step=step, duration_s=pause_x * step_s)
    return None, t


def test_a_periodic_checkpoint_pause_pages_only_when_nothing_marks_it():
    """Every 8 steps a pause of 10 steps: unmarked, no learned timeout can tell it from a hang (why the hooks
    mark torch.save and DCP saves themselves); marked, no page, and a hang after it is still caught in k x D."""
    fired, _ = _periodic_job(HangDetector(k=3, warmup=5, min_timeout_s=0.0), 40, marked=False)
    assert fired is not None
    det = HangDetector(k=3, warmup=5, min_timeout_s=0.0)  # 0.2 s steps: the k x D rule, not the floor
    fired, end = _periodic_job(det, 40, marked=True)
    assert fired is None and det.learned_timeout_s == pytest.approx(0.6)
    hung = scan(det, end, end + 5)  # the job hangs after its last step
    assert hung is not None and hung - end <= 3 * 0.2 + 0.011


def test_a_save_every_step_still_teaches_the_step_time():
    """Saves marked every step, between steps or inside them: the steps teach their time outside the saves
    (a step that held one taught nothing before, so the timeout stayed the 600 s start-up one)."""
    for inside in (False, True):
        det = HangDetector(k=3, warmup=5)
        t = 0.0
        for step in range(30):
            start = t
            if not inside:
                det.checkpoint("started", t=t, step=step)
                det.checkpoint("completed", t=t + 0.3, step=step, duration_s=0.3)
                start = t = t + 0.3
                det.update(0.4, t=t + 0.4, step=step)
            else:
                det.checkpoint("started", t=t + 0.1, step=step)
                det.checkpoint("completed", t=t + 0.4, step=step, duration_s=0.3)
                det.update(0.7, t=t + 0.7, step=step)  # 0.4 s of work around a 0.3 s save
            t = start + (0.4 if not inside else 0.7)
        assert det.learned_timeout_s == pytest.approx(1.2), inside
        hung = scan(det, t, t + 5)
        assert hung is not None and hung - t <= 1.2 + 0.011


def test_the_gate_timeout_follows_every_change_of_state():
    """timeout_s is kept between state changes (the engine reads it every tick): each change must renew it."""
    det = HangDetector(k=3, warmup=1, min_steps=2, window=4)
    for t in (1.0, 2.0, 3.0):  # the first is the warm-up's; two learned steps of 1 s
        det.update(1.0, t=t)
    assert det.timeout_s == pytest.approx(3.0)  # 3 x the mean
    for t in (3.2, 3.4, 3.6, 3.8):  # the window now holds four 0.2 s steps
        det.update(0.2, t=t)
    assert det.timeout_s == pytest.approx(0.8)  # the floor (3 x 0.2 < min_timeout_s)
    det.checkpoint("started", t=4.0)
    assert det.timeout_s == pytest.approx(600.0)
    det.checkpoint("completed", t=5.0, duration_s=1.0)
    assert det.timeout_s == pytest.approx(0.8)
    det.restart(6.0)
    assert det.timeout_s == pytest.approx(600.0)  # warming up again
    det.update(0.2, t=6.2)
    det.update(0.2, t=6.4)
    assert det.timeout_s == pytest.approx(0.8)
    det.finishing(6.5)
    assert det.timeout_s == pytest.approx(600.0)
