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
from schemas.tables import TABLE_SPECS, create_table_sql, rows, table_name


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
    def migrate(self) -> None:
        """Create the database and every table; safe to run any number of times."""
        with self._lock:
            self._client.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            for event_type in EVENT_TYPES:
                self._client.command(create_table_sql(event_type, self.database))

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


def _clickhouse_message(exc: Exception) -> str:
    text = str(exc)
    # clickhouse-connect appends the format clause it added; the user did not write it.
    return text.replace(" FORMAT Native", "").strip()
