"""The ClickHouse history: migrations, exact-once inserts by event id, queries.

The same code talks to chDB (``chdb:///path``, in-process, one process per
directory) and to a ClickHouse server (``http(s)://...``) through
clickhouse-connect.

The package, by what each module holds: :mod:`.store` (:class:`HistoryStore`:
migrations, exact-once inserts by event id, queries), :mod:`.sql` (the
identifiers vigil puts into SQL and the one read statement a user may run),
:mod:`.gcpause` (the garbage collector paused while a batch is decoded or
stored). :class:`HistoryError`, the package's one exception, is here.
"""

from __future__ import annotations


class HistoryError(RuntimeError):
    """The history store failed; the message carries ClickHouse's own words."""


# (after HistoryError: the modules below raise it)
from vigil.streams.history.gcpause import gc_paused, gc_resumed  # noqa: E402
from vigil.streams.history.sql import (IDENTIFIER, READ_ONLY_SETTINGS, check_identifier,  # noqa: E402
                                       quote_identifier, read_only_statement)
from vigil.streams.history.store import HistoryStore, QueryResult, insertable_columns  # noqa: E402

__all__ = ["HistoryError", "HistoryStore", "IDENTIFIER", "QueryResult", "READ_ONLY_SETTINGS", "check_identifier",
           "gc_paused", "gc_resumed", "insertable_columns", "quote_identifier", "read_only_statement"]
