"""F1 with a margin and covering (van den Burg & Williams 2020) on hand-made cases of known answer.

Every expected value below is worked out by hand in the comment beside it, or
is one of the worked examples that come with the reference implementation of
the paper (TCPDBench); none is a recording of this code's output.
"""

from __future__ import annotations

import math

import pytest

from vigil.bench.cpscore import bootstrap_mean, cover_single, covering, f_measure, segments, true_positives, wilson

N = 100
ONE = {0: [50]}  # one annotator, one change at 50 of a 100-point series


def test_true_positives_match_each_prediction_once():
    assert true_positives({1, 10, 20, 23}, {3, 8, 20}) == {1, 10, 20}  # 23's only neighbour 20 is taken
    assert true_positives({10, 12}, {11}) == {10}
    assert true_positives(set(), {1, 2}) == set()
    assert true_positives({1, 2}, set()) == set()


def test_margin_is_inclusive():
    assert true_positives({50}, {55}) == {50}
    assert true_positives({50}, {56}) == set()


def test_perfect_detector():
    assert f_measure({0: [10, 20], 1: [10, 20]}, [10, 20]) == (1.0, 1.0, 1.0)
    assert covering({0: [10, 20], 1: [10, 20]}, [10, 20], N) == 1.0


def test_never_alarming_detector():
    # X = {0}; P = 1/1; R = |{0}| / |{0, 50}| = 1/2; F1 = 2 * 1 * 0.5 / 1.5
    f, p, r = f_measure(ONE, [])
    assert (p, r) == (1.0, 0.5)
    assert f == pytest.approx(2 / 3)
    # segments [0,50) [50,100) each covered by [0,100) with Jaccard 1/2
    assert covering(ONE, [], N) == pytest.approx(0.5)
    # no annotated change: silence is perfect
    assert f_measure({0: [], 1: []}, []) == (1.0, 1.0, 1.0)
    assert covering({0: []}, [], N) == 1.0


def test_always_alarming_detector():
    # X = {0..99}: 100 predictions, 2 true positives (0 and 50); R = 1
    f, p, r = f_measure(ONE, range(N))
    assert (p, r) == (0.02, 1.0)
    assert f == pytest.approx(2 * 0.02 / 1.02)
    # 100 segments of one point: [0,50) is best covered by one point, Jaccard 1/50
    assert covering(ONE, range(N), N) == pytest.approx(1 / 50)


@pytest.mark.parametrize("k", [1, 5])
def test_late_within_the_margin_is_a_hit(k):
    assert f_measure(ONE, [50 + k])[0] == 1.0


def test_late_beyond_the_margin_is_a_miss_and_a_false_positive():
    # X = {0, 56}: P = 1/2, R = 1/2
    assert f_measure(ONE, [56]) == (0.5, 0.5, 0.5)


def test_late_by_k_covering():
    k = 10
    # [0,50) vs [0,60): 50/60; [50,100) vs [60,100): 40/50
    assert covering(ONE, [50 + k], N) == pytest.approx((50 * 50 / 60 + 50 * 40 / 50) / 100)


def test_annotators_are_averaged():
    # recall: annotator 0 has {0, 50} (1 of 2 found), annotator 1 has {0} (1 of 1): R = 3/4; P = 1
    f, p, r = f_measure({0: [50], 1: []}, [])
    assert (p, r) == (1.0, 0.75)
    assert f == pytest.approx(2 * 0.75 / 1.75)
    assert covering({0: [50], 1: []}, [], N) == pytest.approx((0.5 + 1.0) / 2)


def test_worked_examples_of_the_reference_implementation():
    assert f_measure({1: [10, 20], 2: [11, 20], 3: [10], 4: [0, 5]}, [10, 20])[0] == 1.0
    assert f_measure({1: [], 2: [10], 3: [50]}, [10])[0] == pytest.approx(0.9090909090909091)
    assert f_measure({1: [], 2: [10], 3: [50]}, [])[0] == pytest.approx(0.8)
    assert covering({1: [10, 20], 2: [10], 3: [0, 5]}, [10, 20], 45) == pytest.approx(0.7962962962962963)
    assert covering({1: [], 2: [10], 3: [40]}, [10], 45) == pytest.approx(0.7954144620811286)
    assert covering({1: [], 2: [10], 3: [40]}, [], 45) == pytest.approx(0.8189300411522634)


def test_cover_single_and_segments():
    assert segments([3, 5], 8) == [(0, 3), (3, 5), (5, 8)]
    assert segments([0, 4, 9], 6) == [(0, 4), (4, 6)]  # 0 and points past the end cut nothing
    # [0,3) [3,6) covered by [0,2) [2,4) [4,6): each half's best Jaccard is 2/3 ([0,2) and [4,6))
    assert cover_single([(0, 2), (2, 4), (4, 6)], [(0, 3), (3, 6)]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        cover_single([(0, 5)], [(0, 6)])


def test_bad_input_is_rejected():
    with pytest.raises(ValueError):
        f_measure({}, [1])
    with pytest.raises(ValueError):
        covering({}, [1], 10)


def test_wilson_interval():
    lo, hi = wilson(0, 100)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / 103.8415, rel=1e-4)  # z^2/n / (1 + z^2/n)
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)
    assert wilson(0, 0) is None


def test_bootstrap_mean_of_constants_and_spread():
    assert bootstrap_mean([2.0] * 10) == (2.0, 2.0)
    lo, hi = bootstrap_mean([0.0, 1.0] * 50)
    assert lo < 0.5 < hi and math.isclose(lo + hi, 1.0, abs_tol=0.05)
    assert bootstrap_mean([]) is None
