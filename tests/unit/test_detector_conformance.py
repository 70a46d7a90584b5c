"""One suite over every registered detector: reset, snapshot round trip,
silence during warm-up on healthy input, determinism (river's checks/)."""

from __future__ import annotations

import pickle

import pytest

import vigil.detectors
import vigil.detectors.baselines  # noqa: F401  (the benchmark's baselines register on import)
from vigil.detectors import REGISTRY


def _run(det, calls):
    trace = []
    for method, args, kwargs in calls:
        getattr(det, method)(*args, **kwargs)
        trace.append(det.finding)
    return trace


@pytest.fixture(params=sorted(REGISTRY), ids=str)
def detector_cls(request):
    return REGISTRY[request.param]


def test_registry_names_match_classes():
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.version
    assert vigil.detectors.HangDetector.name in REGISTRY


def test_engine_wiring_is_declared(detector_cls):
    """What the engine feeds a detector and per what key is on its class (built-ins as plugins)."""
    from vigil.detectors.inputs import PROGRESS, RANK_TIMINGS
    from vigil.schemas import EVENT_TYPES

    if not detector_cls.consumes:
        return  # a library piece (a change-point core, a baseline): driven by another detector
    assert detector_cls.per in ("job", "node")
    assert set(detector_cls.consumes) <= set(EVENT_TYPES) | {PROGRESS, RANK_TIMINGS}


def test_silent_during_warmup_on_healthy_input(detector_cls):
    det = detector_cls(**detector_cls._conformance_params())
    calls = list(detector_cls._conformance_feed(seed=1))
    trace = _run(det, calls[: detector_cls._conformance_warmup()])
    assert all(f is None for f in trace)


def test_deterministic(detector_cls):
    calls = list(detector_cls._conformance_feed(seed=7))
    a = _run(detector_cls(**detector_cls._conformance_params()), calls)
    b = _run(detector_cls(**detector_cls._conformance_params()), calls)
    assert a == b


def test_reset_returns_to_the_initial_state(detector_cls):
    calls = list(detector_cls._conformance_feed(seed=3))
    fresh = detector_cls(**detector_cls._conformance_params())
    used = detector_cls(**detector_cls._conformance_params())
    _run(used, calls)
    used._reset()
    assert _run(used, calls) == _run(fresh, calls)


def test_snapshot_round_trip_continues_identically(detector_cls):
    calls = list(detector_cls._conformance_feed(seed=5))
    half = len(calls) // 2
    original = detector_cls(**detector_cls._conformance_params())
    _run(original, calls[:half])
    snap = pickle.loads(pickle.dumps(original.snapshot()))
    restored = detector_cls.restore(snap)
    assert _run(restored, calls[half:]) == _run(original, calls[half:])


def test_restore_rejects_a_foreign_snapshot(detector_cls):
    other = next(c for n, c in sorted(REGISTRY.items()) if c is not detector_cls)
    snap = other(**other._conformance_params()).snapshot()
    with pytest.raises(ValueError):
        detector_cls.restore(snap)
