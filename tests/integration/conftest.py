"""Integration fixtures: a real broker and a real ClickHouse engine, started once.

``VIGIL_KAFKA_BOOTSTRAP`` / ``VIGIL_CLICKHOUSE_DSN`` point the suite at
existing ones; otherwise tansu runs on a free loopback port and chDB in a
temporary directory. Each test gets its own topics (a unique prefix), its own
consumer groups and its own ClickHouse database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from vigil.schemas.signing import Keyring
from vigil.streams.config import StreamConfig
from vigil.streams.history import HistoryStore
from vigil.streams.kafka import ensure_topics
from vigil.broker import TansuBroker, find_tansu
from vigil.stack import wait_for_file



#: The decision key of every vigil process these tests start (workers sign with it, actuators check it):
#: exported once, so that subprocesses inherit it. A test that wants other keys sets its own environment.
DECISION_KEYS = {"integration": f"integration-tests-{uuid.uuid4().hex}"}
os.environ.setdefault("VIGIL_DECISION_KEYS", json.dumps(DECISION_KEYS))
#: The vigil processes these tests start serve no /metrics unless a test gives them a port (VIGIL_METRICS_PORT):
#: their default ports would clash between the tests' processes and with any other vigil on this host.
os.environ.setdefault("VIGIL_METRICS_PORT", "0")
#: What signs decisions the tests make up as if the decision engine had (when the environment's key is theirs).
KEYRING = Keyring({k: v.encode() for k, v in json.loads(os.environ["VIGIL_DECISION_KEYS"]).items()},
                  signing_key=next(iter(json.loads(os.environ["VIGIL_DECISION_KEYS"]))))


#: Files whose tests may run beside one another (`make test` runs them on two workers before the rest):
#: they check stored rows, outputs, counts and the CLI's behaviour, never how fast an alert came nor that
#: none came, and each passed on a host at load 8. Every other file runs alone, one test at a time: its
#: real agents, ranks and workers must not be starved, as a false page on a starved host is what it looks for.
CONCURRENT = frozenset({
    "test_bench_history.py", "test_bench_hooks.py", "test_cli_history.py", "test_cli_node.py", "test_cli_stack.py",
    "test_cli_tail.py", "test_clustersim_publish.py", "test_cookbook.py", "test_dashboard_queries.py",
    "test_dead_letters.py", "test_fuzz.py", "test_gpu_samples_history.py", "test_history_analytics.py",
    "test_history_from_simulator.py", "test_history_insert.py", "test_history_sink.py", "test_integrity_actuator.py",
    "test_integrity_sink.py", "test_integrity_stack.py", "test_metrics_endpoints.py",
    "test_notify_alertmanager_stub.py", "test_packaging.py", "test_plugins.py", "test_replay.py",
    "test_report_render.py", "test_sink_decode_pool.py", "test_sink_store_outage.py",
})


def pytest_collection_modifyitems(config, items):
    # Everything under tests/integration talks to the real broker and ClickHouse.
    here = Path(__file__).parent
    missing = sorted(name for name in CONCURRENT if not (here / name).is_file())
    if missing:  # a renamed file would silently move to the serial run
        raise pytest.UsageError(f"conftest.CONCURRENT names files that do not exist: {missing}")
    for item in items:
        path = Path(item.fspath)
        if here in path.parents:
            item.add_marker(pytest.mark.integration)
            if path.name in CONCURRENT:
                item.add_marker(pytest.mark.concurrent)


@pytest.fixture(scope="session")
def kafka_bootstrap():
    external = os.environ.get("VIGIL_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    broker = TansuBroker(find_tansu(None)).start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def history_session(tmp_path_factory):
    dsn = os.environ.get("VIGIL_CLICKHOUSE_DSN") or f"chdb://{tmp_path_factory.mktemp('chdb')}/history"
    store = HistoryStore(dsn, database="vigil_session")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def config(kafka_bootstrap) -> StreamConfig:
    tag = uuid.uuid4().hex[:10]
    cfg = StreamConfig(bootstrap=kafka_bootstrap, topic_prefix=f"test-{tag}", group_id=f"detect-{tag}")
    ensure_topics(cfg.kafka_conf(), cfg.topic_prefix)
    return cfg


@pytest.fixture
def history(history_session) -> HistoryStore:
    store = history_session.with_database(f"test_{uuid.uuid4().hex[:10]}")
    store.migrate()
    return store


class WorkerProcess:
    def __init__(self, config: StreamConfig, workdir: Path, metrics_port: int | None = None) -> None:
        self.config = config
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready = workdir / f"ready-{uuid.uuid4().hex[:6]}"
        self.log = workdir / "worker.log"
        env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
                   VIGIL_GROUP_ID=config.group_id, VIGIL_STATE_DIR=str(workdir))
        if metrics_port is not None:
            env["VIGIL_METRICS_PORT"] = str(metrics_port)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "worker", "--ready-file", str(self.ready), "--log-level", "INFO"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        if not wait_for_file(self.ready, timeout_s, alive=lambda: self.proc.poll() is None):
            raise AssertionError(f"worker not ready; log:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def worker(config, tmp_path):
    w = WorkerProcess(config, tmp_path)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def wait_for(predicate, timeout_s: float, poll=None):
    """Poll ``predicate`` (calling ``poll()`` between tries, e.g. a consumer read) until true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if poll is not None:
            poll()
        else:
            time.sleep(0.02)
    return predicate()
