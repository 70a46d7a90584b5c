"""Issue 17 on a real `vigil up` (tansu + chDB, subprocesses as a user runs them): the SQL endpoint,
secrets in output and on disk, the supervised embedded broker.

On the code before the fix: the endpoint ran any SQL for anyone (file(), DROP, several
statements, no token), `vigil replay --database` pasted its argument into SQL, the DSN's password
was printed by `vigil up`, `migrate`, `demo` and in errors and written to a 0644 stack.json, and
`vigil up` exited when tansu died.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Producer

from vigil.schemas import Heartbeat, Source, encode, from_seconds
from vigil.stack import StackInfo, wait_for_file
from vigil.streams.cookbook import COOKBOOK
from tests.integration.conftest import wait_for

PASSWORD = f"S3cret-{uuid.uuid4().hex[:12]}"


def vigil(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "vigil.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def vigil_side_by_side(commands: list[tuple[str, ...]], env, timeout=120) -> list[subprocess.CompletedProcess]:
    """Independent `vigil` commands run at once, their results in order. Each is mostly a Python start-up (seconds of
    CPU) or a wait on a server that does not answer, so one after another they leave a core idle."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: vigil(*args, env=env, timeout=timeout), commands))


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    e["VIGIL_STATE_DIR"] = str(tmp_path / "state")
    e["COLUMNS"] = "400"  # (rich wraps long lines at the terminal's width)
    return e


