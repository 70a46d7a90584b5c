"""Schemas: round trips, strictness, versioning, batches, JSON Schema drift, DDL."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError
from hypothesis import given, settings, strategies as st

from vigil.schemas import (
    EVENT_TYPES, NODE_SAMPLES, Alert, GpuTelemetry, Heartbeat, IterationTiming, ProcessExit, Source, Subject, decode,
    encode, encode_batch, group_type, topic_name,
)
from vigil.schemas.export import CHECKED_IN, json_schemas
from vigil.schemas.tables import TABLE_SPECS, columns, create_table_sql, rows

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def hb(seq: int = 0, node: str = "n1") -> Heartbeat:
    return Heartbeat(event_time=T0, source=Source(node=node), seq=seq, interval_s=1.0)


def test_round_trip_keeps_every_field():
    it = IterationTiming(event_time=T0, source=Source(job="j", node="n", rank=3, gpu=3), step=7,
                         start=T0, end=T0, duration_s=0.0, compute_s=0.0, communication_s=0.0, dp=0, pp=1, tp=3)
    [back] = decode(encode(it)).events
    assert back == it


def test_naive_datetime_is_rejected():
    raw = json.dumps({"event_type": "heartbeat", "version": 1, "event_time": "2026-11-21T12:00:00",
                      "source": {"node": "n1"}, "seq": 0, "interval_s": 1.0}).encode()
    d = decode(raw)
    assert not d.events and d.errors[0].reason == "invalid" and d.errors[0].field == "event_time"


def test_unknown_version_is_rejected_not_guessed():
    obj = json.loads(encode(hb()))
    obj["version"] = 2
    raw = json.dumps(obj).encode()
    [err] = decode(raw).errors
    assert err.reason == "unsupported_version" and err.raw == raw and err.field == "version"


@pytest.mark.parametrize("raw,reason", [
    (b"\xff\xfe not json", "not_json"),
    (b"{\"event_type\": \"heartbeet\"}", "unknown_event_type"),
    (b"42", "not_an_object"),
    (None, "empty"),
    (b"[]", "empty"),
    (b" [ ] ", "empty"),
])
def test_bad_messages_name_their_reason(raw, reason):
    d = decode(raw)
    assert not d.events and d.errors[0].reason == reason


def test_missing_field_names_the_field():
    obj = json.loads(encode(hb()))
    del obj["seq"]
    [err] = decode(json.dumps(obj).encode()).errors
    assert err.reason == "invalid" and err.field == "seq"


def test_batch_keeps_good_items_and_reports_bad_ones_with_their_index():
    good = [hb(i) for i in range(3)]
    items = [json.loads(encode(e)) for e in good]
    items.insert(1, {**items[0], "seq": "not a number"})
    d = decode(json.dumps(items).encode())
    assert [e.seq for e in d.events] == [0, 1, 2]
    assert len(d.errors) == 1 and d.errors[0].index == 1
    assert json.loads(d.errors[0].raw)["seq"] == "not a number"


def test_encode_batch_decodes_to_the_same_events():
    events = [hb(i) for i in range(5)]
    assert decode(encode_batch(events)).events == events


def test_events_are_frozen():
    event = hb()
    with pytest.raises(ValidationError, match="frozen") as frozen:
        event.seq = 3  # type: ignore[misc]
    assert [(e["type"], e["loc"]) for e in frozen.value.errors()] == [("frozen_instance", ("seq",))]
    assert event.seq == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_never_raises_on_garbage(raw):
    d = decode(raw)
    assert len(d.events) + len(d.errors) >= 1


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["event_type", "version", "event_time", "seq", "interval_s", "source"]),
                       st.one_of(st.none(), st.integers(), st.text(max_size=5), st.floats(allow_nan=True))))
def test_decoder_never_raises_on_wrong_types(obj):
    obj.setdefault("event_type", "heartbeat")
    d = decode(json.dumps(obj).encode())
    assert len(d.events) + len(d.errors) == 1


def test_checked_in_json_schemas_match_the_models():
    """Fails when a model changes without `vigil schemas export schemas/json`."""
    current = json_schemas()
    on_disk = {p.stem: p.read_text() for p in CHECKED_IN.glob("*.json")}
    assert set(on_disk) == set(current), "event types and schemas/json/*.json differ"
    drifted = [name for name in current if on_disk[name] != current[name]]
    assert not drifted, f"JSON Schema drifted for {drifted}: run `vigil schemas export schemas/json`"


def test_every_field_has_a_description():
    missing = []
    for name, model in EVENT_TYPES.items():
        for fname, f in model.model_fields.items():
            if not f.description:
                missing.append(f"{name}.{fname}")
    assert not missing


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_every_event_type_has_a_table(event_type):
    from vigil.schemas.tables import STORED_AS

    event_type = STORED_AS.get(event_type, event_type)  # stored as another's rows (a GPU's samples)
    sql = create_table_sql(event_type, "db")
    spec = TABLE_SPECS[event_type]
    names = {c.name for c in columns(event_type)}
    assert f"db.{spec.table}" in sql and "event_id" in names
    assert set(spec.order_by) <= names


def test_rows_flatten_nested_models():
    alert = Alert(event_time=T0, incident_id=uuid.uuid4(), incident_version=1, status="open", severity=1,
                  kind="node_lost", subject=Subject(node="n1"), onset_time=T0, detection_time=T0,
                  evidence=[{"silence_s": 3.0}], detector="heartbeat_loss", detector_version="1")
    names, [row] = rows("alert", [alert])
    record = dict(zip(names, row))
    assert record["subject_node"] == "n1" and record["subject_job"] is None
    assert json.loads(record["evidence"]) == [{"silence_s": 3.0}]


def test_a_message_is_one_event_type_and_key_or_one_nodes_samples():
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    node = Source(cluster="c", node="n1")
    beat = Heartbeat(event_time=at, source=node, seq=0, interval_s=1.0)
    gpu = GpuTelemetry(event_time=at, source=Source(cluster="c", node="n1", gpu=3), sm_clock_mhz=1980.0)
    assert group_type([beat]) == "heartbeat"
    assert group_type([beat, gpu]) == NODE_SAMPLES
    assert topic_name(group_type([gpu, beat]), "v") == "v.telemetry.node"
    other_node = GpuTelemetry(event_time=at, source=Source(cluster="c", node="n2", gpu=0), sm_clock_mhz=1980.0)
    with pytest.raises(ValueError, match="one key"):
        group_type([beat, other_node])
    exit_ = ProcessExit(event_time=at, source=node, pid=1, exit_code=1)
    with pytest.raises(ValueError, match="node samples"):
        group_type([beat, exit_])
