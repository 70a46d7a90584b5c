"""The benchmarks' intervals and the history bench's backlog, on hand-made inputs of known answer."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest

from vigil.bench.history import sample_batches, sustained_rate
from vigil.bench.intervals import median_interval, window_rates
from vigil.schemas import GpuTelemetry, decode


@pytest.mark.parametrize("n,lo_rank,coverage", [
    (6, 1, 1 - 2 / 64),                 # P(B <= 0) = 1/64
    (7, 1, 1 - 2 / 128),
    (10, 2, 1 - 2 * 11 / 1024),         # P(B <= 1) = 11/1024; P(B <= 2) = 56/1024 > 0.025
    (20, 6, 1 - 2 * 21700 / 2 ** 20),   # P(B <= 5) = 21700/2^20 = 0.0207; P(B <= 6) = 0.0577
])
def test_median_interval_is_the_binomial_order_statistics(n, lo_rank, coverage):
    values = [float(v) for v in range(n, 0, -1)]  # n..1: the ranks are the values
    ci = median_interval(values)
    assert ci["n"] == n and ci["median"] == (n + 1) / 2
    assert (ci["lo"], ci["hi"]) == (lo_rank, n - lo_rank + 1)
    assert ci["coverage"] == round(coverage, 4) and ci["coverage"] >= 0.95


@pytest.mark.parametrize("n", [0, 1, 5])
def test_too_few_runs_give_no_interval(n):
    assert median_interval([1.0] * n) is None  # 5 runs: [min, max] covers 93.75 % only


def test_median_interval_of_equal_runs_is_a_point():
    assert median_interval([0.2] * 8) == {"n": 8, "median": 0.2, "lo": 0.2, "hi": 0.2, "coverage": 0.9922}


def test_a_level_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="level"):
        median_interval([1.0] * 10, level=1.0)


def test_window_rates_of_a_steady_counter():
    samples = [(0.1 * k, 10 * k) for k in range(101)]  # 100 per second for 10 s, sampled every 0.1 s
    rates = window_rates(samples, 2.0)
    assert len(rates) == 5
    assert all(s == pytest.approx(2.0) and r == pytest.approx(100.0) for s, r in rates)


def test_window_rates_show_a_stall_and_drop_the_short_tail():
    # 100/s for 4 s, nothing for 2 s, 100/s for 1.5 s (a tail shorter than a window)
    samples = [(0.0, 0), (2.0, 200), (4.0, 400), (6.0, 400), (7.5, 550)]
    assert window_rates(samples, 2.0) == [(2.0, 100.0), (2.0, 100.0), (2.0, 0.0)]


def test_window_rates_refuse_samples_out_of_order_and_empty_windows():
    with pytest.raises(ValueError, match="time order"):
        window_rates([(0.0, 0), (2.0, 10), (1.0, 20)], 1.0)
    with pytest.raises(ValueError, match="window_s"):
        window_rates([(0.0, 0)], 0.0)
    assert window_rates([], 1.0) == []


def test_sustained_rate_a_stall_widens_the_interval_and_lowers_the_rate():
    steady = sustained_rate([(0.5 * k, 50 * k) for k in range(61)], window_s=2.0)  # 100/s for 30 s
    assert steady["rows_per_s"] == 100 and steady["rows_per_s_ci95"] == [100.0, 100.0]
    assert steady["windows"] == 15 and steady["seconds"] == 30.0 and steady["stored"] == 3000
    # the same, but no row stored from 10 s to 16 s: 2,400 rows in 30 s
    stalled = sustained_rate([(0.5 * k, 50 * min(k, 20) + 50 * max(0, k - 32)) for k in range(61)], window_s=2.0)
    assert stalled["rows_per_s"] == 80 and stalled["window_rows_per_s"].count(0) == 3
    lo, hi = stalled["rows_per_s_ci95"]
    assert lo < 70 and 80 < hi <= 100


def test_sustained_rate_from_one_window_has_no_interval():
    assert sustained_rate([(0.0, 0), (2.5, 250)], window_s=2.0)["rows_per_s_ci95"] is None
    assert sustained_rate([(0.0, 0)])["rows_per_s"] == 0


def test_the_backlog_decodes_as_the_gpu_samples_it_describes():
    t0_us = 1_772_409_600_999_950  # 2026-03-02 00:00:00.99995: the second turns inside the first message
    messages = list(sample_batches(1_234, t0_us, per_message=500, nodes=7))
    assert [len(json.loads(v)) for _, v in messages] == [500, 500, 234]
    events = []
    for key, value in messages:
        decoded = decode(value, accept={"gpu_telemetry"})
        assert decoded.errors == []
        assert key.decode() == decoded.events[0].source.node
        events += decoded.events
    assert len(events) == 1_234 and all(isinstance(e, GpuTelemetry) for e in events)
    assert len({e.event_id for e in events}) == 1_234
    for i in (0, 1, 499, 500, 1_233):
        e = events[i]
        assert (e.source.node, e.source.gpu, e.temperature_c) == (f"n{i % 7:04d}", i % 8, 60.0 + i % 20)
        want = datetime.fromtimestamp((t0_us + 100 * i) // 1_000_000, tz=timezone.utc).replace(
            microsecond=(t0_us + 100 * i) % 1_000_000)
        assert e.event_time == want
    ids = [e.event_id.int for e in events]
    assert ids == [ids[0] + i for i in range(1_234)]  # the index in the low bits
    assert isinstance(events[0].event_id, uuid.UUID)


def test_two_backlogs_never_share_an_id():
    a = decode(next(sample_batches(10, 0))[1]).events
    b = decode(next(sample_batches(10, 0))[1]).events
    assert not {e.event_id for e in a} & {e.event_id for e in b}