class Up:
    """`vigil up` in the background, its output captured."""

    def __init__(self, env: dict, state: Path) -> None:
        self.out = state.parent / f"up-{uuid.uuid4().hex[:6]}.log"
        self.state = state
        with open(self.out, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "vigil.cli", "up"], env=env, stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not wait_for_file(state / "stack.json", 90, alive=lambda: self.proc.poll() is None):
            raise AssertionError(self.text())
        self.info = StackInfo.read(state / "stack.json")
        assert self.info is not None

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def post(url: str, sql: str, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(url, data=sql.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def assert_private(state: Path) -> None:
    bad = []
    for path in [state, *state.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if (path.is_dir() and mode != 0o700) or (path.is_file() and mode not in (0o600, 0o700)):
            bad.append(f"{oct(mode)} {path}")
    assert not bad, bad[:20]


POPULATE = """
import json, sys
from vigil.stack import _jsonable
from vigil.streams.cookbook import COOKBOOK
from vigil.streams.history import HistoryStore
from tests.integration import scripted_history as sh
store = HistoryStore(sys.argv[1], "vigil")
store.migrate()
sh.populate(store)
answers = {}
for recipe in COOKBOOK:
    r = store.query(recipe.sql)
    answers[recipe.name] = [dict(zip(r.columns, _jsonable(list(row)))) for row in r.rows]
store.close()
print(json.dumps(answers))
"""


def test_the_query_endpoint_is_read_only_one_statement_and_wants_the_token(env, tmp_path):
    state = tmp_path / "state"
    dsn = f"chdb://{state}/history"
    pop = subprocess.run([sys.executable, "-c", POPULATE, dsn], env=env, capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert pop.returncode == 0, pop.stderr[-3000:]
    answers = json.loads(pop.stdout.strip().splitlines()[-1])
    up = Up(env, state)
    try:
        url, token = up.info.query_url, up.info.query_token
        assert token and url
        assert post(url, "SELECT 1 AS one", None)[0] == 401
        assert post(url, "SELECT 1 AS one", "wrong")[0] == 401
        assert post(url, "SELECT 1 AS one", token) == (200, {"columns": ["one"], "types": ["UInt8"], "rows": [[1]]})
        outfile = tmp_path / "written.txt"
        for sql, why in [
            ("SELECT * FROM file('/etc/hostname')", "reaches outside the history"),
            ("SELECT * FROM `file`('/etc/hostname', 'LineAsString')", "reaches outside the history"),
            ("DESCRIBE file('/etc/hostname')", "reaches outside the history"),
            ("SELECT * FROM url('http://127.0.0.1:9/x', 'CSV')", "reaches outside the history"),
            ("DROP TABLE vigil.alerts", "only read statements"),
            ("SELECT 1; DROP TABLE vigil.alerts", "one statement at a time"),
            ("SELECT 1; SELECT 2", "one statement at a time"),
            (f"SELECT 1 INTO OUTFILE '{outfile}'", "INTO OUTFILE"),
            ("SELECT 1 SETTINGS readonly = 0", "readonly"),
            ("SELECT 1 /* unclosed", "not closed"),
        ]:
            status, body = post(url, sql, token)
            assert status == 400 and why in body["error"], (sql, status, body)
        assert not outfile.exists()
        assert post(url, "SELECT count() AS n FROM vigil.alerts", token)[0] == 200  # still there

        # `vigil sql` uses the token, and answers the README's cookbook as the store itself does (the endpoint
        # serves requests in threads on a store that serializes them: users may query at once).
        ran = vigil_side_by_side([("sql", recipe.sql, "--format", "json") for recipe in COOKBOOK], env=env)
        for recipe, r in zip(COOKBOOK, ran):
            assert r.returncode == 0, (recipe.name, r.stderr)
            got = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            for row in got + answers[recipe.name]:
                row.pop("open_min", None)  # (minutes until now: the clock moved between the two)
            assert got == answers[recipe.name], recipe.name
        r = vigil("sql", "SELECT * FROM file('/etc/hostname')", env=env)
        assert r.returncode == 1 and "reaches outside the history" in r.stderr

        # `vigil replay --database` is an identifier, never SQL.
        r = vigil("replay", "--database", "x; DROP DATABASE vigil", env=env)
        assert r.returncode == 2 and "not a plain identifier" in r.stderr, r.stderr
        assert post(url, "SELECT count() AS n FROM vigil.alerts", token)[0] == 200
    finally:
        assert up.stop() == 0, up.text()[-3000:]
    # with the stack stopped, `vigil sql` opens the directory itself: read-only too
    r = vigil("sql", "DROP TABLE vigil.alerts", env=env)
    assert r.returncode == 1 and "only read statements" in r.stderr
    r = vigil("sql", "SELECT count() AS n FROM vigil.alerts", "--format", "json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["n"] > 0
    assert_private(state)


def test_no_password_in_any_output_and_private_state_files(env, tmp_path):
    state, demo_state = tmp_path / "state", tmp_path / "demo-state"
    good = {**env, "VIGIL_CLICKHOUSE_DSN": f"chdb://{state}/history?password={PASSWORD}"}
    outputs: dict[str, str] = {}
    # `vigil demo` plays a fixed ~36 s scenario on a stack of its own: it runs beside the rest of the test
    # (its own state directory and history), not after it; only its output and files are judged here.
    demo_log = tmp_path / "demo.log"
    with open(demo_log, "wb") as f:
        demo = subprocess.Popen([sys.executable, "-m", "vigil.cli", "demo"], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**env, "VIGIL_STATE_DIR": str(demo_state),
                                "VIGIL_CLICKHOUSE_DSN": f"chdb://{demo_state}/demo-history?password={PASSWORD}"})
    up = Up(good, state)
    try:
        sql, sql_error, migrate_held, replay_held = vigil_side_by_side([
            ("sql", "SELECT count() AS n FROM vigil.alerts", "--format", "json"), ("sql", "SELEC broken"),
            ("migrate",),  # the stack holds the directory: an error naming the DSN
            ("replay", "--from", "2026-01-01")], env=good)
        assert sql.returncode == 0, sql.stderr
        outputs["sql"] = sql.stdout + sql.stderr
        outputs["sql error"] = sql_error.stdout + sql_error.stderr
        assert migrate_held.returncode == 1
        outputs["migrate (held)"] = migrate_held.stdout + migrate_held.stderr
        outputs["replay (held)"] = replay_held.stdout + replay_held.stderr
        stack_json = (state / "stack.json").read_text()
        assert PASSWORD not in stack_json and "password=***" in stack_json
        assert_private(state)
    finally:
        assert up.stop() == 0
    outputs["up"] = up.text()
    assert "vigil stack up" in outputs["up"] and "password=***" in outputs["up"]
    assert "not production" in outputs["up"] and outputs["up"].count("keeps its log in memory") == 1
    r = vigil("migrate", env=good)
    assert r.returncode == 0, r.stderr
    outputs["migrate"] = r.stdout + r.stderr
    # A ClickHouse server that does not answer: every error names the DSN without its password.
    bad = {**env, "VIGIL_CLICKHOUSE_DSN": f"http://vigil:{PASSWORD}@127.0.0.1:9/", "VIGIL_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    # (`up` waits 15 s for the broker to answer; the others fail at once)
    no_server = [("up",), ("migrate",), ("sql", "SELECT 1"), ("replay",)]
    for args, r in zip(no_server, vigil_side_by_side(no_server, env=bad)):
        assert r.returncode != 0, args
        outputs[" ".join(args) + " (no server)"] = r.stdout + r.stderr
    try:
        demo.wait(timeout=300)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    outputs["demo"] = demo_log.read_text(errors="replace")
    assert "password=***" in outputs["demo"], outputs["demo"][-2000:]
    leaked = [name for name, text in outputs.items() if PASSWORD in text]
    assert not leaked, {name: outputs[name][-1500:] for name in leaked}
    for d in (state, demo_state):
        assert_private(d)
    on_disk = [p for d in (state, demo_state) for p in d.rglob("*") if p.is_file() and p.stat().st_size < 5_000_000
               and PASSWORD.encode() in p.read_bytes()]
    assert not on_disk, on_disk


def test_up_restarts_a_dead_broker_on_its_address_and_records_an_incident(env, tmp_path):
    state = tmp_path / "state"
    up = Up(env, state)
    try:
        bootstrap = up.info.bootstrap
        out = subprocess.run(["pgrep", "-P", str(up.proc.pid), "-f", "tansu"], capture_output=True, text=True).stdout
        (broker_pid,) = [int(p) for p in out.split()]
        os.kill(broker_pid, signal.SIGKILL)

        def new_broker() -> list[int]:
            pids = subprocess.run(["pgrep", "-P", str(up.proc.pid), "-f", "tansu"], capture_output=True,
                                  text=True).stdout.split()
            return [int(p) for p in pids if int(p) != broker_pid]

        assert wait_for(lambda: new_broker() and "started again" in up.text(), 60), up.text()[-3000:]
        assert up.proc.poll() is None and StackInfo.read(state / "stack.json").bootstrap == bootstrap
        # Producers reconnect to the same address; the sink stores what comes after, and the incident.
        producer = Producer({"bootstrap.servers": bootstrap})
        hb = Heartbeat(event_time=from_seconds(time.time()), source=Source(node="after-restart"), seq=1, interval_s=1.0)
        producer.produce("vigil.telemetry.heartbeats", key=b"after-restart", value=encode(hb))
        assert producer.flush(30) == 0

        def stored(sql: str) -> list:
            r = vigil("sql", sql, "--format", "json", env=env)
            return [json.loads(line) for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []

        assert wait_for(lambda: stored("SELECT node FROM vigil.heartbeats") == [{"node": "after-restart"}]
                        and stored("SELECT kind, severity FROM vigil.alerts")
                        == [{"kind": "embedded_broker_restarted", "severity": 2}], 90), up.text()[-3000:]
        assert up.text().count("keeps its log in memory") == 1
    finally:
        assert up.stop() == 0, up.text()[-3000:]
