"""ACF iteration period against generated collective-call streams with known period and times."""

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.period import IterationPeriod, acf, acf_period, iteration_time_from_period
from vigil.sim.rank_traces import make_collective_stream


def test_acf_exact_period():
    a = acf(list("abcdabcdabcdabcd"), 8)
    assert a[0] == pytest.approx(1.0) and a[4] == pytest.approx(1.0) and a[8] == pytest.approx(1.0)
    assert max(a[1:4]) < 0.5


def test_refine_skips_sub_period():
    # 200 alternating tp calls then 2 dp calls: lag 2 has ACF >= 0.95, the period is 202
    it = ["ag|tp", "rs|tp"] * 100 + ["rs|dp", "ar|world"]
    seq = it * 4
    assert acf_period(seq, refine=False) == 2  # Falcon's first-lag rule takes the sub-period
    assert acf_period(seq) == 202


def test_no_period_in_random_sequence():
    rng = np.random.default_rng(0)
    assert acf_period(list(rng.integers(0, 6, 400))) is None


def test_iteration_time_from_period():
    codes = [0, 1, 2] * 5
    times = np.repeat(np.arange(5) * 2.0, 3) + np.tile([0.0, 0.3, 0.9], 5)
    assert iteration_time_from_period(codes, times, 3) == pytest.approx(2.0)


@pytest.mark.parametrize("seed", range(6))
def test_detector_on_generated_streams(seed):
    rng = np.random.default_rng(seed)
    calls, truth = make_collective_stream(rng, n_iters=40)
    det = IterationPeriod()
    for op, grp, t in calls:
        det.update(op, grp, t=t)
    assert det.period == truth["period"]
    lo, hi = det.window_span
    starts, times = np.asarray(truth["iter_starts"]), np.asarray(truth["iter_times"])
    inside = (starts >= lo) & (starts + times <= hi)
    ref = float(np.median(times[inside]))
    assert abs(det.iteration_time - ref) / ref < 0.02
    assert len(det.iteration_times) >= 1 and det.finding is None


def test_period_lost_after_pattern_stops():
    rng = np.random.default_rng(1)
    calls, truth = make_collective_stream(rng, n_iters=12, layers=4, microbatches=1, iter_time=1.0, log_every=1000)
    det = IterationPeriod(max_calls=512, recompute_every=64, lost_after=1024)
    for op, grp, t in calls:
        det.update(op, grp, t=t)
    assert det.period == truth["period"] and det.finding is None
    t = calls[-1][2]
    for i in range(1100):  # an evaluation phase: no recurring pattern
        t += 0.01
        det.update(str(rng.choice(["broadcast", "all_reduce", "all_gather", "barrier"])), str(rng.choice(["world", "dp", "tp"])), t=t)
    f = det.finding
    assert f is not None and f.kind == "iteration_period_lost" and f.evidence["last_period"] == truth["period"]


def test_validation():
    with pytest.raises(DetectorError):
        IterationPeriod(min_calls=2)
    with pytest.raises(DetectorError):
        IterationPeriod(threshold=1.5)
    det = IterationPeriod()
    det.update("all_reduce", "dp", t=1.0)
    with pytest.raises(DetectorError):
        det.update("all_reduce", "dp", t=0.5)
    with pytest.raises(DetectorError):
        det.update(3, "dp", t=2.0)
