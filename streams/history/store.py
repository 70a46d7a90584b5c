"""The store: a clickhouse-connect client (chDB or a server) with vigil's tables, exact-once inserts, queries."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import compress
from operator import attrgetter
from typing import Any, Iterable

import clickhouse_connect

from vigil.schemas import Envelope
from vigil.schemas.events import EVENT_TYPES
from vigil.schemas.tables import TABLE_SPECS, as_stored, column_values, columns, create_table_sql, table_name
from vigil.streams.analytics import ROLLUPS, migrate_analytics
from vigil.streams.history import HistoryError
from vigil.streams.history.gcpause import gc_paused
from vigil.streams.history.sql import READ_ONLY_SETTINGS, check_identifier, quote_identifier, read_only_statement

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple]


class HistoryStore:
    """A clickhouse-connect client with vigil's tables.

    Thread-safe: a lock serializes calls, because chDB runs in-process and the
    embedded stack shares one client between the sink and the query server.
    """

    def __init__(self, dsn: str, database: str = "vigil") -> None:
        from vigil.streams.redact import redact_dsn

        self.dsn = dsn
        self.database = check_identifier(database)
        self._lock = threading.Lock()
        try:
            self._client = clickhouse_connect.get_client(dsn=dsn)
        except Exception as exc:
            if "Cannot lock file" in str(exc):
                raise HistoryError(
                    f"the ClickHouse data directory of {redact_dsn(dsn)} is held by another process "
                    "(a running `vigil up`/`vigil demo`); query through it, or stop it first"
                ) from None
            raise HistoryError(f"could not open ClickHouse at {redact_dsn(dsn)}: "
                               f"{_redacted(_clickhouse_message(exc), dsn)}") from None
        # Ids (as ints) seen recently, so that a redelivered batch costs no query: the
        # latest up to _recent_cap in _recent_ids, the generation before in _older_ids.
        self._recent_ids: dict[int, None] = {}
        self._older_ids: dict[int, None] = {}
        self._recent_cap = 100_000

    def with_database(self, database: str) -> "HistoryStore":
        """A store on the same connection, using another database (tests isolate by database)."""
        other = object.__new__(HistoryStore)
        other.__dict__.update(self.__dict__)
        other.database = check_identifier(database)
        other._recent_ids, other._older_ids = {}, {}
        return other

    # -- schema ------------------------------------------------------------
    def migrate(self, ttl_days: int | None = None, ttl_overrides: dict[str, int] | None = None) -> list[str]:
        """Bring the database to this code's schema; safe to run any number of times.

        Creates what is missing, adds new columns, rebuilds a table whose
        partitioning or sort key changed (copying its rows, then exchanging the
        two atomically), sets the retention TTL of the raw telemetry tables
        (``ttl_days``, per table in ``ttl_overrides``; None or 0 keeps them
        forever), and creates the analytics rollups (backfilled from the
        stored events) and views. Existing rows are kept. Returns what it
        changed (empty when nothing had to).
        """
        try:
            return self._migrate(ttl_days, ttl_overrides)
        except HistoryError:
            raise
        except Exception as exc:
            raise HistoryError(f"migrating {self.database} failed: "
                               f"{_redacted(_clickhouse_message(exc), self.dsn)}") from None

    def _migrate(self, ttl_days: int | None, ttl_overrides: dict[str, int] | None) -> list[str]:
        done: list[str] = []
        with self._lock:
            db = check_identifier(self.database)
            self._client.command(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(db)}")
            layout = {r[0]: r[1:] for r in self._client.query(
                "SELECT name, partition_key, sorting_key, engine_full FROM system.tables WHERE database = {db:String}",
                parameters={"db": db}).result_rows}
            rebuilt: set[str] = set()
            for event_type, spec in TABLE_SPECS.items():
                days = (ttl_overrides or {}).get(spec.table, ttl_days)
                if spec.table not in layout:
                    self._client.command(create_table_sql(event_type, db, days))
                    done.append(f"created {spec.table}")
                    continue
                partition_key, sorting_key, engine_full = layout[spec.table]
                done += self._add_columns(event_type)
                want_sort = ", ".join(spec.order_by)
                if _norm(partition_key) != _norm(spec.partition_by) or _norm(sorting_key) != _norm(want_sort):
                    self._rebuild(event_type, days)
                    rebuilt.add(spec.table)
                    done.append(f"rebuilt {spec.table}: PARTITION BY {spec.partition_by} ORDER BY ({want_sort})")
                    continue
                done += self._set_ttl(spec.table, spec.ttl_clause(days), engine_full)
            done += migrate_analytics(self._client.command, lambda q: self._client.query(q).result_rows, db, rebuilt)
        return done

    def _add_columns(self, event_type: str) -> list[str]:
        spec = TABLE_SPECS[event_type]
        have = {r[0] for r in self._client.query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String}",
            parameters={"db": self.database, "t": spec.table}).result_rows}
        done = []
        for col in columns(event_type):
            if col.name not in have:
                # A new optional field: the rows stored before it get the column's default (NULL).
                self._client.command(f"ALTER TABLE {self.database}.{spec.table} ADD COLUMN IF NOT EXISTS "
                                     f"`{col.name}` {col.ch_type}")
                done.append(f"added column {spec.table}.{col.name}")
        return done

    def _rebuild(self, event_type: str, ttl_days: int | None) -> None:
        spec = TABLE_SPECS[event_type]
        db, old, new = self.database, spec.table, f"{spec.table}__migrating"
        self._client.command(f"DROP TABLE IF EXISTS {db}.{new}")  # left by an interrupted run
        self._client.command(create_table_sql(event_type, db, ttl_days, table=new))
        names = ", ".join(f"`{c.name}`" for c in columns(event_type)) + ", `ingest_time`"
        self._client.command(f"INSERT INTO {db}.{new} ({names}) SELECT {names} FROM {db}.{old}")
        self._client.command(f"EXCHANGE TABLES {db}.{old} AND {db}.{new}")
        self._client.command(f"DROP TABLE {db}.{new}")

    def _set_ttl(self, table: str, ttl: str, engine_full: str) -> list[str]:
        have = engine_full.split(" TTL ", 1)[1].split(" SETTINGS ", 1)[0].strip() if " TTL " in engine_full else ""
        if _norm(have) == _norm(ttl):
            return []
        if ttl:
            self._client.command(f"ALTER TABLE {self.database}.{table} MODIFY SETTING ttl_only_drop_parts = 1")
            self._client.command(f"ALTER TABLE {self.database}.{table} MODIFY TTL {ttl}")
            return [f"{table}: TTL {ttl}"]
        self._client.command(f"ALTER TABLE {self.database}.{table} REMOVE TTL")
        return [f"{table}: TTL removed"]

    # -- writes ------------------------------------------------------------
    def insert_events(self, events: Iterable[Envelope]) -> int:
        """Insert events not stored before; return how many rows were written.

        Duplicates within the batch, among recently inserted ids, and among
        stored rows of the same time range are dropped, so a redelivered
        event is never stored twice.
        """
        with gc_paused():
            return self._insert_events(events)

    def _insert_events(self, events: Iterable[Envelope]) -> int:
        events = as_stored(events if isinstance(events, list) else list(events))
        # Keyed by the id's 128-bit int: hashing a UUID object costs a Python call, an int none.
        keys = list(map(_ID_INT, events))
        kinds = set(map(_EVENT_TYPE, events))
        by_type: dict[str, dict[int, Envelope]]
        if len(kinds) == 1:
            # A topic's batch is of one type: deduplicated within itself by a dict, in C.
            by_type = {kinds.pop(): dict(zip(keys, events))}
        else:
            by_type = {}
            for key, event in zip(keys, events):
                batch = by_type.get(event.event_type)  # type: ignore[attr-defined]
                if batch is None:
                    batch = by_type[event.event_type] = {}  # type: ignore[attr-defined]
                batch[key] = event
        for batch in by_type.values():
            for known in (self._recent_ids, self._older_ids):
                if known:
                    for key in batch.keys() & known.keys():
                        del batch[key]
        written = 0
        with self._lock:
            for event_type, batch in by_type.items():
                if not batch:
                    continue
                # Column-oriented: clickhouse-connect writes each column in one pass.
                names, data = column_values(event_type, list(batch.values()))
                keep: list[bool] | None = None
                insert: list[list[Any]] = []
                try:
                    times = data[names.index(TABLE_SPECS[event_type].time_column)]  # microseconds
                    stored = self._stored_ids(event_type, batch, min(times), max(times))
                    keep = [key not in stored for key in batch] if stored else None
                    names_in, columns_in = insertable_columns(event_type, names, data)
                    insert = columns_in if keep is None else [list(compress(values, keep)) for values in columns_in]
                    fresh = len(insert[0])
                    if fresh:
                        self._client.insert(table_name(event_type, self.database), insert,
                                            column_names=names_in, column_oriented=True,
                                            settings=_insert_settings(event_type))
                        written += fresh
                finally:
                    # clickhouse-connect's insert context is a reference cycle that holds the
                    # columns until the next garbage collection: free their values now.
                    for values in data:
                        values.clear()
                    if keep is not None:
                        for values in insert:
                            values.clear()
                self._remember(batch)
        return written

    #: Ids per ``IN`` query: ClickHouse takes an array parameter in time linear in its
    #: length up to some tens of thousands of UUIDs, and far more than linear past that
    #: (100k ids: ~50 s, measured with chDB 26).
    _IN_CHUNK = 10_000

    def insert_block(self, block: Any) -> int | None:
        """Insert a block prepared by :mod:`vigil.streams.sinkprep`; return the rows written, or None
        (nothing written) when some of its ids may be stored already: the caller then
        inserts its events with :meth:`insert_events`, which leaves those out."""
        keys = dict.fromkeys(block.keys)
        with gc_paused():
            for known in (self._recent_ids, self._older_ids):
                if known and not known.keys().isdisjoint(keys):
                    return None
            with self._lock:
                if self._stored_ids(block.event_type, keys, block.first_us, block.last_us):
                    return None
                self._client.raw_insert(table_name(block.event_type, self.database), block.column_names,
                                        block.native, settings=_insert_settings(block.event_type), fmt="Native")
                self._remember(keys)
        return len(keys)

    def _stored_ids(self, event_type: str, batch: dict[int, Any], first_us: int, last_us: int) -> set[int]:
        """The ids of ``batch`` (a dict keyed by event ids as ints), whose times span
        [first_us, last_us] (microseconds since the epoch), that are stored already."""
        table, time_col = table_name(event_type, self.database), TABLE_SPECS[event_type].time_column
        lo, hi = _EPOCH + timedelta(microseconds=first_us - 1), _EPOCH + timedelta(microseconds=last_us + 1)
        # Typed parameters: the %(x)s form renders datetimes to whole seconds and
        # would miss stored rows in the last second of the range.
        where = f"{time_col} BETWEEN {{lo:DateTime64(6, 'UTC')}} AND {{hi:DateTime64(6, 'UTC')}}"
        # Usually few rows are stored in the batch's time range (the tail of the previous
        # batch; none for new data): read their ids and compare here, which costs far less
        # than sending the batch's ids to ClickHouse.
        cap = max(4 * len(batch), 10_000)
        in_range = self._client.query(f"SELECT event_id FROM {table} WHERE {where} LIMIT {cap + 1}",
                                      parameters={"lo": lo, "hi": hi}).result_columns
        ids = in_range[0] if in_range else []
        if len(ids) <= cap:
            return {u.int for u in ids} & batch.keys()
        # A dense range (a late batch among many stored rows): ask about the batch's ids.
        stored: set[int] = set()
        keys = list(batch)
        for i in range(0, len(keys), self._IN_CHUNK):
            result = self._client.query(
                f"SELECT event_id FROM {table} WHERE {where} AND event_id IN {{ids:Array(UUID)}}",
                parameters={"lo": lo, "hi": hi, "ids": [uuid.UUID(int=k) for k in keys[i:i + self._IN_CHUNK]]},
            )
            stored.update(row[0].int for row in result.result_rows)
        return stored

    def _remember(self, keys: dict[int, Any]) -> None:
        self._recent_ids.update(dict.fromkeys(keys))  # (from a dict: no key hashed again)
        if len(self._recent_ids) > self._recent_cap:
            self._older_ids, self._recent_ids = self._recent_ids, {}

    def healthy(self) -> bool:
        """Does the store answer at all? (Tells a bad event from a store that is down.)"""
        try:
            with self._lock:
                self._client.query("SELECT 1")
            return True
        except Exception:
            return False

    # -- reads -------------------------------------------------------------
    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        """Run ``sql`` as vigil's own code writes it (any statement: vigil's readers, tests)."""
        return self._query(sql, parameters, None)

    def query_read_only(self, sql: str) -> QueryResult:
        """Run a query someone typed: one read statement (:func:`read_only_statement`), with ClickHouse's
        read-only mode and limits (:data:`READ_ONLY_SETTINGS`)."""
        return self._query(read_only_statement(sql), None, READ_ONLY_SETTINGS)

    def _query(self, sql: str, parameters: dict[str, Any] | None, settings: dict[str, Any] | None) -> QueryResult:
        with self._lock:
            try:
                result = self._client.query(sql, parameters=parameters, settings=settings)
            except Exception as exc:
                raise HistoryError(_redacted(_clickhouse_message(exc), self.dsn)) from None
        return QueryResult(list(result.column_names), [t.name for t in result.column_types], list(result.result_rows))

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _insert_settings(event_type: str) -> dict[str, Any] | None:
    """A batch holds each id once and every sort key ends with event_id, so ReplacingMergeTree's
    collapsing of equal keys within the inserted block finds nothing to collapse: skipping it
    halves ClickHouse's own time per insert. Not for a table that feeds a rollup: the setting
    reaches the views' inserts too, where a block can hold equal keys (a step stored twice)."""
    return None if TABLE_SPECS[event_type].table in _FEEDS_ROLLUPS else _NO_OPTIMIZE_ON_INSERT


