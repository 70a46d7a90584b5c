"""``vigil bench fuzz``: garbage and edge-case events through the real loop; nothing lost, nothing twice.

A seeded generator makes Kafka messages of every kind a careless producer or
an attacker could write, and knows, for each, what must become of every item
in it (the ground truth; the code under test is never asked):

* **good** events of every type on their own topics, single and batched, at
  the edges of their bounds (Int64 limits, 256-character names, GPU 1023,
  1970 and 2261), unicode text, events sent without ``event_id`` (their id
  derived from content: :func:`vigil.schemas.content_id`), messages sent twice;
* **malformed** ones: not JSON, truncated, binary, empty (no value, ``[]``),
  nested 100k deep, huge (1-3 MB), JSON scalars, an unknown type or version,
  a missing field, ``"seq": true``, ``"version": "1"``, ints past 64 bits,
  negative counts, NaN and 1e400, naive or out-of-range times, names with NUL,
  newline, bidi overrides or ``ALL,x``, an explicit null id, extra fields, a
  decision on a telemetry topic, and batches that mix good items and bad ones.

Every message goes through a real broker to a real detection worker (its own
process, restarted if it dies: ``worker_restarts``) and the history sink
into chDB. An item is **stored** when its event id is in its table, and
**dead-lettered** when the dead-letter table holds a row for its message
(topic, partition, offset) for it. The verdict per message:

* ``stored``: every item stored once;
* ``dead_lettered``: every bad item dead-lettered once, the good ones stored once;
* ``lost``: some item neither, when the history had settled;
* ``duplicated``: some item stored or dead-lettered more than once (physical rows).

``sink_stalls`` counts the times the sink waited on the store (there is no
store outage here, so any is a stall on a message) or died. Dead letters the
worker writes for valid events its detectors will not use (``refused``:
dated ahead of its clock) are reported apart (``refused_by_worker``): those
events are stored too.

JSON: ``{"messages", "stored", "dead_lettered", "lost", "duplicated",
"sink_stalls", "worker_restarts", "wall_s", "detail"}``.

The generator and its ground truth are in :mod:`vigil.bench.fuzz_messages`;
this module produces its messages through the loop and judges them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from vigil.bench.command import reproducing_command
from vigil.bench.fuzz_messages import (BAD, GOOD, INT64_MAX, REASON_MAX, Expect, FuzzMessage,  # noqa: F401
                                       Generator, derived_id)
from vigil.bench.machine import measured
from vigil.schemas import topic_name

__all__ = ["Expect", "FuzzMessage", "Generator", "account", "run"]


# -- accounting ------------------------------------------------------------------------------------------


def account(query: Callable[[str], list[tuple]], database: str, messages: list[FuzzMessage],
            prefix: str) -> dict[str, Any]:
    """The verdict on ``messages`` (produced, with their partition and offset) from the history."""
    stored: dict[str, int] = {}
    for table in sorted({e.table for m in messages for e in m.items if e.kind == GOOD}):
        for eid, n in query(f"SELECT toString(event_id), count() FROM {database}.{table} GROUP BY event_id"):
            stored[eid] = stored.get(eid, 0) + n
    dead: dict[tuple[str, int, int], tuple[int, int]] = {}
    for topic, partition, offset, rows, ids in query(
            f"SELECT source_topic, source_partition, source_offset, count(), uniqExact(event_id) "
            f"FROM {database}.dead_letters WHERE reason != 'refused' GROUP BY 1, 2, 3"):
        dead[(topic, partition, offset)] = (rows, ids)
    refused = query(f"SELECT count() FROM {database}.dead_letters WHERE reason = 'refused'")[0][0]
    verdict = {"stored": 0, "dead_lettered": 0, "lost": 0, "duplicated": 0}
    lost_labels: dict[str, int] = {}
    dup_labels: dict[str, int] = {}
    lost_samples: list[dict[str, Any]] = []
    for m in messages:
        topic = topic_name(m.topic_type, prefix)
        bad = sum(1 for e in m.items if e.kind == BAD)
        rows, ids = dead.get((topic, m.partition, m.offset), (0, 0))
        goods = [stored.get(e.event_id, 0) for e in m.items if e.kind == GOOD]
        if any(n == 0 for n in goods) or ids < bad:
            verdict["lost"] += 1
            lost_labels[m.label] = lost_labels.get(m.label, 0) + 1
            if len(lost_samples) < 20:
                lost_samples.append({"label": m.label, "topic": topic, "partition": m.partition, "offset": m.offset,
                                     "bytes": len(m.value or b""), "bad_items": bad, "dead_letters": ids,
                                     "good_items_missing": sum(1 for n in goods if n == 0)})
        elif any(n > 1 for n in goods) or rows > bad:
            verdict["duplicated"] += 1
            dup_labels[m.label] = dup_labels.get(m.label, 0) + 1
        elif bad:
            verdict["dead_lettered"] += 1
        else:
            verdict["stored"] += 1
    return {**verdict, "refused_by_worker": refused, "lost_by_kind": lost_labels, "duplicated_by_kind": dup_labels,
            "lost_samples": lost_samples}


# -- the benchmark ---------------------------------------------------------------------------------------


#: run() parameter -> the ``vigil bench fuzz`` option that sets it
CLI_OPTIONS = {"messages": "--messages", "malformed": "--malformed", "seed": "--seed"}


def run(json_path: str | None, messages: int = 20_000, malformed: float = 0.35, seed: int = 0,
        settle_s: float = 600.0, progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Produce ``messages`` (a ``malformed`` share of them malformed) through the real loop; return the verdict."""
    command = reproducing_command(run, dict(locals()), "vigil bench fuzz", CLI_OPTIONS)
    machine: dict[str, Any] = {}
    with measured(machine):
        result = _run(messages, malformed, seed, settle_s, progress)
    result["command"], result["detail"]["machine"] = command, machine
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _run(messages: int, malformed: float, seed: int, settle_s: float,
         progress: Callable[[str], Any] | None) -> dict[str, Any]:
    from confluent_kafka import Producer

    from vigil.settings import Settings
    from vigil.stack import EmbeddedStack, wait_for_file

    say = progress or (lambda _: None)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-fuzz-") as tmp:
        state = Path(tmp)
        key = {"fuzz": base64.b64encode(os.urandom(32)).decode()}
        settings = Settings(state_dir=state, telemetry_ttl_days=0, decision_keys=key, kafka_bootstrap=None,
                            clickhouse_dsn=None, topic_prefix="fuzz", group_id="fuzz-detect")
        say("starting the embedded stack")
        stack = EmbeddedStack(settings, query_server=False).start()
        worker: subprocess.Popen | None = None
        restarts = 0
        try:
            assert stack.bootstrap is not None and stack.sink is not None and stack.store is not None
            env = {**os.environ, "VIGIL_KAFKA_BOOTSTRAP": stack.bootstrap, "VIGIL_TOPIC_PREFIX": "fuzz",
                   "VIGIL_GROUP_ID": "fuzz-detect", "VIGIL_STATE_DIR": str(state),
                   "VIGIL_DECISION_KEYS": json.dumps(key)}
            ready = state / "worker.ready"
            log = state / "worker.log"

            deaths: list[str] = []

            def start_worker() -> subprocess.Popen:
                if log.exists() and worker is not None:  # (a restart: keep why it died)
                    deaths.append(log.read_text(errors="replace")[-1500:])
                with open(log, "ab") as out:
                    return subprocess.Popen([sys.executable, "-m", "vigil.cli", "worker", "--ready-file", str(ready)],
                                            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

            say("starting a detection worker")
            worker = start_worker()
            if not wait_for_file(ready, 90, alive=lambda: worker is not None and worker.poll() is None):
                raise RuntimeError(f"the worker did not start:\n{log.read_text()[-2000:]}")

            gen = Generator(seed)
            producer = Producer({"bootstrap.servers": stack.bootstrap, "message.max.bytes": 8 << 20,
                                 "linger.ms": 5, "queue.buffering.max.kbytes": 1 << 20, "log_level": 3})
            produced: list[FuzzMessage] = []
            failed: list[str] = []

            def delivered(m: FuzzMessage):
                def cb(err, msg) -> None:
                    if err is not None:
                        failed.append(f"{m.label}: {err}")
                    else:
                        m.partition, m.offset = msg.partition(), msg.offset()
                return cb

            say(f"producing {messages:,} messages")
            for i in range(messages):
                m = gen.message(malformed)
                producer.produce(topic_name(m.topic_type, "fuzz"), key=m.key, value=m.value, on_delivery=delivered(m))
                produced.append(m)
                if i % 500 == 0:
                    producer.poll(0)
                    if worker.poll() is not None:
                        restarts += 1
                        worker = start_worker()
            left = producer.flush(120)
            if left or failed:
                raise RuntimeError(f"{left} message(s) not delivered; {failed[:5]}")

            say("waiting for the history to settle")
            deadline = time.monotonic() + settle_s
            query = lambda sql: stack.store.query(sql).rows  # noqa: E731
            verdict = account(query, "vigil", produced, "fuzz")
            last, quiet_since = None, time.monotonic()
            while time.monotonic() < deadline and (verdict["lost"] or time.monotonic() - quiet_since < 5):
                if worker.poll() is not None:
                    restarts += 1
                    worker = start_worker()
                stack.sink.wait_until(lambda s: False, 1.0)  # (waits on the sink's own event: a second)
                verdict = account(query, "vigil", produced, "fuzz")
                now = (verdict["stored"], verdict["dead_lettered"], verdict["lost"], verdict["duplicated"])
                if now != last:
                    last, quiet_since = now, time.monotonic()
                    say(f"stored {now[0]:,}, dead-lettered {now[1]:,}, not yet {now[2]:,}")
            sink_alive = stack.sink.alive
            if worker.poll() is not None:
                restarts += 1
            stats = stack.sink.stats
        finally:
            if worker is not None and worker.poll() is None:
                worker.terminate()
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            stack.stop()
    malformed_n = sum(1 for m in produced if m.malformed)
    result = {
        "messages": len(produced),
        "stored": verdict["stored"],
        "dead_lettered": verdict["dead_lettered"],
        "lost": verdict["lost"],
        "duplicated": verdict["duplicated"],
        "sink_stalls": stats.retries + (0 if sink_alive else 1),
        "worker_restarts": restarts,
        "wall_s": round(time.time() - started, 1),
        "detail": {
            "seed": seed,
            "malformed_messages": malformed_n,
            "malformed_share": round(malformed_n / max(len(produced), 1), 3),
            "items": sum(len(m.items) for m in produced),
            "bad_items": sum(1 for m in produced for e in m.items if e.kind == BAD),
            "by_kind": _by_kind(produced),
            "refused_by_worker": verdict["refused_by_worker"],
            "worker_deaths": deaths,
            "lost_by_kind": verdict["lost_by_kind"],
            "lost_samples": verdict["lost_samples"],
            "duplicated_by_kind": verdict["duplicated_by_kind"],
            "sink": {"messages": stats.messages, "stored": stats.stored, "dead_letters": stats.dead_letters,
                     "duplicates_dropped": stats.duplicates, "retries": stats.retries, "sink_errors": stats.sink_errors,
                     "consume_errors": stats.consume_errors, "alive": sink_alive, "errors": stats.errors[-5:]},
        },
    }
    return result


def _by_kind(messages: list[FuzzMessage]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in messages:
        out[m.label] = out.get(m.label, 0) + 1
    return dict(sorted(out.items()))
