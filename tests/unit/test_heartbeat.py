"""Heartbeat loss against planted silences on a simulated clock."""

from __future__ import annotations

import pytest

from vigil.detectors import DetectorError, HeartbeatLoss


@pytest.mark.parametrize("interval,missed", [(1.0, 2.5), (0.2, 3), (10.0, 1.5)])
def test_fires_after_the_configured_missed_intervals(interval, missed):
    det = HeartbeatLoss(missed_intervals=missed)
    for seq in range(10):
        det.update(t=seq * interval, interval_s=interval, seq=seq)
    last = 9 * interval
    det.tick(last + missed * interval * 0.99)
    assert det.finding is None
    det.tick(last + missed * interval * 1.01)
    f = det.finding
    assert f is not None and f.kind == "node_lost" and f.severity == 1 and f.onset == last
    assert f.evidence["last_seq"] == 9


def test_never_seen_node_is_not_lost():
    det = HeartbeatLoss()
    det.tick(1e9)
    assert det.finding is None


def test_return_clears_and_records_recovery():
    det = HeartbeatLoss()
    det.update(t=0.0, interval_s=1.0, seq=0)
    det.tick(10.0)
    assert det.finding is not None
    det.update(t=11.0, interval_s=1.0, seq=0)
    assert det.finding is None and det.recovered_at == 11.0


def test_late_duplicate_heartbeat_does_not_move_time_back():
    det = HeartbeatLoss()
    det.update(t=5.0, interval_s=1.0, seq=5)
    det.update(t=3.0, interval_s=1.0, seq=3)
    assert det.last_seen == 5.0


def test_bad_parameters_raise():
    with pytest.raises(DetectorError):
        HeartbeatLoss(missed_intervals=0.5)
    with pytest.raises(DetectorError):
        HeartbeatLoss(interval_s=0)


def test_a_stream_that_arrives_late_is_not_a_lost_node():
    """Beats sent every second but heard up to 1.2 s late (a busy host): the silence counted from the last
    send includes that delay, which the timeout allows (at most one interval); a real stop is still caught."""
    det = HeartbeatLoss(missed_intervals=2.5)
    for seq in range(20):
        det.update(t=100.0 + seq, interval_s=1.0, seq=seq, lag_s=0.2 if seq % 5 else 0.9)
    last = 119.0
    det.tick(last + 2.5 + 0.85)  # the next beat is late by as much as one before it was
    assert det.finding is None and det.delivery_lag_s == pytest.approx(0.9)
    det.tick(last + 2.5 + 0.95)
    assert det.finding is not None and det.finding.evidence["delivery_lag_s"] == pytest.approx(0.9)


def test_the_delay_allowed_is_at_most_one_interval():
    det = HeartbeatLoss(missed_intervals=2.5)
    det.update(t=100.0, interval_s=1.0, seq=0, lag_s=30.0)  # replayed from a spool after an outage
    det.tick(103.6)
    assert det.finding is not None and det.delivery_lag_s == 1.0
