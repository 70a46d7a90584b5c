"""The labelled corpora of the detector benchmark: seeded, ground truth consistent with the series."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.sim.changepoints import ANNOTATOR_THRESHOLDS, FAMILIES, generate_corpus, generate_series
from vigil.sim.failslow_cases import OUT_OF_FAMILY, generate_cases


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(20, seed=11)


def test_reproducible_and_one_series_alone(corpus):
    again = generate_corpus(20, seed=11)
    for a, b in zip(corpus[::17], again[::17]):
        np.testing.assert_array_equal(a.values, b.values)
        assert a.annotations == b.annotations
    s = corpus[45]
    solo = generate_series(s.family, s.seed)
    np.testing.assert_array_equal(solo.values, s.values)


def test_every_family_sizes_and_ranges(corpus):
    assert [s.family for s in corpus[::20]] == list(FAMILIES)
    for s in corpus:
        assert len(s.annotations) == len(ANNOTATOR_THRESHOLDS)
        assert all(0 < c < len(s) for c in s.changes)
        assert all(0 < a < len(s) for marks in s.annotations.values() for a in marks)
        assert np.all(np.isfinite(s.values))
        if s.family == "short":
            assert 10 <= len(s) <= 60
        if s.family == "random_walk":
            assert s.changes == () and all(m == [] for m in s.annotations.values())
        if s.family == "iteration":
            assert np.all(s.values > 0)


def test_annotators_mark_by_salience(corpus):
    for s in corpus:
        for c, sal in zip(s.changes, s.salience):
            for a, thr in enumerate(ANNOTATOR_THRESHOLDS):
                near = any(abs(m - c) <= 3 for m in s.annotations[a])
                if sal >= thr:
                    assert near, (s.family, s.seed, c)
        # a more sensitive annotator never marks fewer true changes than a less sensitive one
        counts = [sum(sal >= thr for sal in s.salience) for thr in ANNOTATOR_THRESHOLDS]
        assert counts == sorted(counts, reverse=True)


def test_a_salient_level_shift_is_in_the_values_where_the_truth_says():
    checked = 0
    for seed in range(40):
        s = generate_series("level", seed)
        x = s.values
        noise = 1.4826 * np.median(np.abs(np.diff(x))) / np.sqrt(2)
        for c, sal in zip(s.changes, s.salience):
            if sal >= 4:  # at least 2 sigmas between segments of 15 or more
                checked += 1
                step = abs(np.median(x[c:c + 15]) - np.median(x[c - 15:c])) / noise
                assert step > 1.0, (seed, c)
    assert checked > 20


def test_failslow_cases_ground_truth():
    cases = generate_cases(4, seed=5)
    assert sorted({c.family for c in cases}) == sorted(OUT_OF_FAMILY)
    for c in cases:
        tr = c.trace
        if c.family in ("benign_shift", "restart_level"):
            assert tr.clean and len(c.events) == 1
        elif c.family in ("checkpoint_eval", "warmup"):
            assert tr.clean and c.events == ()
        else:
            assert not tr.clean
        for e in tr.fail_slows:
            assert e.step >= 0.10
            # the expected time rises at the onset (a ramp rises from its first value)
            assert tr.expected[e.onset] > tr.expected[e.onset - 1]
            if e.recovery is not None:
                assert tr.expected[e.recovery] < tr.expected[e.recovery - 1]
        np.testing.assert_allclose(tr.timestamps, np.cumsum(tr.iteration_times))
