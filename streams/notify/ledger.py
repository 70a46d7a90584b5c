"""What ``vigil notify`` delivered, kept in SQLite so that a restart delivers nothing twice.

One row per ``(incident id, incident version, receiver)`` that reached an
end: ``delivered`` or ``dead`` (dead-lettered after a permanent failure or
exhausted retries). A redelivered alert (at-least-once from Kafka, or a
restart before the offsets were committed) finds its row and is skipped.
Per incident the ledger also keeps the latest version seen, whether any
version paged (so its resolution pages too), and per receiver a thread
reference (Slack's root message ``ts``, the first email's ``Message-ID``) and
the Alertmanager label set last posted with the time of its next refresh.

The file is created with mode 0600 (it names nodes and jobs, and a Slack
thread reference); SQLite gives its journal the same mode.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

__all__ = ["DeliveryLedger", "OpenIncident"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    incident_id TEXT NOT NULL, version INTEGER NOT NULL, receiver TEXT NOT NULL,
    outcome TEXT NOT NULL, at REAL NOT NULL, attempts INTEGER NOT NULL, detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (incident_id, version, receiver)
);
CREATE TABLE IF NOT EXISTS incidents (
    incident_id TEXT PRIMARY KEY, latest_version INTEGER NOT NULL, paged INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL, alert TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS threads (
    incident_id TEXT NOT NULL, receiver TEXT NOT NULL, ref TEXT NOT NULL,
    PRIMARY KEY (incident_id, receiver)
);
CREATE TABLE IF NOT EXISTS notes (
    incident_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (incident_id, key)
);
CREATE TABLE IF NOT EXISTS refresh (
    incident_id TEXT NOT NULL, receiver TEXT NOT NULL, labels TEXT NOT NULL, next_at REAL NOT NULL,
    PRIMARY KEY (incident_id, receiver)
);
"""


@dataclass(frozen=True)
class OpenIncident:
    """An incident whose Alertmanager alert must be re-posted (refreshed) at ``next_at``."""

    incident_id: str
    receiver: str
    labels: dict[str, str]
    next_at: float
    alert: dict[str, Any]


class DeliveryLedger:
    """SQLite ledger of deliveries; thread-safe; every write is committed at once."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- deliveries -------------------------------------------------------------------------------------

    def outcome(self, incident: uuid.UUID | str, version: int, receiver: str) -> str | None:
        """``delivered``, ``dead`` or None (not done yet)."""
        with self._lock:
            row = self._db.execute("SELECT outcome FROM deliveries WHERE incident_id=? AND version=? AND receiver=?",
                                   (str(incident), version, receiver)).fetchone()
        return row[0] if row else None

    def record(self, incident: uuid.UUID | str, version: int, receiver: str, outcome: str, at: float,
               attempts: int, detail: str = "") -> None:
        if outcome not in ("delivered", "dead"):
            raise ValueError(f"outcome must be delivered or dead, got {outcome!r}")
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (str(incident), version, receiver, outcome, at, attempts, detail[:2000]))

    def deliveries(self, receiver: str | None = None) -> list[tuple[str, int, str, str]]:
        """(incident id, version, receiver, outcome) rows, oldest first."""
        sql = "SELECT incident_id, version, receiver, outcome FROM deliveries"
        args: tuple[Any, ...] = ()
        if receiver is not None:
            sql, args = sql + " WHERE receiver=?", (receiver,)
        with self._lock:
            return [tuple(r) for r in self._db.execute(sql + " ORDER BY at, version", args)]  # type: ignore[misc]

    # -- incidents --------------------------------------------------------------------------------------

    def observe(self, incident: uuid.UUID | str, version: int, status: str, alert: dict[str, Any]) -> bool:
        """Remember the latest version of an incident; False when ``version`` is older than one seen."""
        with self._lock:
            row = self._db.execute("SELECT latest_version FROM incidents WHERE incident_id=?", (str(incident),)).fetchone()
            if row is not None and row[0] > version:
                return False
            if row is None:
                self._db.execute("INSERT INTO incidents VALUES (?, ?, 0, ?, ?)",
                                 (str(incident), version, status, json.dumps(alert)))
            else:
                self._db.execute("UPDATE incidents SET latest_version=?, status=?, alert=? WHERE incident_id=?",
                                 (version, status, json.dumps(alert), str(incident)))
            return True

    def mark_paged(self, incident: uuid.UUID | str) -> None:
        with self._lock:
            self._db.execute("UPDATE incidents SET paged=1 WHERE incident_id=?", (str(incident),))

    def paged(self, incident: uuid.UUID | str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT paged FROM incidents WHERE incident_id=?", (str(incident),)).fetchone()
        return bool(row and row[0])

    # -- threads (Slack root ts, first email Message-ID) ------------------------------------------------

    def thread(self, incident: uuid.UUID | str, receiver: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT ref FROM threads WHERE incident_id=? AND receiver=?",
                                   (str(incident), receiver)).fetchone()
        return row[0] if row else None

    def set_thread(self, incident: uuid.UUID | str, receiver: str, ref: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO threads VALUES (?, ?, ?)", (str(incident), receiver, ref))

    # -- notes (what a receiver last told a person about an incident) ----------------------------------

    def note(self, incident: uuid.UUID | str, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM notes WHERE incident_id=? AND key=?",
                                   (str(incident), key)).fetchone()
        return row[0] if row else None

    def set_note(self, incident: uuid.UUID | str, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO notes VALUES (?, ?, ?)", (str(incident), key, value))

    # -- Alertmanager refreshes -------------------------------------------------------------------------

    def labels(self, incident: uuid.UUID | str, receiver: str) -> dict[str, str] | None:
        with self._lock:
            row = self._db.execute("SELECT labels FROM refresh WHERE incident_id=? AND receiver=?",
                                   (str(incident), receiver)).fetchone()
        return json.loads(row[0]) if row else None

    def schedule_refresh(self, incident: uuid.UUID | str, receiver: str, labels: dict[str, str],
                         next_at: float | None) -> None:
        """Re-post this incident's alert at ``next_at``; None: it resolved, stop refreshing (labels kept)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO refresh VALUES (?, ?, ?, ?)",
                             (str(incident), receiver, json.dumps(labels, sort_keys=True),
                              next_at if next_at is not None else -1.0))

    def due_refreshes(self, now: float) -> Iterator[OpenIncident]:
        with self._lock:
            rows = self._db.execute(
                "SELECT r.incident_id, r.receiver, r.labels, r.next_at, i.alert FROM refresh r "
                "JOIN incidents i USING (incident_id) WHERE r.next_at >= 0 AND r.next_at <= ? ORDER BY r.next_at",
                (now,)).fetchall()
        for inc, receiver, labels, next_at, alert in rows:
            yield OpenIncident(inc, receiver, json.loads(labels), next_at, json.loads(alert))
