"""The report's time axes and incident timeline, on spans and incidents whose layout is known."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from vigil.report import MAX_TICKS, IncidentRow, time_ticks, timeline_rows

T = datetime(2026, 3, 2, 23, 58, 41, 500000, tzinfo=timezone.utc)


@pytest.mark.parametrize("span_s", [0.4, 2, 8, 12, 40, 90, 300, 1400, 3 * 3600, 20 * 3600, 2 * 86400, 9 * 86400,
                                    90 * 86400, 800 * 86400])
def test_ticks_are_distinct_inside_the_span_and_few(span_s):
    rng = random.Random(span_s)
    for _ in range(20):
        t0 = T + timedelta(seconds=rng.uniform(0, 86400))
        t1 = t0 + timedelta(seconds=span_s)
        ticks = time_ticks(t0, t1)
        labels = [label for _, label in ticks]
        assert 2 <= len(ticks) <= MAX_TICKS, labels
        assert len(set(labels)) == len(labels), labels
        assert all(t0 <= m <= t1 for m, _ in ticks)


def test_a_demo_length_span_shows_seconds_not_one_minute_repeated():
    # vigil demo: ~36 s of cluster life; every tick used to read the same "11-24 23:04"
    t0 = datetime(2026, 11, 24, 23, 4, 39, 571861, tzinfo=timezone.utc)
    labels = [label for _, label in time_ticks(t0, t0 + timedelta(seconds=36))]
    assert labels == ["23:04:40", "23:04:45", "23:04:50", "23:04:55", "23:05:00", "23:05:05", "23:05:10",
                      "23:05:15"]


def _inc(subject, onset, resolved, severity=1, kind="node_lost"):
    at = lambda s: T + timedelta(seconds=s)  # noqa: E731
    return IncidentRow(at(onset), None if resolved is None else at(resolved), kind, severity, subject, None, subject)


def test_one_labelled_row_per_subject_and_a_further_one_only_for_overlapping_bars():
    a = _inc("n1", 0, 10)
    b = _inc("n1", 5, 8, severity=2, kind="xid")       # overlaps a: a second row for n1
    c = _inc("n1", 12, None)                           # after a ends: back on n1's first row
    d = _inc("j1", 1, 3, severity=3, kind="fail_slow")
    e = _inc("n2", 20, None, severity=2, kind="xid")
    rows = timeline_rows([e, d, c, b, a], end=T + timedelta(seconds=30))
    assert rows == [("n1", [a, c]), ("n1 (2)", [b]), ("n2", [e]), ("j1", [d])]  # worst subjects first


def test_seventeen_nodes_lost_at_once_are_seventeen_labelled_rows():
    lost = [_inc(f"node-{i:02d}", 100 + 0.01 * i, None) for i in range(17)]
    rows = timeline_rows(lost, end=T + timedelta(seconds=200))
    assert [label for label, _ in rows] == [f"node-{i:02d}" for i in range(17)]
    assert all(len(lane) == 1 for _, lane in rows)
