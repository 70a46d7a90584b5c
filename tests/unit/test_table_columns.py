"""The history's column-oriented insert values are the row values, transposed."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from vigil.schemas import (
    Alert, CollectiveCall, Decision, DetectorFinding, GpuTelemetry, IterationStep, Source, Subject,
)
from vigil.schemas.tables import column_values, columns, rows

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _samples() -> dict[str, list]:
    at = [T0 + timedelta(seconds=i) for i in range(3)]
    return {
        "gpu_telemetry": [
            GpuTelemetry(event_time=at[0], source=Source(node="n1", gpu=0), utilization_pct=90.0),
            GpuTelemetry(event_time=at[1], source=Source(cluster="c", node="n2", job="j", rank=3, gpu=1),
                         nvlink_errors={"crc": 2}, ecc_sbe=0),
            GpuTelemetry(event_time=at[2]),
        ],
        "alert": [
            Alert(event_time=at[i], incident_id=uuid.uuid4(), incident_version=1, status="open", severity=1,
                  kind="node_lost", subject=Subject(node="n1") if i else Subject(), onset_time=at[0],
                  detection_time=at[i], evidence=[{"silence_s": 3.0}] if i == 1 else [], detector="d",
                  detector_version="1")
            for i in range(3)
        ],
        "finding": [
            DetectorFinding(event_time=at[i], status="raised", kind="xid", severity=2, subject=Subject(job="j"),
                            onset_time=at[0], detector="d", detector_version="1",
                            job_nodes=["n1", "n2"] if i else [], evidence={} if i else {"code": 79})
            for i in range(3)
        ],
        "decision": [
            Decision(event_time=at[i], decision_id=uuid.uuid4(), idempotency_key=f"k{i}", action="none",
                     target=Subject(), reason="r", answers=[uuid.uuid4()] * i, plan={"a": [1, 2]} if i else {})
            for i in range(3)
        ],
        "iteration_step": [
            IterationStep(event_time=at[i], step=i, start=at[0], end=at[i], duration_s=float(i), ranks=[0, 1],
                          nodes=["n1", "n2"], gpus=[0, 1], compute_s=[0.5, 0.6], communication_s=[0.1, 0.2],
                          dp=[0, 1], pp=[0, 0], tp=[0, 0])
            for i in range(3)
        ],
        "collective": [
            CollectiveCall(event_time=at[i], op="all_reduce", group="g", start=at[0], end=at[i]) for i in range(3)
        ],
    }


@pytest.mark.parametrize("event_type", sorted(_samples()))
def test_column_values_are_the_rows_transposed(event_type):
    events = _samples()[event_type]
    names, by_row = rows(event_type, events)
    col_names, by_column = column_values(event_type, events)
    assert col_names == names
    for i, col in enumerate(columns(event_type)):
        expected = [row[i] for row in by_row]
        if col.ch_type.startswith(("DateTime64", "Nullable(DateTime64")):  # given as integer microseconds
            expected = [None if v is None else (v - EPOCH) // timedelta(microseconds=1) for v in expected]
        assert by_column[i] == expected, col.name


def test_every_sort_key_ends_with_the_event_id():
    # The history's insert skips ReplacingMergeTree's collapsing within a block because a
    # block holds each id once: that is only sound while equal keys mean equal ids.
    from vigil.schemas.tables import TABLE_SPECS

    assert [t for t, spec in TABLE_SPECS.items() if spec.order_by[-1] != "event_id"] == []
