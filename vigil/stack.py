"""The embedded stack: broker, topics, ClickHouse history, history sink, query service.

``vigil up`` runs it in the foreground; ``vigil demo`` and the test fixtures
run it in-process. Only one process may open a chDB directory, so the stack
owns it and answers SQL for other processes over a loopback HTTP endpoint
recorded, with the broker's address, in ``<state dir>/stack.json``.

What a stack keeps is its user's alone: the state directory is 0700, its
files 0600. The query endpoint wants the stack's token (made at start, kept
in ``stack.json``; ``vigil sql`` sends it) and runs one read statement at a
time in ClickHouse's read-only mode (:func:`vigil.streams.history.read_only_statement`).
``stack.json`` holds the DSN without its password.

The embedded broker is supervised: when tansu dies, the stack starts it
again on the same address (producers and workers reconnect by themselves),
re-creates the topics and records the outage as an incident
(``embedded_broker_restarted`` on the alert topic). Its log lived in memory,
so what was not yet consumed, and every committed offset, is gone: it is a
broker for demos, tests and laptops (:data:`EMBEDDED_BROKER_WARNING`).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from vigil.secrets import private_dir, private_tree, redact_dsn, token, write_private
from vigil.streams.config import StreamConfig
from vigil.streams.history import HistoryError, HistoryStore, QueryResult
from vigil.streams.kafka import ensure_topics
from vigil.streams.sink import HistorySink
from vigil.broker import StackError, TansuBroker, find_tansu, wait_for_metadata
from vigil.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED_BROKER_WARNING = (
    "the embedded broker (tansu) keeps its log in memory: if it dies, vigil restarts it, but events not yet "
    "consumed and committed offsets are lost. It is for demos, tests and laptops, not production: point "
    "VIGIL_KAFKA_BOOTSTRAP at a Kafka cluster.")
#: Kind of the incident a broker restart records.
BROKER_RESTART_KIND = "embedded_broker_restarted"
_NS = uuid.UUID("9e4b6a61-0c3f-4f1e-b6f2-4b0f0d2a7c55")


def stream_config(settings: Settings, bootstrap: str, **overrides: Any) -> StreamConfig:
    return settings.stream_config(bootstrap, **overrides)


@dataclass(frozen=True)
class StackInfo:
    """What a running stack publishes in its stack file."""

    pid: int
    bootstrap: str
    query_url: str | None
    topic_prefix: str
    #: The DSN without its password (what identifies the history, not what opens it).
    clickhouse_dsn: str
    #: The query endpoint's bearer token.
    query_token: str | None = None

    @classmethod
    def read(cls, path: Path) -> "StackInfo | None":
        """The running stack's info, or None when none runs (stale files are ignored)."""
        try:
            data = json.loads(path.read_text())
            info = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        return info if _pid_alive(info.pid) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


#: Largest SQL text the query endpoint reads.
MAX_QUERY_BYTES = 1 << 20


