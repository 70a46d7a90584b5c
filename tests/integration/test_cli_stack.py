"""`vigil up`, `vigil sql` and `vigil tail` as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from confluent_kafka import Producer
from vigil.schemas import Alert, Source, Subject, encode, from_seconds, message_key
from vigil.stack import StackInfo, wait_for_file

def vigil(*args, env, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "vigil.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    e["VIGIL_STATE_DIR"] = str(tmp_path / "state")
    return e


def test_up_serves_sql_and_tail_then_stops_everything(env, tmp_path):
    up = subprocess.Popen([sys.executable, "-m", "vigil.cli", "up"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    stack_file = tmp_path / "state" / "stack.json"
    try:
        assert wait_for_file(stack_file, 60, alive=lambda: up.poll() is None), up.stdout.read() if up.poll() is not None else ""
        info = StackInfo.read(stack_file)
        assert info is not None and info.pid == up.pid
        broker_pids = children(up.pid)
        assert broker_pids, "tansu should run as a child of `vigil up`"

        # SQL through the stack, which owns the chDB directory
        r = vigil("sql", "SELECT count() AS n FROM vigil.alerts", "--format", "json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip()) == {"n": 0}

        # a query error prints ClickHouse's message, not a traceback
        r = vigil("sql", "SELECT 1 +", env=env)
        assert r.returncode == 1 and "Syntax error" in r.stderr and "Traceback" not in r.stderr
        # (a statement that is not a read is refused before ClickHouse sees it: the endpoint is read-only)
        r = vigil("sql", "SELEC 1", env=env)
        assert r.returncode == 1 and "only read statements" in r.stderr and "Traceback" not in r.stderr

        # tail sees an alert published on the topic, filtered by severity
        tail = subprocess.Popen([sys.executable, "-m", "vigil.cli", "tail", "alerts", "--json", "--from-beginning",
                                 "--severity", "1", "--max-alerts", "1"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            producer = Producer({"bootstrap.servers": info.bootstrap})
            now = from_seconds(time.time())
            for sev, node in ((3, "noise"), (1, "n7")):
                alert = Alert(event_time=now, incident_id=uuid.uuid4(), incident_version=1, status="open",
                              severity=sev, kind="node_lost", subject=Subject(node=node), onset_time=now,
                              detection_time=now, detector="test", detector_version="1", source=Source())
                producer.produce(f"{info.topic_prefix}.alerts", key=message_key(alert), value=encode(alert))
            producer.flush(10)
            out, err = tail.communicate(timeout=60)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait()
        assert tail.returncode == 0, err
        assert json.loads(out.strip())["subject"]["node"] == "n7"

        # the sink stores both alerts; SQL sees them
        def stored() -> int:
            r = vigil("sql", "SELECT count() AS n FROM vigil.alerts", "--format", "json", env=env)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout.strip())["n"]

        deadline = time.monotonic() + 30
        while stored() != 2 and time.monotonic() < deadline:
            pass
        assert stored() == 2
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    assert up.returncode == 0
    assert not stack_file.exists()
    for pid in broker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    # with the stack stopped, `vigil sql` opens the chDB directory itself
    r = vigil("sql", "SELECT kind, severity FROM vigil.alerts ORDER BY severity", "--format", "tsv", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["kind\tseverity", "node_lost\t1", "node_lost\t3"]


def test_up_on_a_taken_port_says_what_to_do(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = vigil("up", "--port", str(port), env=env)
    assert r.returncode == 1 and f"port {port}" in r.stderr and "taken" in r.stderr


def test_up_without_the_broker_binary_says_what_to_do(env, tmp_path):
    r = vigil("up", env={**env, "VIGIL_TANSU_BIN": str(tmp_path / "missing")})
    assert r.returncode == 1 and "VIGIL_TANSU_BIN" in r.stderr


def test_sql_before_any_history_says_what_to_do(env):
    r = vigil("sql", "SELECT 1", env=env)
    assert r.returncode == 1 and "vigil up" in r.stderr
