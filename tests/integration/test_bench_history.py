"""vigil bench history at a tiny size: the JSON has the documented shape and every cookbook query runs."""

from __future__ import annotations

import json

from streams.cookbook import COOKBOOK
from vigil.bench.history import run


def test_bench_history_tiny(tmp_path):
    out = tmp_path / "history.json"
    result = run(str(out), telemetry_rows=20_000, incidents=2_000, sink_events=2_000, repeats=1)
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(result))
    assert data["insert_rows_per_s"] > 0
    assert set(data["queries"]) == {r.name for r in COOKBOOK}
    assert all(s > 0 for s in data["queries"].values())
    gen = data["detail"]["generated"]
    assert gen["telemetry_rows"] == 20_000 and gen["rows"]["incidents"] == 2_000
    assert data["detail"]["sink"]["stored"] == 2_000
