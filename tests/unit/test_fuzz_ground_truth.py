"""The fuzz benchmark's ground truth, checked against the decoder without a broker.

``vigil bench fuzz`` counts an item as lost when it is neither stored nor
dead-lettered as its generator expected. A generator that calls an item good
which the schema refuses makes the benchmark report losses that are its own
(a node state's reason once went past the schema's 2000 characters): so every
item the generator labels good must decode on its topic, with the id it expects,
and every message it labels malformed must give at least one error.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from vigil.bench.fuzz import BAD, GOOD, REASON_MAX, Generator
from vigil.schemas import topic_name
from vigil.schemas.codec import decode
from vigil.schemas.topics import topic_accepts

NOW = datetime(2026, 11, 27, tzinfo=timezone.utc)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_item_the_generator_calls_good_decodes_on_its_topic_with_the_expected_id(seed):
    gen = Generator(seed, now=NOW)
    checked = 0
    for _ in range(3000):
        m = gen.message(0.35)
        if m.value is None or len(m.value) > 1_000_000:  # huge and empty messages are bad by construction
            assert m.malformed
            continue
        out = decode(m.value, topic_accepts(topic_name(m.topic_type, "fuzz")))
        if not m.malformed:
            assert not out.errors, f"{m.label} on {m.topic_type}: {out.errors[0]}"
            assert [str(e.event_id) for e in out.events] == [x.event_id for x in m.items], m.label
            checked += len(m.items)
        else:
            assert out.errors, f"{m.label} on {m.topic_type} decoded cleanly"
            good = [x.event_id for x in m.items if x.kind == GOOD]
            assert {str(e.event_id) for e in out.events} >= set(good), m.label
            assert len(out.errors) >= sum(x.kind == BAD for x in m.items) or m.label in {
                "binary", "truncated", "invalid_utf8", "deep", "empty_array", "empty_bytes", "scalar", "huge"}
    assert checked > 1000


def test_a_reason_at_the_bound_is_good_and_one_past_it_is_dead_lettered():
    gen = Generator(0, now=NOW)
    edge = gen.event("node_state", edge=True)
    assert len(edge["reason"]) == REASON_MAX
    assert not decode(__import__("json").dumps(edge).encode(), topic_accepts("fuzz.state.nodes")).errors
    bad = gen._break(gen.event("heartbeat"), "reason_too_long")
    assert len(bad["reason"]) == REASON_MAX + 1
    out = decode(__import__("json").dumps(bad).encode(), topic_accepts("fuzz.state.nodes"))
    assert [e.reason for e in out.errors] == ["invalid"]
