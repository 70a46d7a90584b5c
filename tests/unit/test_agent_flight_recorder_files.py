"""The agent publishes the dump files torch writes when a NCCL collective times out (real files, torch's format).

The files are torch's own dumps of a known hang (``tests/fixtures/flight_recorder``,
gloo, torch 2.13; JSON and the on-timeout pickle) copied where torch would
write them (``<prefix><global rank>``). No NCCL here: the writing is the test's.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from vigil.detectors.flight_recorder import FlightRecorderAnalyzer, dump_record
from vigil.producers.agent import FlightRecorderFileCollector
from vigil.producers.agent.runner import Agent
from vigil.schemas import Source
from vigil.schemas.events import AgentHealth, FlightRecorderDump

FIX = Path(__file__).parents[1] / "fixtures" / "flight_recorder"
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SRC = Source(cluster="c", node="node1", job="train")


def write(prefix: Path, rank: int, suffix: str = "pkl", mtime: float | None = None) -> Path:
    path = Path(f"{prefix}{rank}")
    shutil.copyfile(FIX / f"rank{rank}.{suffix}", path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_each_new_dump_file_is_published_once_with_its_rank_and_time(tmp_path):
    prefix = tmp_path / "nccl_trace_rank_"
    write(prefix, 0, mtime=1.6e9)  # an earlier run's file: there before the agent looked
    c = FlightRecorderFileCollector(1.0, SRC, lambda: [0, 1, 2, 3], prefix=str(prefix))
    assert c.collect(NOW) == []
    write(prefix, 2, "pkl", mtime=1.7e9)
    write(prefix, 3, "json", mtime=1.7e9 + 1)
    shutil.copyfile(FIX / "rank1.pkl", f"{prefix}9")  # another job's rank on this node: not ours
    out = c.collect(NOW)
    assert sorted((e.source.rank, e.trigger, e.source.job, e.source.node) for e in out) == \
        [(2, "timeout_file", "train", "node1"), (3, "timeout_file", "train", "node1")]
    assert all(isinstance(e, FlightRecorderDump) and e.available for e in out)
    assert {e.source.rank: e.event_time.timestamp() for e in out} == {2: 1.7e9, 3: 1.7e9 + 1}
    assert c.collect(NOW) == []  # each file once
    write(prefix, 0, "json", mtime=1.8e9)  # torch wrote rank 0's again (a later timeout): a new version
    (again,) = c.collect(NOW)
    assert again.source.rank == 0 and again.event_time.timestamp() == 1.8e9


def test_the_files_name_the_culprit_through_the_detector(tmp_path):
    prefix = tmp_path / "fr_"
    c = FlightRecorderFileCollector(1.0, SRC, lambda: [0, 1, 2, 3], prefix=str(prefix))
    c.collect(NOW)
    for r in range(4):
        write(prefix, r, "pkl", mtime=1.7e9 + r)
    events = c.collect(NOW)
    det = FlightRecorderAnalyzer(settle_s=30.0)
    for e in events:
        det.update(dump_record(e), t=e.event_time.timestamp())
    det.tick(1.7e9 + 40)  # torch's gloo dumps name no group members: the round closes at settle_s
    # the fixture's known cause: rank 3 never entered collective 3 of the pair group [2, 3]
    f = det.finding
    assert f.kind == "collective_stuck" and f.evidence["verdict"] == "missing"
    assert f.evidence["culprit_ranks"] == [3] and f.evidence["seq"] == 3


def test_a_file_caught_half_written_is_read_again_and_a_broken_one_reported_once(tmp_path):
    prefix = tmp_path / "fr_"
    c = FlightRecorderFileCollector(1.0, SRC, lambda: [1], prefix=str(prefix))
    agent = Agent([c], publisher=None, source=SRC)
    assert agent.run_once(c, NOW) == []
    whole = (FIX / "rank1.pkl").read_bytes()
    Path(f"{prefix}1").write_bytes(whole[: len(whole) // 2])  # torch is still writing it
    assert agent.run_once(c, NOW) == []
    Path(f"{prefix}1").write_bytes(whole)  # done
    (ev,) = agent.run_once(c, NOW)
    assert isinstance(ev, FlightRecorderDump) and ev.source.rank == 1
    Path(f"{prefix}1").write_bytes(b"\x80\x04not a pickle at all")
    assert agent.run_once(c, NOW) == []  # may still be being written
    (health,) = agent.run_once(c, NOW)  # unchanged and unreadable: said, never published
    assert isinstance(health, AgentHealth) and health.status == "failed" and "not a flight-recorder dump" in health.detail
    assert agent.run_once(c, NOW) == []  # said once while it lasts
    Path(f"{prefix}1").unlink()
    (back,) = agent.run_once(c, NOW)
    assert back.status == "recovered"
