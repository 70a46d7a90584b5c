"""The actuator's ledger: one row per decision, persisted in SQLite, so no decision is acted on twice.

A row is written (``pending``) before anything runs and moves through the
state machine of :mod:`vigil.actuators.state`; ``idempotency_key`` is unique, so a
redelivered decision (same ``decision_id``) and a second decision carrying an
already-used key both find the recorded row and do nothing new
(:meth:`Ledger.lookup`).

Crash recovery, on open (no partial state is left behind):

* a row left ``running`` by a crashed actuator is marked ``failed`` with
  "actuator stopped mid-action; not re-run because its effect is unknown":
  a restart that half-happened must not happen twice; the failure feeds
  escalation like any other;
* a row left ``pending`` is deleted: nothing ran, and the decision (whose
  offset was not committed) is redelivered and handled afresh.

The ledger also records where in the log each decision was first read
(``topic/partition/offset``, :meth:`Ledger.record_origin`): the same decision
read again from the same place is a redelivery, from another place a replay.

The ledger also keeps the circuit breaker's state and the human resets
(:meth:`Ledger.request_reset`, usable from another process while the
actuator runs: SQLite in WAL mode lets one writer and readers share the
file). One actuator owns a ledger at a time: opening it takes an exclusive
lock on ``<path>.lock``, and a second owner is refused with a
:class:`~vigil.actuators.errors.LedgerError`.

Timestamps are seconds since the epoch passed in by the caller; the ledger
reads no clock.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from vigil.actuators.errors import LedgerError
from vigil.actuators.state import ActionState, check_transition
from vigil.schemas import Decision

__all__ = ["CircuitState", "Ledger", "LedgerRecord", "Reset", "STOPPED_MID_ACTION"]

STOPPED_MID_ACTION = "actuator stopped mid-action; not re-run because its effect is unknown"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    decision_id     TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    action          TEXT NOT NULL,
    job             TEXT,
    node            TEXT,
    state           TEXT NOT NULL,
    backend         TEXT NOT NULL,
    detail          TEXT NOT NULL DEFAULT '',
    commands        TEXT NOT NULL DEFAULT '[]',
    drained         TEXT NOT NULL DEFAULT '[]',
    progress        INTEGER,
    executed        INTEGER NOT NULL DEFAULT 0,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_created ON actions (created_at);
CREATE TABLE IF NOT EXISTS circuit (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    is_open     INTEGER NOT NULL,
    opened_at   REAL,
    reason      TEXT NOT NULL DEFAULT '',
    incident_id TEXT
);
CREATE TABLE IF NOT EXISTS origins (
    decision_id TEXT PRIMARY KEY,
    origin      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resets (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    kind   TEXT NOT NULL CHECK (kind IN ('circuit', 'job')),
    job    TEXT,
    at     REAL NOT NULL,
    who    TEXT NOT NULL DEFAULT ''
);
"""

_COLUMNS = ("decision_id", "idempotency_key", "action", "job", "node", "state", "backend", "detail", "commands",
            "drained", "progress", "executed", "created_at", "updated_at")


@dataclass(frozen=True)
class LedgerRecord:
    """One decision as the ledger holds it."""

    decision_id: str
    idempotency_key: str
    action: str
    job: str | None
    node: str | None
    state: ActionState
    backend: str
    detail: str
    commands: list[list[str]]
    drained: list[str]
    progress: int | None
    executed: bool
    created_at: float
    updated_at: float

    @classmethod
    def _from_row(cls, row: tuple[Any, ...]) -> "LedgerRecord":
        d = dict(zip(_COLUMNS, row))
        d["state"] = ActionState(d["state"])
        d["commands"] = json.loads(d["commands"])
        d["drained"] = json.loads(d["drained"])
        d["executed"] = bool(d["executed"])
        return cls(**d)


@dataclass(frozen=True)
class CircuitState:
    is_open: bool
    opened_at: float | None
    reason: str
    incident_id: str | None


