"""vigil migrate and vigil sql on a history of their own (subprocesses: one chDB directory per process)."""

from __future__ import annotations

import os
import subprocess
import sys


def _vigil(tmp_path, *args):
    env = dict(os.environ, VIGIL_STATE_DIR=str(tmp_path / "state"), COLUMNS="200")
    env.pop("VIGIL_CLICKHOUSE_DSN", None)
    return subprocess.run([sys.executable, "-m", "vigil.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_migrate_twice_then_a_bad_query_prints_clickhouse_message_and_position(tmp_path):
    first = _vigil(tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert "created incident_rollup_mv" in first.stdout
    second = _vigil(tmp_path, "migrate")
    assert second.returncode == 0 and "nothing to change" in second.stdout

    bad = _vigil(tmp_path, "sql", "SELECT kind, count( FROM vigil.alerts")
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert "Syntax error" in bad.stderr and "SYNTAX_ERROR" in bad.stderr
    lines = bad.stderr.splitlines()
    caret = next(i for i, line in enumerate(lines) if "^ line 1, column 26" in line)
    assert lines[caret - 1] == "SELECT kind, count( FROM vigil.alerts"
    assert lines[caret].index("^") == 25  # under "vigil", where ClickHouse stopped

    unknown = _vigil(tmp_path, "sql", "SELECT nope FROM vigil.incidents")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert "UNKNOWN_IDENTIFIER" in unknown.stderr and "nope" in unknown.stderr

    ok = _vigil(tmp_path, "sql", "SELECT count() AS n FROM vigil.incidents", "--format", "tsv")
    assert ok.returncode == 0 and ok.stdout.split() == ["n", "0"]
