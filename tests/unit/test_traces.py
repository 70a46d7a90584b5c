"""The labelled trace generator: seeded, realistic ingredients, exact ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.sim.traces import MIN_ONSET, generate_trace, generate_traces


@pytest.fixture(scope="module")
def traces():
    return generate_traces(500, seed=0)


def test_seeded_and_reproducible_one_by_one(traces):
    again = generate_traces(500, seed=0)
    for a, b in zip(traces[::10], again[::10]):
        np.testing.assert_array_equal(a.iteration_times, b.iteration_times)
        assert a.fail_slows == b.fail_slows
    t = traces[300]
    solo = generate_trace(t.seed, faulty=not t.clean, trace_id=t.trace_id)
    np.testing.assert_array_equal(solo.iteration_times, t.iteration_times)
    other = generate_traces(20, seed=1)
    assert not np.array_equal(other[0].iteration_times[:100], traces[0].iteration_times[:100])


def test_half_clean_half_faulty(traces):
    assert len(traces) == 500
    assert sum(t.clean for t in traces) == 250
    assert all(t.fail_slows for t in traces[250:])


def test_times_are_positive_and_timestamps_their_running_sum(traces):
    for t in traces[::25]:
        assert np.all(t.iteration_times > 0)
        np.testing.assert_allclose(t.timestamps, np.cumsum(t.iteration_times))
        assert 1000 <= len(t) <= 5000


def test_clean_traces_carry_pauses_spikes_and_warmup(traces):
    clean = [t for t in traces if t.clean]
    assert all(t.checkpoint_iterations.size > 0 for t in clean if len(t) > 2000)
    assert sum(t.gc_iterations.size > 0 for t in clean) > 0.5 * len(clean)
    assert sum(t.spike_iterations.size > 0 for t in clean) > 0.9 * len(clean)
    for t in clean[:50]:
        base = np.median(t.iteration_times)
        assert t.iteration_times[0] > 2.5 * base  # slow first step
        ck = t.checkpoint_iterations
        if ck.size:
            assert np.all(t.iteration_times[ck] > t.expected[ck] * 1.1)  # pauses are there
        # Heavy tails: more far-out values than a Gaussian of the same core scale would give.
        body = t.iteration_times[100:] / t.expected[100:]
        mask = np.ones(body.size, bool)
        for idx in (t.gc_iterations, t.checkpoint_iterations, t.spike_iterations):
            sel = idx[idx >= 100] - 100
            mask[sel] = False
            mask[np.minimum(sel + 1, body.size - 1)] = False
        z = np.log(body[mask])
        mad = 1.4826 * np.median(np.abs(z - np.median(z)))
        assert mad == pytest.approx(t.jitter, rel=0.35)


def test_ground_truth_matches_the_injected_signal(traces):
    episodes = [(t, e) for t in traces for e in t.fail_slows]
    assert len(episodes) >= 250
    for t, e in episodes:
        assert MIN_ONSET <= e.onset < len(t)
        assert e.cause in ("computation", "communication")
        assert e.location.startswith("gpu:" if e.cause == "computation" else "link:")
        assert 0.05 <= e.severity <= 0.90
        # The expected step time changes by exactly `step` at the onset ...
        exp = t.expected
        drift_free = exp[e.onset] / exp[e.onset - 1]
        assert drift_free == pytest.approx(1.0 + e.step, rel=2e-3)
        # ... and by `recovery_step` at the recovery.
        if e.recovery is not None:
            assert e.onset < e.recovery < len(t)
            assert exp[e.recovery] / exp[e.recovery - 1] == pytest.approx(1.0 - e.recovery_step, rel=2e-3)
            assert e.recovery_time == pytest.approx(t.timestamps[e.recovery])
        assert e.onset_time == pytest.approx(t.timestamps[e.onset])
    solo = [e for t, e in episodes if len(t.fail_slows) == 1]
    assert all(e.step == pytest.approx(e.severity, rel=1e-9) for e in solo)


def test_faulty_mix_covers_both_causes_overlaps_and_the_severity_range(traces):
    eps = [e for t in traces for e in t.fail_slows]
    causes = {e.cause for e in eps}
    assert causes == {"computation", "communication"}
    assert sum(len(t.fail_slows) == 2 for t in traces) >= 20
    sev = np.array([e.severity for e in eps])
    assert sev.min() < 0.07 and sev.max() > 0.7
    assert np.mean(sev >= 0.10) > 0.5
    durations = np.array([e.duration_s for e in eps])
    assert durations.min() < 60 and durations.max() > 3600
    assert any(e.recovery is None for e in eps) and any(e.recovery is not None for e in eps)


def test_overlapping_slowdowns_overlap(traces):
    for t in traces:
        if len(t.fail_slows) == 2:
            a, b = t.fail_slows
            end_a = a.recovery if a.recovery is not None else len(t)
            assert a.onset < b.onset < end_a


def test_parameter_checks():
    with pytest.raises(ValueError):
        generate_traces(0)
    with pytest.raises(ValueError):
        generate_traces(10, clean_fraction=1.5)
    with pytest.raises(ValueError):
        generate_trace(1, faulty=True, n_iterations=100)