@dataclass(frozen=True)
class Reset:
    """A human reset: of the circuit breaker, or of one job's no-progress guard."""

    id: int
    kind: str
    job: str | None
    at: float
    who: str


def _connect(path: Path) -> sqlite3.Connection:
    if not path.exists():  # the ledger is the actuator's own: readable by its user only
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # an action recorded is an action that survives a power cut
    conn.executescript(_SCHEMA)
    return conn


class Ledger:
    """Open (create) the ledger at ``path``, recovering what a crashed actuator left; ``now`` stamps that."""

    def __init__(self, path: str | os.PathLike, *, now: float) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = self.path.with_name(self.path.name + ".lock")
        self._lockfile = os.fdopen(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise LedgerError(f"ledger {self.path} is in use by another actuator "
                              "(one actuator per ledger; give this one its own --ledger)") from None
        try:
            self._conn = _connect(self.path)
        except sqlite3.Error as exc:
            self._lockfile.close()
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self.recovered: list[LedgerRecord] = self._recover(now)

    # -- recovery -------------------------------------------------------------------------------------

    def _recover(self, now: float) -> list[LedgerRecord]:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("DELETE FROM actions WHERE state = ?", (ActionState.pending.value,))
                stuck = [LedgerRecord._from_row(r) for r in c.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM actions WHERE state = ?", (ActionState.running.value,))]
                for rec in stuck:
                    check_transition(rec.state, ActionState.failed, rec.decision_id)
                    detail = f"{STOPPED_MID_ACTION} (was: {rec.detail})" if rec.detail else STOPPED_MID_ACTION
                    c.execute("UPDATE actions SET state = ?, detail = ?, updated_at = ? WHERE decision_id = ?",
                              (ActionState.failed.value, detail[:4000], now, rec.decision_id))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return [r for r in (self.get(s.decision_id) for s in stuck) if r is not None]

    # -- reading --------------------------------------------------------------------------------------

    def _one(self, where: str, arg: str) -> LedgerRecord | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM actions WHERE {where} = ?", (arg,)).fetchone()
        return LedgerRecord._from_row(row) if row else None

    def get(self, decision_id: object) -> LedgerRecord | None:
        return self._one("decision_id", str(decision_id))

    def by_key(self, idempotency_key: str) -> LedgerRecord | None:
        return self._one("idempotency_key", idempotency_key)

    def lookup(self, decision: Decision) -> LedgerRecord | None:
        """The recorded row for this decision id, else for its idempotency key, else None."""
        return self.get(decision.decision_id) or self.by_key(decision.idempotency_key)

    def history(self) -> list[LedgerRecord]:
        """Rows that reached ``running`` (something was executed), oldest first."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM actions WHERE executed = 1 ORDER BY created_at, rowid").fetchall()
        return [LedgerRecord._from_row(r) for r in rows]

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM actions").fetchone()[0]

    # -- writing --------------------------------------------------------------------------------------

    def begin(self, decision: Decision, backend: str, now: float) -> tuple[LedgerRecord, bool]:
        """Record ``decision`` as ``pending``; ``(row, True)``, or ``(the recorded row, False)`` if it is known."""
        target = decision.target
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO actions (decision_id, idempotency_key, action, job, node, state, backend, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (str(decision.decision_id), decision.idempotency_key, decision.action, target.job, target.node,
                     ActionState.pending.value, backend, now, now))
                created = True
            except sqlite3.IntegrityError:
                created = False
        rec = self.lookup(decision)
        assert rec is not None
        return rec, created

    def transition(self, decision_id: object, to: ActionState, now: float, *, detail: str | None = None,
                   backend: str | None = None, commands: Iterable[Iterable[str]] | None = None,
                   drained: Iterable[str] | None = None, progress: int | None = None,
                   executed: bool | None = None) -> LedgerRecord:
        """Move a row to ``to`` (checked against the transition table) and update what is given."""
        did = str(decision_id)
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT state FROM actions WHERE decision_id = ?", (did,)).fetchone()
                if row is None:
                    raise LedgerError(f"decision {did} is not in the ledger {self.path}; begin() it first")
                check_transition(row[0], to, did)
                sets, args = ["state = ?", "updated_at = ?"], [ActionState(to).value, now]
                for col, value in (("detail", None if detail is None else detail[:4000]), ("backend", backend),
                                   ("commands", None if commands is None else json.dumps([list(c) for c in commands])),
                                   ("drained", None if drained is None else json.dumps(list(drained))),
                                   ("progress", progress),
                                   ("executed", None if executed is None else int(executed))):
                    if value is not None:
                        sets.append(f"{col} = ?")
                        args.append(value)
                c.execute(f"UPDATE actions SET {', '.join(sets)} WHERE decision_id = ?", (*args, did))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        rec = self.get(did)
        assert rec is not None
        return rec

    def record_origin(self, decision_id: object, origin: str) -> None:
        """Where ``decision_id`` was first read (kept if already recorded)."""
        with self._lock:
            self._conn.execute("INSERT OR IGNORE INTO origins (decision_id, origin) VALUES (?, ?)",
                               (str(decision_id), origin[:500]))

    def origin_of(self, decision_id: object) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT origin FROM origins WHERE decision_id = ?", (str(decision_id),)).fetchone()
        return row[0] if row else None

    # -- the circuit breaker and human resets ------------------------------------------------------------

    def circuit(self) -> CircuitState:
        with self._lock:
            row = self._conn.execute("SELECT is_open, opened_at, reason, incident_id FROM circuit WHERE id = 1").fetchone()
        if row is None:
            return CircuitState(False, None, "", None)
        return CircuitState(bool(row[0]), row[1], row[2], row[3])

    def open_circuit(self, reason: str, at: float, incident_id: str) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO circuit (id, is_open, opened_at, reason, incident_id) VALUES (1, 1, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET is_open = 1, opened_at = excluded.opened_at, reason = excluded.reason, "
                "incident_id = excluded.incident_id", (at, reason[:2000], incident_id))

    def resets(self, after_id: int = 0) -> list[Reset]:
        with self._lock:
            rows = self._conn.execute("SELECT id, kind, job, at, who FROM resets WHERE id > ? ORDER BY id",
                                      (after_id,)).fetchall()
        return [Reset(*r) for r in rows]

    def apply_circuit_reset(self) -> None:
        """Mark the circuit closed (the executor calls this when it applies a human's reset)."""
        with self._lock:
            self._conn.execute("UPDATE circuit SET is_open = 0 WHERE id = 1")

    @staticmethod
    def request_reset(path: str | os.PathLike, *, at: float, kind: str = "circuit", job: str | None = None,
                      who: str = "") -> int:
        """Record a human reset in the ledger at ``path`` (works while an actuator owns it); returns its id.

        ``kind="circuit"`` closes the blast-radius circuit breaker and forgets the
        drains of its window; ``kind="job"`` lifts the no-progress guard of ``job``.
        The running actuator applies it when it next handles a decision or ticks.
        """
        if kind not in ("circuit", "job"):
            raise ValueError(f"reset kind must be 'circuit' or 'job', got {kind!r}")
        if kind == "job" and not job:
            raise ValueError("a job reset needs the job")
        p = Path(path)
        if not p.exists():
            raise LedgerError(f"no ledger at {p} (the actuator's --ledger)")
        conn = _connect(p)
        try:
            cur = conn.execute("INSERT INTO resets (kind, job, at, who) VALUES (?, ?, ?, ?)", (kind, job, at, who))
            if kind == "circuit":
                conn.execute("UPDATE circuit SET is_open = 0 WHERE id = 1")
            return int(cur.lastrowid)
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            finally:
                try:
                    fcntl.flock(self._lockfile, fcntl.LOCK_UN)
                finally:
                    self._lockfile.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
