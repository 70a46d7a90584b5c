"""Creating the rollups, their feeding views and the views in a database; a windowed view's arguments."""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from vigil.streams.analytics.rollups import ROLLUPS
from vigil.streams.analytics.views import VIEWS



def migrate_analytics(command: Callable[[str], Any], query: Callable[[str], list[tuple]], db: str,
                      rebuilt: set[str] = frozenset()) -> list[str]:
    """Create the rollups, their views (backfilled from the event tables once) and the views.

    ``rebuilt`` names event tables just rebuilt by a layout migration: their
    materialized views are created anew (a view follows the table it was
    created on). Returns what was done, for the log.
    """
    done: list[str] = []
    existing = dict(query(f"SELECT name, comment FROM system.tables WHERE database = '{db}'"))
    refilled: set[str] = set()  # rollups backfilled in this run
    for rollup in ROLLUPS:
        command(f"CREATE TABLE IF NOT EXISTS {db}.{rollup.table} {rollup.ddl}")
        created = False
        for view, source, select in rollup.feeds:
            sql = select.replace("{db}", db)
            # The comment records the definition, so a changed feed is replaced. (A feed
            # whose meaning changes should fill a new table: old rows are not recomputed.)
            tag = "vigil:" + hashlib.sha1(select.encode()).hexdigest()[:16]
            if view in existing and (source in rebuilt or existing[view] != tag):
                command(f"DROP VIEW IF EXISTS {db}.{view}")
                del existing[view]
            if view not in existing:
                command(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{view} TO {db}.{rollup.table} AS {sql} "
                        f"COMMENT '{tag}'")
                created = True
                if rollup.idempotent:
                    # Rows stored before the view existed; idempotent aggregates make an overlap harmless.
                    command(f"INSERT INTO {db}.{rollup.table} {sql}")
                    refilled.add(rollup.table)
                    done.append(f"created {view} and backfilled {rollup.table} from {source}")
                else:
                    done.append(f"created {view}")
        if not rollup.idempotent and (created or any(source in refilled for _, source, _ in rollup.feeds)):
            # Sums: start from empty (a rollup it is fed from may just have been backfilled through
            # its views) and read the sources without their unmerged duplicates.
            command(f"TRUNCATE TABLE {db}.{rollup.table}")
            for _, source, select in rollup.feeds:
                src = f"FROM {db}.{source}"
                command(f"INSERT INTO {db}.{rollup.table} {select.replace('{db}', db).replace(src, src + ' FINAL')}")
            refilled.add(rollup.table)
            done.append(f"backfilled {rollup.table} from {', '.join(sorted({s for _, s, _ in rollup.feeds}))}")
    for name, sql in VIEWS.items():
        body = sql.replace("{db}", db)
        command(f"CREATE OR REPLACE VIEW {db}.{name} AS {body}")
    return done


def _time_literal(value: str | None, default: str) -> str:
    if value is None:
        return default
    quoted = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"parseDateTime64BestEffort('{quoted}', 6, 'UTC')"


def window_args(since: str | None = None, until: str | None = None) -> str:
    """``since=..., until=...`` arguments of a windowed view (defaults: all time).

    Values are ClickHouse date-time literals as ``parseDateTime64BestEffort``
    reads them (``2026-01-31``, ``2026-01-31 12:00:00``, ISO 8601).
    """
    s = _time_literal(since, "toDateTime64(0, 6, 'UTC')")
    u = _time_literal(until, "toDateTime64('2261-12-31 00:00:00', 6, 'UTC')")
    return f"since={s}, until={u}"