_NO_OPTIMIZE_ON_INSERT = {"optimize_on_insert": 0}
_FEEDS_ROLLUPS = frozenset(source for rollup in ROLLUPS for _, source, _ in rollup.feeds)
_ID_INT = attrgetter("event_id.int")
_EVENT_TYPE = attrgetter("event_type")


def insertable_columns(event_type: str, names: list[str], data: list[list[Any]]) -> tuple[list[str], list[list[Any]]]:
    """The columns of a batch worth sending: a nullable column that is NULL in every row is
    left out, as ClickHouse fills it with its default, NULL, for less than it costs to write."""
    nullable = _NULLABLE[event_type]
    kept = [i for i, values in enumerate(data)
            if i not in nullable or values[0] is not None or values.count(None) != len(values)]
    return [names[i] for i in kept], [data[i] for i in kept]


#: Column indexes, per event type, of the columns that may hold NULL (and default to it).
_NULLABLE: dict[str, frozenset[int]] = {
    event_type: frozenset(i for i, c in enumerate(columns(event_type))
                          if c.ch_type.startswith(("Nullable(", "LowCardinality(Nullable(")))
    for event_type in EVENT_TYPES
}


def _norm(expr: str) -> str:
    return "".join(expr.split()).replace("`", "")


def _redacted(text: str, dsn: str) -> str:
    """``text`` without the password of ``dsn`` (a driver may quote the URL it failed on)."""
    from vigil.streams.redact import Redactor, dsn_secrets

    return Redactor(dsn_secrets(dsn))(text)


def _clickhouse_message(exc: Exception) -> str:
    text = str(exc)
    # clickhouse-connect appends the format clause it added; the user did not write it.
    return text.replace(" FORMAT Native", "").strip()
