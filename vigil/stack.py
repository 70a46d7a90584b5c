"""The embedded stack: broker, topics, ClickHouse history, history sink, query service.

``vigil up`` runs it in the foreground; ``vigil demo`` and the test fixtures
run it in-process. Only one process may open a chDB directory, so the stack
owns it and answers SQL for other processes over a loopback HTTP endpoint
recorded, with the broker's address, in ``<state dir>/stack.json``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from vigil.streams.config import StreamConfig
from vigil.streams.history import HistoryError, HistoryStore, QueryResult
from vigil.streams.kafka import ensure_topics
from vigil.streams.sink import HistorySink
from vigil.broker import StackError, TansuBroker, find_tansu, wait_for_metadata
from vigil.settings import Settings


def stream_config(settings: Settings, bootstrap: str, **overrides: Any) -> StreamConfig:
    return settings.stream_config(bootstrap, **overrides)


@dataclass(frozen=True)
class StackInfo:
    """What a running stack publishes in its stack file."""

    pid: int
    bootstrap: str
    query_url: str | None
    topic_prefix: str
    clickhouse_dsn: str

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


class _QueryHandler(BaseHTTPRequestHandler):
    store: HistoryStore  # set on the subclass the server builds

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path != "/query":
            self._reply(404, {"error": f"no such endpoint {self.path}; POST SQL to /query"})
            return
        length = int(self.headers.get("Content-Length", "0"))
        sql = self.rfile.read(length).decode("utf-8", errors="replace")
        try:
            result = self.store.query(sql)
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
        s.state_dir.mkdir(parents=True, exist_ok=True)
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
        query_url = None
        if self.with_query_server:
            handler = type("QueryHandler", (_QueryHandler,), {"store": self.store})
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=self._server.serve_forever, name="query-server", daemon=True).start()
            query_url = f"http://127.0.0.1:{self._server.server_address[1]}/query"
        info = StackInfo(pid=os.getpid(), bootstrap=self.bootstrap, query_url=query_url,
                         topic_prefix=s.topic_prefix, clickhouse_dsn=s.resolved_clickhouse_dsn)
        tmp = s.stack_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info.__dict__))
        tmp.replace(s.stack_file)
        self._owns_stack_file = True

    def failure(self) -> str | None:
        """Why the stack no longer works (its broker or sink died), or None."""
        if self.broker is not None and not self.broker.alive:
            return f"the tansu broker exited (see {self.settings.state_dir / 'tansu.log'})"
        if self.sink is not None and not self.sink.alive:
            return f"the history sink stopped: {self.sink.failure!r}"
        return None

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
    """Queries through a running stack's query endpoint."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str) -> QueryResult:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url, data=sql.encode(), method="POST")
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
        if running is not None and running.query_url and running.clickhouse_dsn == settings.resolved_clickhouse_dsn:
            return RemoteHistory(running.query_url)
        if not settings.chdb_path.exists():
            raise HistoryError(
                f"no history at {settings.chdb_path} yet: run `vigil up` (or `vigil demo`) first, "
                "or set VIGIL_CLICKHOUSE_DSN"
            )
    store = HistoryStore(settings.resolved_clickhouse_dsn, settings.clickhouse_database)
    return store


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
