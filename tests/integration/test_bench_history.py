"""vigil bench history at a tiny size: the JSON has the documented shape and every cookbook query runs.

The command runs in a process of its own, as users run it: chDB opens one data
directory per process, and this test's pytest process may hold another already.
"""

from __future__ import annotations

import json
import subprocess
import sys

from vigil.streams.cookbook import COOKBOOK


def test_bench_history_tiny(tmp_path):
    out = tmp_path / "history.json"
    done = subprocess.run([sys.executable, "-m", "vigil.cli", "bench", "history", "--json", str(out),
                           "--telemetry-rows", "20000", "--incidents", "2000", "--sink-seconds", "120",
                           "--sink-events", "2000", "--repeats", "6"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["insert_rows_per_s"] > 0
    assert set(data["queries"]) == {r.name for r in COOKBOOK}
    assert all(s > 0 for s in data["queries"].values())
    gen = data["detail"]["generated"]
    assert gen["telemetry_rows"] == 20_000 and gen["rows"]["incidents"] == 2_000
    sink = data["detail"]["sink"]
    assert sink["stored"] == 2_000 and sink["backlog_drained"]  # it stops when the backlog is stored
    assert 0 < data["insert_sustained_s"] == sink["seconds"]
    assert all(len(q["runs_s"]) == q["n"] == 6 for q in data["detail"]["queries"].values())
    assert all(lo <= data["queries"][name] <= hi for name, (lo, hi) in data["queries_ci95"].items())
    assert data["command"] == (f"vigil bench history --json {out} --telemetry-rows 20000 --incidents 2000 "
                               "--sink-seconds 120.0 --sink-events 2000 --repeats 6")
    assert all(len(data["detail"]["machine"][k]) == 3 for k in ("load_before", "load_after"))
    assert "written to" in done.stdout
