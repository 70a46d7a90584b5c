"""NIC collector on a fixture tree with the real sysfs layout: values, state, resets, bad files."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vigil.detectors.nic import NicCongestion
from vigil.producers.agent import Agent, NicCollector
from vigil.schemas import NicCounters, Source
from vigil.schemas.events import AgentHealth

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sys" / "class" / "infiniband"
T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
SRC = Source(node="node-1")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "infiniband"
    shutil.copytree(FIXTURE, root)
    return root


def by_dev(events):
    return {(e.device, e.port): e for e in events if isinstance(e, NicCounters)}


def test_reads_every_port_of_every_device(tree):
    events = by_dev(NicCollector(10, SRC, tree).collect(T0))
    assert set(events) == {("mlx5_0", 1), ("mlx5_1", 1)}
    e = events[("mlx5_0", 1)]
    assert e.port_state == "ACTIVE" and events[("mlx5_1", 1)].port_state == "DOWN"
    assert e.counters["np_cnp_sent"] == 4242 and e.counters["port_xmit_wait"] == 123456
    assert e.counters["link_downed"] == 1
    assert e.source.node == "node-1" and e.event_time == T0


def test_counter_reset_is_reported_as_read_and_the_detector_handles_it(tree):
    col = NicCollector(10, SRC, tree)
    det = NicCongestion()
    first = by_dev(col.collect(T0))[("mlx5_0", 1)]
    det.update(first.counters, t=T0.timestamp(), port="mlx5_0:1")
    # driver reload: counters restart from small values
    hw = tree / "mlx5_0" / "ports" / "1" / "hw_counters"
    (hw / "np_cnp_sent").write_text("10\n")
    (hw / "rp_cnp_handled").write_text("7\n")
    t1 = T0 + timedelta(seconds=10)
    second = by_dev(col.collect(t1))[("mlx5_0", 1)]
    assert second.counters["np_cnp_sent"] == 10  # as read: no guessing in the collector
    det.update(second.counters, t=t1.timestamp(), port="mlx5_0:1")
    # a reset is an increase of the new value, never a negative rate
    from vigil.detectors.nic import counter_delta

    assert counter_delta(first.counters["np_cnp_sent"], second.counters["np_cnp_sent"], 64) == (10, "reset")


def test_unreadable_and_garbage_files_are_reported_once_and_the_rest_is_read(tree):
    ctr = tree / "mlx5_0" / "ports" / "1" / "counters"
    (ctr / "port_rcv_errors").write_text("not-a-number\n")
    (ctr / "symbol_error").unlink()
    (ctr / "symbol_error").mkdir()  # reading it fails with IsADirectoryError
    col = NicCollector(10, SRC, tree)
    agent = Agent([col], publisher=None, source=SRC)
    out1 = agent.run_once(col, T0)
    out2 = agent.run_once(col, T0 + timedelta(seconds=10))
    health1 = [e for e in out1 if isinstance(e, AgentHealth)]
    assert {h.problem.rsplit("/", 1)[-1] for h in health1} == {"port_rcv_errors", "symbol_error"}
    assert all(h.status == "failed" and h.collector == "nic" for h in health1)
    assert not [e for e in out2 if isinstance(e, AgentHealth)]  # once, not every interval
    ev = by_dev(out2)[("mlx5_0", 1)]
    assert "port_rcv_errors" not in ev.counters and ev.counters["np_cnp_sent"] == 4242
    # fixed: reported as recovered
    (ctr / "port_rcv_errors").write_text("0\n")
    out3 = agent.run_once(col, T0 + timedelta(seconds=20))
    rec = [e for e in out3 if isinstance(e, AgentHealth)]
    assert [(h.status, h.problem.rsplit("/", 1)[-1]) for h in rec] == [("recovered", "port_rcv_errors")]
    assert rec[0].occurrences == 2


def test_missing_root_is_unavailable_reported_once(tmp_path):
    col = NicCollector(10, SRC, tmp_path / "nope")
    agent = Agent([col], publisher=None, source=SRC)
    first = agent.run_once(col, T0)
    assert [(e.status, e.collector) for e in first] == [("failed", "nic")]
    assert "does not exist" in first[0].detail
    assert agent.run_once(col, T0) == []