class _QueryHandler(BaseHTTPRequestHandler):
    store: HistoryStore  # set on the subclass the server builds
    token: str

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path != "/query":
            self._reply(404, {"error": f"no such endpoint {self.path}; POST SQL to /query"})
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            self._reply(401, {"error": "the stack's query token is required (Authorization: Bearer <token>; "
                                       "`vigil sql` reads it from the state directory's stack.json)"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_QUERY_BYTES:
            self._reply(413, {"error": f"a query is at most {MAX_QUERY_BYTES} bytes"})
            return
        sql = self.rfile.read(length).decode("utf-8", errors="replace")
        try:
            result = self.store.query_read_only(sql)
        except HistoryError as exc:
            self._reply(400, {"error": str(exc)})
            return
        self._reply(200, {"columns": result.columns, "types": result.types,
                          "rows": [_jsonable(list(r)) for r in result.rows]})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class EmbeddedStack:
    """Start with :meth:`start` (or ``with``); :meth:`stop` ends what it started."""

    def __init__(self, settings: Settings, *, port: int | None = None, sink: bool = True,
                 query_server: bool = True) -> None:
        self.settings = settings
        self.port = port
        self.with_sink = sink
        self.with_query_server = query_server
        self.broker: TansuBroker | None = None
        self.store: HistoryStore | None = None
        self.sink: HistorySink | None = None
        self.bootstrap: str | None = None
        self._server: ThreadingHTTPServer | None = None
        self._owns_stack_file = False
        #: Times the embedded broker died and was started again.
        self.broker_restarts = 0

    @property
    def config(self) -> StreamConfig:
        assert self.bootstrap is not None, "stack not started"
        return stream_config(self.settings, self.bootstrap)

    def start(self) -> "EmbeddedStack":
        s = self.settings
        running = StackInfo.read(s.stack_file)
        if running is not None and running.pid != os.getpid():
            raise StackError(
                f"a vigil stack already runs from {s.state_dir} (pid {running.pid}, broker {running.bootstrap}); "
                "stop it, or give this one its own VIGIL_STATE_DIR"
            )
        private_dir(s.state_dir)
        # What the stack keeps there is its user's alone, also when an older vigil made it.
        for path in [s.stack_file, s.stack_key_file, s.state_dir / "tansu.log",
                     *([s.chdb_path] if s.chdb_path is not None and s.state_dir in s.chdb_path.parents else [])]:
            private_tree(path)
        try:
            self._start_parts()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_parts(self) -> None:
        s = self.settings
        if s.kafka_bootstrap:
            wait_for_metadata(s.kafka_bootstrap, timeout_s=15.0)
            self.bootstrap = s.kafka_bootstrap
        else:
            self.broker = TansuBroker(find_tansu(s.tansu_bin), self.port, log_path=s.state_dir / "tansu.log").start()
            self.bootstrap = self.broker.bootstrap
        ensure_topics(self.config.kafka_conf(), s.topic_prefix)
        try:
            self.store = HistoryStore(s.resolved_clickhouse_dsn, s.clickhouse_database)
        except HistoryError as exc:
            raise StackError(str(exc)) from exc
        self.store.migrate(s.telemetry_ttl_days, s.telemetry_ttl_overrides)
        if self.with_sink:
            self.sink = HistorySink(self.config, self.store, decode_processes=s.sink_decode_processes).start()
        query_url = query_token = None
        if self.with_query_server:
            query_token = token()
            handler = type("QueryHandler", (_QueryHandler,), {"store": self.store, "token": query_token})
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=self._server.serve_forever, name="query-server", daemon=True).start()
            query_url = f"http://127.0.0.1:{self._server.server_address[1]}/query"
        info = StackInfo(pid=os.getpid(), bootstrap=self.bootstrap, query_url=query_url,
                         topic_prefix=s.topic_prefix, clickhouse_dsn=redact_dsn(s.resolved_clickhouse_dsn),
                         query_token=query_token)
        write_private(s.stack_file, json.dumps(asdict(info)))
        self._owns_stack_file = True

    def failure(self) -> str | None:
        """Why the stack no longer works, or None. A dead embedded broker is started again first
        (:meth:`restart_broker`); only one that cannot be is a failure."""
        if self.broker is not None and not self.broker.alive:
            try:
                self.restart_broker()
            except StackError as exc:
                return f"the tansu broker exited and could not be started again: {exc}"
        if self.sink is not None and not self.sink.alive:
            return f"the history sink stopped: {self.sink.failure!r}"
        return None

    def restart_broker(self) -> None:
        """Start the dead embedded broker again on its address, re-create the topics, record an incident."""
        assert self.broker is not None
        code = self.broker.proc.returncode if self.broker.proc is not None else None
        died = time.time()
        log.error("the embedded broker exited (code %s); starting it again on %s", code, self.broker.bootstrap)
        self.broker.stop()
        self.broker.start()
        self.broker_restarts += 1
        ensure_topics(self.config.kafka_conf(), self.settings.topic_prefix)
        self._record_broker_restart(code, died)

    def _record_broker_restart(self, code: int | None, died: float) -> None:
        from confluent_kafka import Producer

        from vigil.schemas import Alert, Source, Subject, encode, from_seconds, message_key

        now = from_seconds(time.time())
        incident = uuid.uuid5(_NS, f"broker/{self.bootstrap}/{died!r}")
        alert = Alert(event_id=uuid.uuid5(_NS, f"alert/{incident}"), event_time=now, source=Source(),
                      incident_id=incident, incident_version=1, status="open", severity=2, kind=BROKER_RESTART_KIND,
                      subject=Subject(), onset_time=from_seconds(died), detection_time=now,
                      summary=(f"the embedded broker on {self.bootstrap} died (exit code {code}) and was started "
                               f"again (restart {self.broker_restarts}); its log was in memory: events not yet "
                               "consumed and committed offsets were lost"),
                      evidence=[{"exit_code": code, "restarts": self.broker_restarts}], evidence_count=1,
                      detector="vigil.stack", detector_version="1")
        producer = Producer({**self.config.kafka_conf(), "log_level": 3})
        producer.produce(self.config.topic("alert"), key=message_key(alert), value=encode(alert))
        left = producer.flush(15)
        if left:
            log.error("could not record the broker restart on %s", self.config.topic("alert"))

    def stop(self) -> None:
        if self._owns_stack_file:
            self.settings.stack_file.unlink(missing_ok=True)
            self._owns_stack_file = False
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.sink is not None:
            self.sink.stop()
            self.sink = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def __enter__(self) -> "EmbeddedStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RemoteHistory:
    """Queries through a running stack's query endpoint (read-only, with the stack's token)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.token = token

    def query_read_only(self, sql: str) -> QueryResult:
        return self.query(sql)

    def query(self, sql: str) -> QueryResult:
        import urllib.error
        import urllib.request

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        req = urllib.request.Request(self.url, data=sql.encode(), method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise HistoryError(json.loads(exc.read()).get("error", str(exc))) from None
        except urllib.error.URLError as exc:
            raise HistoryError(f"the stack's query service at {self.url} did not answer: {exc.reason}") from None
        return QueryResult(body["columns"], body["types"], [tuple(r) for r in body["rows"]])

    def close(self) -> None:
        pass


def open_history(settings: Settings) -> HistoryStore | RemoteHistory:
    """The history to query: through a running stack when it owns the chDB directory."""
    if settings.chdb_path is not None:
        running = StackInfo.read(settings.stack_file)
        if running is not None and running.query_url and running.clickhouse_dsn == redact_dsn(
                settings.resolved_clickhouse_dsn):
            return RemoteHistory(running.query_url, running.query_token)
        if not settings.chdb_path.exists():
            raise HistoryError(
                f"no history at {settings.chdb_path} yet: run `vigil up` (or `vigil demo`) first, "
                "or set VIGIL_CLICKHOUSE_DSN"
            )
    store = HistoryStore(settings.resolved_clickhouse_dsn, settings.clickhouse_database)
    return store


def ensure_stack_key(settings: Settings) -> dict[str, str]:
    """A development stack's decision key: when no ``VIGIL_DECISION_KEYS`` is set, one kept in the state
    directory (made once, 0600). Returns the environment the stack's own processes get for it."""
    if settings.decision_keys:
        return {}
    path = settings.stack_key_file
    if not path.exists():
        private_dir(settings.state_dir)
        write_private(path, json.dumps({"key_id": f"stack-{uuid.uuid4().hex[:8]}", "key": token()}))
        log.info("made a decision key for this stack in %s", path)
    data = json.loads(path.read_text())
    return {"VIGIL_DECISION_KEYS": json.dumps({data["key_id"]: data["key"]})}


def resolve_bootstrap(settings: Settings) -> str:
    """The broker to talk to: VIGIL_KAFKA_BOOTSTRAP, else the running embedded stack's."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    running = StackInfo.read(settings.stack_file)
    if running is None:
        raise StackError(
            f"no broker: VIGIL_KAFKA_BOOTSTRAP is unset and no `vigil up` runs from {settings.state_dir}. "
            "Start one with `vigil up` in another terminal, or point VIGIL_KAFKA_BOOTSTRAP at Kafka."
        )
    return running.bootstrap


def wait_for_file(path: Path, timeout_s: float, alive: Any = None) -> bool:
    """Wait until ``path`` exists (``alive()`` false aborts early)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if alive is not None and not alive():
            return False
        time.sleep(0.02)
    return path.exists()
