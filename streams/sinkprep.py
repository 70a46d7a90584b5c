"""Message values -> insert-ready ClickHouse blocks, in worker processes.

Nearly all of the history sink's CPU goes to parsing and validating JSON into
events and to serializing their columns in ClickHouse's Native format. Neither
needs the store, so the sink hands chunks of messages to a pool of processes
that run :func:`prepare` (one core each: the GIL would serialize threads) and
keeps only the id checks and the inserts for itself.

The fast path takes only what is clean: a message with any item that does not
decode, or events a block cannot hold, is handed back by index, and the sink
handles those messages the careful way (dead letters with the reason and the
raw bytes, refused events one by one). Nothing is dropped here.

Example::

    >>> from vigil.schemas import Heartbeat, Source, encode_batch, from_seconds
    >>> beats = [Heartbeat(event_time=from_seconds(i), source=Source(node="n1"), seq=i, interval_s=1.0)
    ...          for i in range(3)]
    >>> prepared = prepare([encode_batch(beats), b"not json", encode_batch(beats)],
    ...                    ["vigil.telemetry.heartbeats", "vigil.telemetry.heartbeats", "vigil.decisions"])
    >>> [(b.event_type, len(b.keys), b.messages) for b in prepared.blocks], prepared.careful
    ([('heartbeat', 3, [0])], [1, 2])
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.datatypes.registry import get_from_name
from clickhouse_connect.driver.common import write_leb128
from clickhouse_connect.driver.insert import InsertContext

from vigil.schemas import Envelope, decode, topic_accepts
from vigil.schemas.tables import TABLE_SPECS, as_stored, column_values, columns
from vigil.streams.history import gc_paused, insertable_columns


@dataclass
class Block:
    """One event type's rows from a chunk of messages, as one Native-format block."""

    event_type: str
    #: Event ids as 128-bit ints, each once, in row order.
    keys: list[int]
    #: The rows' time column spans [first_us, last_us], microseconds since the epoch.
    first_us: int
    last_us: int
    column_names: list[str]
    native: bytes
    #: Indexes (in the chunk) of the messages whose events are in this block.
    messages: list[int]


@dataclass
class Prepared:
    blocks: list[Block] = field(default_factory=list)
    #: Indexes (in the chunk) of messages for the careful path.
    careful: list[int] = field(default_factory=list)


def prepare(values: list[bytes | None], topics: list[str] | None = None) -> Prepared:
    """Decode ``values`` (message values, read from ``topics``: each holds only its topic's event
    types; None: any) and serialize their events, by type, into blocks."""
    out = Prepared()
    with gc_paused():
        _prepare(values, topics, out)  # (its events die when it returns, before the collector is back)
    return out


def _prepare(values: list[bytes | None], topics: list[str] | None, out: Prepared) -> None:
    by_type: dict[str, dict[int, Envelope]] = {}
    messages_by_type: dict[str, list[int]] = {}
    for index, raw in enumerate(values):
        decoded = decode(raw, accept=topic_accepts(topics[index]) if topics is not None else None)
        if decoded.errors:
            out.careful.append(index)
            continue
        for event in as_stored(decoded.events, views=True):
            event_type = event.event_type  # type: ignore[attr-defined]
            batch = by_type.get(event_type)
            if batch is None:
                batch = by_type[event_type] = {}
                messages_by_type[event_type] = []
            batch[event.event_id.int] = event  # (an id twice in the chunk: stored once)
            carriers = messages_by_type[event_type]
            if not carriers or carriers[-1] != index:
                carriers.append(index)
    for event_type, batch in by_type.items():
        try:
            out.blocks.append(_block(event_type, batch, messages_by_type[event_type]))
        except Exception:  # noqa: BLE001 - a value the column cannot hold (an int past 64 bits, say)
            out.careful.extend(messages_by_type[event_type])
    out.careful.sort()


def _block(event_type: str, batch: dict[int, Envelope], messages: list[int]) -> Block:
    names, data = column_values(event_type, list(batch.values()))
    times = data[names.index(TABLE_SPECS[event_type].time_column)]
    first_us, last_us = min(times), max(times)
    keys = data[names.index("event_id")] = list(batch)  # the UUID column takes the ids' ints
    names, data = insertable_columns(event_type, names, data)
    types = _TYPES[event_type]
    ch_types = [types[name] for name in names]
    context = InsertContext("", names, ch_types, data, column_oriented=True)
    native = bytearray()
    write_leb128(len(names), native)
    write_leb128(len(data[0]), native)
    for name, ch_type, values in zip(names, ch_types, data):
        for text in (name, ch_type.insert_name):
            encoded = text.encode()
            write_leb128(len(encoded), native)
            native += encoded
        context.start_column(name)
        ch_type.write_column(values, native, context)
        if values is not keys:
            values.clear()  # the insert context is a reference cycle: free the values now, not at a collection
    return Block(event_type, keys, first_us, last_us, names, bytes(native), messages)


_TYPES: dict[str, dict[str, Any]] = {
    event_type: {c.name: get_from_name(c.ch_type) for c in columns(event_type)} for event_type in TABLE_SPECS
}


def default_processes() -> int:
    """Processes the sink decodes in: one per core, up to 4; none on a single core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores < 2 else min(cores, 4)


def new_pool(processes: int) -> Executor:
    """A pool of ``processes`` started and ready (each has imported the models): about a second."""
    # spawn, not fork: the sink's process holds librdkafka's and chDB's threads.
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    # Submitted together, before any worker is idle: each starts a process of its own.
    for started in [pool.submit(_ready) for _ in range(processes)]:
        started.result()
    return pool


def _ready() -> int:
    """Run by each new worker: unpickling it imports this module (the models, the ClickHouse types)."""
    return os.getpid()
