"""What vigil puts into SQL (checked identifiers) and what it lets a user run: one read statement.

:func:`read_only_statement` is the guard of ``vigil sql`` and the stack's
query endpoint, which run it with :data:`READ_ONLY_SETTINGS`.
"""

from __future__ import annotations

import re
from typing import Any

from vigil.streams.history import HistoryError



#: A database or table name vigil will put into SQL (always quoted as well).
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_identifier(name: str, what: str = "database") -> str:
    """``name`` if it is a plain identifier, else :class:`HistoryError` (it would be pasted into SQL)."""
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        raise HistoryError(f"{what} name {str(name)[:80]!r} is not a plain identifier "
                           f"(letters, digits and _, not starting with a digit, at most 64)")
    return name


def quote_identifier(name: str) -> str:
    """A checked identifier in backquotes."""
    return f"`{check_identifier(name)}`"


# -- read-only SQL: what `vigil sql` and the stack's query endpoint run ------------------------------------

#: Settings every read-only query runs with: ClickHouse refuses writes, DDL, table functions that
#: reach files, URLs or other servers, and changing settings (these included); runaway queries end.
#: In read-only mode ClickHouse does not apply the SETTINGS clause a view was created with, so the
#: settings the analytics views declare (``streams/analytics/views.py``: ``join_use_nulls``) are given here;
#: the README's cookbook is run through this in the tests, so a new one cannot go unnoticed.
READ_ONLY_SETTINGS: dict[str, Any] = {"readonly": 1, "max_execution_time": 120, "max_result_rows": 1_000_000,
                                      "result_overflow_mode": "throw", "join_use_nulls": 1}
#: How a read-only query may begin.
_READ_STATEMENTS = frozenset({"select", "with", "show", "describe", "desc", "explain", "exists"})
#: Table functions that reach outside the history (files, URLs, other servers, programs): refused by
#: name even before ClickHouse's read-only mode refuses them (which it does for all of these).
_OUTSIDE_FUNCTIONS = frozenset({
    "file", "filecluster", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn", "azureblobstorage",
    "azureblobstoragecluster", "hdfs", "hdfscluster", "remote", "remotesecure", "cluster", "clusterallreplicas",
    "mysql", "postgresql", "mongodb", "redis", "sqlite", "odbc", "jdbc", "executable", "input", "deltalake",
    "deltalakecluster", "iceberg", "icebergs3", "icebergazure", "iceberghdfs", "icebergcluster", "hudi",
    "hudicluster", "paimon", "arrowflight", "ytsaurus", "prometheusquery", "timeseriesdata", "dictionary",
})
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|\#[^\n]*|/\*)
  | (?P<string>'(?:[^'\\]|\\.|'')*')
  | (?P<quoted>"(?:[^"\\]|\\.|"")*"|`(?:[^`\\]|\\.|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<semicolon>;)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


def read_only_statement(sql: str) -> str:
    """The one read statement in ``sql``, trimmed of comments and a trailing ``;``, or :class:`HistoryError`
    saying why it is refused: more than one statement, not a read (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN,
    EXISTS), ``INTO OUTFILE``, or a table function that reaches files, URLs or other servers.

    >>> read_only_statement("SELECT 1; -- done")
    'SELECT 1'
    >>> read_only_statement("SELECT 1; DROP TABLE vigil.alerts")
    Traceback (most recent call last):
    ...
    vigil.streams.history.HistoryError: one statement at a time: this holds 2
    """
    tokens: list[tuple[str, str, int, int]] = []  # (kind, text, start, end) of meaningful tokens
    pos, statements = 0, [[]]  # type: ignore[var-annotated]
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        assert m is not None  # (the last alternative takes any character)
        kind, text = m.lastgroup, m.group()
        if kind == "comment" and text == "/*":
            depth, end = 1, pos + 2
            while depth and end < len(sql):  # ClickHouse's block comments nest
                if sql.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif sql.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
            if depth:
                raise HistoryError("a /* comment is not closed")
            pos = end
            continue
        if kind == "other" and text in "'\"`":
            raise HistoryError(f"a {text} quote is not closed")
        if kind == "semicolon":
            statements.append([])
        elif kind not in ("ws", "comment"):
            statements[-1].append((kind, text, m.start(), m.end()))
        pos = m.end()
    statements = [st for st in statements if st]
    if not statements:
        raise HistoryError("no SQL statement given")
    if len(statements) > 1:
        raise HistoryError(f"one statement at a time: this holds {len(statements)}")
    tokens = statements[0]
    first = next((text.lower() for kind, text, _, _ in tokens if kind != "other" or text != "("), "")
    if first not in _READ_STATEMENTS:
        raise HistoryError(f"only read statements run here ({', '.join(sorted(s.upper() for s in _READ_STATEMENTS))}), "
                           f"not {first.upper() or 'this'}: the query endpoint is read-only")
    words = [(kind, text.lower()) for kind, text, _, _ in tokens]
    for i, (kind, word) in enumerate(words):
        nxt = words[i + 1][1] if i + 1 < len(words) else ""
        name = word.strip("`\"").lower() if kind in ("word", "quoted") else ""
        if kind == "word" and word == "into" and nxt == "outfile":
            raise HistoryError("INTO OUTFILE writes a file: refused (the query endpoint is read-only)")
        if name in _OUTSIDE_FUNCTIONS and nxt == "(":
            raise HistoryError(f"the table function {name}() reaches outside the history (files, URLs or other "
                               "servers): refused")
    return sql[tokens[0][2]:tokens[-1][3]]
