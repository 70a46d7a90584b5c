"""The store writes each event once, every column as the model holds it (NULLs included)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from vigil.schemas import Alert, Decision, GpuTelemetry, Heartbeat, IterationStep, Source, Subject, encode_batch
from vigil.schemas.tables import columns, rows
from vigil.streams.sinkprep import prepare

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def _stored(history, table: str, event_type: str) -> dict[uuid.UUID, tuple]:
    names = ", ".join(f"`{c.name}`" for c in columns(event_type))  # event_id first
    return {r[0]: r for r in history.query(f"SELECT {names} FROM {history.database}.{table}").rows}


def _expected(event_type: str, events: list) -> dict[uuid.UUID, tuple]:
    _, by_row = rows(event_type, events)
    # (ClickHouse gives times back naive, in UTC)
    return {r[0]: tuple(v.astimezone(timezone.utc).replace(tzinfo=None) if isinstance(v, datetime) else v for v in r)
            for r in by_row}


def test_rows_read_back_as_the_models_hold_them_with_null_columns_null(history):
    # Most GPU samples leave most fields unset: those columns are NULL in every row of the
    # batch; one field is set in a single row, the rest of its column NULL.
    gpus = [GpuTelemetry(event_time=T0 + timedelta(seconds=i), source=Source(node=f"n{i % 3}", gpu=i % 8),
                         utilization_pct=50.0 + i, nvlink_errors={"crc": i} if i == 7 else {},
                         pcie_replays=3 if i == 5 else None)
            for i in range(20)]
    alerts = [Alert(event_time=T0, incident_id=uuid.uuid4(), incident_version=1, status="open", severity=2,
                    kind="task_hang", subject=Subject(job="j") if i else Subject(), onset_time=T0,
                    detection_time=T0 + timedelta(seconds=i), detector="d", detector_version="1")
              for i in range(3)]
    assert history.insert_events(gpus + alerts) == 23  # a batch of two types
    assert _stored(history, "gpu_telemetry", "gpu_telemetry") == _expected("gpu_telemetry", gpus)
    assert _stored(history, "alerts", "alert") == _expected("alert", alerts)


def _mixed_events() -> dict[str, list]:
    step = dict(source=Source(job="j"), start=T0, end=T0 + timedelta(seconds=10), duration_s=10.0, ranks=[0, 1],
                nodes=["n1", "n2"], gpus=[0, 0], compute_s=[7.0, 7.5], communication_s=[3.0, 2.5], dp=[0, 1],
                pp=[0, 0], tp=[0, 0])
    return {
        "gpu_telemetry": [GpuTelemetry(event_time=T0 + timedelta(seconds=i), source=Source(node=f"n{i % 3}", gpu=i % 8),
                                       utilization_pct=50.0 + i, nvlink_errors={"crc": i} if i == 7 else {},
                                       pcie_replays=3 if i == 5 else None) for i in range(20)],
        "alert": [Alert(event_time=T0, incident_id=uuid.uuid4(), incident_version=1, status="open", severity=2,
                        kind="task_hang", subject=Subject(job="j") if i else Subject(), onset_time=T0,
                        detection_time=T0 + timedelta(seconds=i), detector="d", detector_version="1")
                  for i in range(3)],
        "iteration_step": [IterationStep(event_time=T0 + timedelta(seconds=10 + i), step=i, **step) for i in range(4)],
        "decision": [Decision(event_time=T0, decision_id=uuid.uuid4(), target=Subject(job="j"), action="restart_process",
                              reason="r", plan={"nodes": ["n1"]} if i else {},
                              answers=[uuid.uuid4() for _ in range(i)], idempotency_key=f"k{i}") for i in range(3)],
    }


def test_a_block_prepared_for_the_sink_reads_back_as_the_models_hold_them(history):
    events = _mixed_events()
    messages = [encode_batch(batch) for batch in events.values()]
    prepared = prepare(messages)
    assert prepared.careful == []
    for block in prepared.blocks:
        assert history.insert_block(block) == len(events[block.event_type])
    for event_type, table in (("gpu_telemetry", "gpu_telemetry"), ("alert", "alerts"),
                              ("iteration_step", "iteration_steps"), ("decision", "decisions")):
        assert _stored(history, table, event_type) == _expected(event_type, events[event_type]), event_type


@pytest.mark.parametrize("already", ["inserted recently", "stored before this process"])
def test_a_prepared_block_holding_a_stored_id_is_not_inserted(history, already):
    beats = [Heartbeat(event_time=T0 + timedelta(seconds=i), source=Source(node="n1"), seq=i, interval_s=1.0)
             for i in range(10)]
    history.insert_events(beats[3:4])
    store = history if already == "inserted recently" else history.with_database(history.database)
    [block] = prepare([encode_batch(beats)]).blocks
    assert store.insert_block(block) is None  # the sink then inserts its events one by one
    assert store.insert_events(beats) == 9


def test_an_event_id_is_stored_once_whatever_the_path(history):
    beats = [Heartbeat(event_time=T0 + timedelta(seconds=i), source=Source(node="n1"), seq=i, interval_s=1.0)
             for i in range(10)]
    assert history.insert_events(beats + beats[:4]) == 10  # twice within one batch
    assert history.insert_events(beats[5:] + [beats[2]]) == 0  # ids the store inserted recently
    other = history.with_database(history.database)  # no recent ids: the stored ids are read back
    more = [Heartbeat(event_time=T0 + timedelta(seconds=10 + i), source=Source(node="n1"), seq=10 + i,
                      interval_s=1.0) for i in range(3)]
    assert other.insert_events(iter(beats[::3] + more)) == 3  # (any iterable)
    assert history.query(f"SELECT count(), uniqExact(event_id) FROM {history.database}.heartbeats").rows \
        == [(13, 13)]


def test_a_rollup_fed_by_the_batch_collapses_it_as_on_any_insert(history):
    # A step published twice (two ids, one execution) in one batch: job_steps, keyed by
    # execution, holds it once from the start, not only after its parts merge.
    step = dict(event_time=T0 + timedelta(seconds=10), source=Source(job="j"), step=5, start=T0,
                end=T0 + timedelta(seconds=10), duration_s=10.0, ranks=[0], nodes=["n1"], gpus=[0], compute_s=[7.0],
                communication_s=[3.0], dp=[0], pp=[0], tp=[0])
    assert history.insert_events([IterationStep(**step), IterationStep(**step)]) == 2
    assert history.query(f"SELECT count() FROM {history.database}.job_steps").rows == [(1,)]
