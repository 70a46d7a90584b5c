"""The ClickHouse history: migrations, exact-once inserts by event id, queries.

The same code talks to chDB (``chdb:///path``, in-process, one process per
directory) and to a ClickHouse server (``http(s)://...``) through
clickhouse-connect.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

import clickhouse_connect

from schemas import Envelope
from schemas.events import EVENT_TYPES
from schemas.tables import TABLE_SPECS, columns, create_table_sql, rows, table_name
from streams.analytics import migrate_analytics


class HistoryError(RuntimeError):
    """The history store failed; the message carries ClickHouse's own words."""


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
        self.dsn = dsn
        self.database = database
        self._lock = threading.Lock()
        try:
            self._client = clickhouse_connect.get_client(dsn=dsn)
        except Exception as exc:
            if "Cannot lock file" in str(exc):
                raise HistoryError(
                    f"the ClickHouse data directory of {dsn} is held by another process "
                    "(a running `vigil up`/`vigil demo`); query through it, or stop it first"
                ) from exc
            raise HistoryError(f"could not open ClickHouse at {dsn}: {exc}") from exc
        # Ids seen recently, so that a redelivered batch costs no query.
        self._recent_ids: OrderedDict = OrderedDict()
        self._recent_cap = 200_000

    def with_database(self, database: str) -> "HistoryStore":
        """A store on the same connection, using another database (tests isolate by database)."""
        other = object.__new__(HistoryStore)
        other.__dict__.update(self.__dict__)
        other.database = database
        other._recent_ids = OrderedDict()
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
            raise HistoryError(f"migrating {self.database} failed: {_clickhouse_message(exc)}") from exc

    def _migrate(self, ttl_days: int | None, ttl_overrides: dict[str, int] | None) -> list[str]:
        done: list[str] = []
        with self._lock:
            db = self.database
            self._client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
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
        by_type: dict[str, dict[Any, Envelope]] = {}
        for event in events:
            if event.event_id in self._recent_ids:
                continue
            by_type.setdefault(event.event_type, {})[event.event_id] = event  # type: ignore[attr-defined]
        written = 0
        with self._lock:
            for event_type, batch in by_type.items():
                stored = self._stored_ids(event_type, list(batch.values()))
                fresh = [e for eid, e in batch.items() if eid not in stored]
                if fresh:
                    names, values = rows(event_type, fresh)
                    self._client.insert(table_name(event_type, self.database), values, column_names=names)
                    written += len(fresh)
                self._remember(batch.keys())
        return written

    def _stored_ids(self, event_type: str, batch: Sequence[Envelope]) -> set:
        time_col = TABLE_SPECS[event_type].time_column
        times = [getattr(e, time_col) for e in batch]
        lo, hi = min(times) - timedelta(microseconds=1), max(times) + timedelta(microseconds=1)
        # Typed parameters: the %(x)s form renders datetimes to whole seconds and
        # would miss stored rows in the last second of the range.
        result = self._client.query(
            f"SELECT event_id FROM {table_name(event_type, self.database)} "
            f"WHERE {time_col} BETWEEN {{lo:DateTime64(6, 'UTC')}} AND {{hi:DateTime64(6, 'UTC')}} "
            f"AND event_id IN {{ids:Array(UUID)}}",
            parameters={"lo": lo, "hi": hi, "ids": [e.event_id for e in batch]},
        )
        return {row[0] for row in result.result_rows}

    def _remember(self, ids: Iterable[Any]) -> None:
        for eid in ids:
            self._recent_ids[eid] = None
        while len(self._recent_ids) > self._recent_cap:
            self._recent_ids.popitem(last=False)

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
        with self._lock:
            try:
                result = self._client.query(sql, parameters=parameters)
            except Exception as exc:
                raise HistoryError(_clickhouse_message(exc)) from None
        return QueryResult(list(result.column_names), [t.name for t in result.column_types], list(result.result_rows))

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _norm(expr: str) -> str:
    return "".join(expr.split()).replace("`", "")


def _clickhouse_message(exc: Exception) -> str:
    text = str(exc)
    # clickhouse-connect appends the format clause it added; the user did not write it.
    return text.replace(" FORMAT Native", "").strip()
