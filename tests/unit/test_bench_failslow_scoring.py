"""The fail-slow benchmark's matching and scoring on hand-made traces of known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vigil.bench.detectors import NeverAlarm, ONSET_TOLERANCE, evaluate, held_step, run_detector, score_trace
from vigil.detectors.base import Finding
from vigil.sim.traces import InjectedFailSlow, IterationTrace


def _trace(episodes=(), n=1000, trace_id=0):
    """A flat 1 s trace; ``episodes`` are (onset, recovery or None, step)."""
    eps = tuple(InjectedFailSlow(onset=o, recovery=r, cause="computation", location="gpu:0", severity=s,
                                 slowdown=s, step=s, recovery_step=math.nan if r is None else s / (1 + s),
                                 duration_s=1.0, onset_time=float(o), recovery_time=None if r is None else float(r))
                for o, r, s in episodes)
    x = np.ones(n)
    return IterationTrace(trace_id=trace_id, seed=0, iteration_times=x, timestamps=np.cumsum(x), expected=x,
                          base_iteration_time=1.0, compute_fraction=0.7, n_gpus=8, jitter=0.01, fail_slows=eps,
                          gc_iterations=np.empty(0, int), checkpoint_iterations=np.empty(0, int),
                          spike_iterations=np.empty(0, int))


SLOW = _trace([(400, 700, 0.3)])
CLEAN = _trace()
SMALL = _trace([(400, 700, 0.05)])  # 5 %: not required


def test_perfect_detector_is_correct():
    s = score_trace(SLOW, [(403, 400, "fail_slow"), (703, 700, "recovery")])
    assert s["correct"] and s["scored"] and s["fp"] == 0
    assert s["detected"] == {0: (3, 0)} and s["rec_found"] == 1


def test_never_alarming_detector_misses_and_is_right_on_clean_traces():
    s = score_trace(SLOW, [])
    assert not s["correct"] and s["detected"] == {}
    assert score_trace(CLEAN, [])["correct"]


def test_faulty_trace_without_required_episode_is_not_scored():
    s = score_trace(SMALL, [])
    assert not s["scored"]


def test_always_alarming_detector_is_wrong():
    changes = [(i, i, "fail_slow") for i in range(len(SLOW))]
    s = score_trace(SLOW, changes)
    assert 0 in s["detected"]  # the alarm at the onset matches
    assert s["fp"] == len(SLOW) - 1 and not s["correct"]


@pytest.mark.parametrize("k,hit", [(0, True), (ONSET_TOLERANCE, True), (ONSET_TOLERANCE + 1, False)])
def test_onset_late_by_k(k, hit):
    s = score_trace(SLOW, [(430, 400 + k, "fail_slow")])
    assert (0 in s["detected"]) is hit
    assert s["fp"] == (0 if hit else 1)


def test_alarm_after_the_episode_ended_does_not_count():
    s = score_trace(SLOW, [(700, 400, "fail_slow")])
    assert s["detected"] == {} and s["fp"] == 1


def test_second_alarm_for_one_episode_is_a_false_positive():
    s = score_trace(SLOW, [(403, 400, "fail_slow"), (410, 401, "fail_slow")])
    assert s["fp"] == 1 and not s["correct"]


def test_recovery_alarm_that_is_no_recovery_is_a_false_positive():
    s = score_trace(CLEAN, [(40, 30, "recovery")])
    assert s["fp"] == 1 and s["fp_recovery"] == 1 and not s["correct"]
    s = score_trace(SLOW, [(403, 400, "fail_slow"), (600, 590, "recovery")])
    assert s["fp_recovery"] == 1 and not s["correct"]


def test_recovery_reported_before_it_happened_does_not_match():
    s = score_trace(SLOW, [(403, 400, "fail_slow"), (699, 700, "recovery")])
    assert s["fp_recovery"] == 1


class _Scripted:
    """A detector that reports a fail-slow ``delay`` updates after each true onset of the trace it is told."""

    def __init__(self, onsets, delay):
        self._onsets = set(onsets)
        self._delay = delay
        self._i = -1
        self.change_detected = False
        self.last_change = None

    def update(self, x, *, t):
        self._i += 1
        o = self._i - self._delay
        self.change_detected = o in self._onsets
        if self.change_detected:
            self.last_change = Finding("fail_slow", 3, float(o), t, {"onset_index": o})


def test_evaluate_floor_perfect_and_late_detectors():
    traces = [CLEAN, SLOW, SMALL]
    floor = evaluate(NeverAlarm, traces)
    assert floor["n_scored"] == 2 and floor["faulty_without_required"] == 1
    assert floor["accuracy"] == 0.5 and floor["fpr"] == 0.0 and floor["fnr_ge10"] == 1.0
    lo, hi = floor["accuracy_ci"]
    assert lo < 0.5 < hi
    # one scripted detector for all traces: it knows the onsets of SLOW (400) and of SMALL (400)
    for k in (2, 7):
        m = evaluate(lambda: _Scripted([400], k), [SLOW])
        assert m["accuracy"] == 1.0 and m["fnr_ge10"] == 0.0
        assert m["delay_median"] == k and m["delay_max"] == k and m["delay_n"] == 1
        assert m["delay_median_ge20"] == k and m["delay_p99"] is None  # no p99 from one sample
    always_wrong = evaluate(lambda: _Scripted([100], 0), [CLEAN])
    assert always_wrong["fpr"] == 1.0 and always_wrong["accuracy"] == 0.0


def test_run_detector_restarts_at_known_events():
    made = []

    def make():
        made.append(_Scripted([5], 0))
        return made[-1]

    changes, _ = run_detector(make, _trace(n=50), events=[20])
    assert len(made) == 2
    assert changes == [(5, 5, "fail_slow"), (25, 25, "fail_slow")]  # onsets in the trace's indices


def test_targets_over_the_interval_use_its_far_end():
    from vigil.bench.detectors import targets_over_interval

    met = {"accuracy_ci": [0.995, 1.0], "fpr_ci": [0.0, 0.0], "fnr_ge10_ci": [0.0, 0.01],
           "delay_median_ge20_ci": [3.0, 5.0]}
    assert set(targets_over_interval(met).values()) == {True}  # every bound reached exactly at the far end
    short = {"accuracy_ci": [0.994, 1.0], "fpr_ci": [0.0, 0.001], "fnr_ge10_ci": [0.0, 0.0101],
             "delay_median_ge20_ci": [3.0, 5.5]}
    assert set(targets_over_interval(short).values()) == {False}
    assert set(targets_over_interval({"accuracy_ci": None, "fpr_ci": None, "fnr_ge10_ci": None,
                                      "delay_median_ge20_ci": None}).values()) == {None}


def test_a_perfect_score_on_two_traces_meets_the_targets_only_at_the_point():
    from vigil.bench.detectors import _targets, targets_over_interval

    m = evaluate(lambda: _Scripted([400], 2), [SLOW, _trace(n=300)])  # (the clean one ends before 400)
    assert m["accuracy"] == 1.0 and m["fpr"] == 0.0 and m["fnr_ge10"] == 0.0 and m["delay_median_ge20"] == 2
    assert set(_targets(m).values()) == {True}
    # Wilson 95 % on 2 of 2 correct: lower end 0.342; 0 of 1 clean alarmed: upper end 0.793
    assert m["accuracy_ci"][0] == pytest.approx(0.3424, abs=1e-4)
    over = targets_over_interval(m)
    assert over == {"accuracy_ge_0.995": False, "fpr_eq_0": False, "fnr_ge10_le_0.01": False,
                    "delay_median_ge20_le_5": True}  # one delay of 2: its bootstrap interval is [2, 2]


def _episode(onset, recovery, step, recovery_step):
    return InjectedFailSlow(onset=onset, recovery=recovery, cause="computation", location="gpu:0", severity=step,
                            slowdown=step, step=step, recovery_step=recovery_step, duration_s=1.0,
                            onset_time=float(onset), recovery_time=float(recovery))


def _overlap(second_onset):
    """+30 % from 400 to 500 (back by 1 - 1/1.3); a second episode +16 % at ``second_onset`` until 800, on its own +20 %."""
    x = np.ones(1000)
    x[400:500] = 1.3
    x[second_onset:800] = 1.2
    x[second_onset:500] = 1.3 * 1.16
    eps = (_episode(400, 500, 0.3, 1 - 1.2 / (1.3 * 1.16)), _episode(second_onset, 800, 0.16, 1 - 1 / 1.2))
    return IterationTrace(trace_id=0, seed=0, iteration_times=x, timestamps=np.cumsum(x), expected=x,
                          base_iteration_time=1.0, compute_fraction=0.7, n_gpus=8, jitter=0.01, fail_slows=eps,
                          gc_iterations=np.empty(0, int), checkpoint_iterations=np.empty(0, int),
                          spike_iterations=np.empty(0, int))


def test_episode_whose_step_another_recovery_undoes_is_not_required():
    # starts 2 iterations before the first one recovers: the series is 1.3 before it and 1.2 from 500 on
    tr = _overlap(498)
    assert held_step(tr, tr.fail_slows[1]) == pytest.approx(1.2 / 1.3 - 1)
    s = score_trace(tr, [(403, 400, "fail_slow"), (503, 500, "recovery"), (803, 800, "recovery")])
    assert s["required"] == [0] and s["correct"]


def test_episode_that_holds_its_step_is_required():
    tr = _overlap(450)  # 50 iterations at 1.3 * 1.16 first
    assert held_step(tr, tr.fail_slows[1]) == pytest.approx(0.16)
    s = score_trace(tr, [(403, 400, "fail_slow"), (503, 500, "recovery"), (803, 800, "recovery")])
    assert s["required"] == [0, 1] and not s["correct"]
