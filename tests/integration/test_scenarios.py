"""The lifecycle scenarios that run on every `make test`: the real agent, gloo ranks and worker.

Each scenario judges itself against the ground truth it created (what it did
to the processes, the spec of its job, the ranks' own files). Here every
required observation must hold and nothing may page; how *fast* each came is
the benchmark's business (`vigil bench scenarios`), so a latency requirement
counts here only as "it came".
"""

from __future__ import annotations

import pytest

from vigil.bench.scenarios import FAST, run_scenario


@pytest.mark.parametrize("name", FAST)
def test_scenario(name, kafka_bootstrap, tmp_path):
    result = run_scenario(name, kafka_bootstrap, tmp_path)
    observed = result["observed"]
    assert "error" not in observed, (observed.get("trace"), observed.get("logs"))
    assert result["false_pages"] == 0, observed["pages"] + observed["decisions"]
    for requirement, ok in observed["requirements"].items():
        if requirement.endswith("_in_time"):
            assert observed.get(requirement) is not None, (requirement, observed.get("timeline"))
        else:
            assert ok, (requirement, observed.get(requirement), observed.get("timeline"), observed.get("logs"))
