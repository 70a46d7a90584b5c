"""Issue 17, schemas: bounds the tables need, names, strict types per topic, deterministic identity.

Written against the code before the fix: every test here failed on it (values past 64 bits
and names with NUL / bidi characters passed, "1" and true were coerced, a decision was
accepted on the heartbeat topic, a message without ``event_id`` got a new id per decode).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest

from vigil.schemas import Decision, Heartbeat, Source, Subject, decode, encode

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def beat(**over) -> dict:
    obj = json.loads(encode(Heartbeat(event_time=T0, source=Source(node="n1"), seq=1, interval_s=1.0)))
    obj.update(over)
    return obj


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize("where,value", [
    (("source", "rank"), 2**64),
    (("source", "rank"), 2**63),
    (("seq",), 2**63),
    (("source", "gpu"), -1),
])
def test_integers_past_what_the_tables_hold_are_refused(where, value):
    obj = beat()
    target = obj
    for part in where[:-1]:
        target = target.setdefault(part, {})
    target[where[-1]] = value
    d = decode(raw(obj))
    assert not d.events and d.errors[0].reason == "invalid", d
    assert d.errors[0].field == ".".join(where)


def test_a_dead_letter_with_an_offset_past_64_bits_is_refused():
    obj = {"event_type": "dead_letter", "version": 1, "event_id": str(uuid.uuid4()), "event_time": T0.isoformat(),
           "reason": "x", "detail": "y", "source_topic": "vigil.telemetry.heartbeats", "source_partition": 0,
           "source_offset": 2**70, "raw_b64": ""}
    d = decode(raw(obj))
    assert not d.events and d.errors[0].field == "source_offset"


def test_times_outside_what_datetime64_holds_are_refused_everywhere_not_only_event_time():
    obj = {"event_type": "iteration", "version": 1, "event_id": str(uuid.uuid4()), "event_time": T0.isoformat(),
           "source": {"job": "j", "rank": 0}, "step": 1, "start": "9999-01-01T00:00:00Z",
           "end": "9999-01-01T00:00:01Z", "duration_s": 1.0}
    d = decode(raw(obj))
    assert not d.events and d.errors[0].field in ("start", "end")


@pytest.mark.parametrize("name", [
    "node\x0007", "node-07\n", "node\u202e70-edon", "\u2066n1", "n 1", "-n1", "", "n" * 300, "ALL\t", "n1;reboot",
    "node[1-64]", "a,b",
])
def test_names_with_control_bidi_space_or_set_characters_are_refused(name):
    d = decode(raw(beat(source={"node": name})))
    assert not d.events and d.errors[0].field == "source.node", (name, d)


@pytest.mark.parametrize("name", ["n1", "gpu-07", "node-05.rack3.example.org", "1234", "job_a:b", "cuda@x+y=z"])
def test_ordinary_names_pass(name):
    assert decode(raw(beat(source={"node": name, "job": name, "cluster": name}))).events


def test_labels_refuse_control_and_bidi_characters_but_take_spaces():
    ok = Subject(link="node/mlx5_0:1")
    assert ok.link == "node/mlx5_0:1"
    obj = {"event_type": "collective", "version": 1, "event_id": str(uuid.uuid4()), "event_time": T0.isoformat(),
           "op": "all_reduce", "group": "g\u202e1", "start": T0.isoformat(), "end": T0.isoformat()}
    assert decode(raw(obj)).errors[0].field == "group"
    obj["group"] = "data parallel 0"
    assert decode(raw(obj)).events


@pytest.mark.parametrize("field,value", [("version", "1"), ("seq", True), ("seq", "3"), ("interval_s", "1.0"),
                                         ("version", True), ("seq", 1.0)])
def test_no_coercion_of_strings_or_bools_into_numbers(field, value):
    d = decode(raw(beat(**{field: value})))
    assert not d.events and d.errors[0].field == field, d


def test_a_number_where_a_float_is_expected_is_still_a_float():
    [ev] = decode(raw(beat(interval_s=2))).events
    assert ev.interval_s == 2.0


def decision_obj() -> dict:
    return json.loads(encode(Decision(event_time=T0, decision_id=uuid.uuid4(), idempotency_key="k",
                                      action="isolate_node", target=Subject(node="n1"), reason="r")))


def test_a_topic_accepts_only_its_event_types():
    from vigil.schemas.topics import topic_accepts

    topic = "vigil.telemetry.heartbeats"
    assert topic_accepts(topic) == {"heartbeat"}
    assert topic_accepts("x.y.telemetry.node") == {"heartbeat", "gpu_telemetry", "gpu_samples", "nic_counters"}
    assert topic_accepts("x.y.telemetry.gpu") == {"gpu_telemetry", "gpu_samples"}  # per GPU, or a node's in columns
    assert topic_accepts("vigil.decisions") == {"decision"}
    for message in (raw([beat(), decision_obj()]), raw(decision_obj()), raw([decision_obj()])):
        d = decode(message, accept=topic_accepts(topic))
        assert [type(e) for e in d.events] in ([Heartbeat], []), d
        assert [e.reason for e in d.errors] == ["wrong_topic"]
        assert "decision" in d.errors[0].detail and "heartbeat" in d.errors[0].detail
    # Without a topic (an SDK reading what it asked for) decoding is as before.
    assert len(decode(raw([beat(), decision_obj()])).events) == 2


def test_an_unknown_topic_accepts_nothing():
    from vigil.schemas.topics import topic_accepts

    assert topic_accepts("someone.elses.topic") == frozenset()
    d = decode(raw(beat()), accept=topic_accepts("someone.elses.topic"))
    assert not d.events and d.errors[0].reason == "wrong_topic"


def test_an_event_without_an_id_gets_the_same_id_from_its_content_at_every_decode():
    from vigil.schemas.codec import content_id

    obj = beat()
    del obj["event_id"]
    first, second = decode(raw(obj)).events, decode(json.dumps(obj, indent=2).encode()).events
    assert first[0].event_id == second[0].event_id == content_id(obj)
    other = dict(obj, seq=2)
    assert decode(raw(other)).events[0].event_id != first[0].event_id
    # in a batch too, one id per item
    batch = decode(raw([obj, other])).events
    assert [e.event_id for e in batch] == [content_id(obj), content_id(other)]


def test_a_nested_event_id_or_version_key_does_not_stand_in_for_the_events_own():
    from vigil.schemas.codec import content_id

    obj = {"event_type": "finding", "event_time": T0.isoformat(), "status": "raised", "kind": "xid", "severity": 1,
           "subject": {"node": "n1"}, "onset_time": T0.isoformat(), "detector": "d", "detector_version": "1",
           "evidence": {"event_id": str(uuid.uuid4()), "version": 1}}
    d = decode(raw(obj))  # no version of its own: refused, not guessed
    assert not d.events and d.errors[0].reason == "unsupported_version"
    obj["version"] = 1
    a, b = decode(raw(obj)).events, decode(raw(obj)).events
    assert a[0].event_id == b[0].event_id == content_id(obj)


def test_an_explicit_null_event_id_is_refused_not_derived():
    d = decode(raw(beat(event_id=None)))
    assert not d.events and d.errors[0].field == "event_id"


def test_an_item_that_does_not_state_its_own_type_is_refused_on_its_topic():
    """Decoding on a topic's accepted types (the fast path) still needs each item to say what it is: the
    model's default type must not stand in, nor a nested ``event_type`` key, alone or in a batch."""
    from vigil.schemas.topics import topic_accepts

    untyped = beat()
    del untyped["event_type"]
    for topic in ("vigil.telemetry.heartbeats", "vigil.telemetry.node"):
        accept = topic_accepts(topic)
        for message in (raw(untyped), raw([beat(), untyped]), raw([beat(), dict(untyped, source={"node": "n1"})])):
            d = decode(message, accept=accept)
            assert [e.reason for e in d.errors] == ["unknown_event_type"], (topic, d)
        assert [type(e) for e in decode(raw([beat(), untyped]), accept=accept).events] == [Heartbeat]
    nested = {"event_type": "gpu_telemetry", "version": 1, "event_id": str(uuid.uuid4()),
              "event_time": T0.isoformat(), "source": {"node": "n1", "gpu": 0}, "nvlink_errors": {"event_type": 1}}
    gpu = decode(raw([nested, untyped]), accept=topic_accepts("vigil.telemetry.node"))
    assert [e.reason for e in gpu.errors] == ["unknown_event_type"] and len(gpu.events) == 1
    assert [e.reason for e in decode(b"[]", accept=topic_accepts("vigil.telemetry.node")).errors] == ["empty"]
