"""WorkerStats' lag histogram: exact below a second, 1 % buckets above (by their lower edge)."""

from vigil.streams.worker import WorkerStats


def test_lags_are_exact_below_a_second_and_bucketed_by_one_percent_above():
    stats = WorkerStats()
    created_ms = 1_000_000
    for lag_ms in (0, 5, 999, 1000, 1234, 1239, 56_789, 123_456):
        stats.processed(created_ms, (created_ms + lag_ms) / 1000.0, records=1)
    assert stats.lag_ms == {0: 1, 5: 1, 999: 1, 1000: 1, 1230: 2, 56_700: 1, 123_000: 1}
    assert stats.messages == 8 and stats.last_lag_ms == 123_000
