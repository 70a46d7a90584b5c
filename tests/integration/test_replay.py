"""vigil replay: the history rebuilt from the Kafka log equals the history the sink built, with no duplicates."""

from __future__ import annotations

import subprocess
import sys
import uuid

from confluent_kafka import Producer

from vigil.schemas import encode, message_key, topic_name
from vigil.streams.analytics import window_args
from vigil.streams.replay import replay
from vigil.streams.sink import HistorySink
from tests.integration import scripted_history as sh
from tests.integration.conftest import wait_for

TABLES = ("heartbeats", "job_states", "iteration_steps", "alerts", "decisions", "actions", "xid_errors")
VIEWS = ("incident_taxonomy", "ettr", "mttf_by_size", "mttr_by_action", "detection_latency", "failslow_lost",
         "lemon_nodes")


def _publish(config, events) -> None:
    producer = Producer(config.kafka_conf(**{"linger.ms": 5}))
    for e in events:
        # The log's timestamps are the events' times, so --from/--to select by them here.
        producer.produce(topic_name(e.event_type, config.topic_prefix), key=message_key(e), value=encode(e),
                         timestamp=int(e.event_time.timestamp() * 1000))
    producer.flush(30)


def _same_to_the_last_bits(rows: list) -> list:
    """Floats to 12 significant digits: ClickHouse sums in parallel in no fixed order, so an aggregate over the
    same rows may differ in its last bit from one query to the next (seen: 0.5404365064090227 vs ...226)."""
    return [tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in row) for row in rows]


def _snapshot(store) -> dict:
    db = store.database
    out = {t: store.query(f"SELECT count(), uniqExact(event_id) FROM {db}.{t}").rows for t in TABLES}
    for v in VIEWS:
        out[v] = _same_to_the_last_bits(store.query(f"SELECT * FROM {db}.{v}({window_args()}) ORDER BY ALL").rows)
    out["incidents"] = store.query(f"SELECT * EXCEPT opened_time FROM {db}.incidents ORDER BY incident_id").rows
    return out


def test_replay_into_a_fresh_database_gives_identical_tables_and_twice_no_duplicates(config, history,
                                                                                       history_session):
    events = sh.events()
    _publish(config, events)
    sink = HistorySink(config, history, group_id=f"{config.group_id}-sink").start()
    try:
        assert wait_for(lambda: sink.stats.messages >= len(events), 120)
    finally:
        sink.stop()
    built = _snapshot(history)
    assert built["alerts"][0][0] == sum(1 for e in events if e.event_type == "alert")

    fresh = history_session.with_database(f"test_{uuid.uuid4().hex[:10]}")
    fresh.migrate()
    first = replay(config, fresh)
    assert first.stats.stored == len(events)
    assert _snapshot(fresh) == built
    second = replay(config, fresh)  # the same log again: every event is already there
    assert second.stats.stored == 0 and second.stats.duplicates == len(events)
    assert _snapshot(fresh) == built


def test_replay_from_to_selects_by_log_time(config, history):
    events = sh.events()
    _publish(config, events)
    since, until = sh.at(sh.DAY), sh.at(sh.DAY + 6 * 3600)
    result = replay(config, history, since, until)
    inside = [e for e in events if since <= e.event_time <= until]
    assert result.stats.stored == len(inside)
    lo, hi = history.query(f"SELECT min(event_time), max(event_time) FROM {history.database}.heartbeats").rows[0]
    assert since.replace(tzinfo=None) <= lo and hi <= until.replace(tzinfo=None)


def test_vigil_replay_command(config, tmp_path):
    events = [e for e in sh.events() if e.event_type in ("alert", "job_state")]
    _publish(config, events)
    env = {"VIGIL_KAFKA_BOOTSTRAP": config.bootstrap, "VIGIL_TOPIC_PREFIX": config.topic_prefix,
           "VIGIL_STATE_DIR": str(tmp_path / "state"), "VIGIL_TELEMETRY_TTL_DAYS": "0"}
    import os

    cmd = [sys.executable, "-m", "vigil.cli", "replay", "--from", "2026-03-01", "--to", "2026-03-05",
           "--database", "rebuilt"]
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{len(events)} stored" in out.stdout
    out2 = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert out2.returncode == 0 and "0 stored" in out2.stdout and f"{len(events)} already stored" in out2.stdout
