"""Hang root cause from flight-recorder dumps: real torch dumps of a known fault, and dumps built to the documented format.

``tests/fixtures/flight_recorder/rank*.json|pkl`` are torch's own dumps (gloo,
torch 2.13, made by ``make_dumps.py`` there) of a hang whose cause is known
by construction: rank 3 never entered collective 3 of the pair group [2, 3];
rank 2 waits in it, and ranks 0 and 1 wait in world collective 5 for both.
The other cases are dumps written by hand in torch's format (NCCL states,
which gloo does not record).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from vigil.detectors import REGISTRY
from vigil.detectors.base import DetectorError
from vigil.detectors.flight_recorder import FlightRecorderAnalyzer, analyze_dumps, dump_record
from vigil.producers.training.flight_recorder import fit_payload, normalize, read_dump_file, unavailable
from vigil.producers.training.wire import records_to_events
from vigil.schemas.events import FlightRecorderDump

FIX = Path(__file__).parents[1] / "fixtures" / "flight_recorder"


def real(rank: int, suffix: str = "json") -> dict:
    groups = json.loads((FIX / f"rank{rank}.groups.json").read_text())
    payload = normalize(read_dump_file(FIX / f"rank{rank}.{suffix}"), trigger="hang", backend="gloo", groups=groups)
    return dict(payload, rank=rank, node=f"node{rank // 2}")


@pytest.mark.parametrize("suffix", ["json", "pkl"])
def test_real_torch_dumps_name_the_rank_that_never_entered_the_pair_collective(suffix):
    dumps = [real(r, suffix) for r in range(4)]
    assert all(d["available"] and d["format_version"] for d in dumps)
    a = analyze_dumps(dumps, now=2.0e9)
    assert a.verdict == "missing"
    assert (a.group, a.seq, a.op) == ("2", 3, "gloo:all_reduce")
    assert a.culprit_ranks == (3,) and a.waiting_ranks == (2,)
    # the chain explains the world collective ranks 0 and 1 wait in
    assert [(c["group"], c["seq"], c["culprit_ranks"]) for c in a.chain] == [("0", 5, [2, 3]), ("2", 3, [3])]


def test_real_gloo_dump_has_no_pg_config_so_groups_come_from_torch_distributed():
    raw = read_dump_file(FIX / "rank0.json")
    assert not any(json.loads(v["ranks"]) for v in raw["pg_config"].values())  # gloo leaves it empty
    p = normalize(raw, trigger="hang")
    assert all(g["ranks"] == [] for g in p["groups"])
    p = real(0)
    assert {g["name"]: g["ranks"] for g in p["groups"]} == {"0": [0, 1, 2, 3], "1": [0, 1]}
    assert {g["name"]: (g["last_enqueued"], g["last_completed"]) for g in p["groups"]} == {"0": (5, 4), "1": (3, 3)}


def test_dump_files_are_read_without_executing_anything(tmp_path):
    evil = tmp_path / "nccl_trace_rank_0"
    evil.write_bytes(pickle.dumps({"entries": [], "x": Path("/etc/passwd")}))  # names pathlib.PosixPath
    with pytest.raises(ValueError, match="not a flight-recorder dump"):
        read_dump_file(evil)
    (tmp_path / "junk").write_bytes(b"\x00\x01junk")
    with pytest.raises(ValueError):
        read_dump_file(tmp_path / "junk")


def test_payload_goes_through_the_hooks_wire_as_an_event_and_back():
    p = fit_payload(real(1), lambda q: len(json.dumps(q)) < 1500)  # a datagram limit: fewer entries per group
    assert p["entries"] and len(json.dumps(p)) < 1500 and p["entries_total"] > len(p["entries"])
    src = {"cluster": "c", "node": "node0", "job": "j", "rank": 1, "gpu": None}
    rec = {k: v for k, v in p.items() if k not in ("rank", "node")}
    (ev,), errors = records_to_events(src, [["fr", 1.7e9, rec]])
    assert not errors and isinstance(ev, FlightRecorderDump)
    d = dump_record(ev)
    assert d["rank"] == 1 and d["node"] == "node0" and d["groups"] == p["groups"]


# --- dumps written by hand in torch's format (NCCL: entries carry states) ---------------------

def nccl_dump(rank, world, issued, done, states=None, group="0", t0=1000.0):
    states = states or {}
    entries = [{"group": group, "seq": s, "p2p_seq": 0, "is_p2p": False, "op": "nccl:all_reduce",
                "state": "completed" if s <= done else states.get(s, "started"), "retired": s <= done,
                "created_ns": int((t0 + s + 0.01 * rank) * 1e9),
                "started_ns": int((t0 + s + 0.02 * rank) * 1e9) if states.get(s, "started") != "scheduled" else None,
                "completed_ns": None}
               for s in range(1, issued + 1)]
    return {"rank": rank, "node": f"n{rank}", "available": True, "entries": entries,
            "groups": [{"name": group, "desc": "default_pg", "ranks": list(range(world)), "last_enqueued": issued,
                        "last_started": None, "last_completed": done}]}


def test_a_rank_that_issued_but_never_started_the_collective_is_named():
    dumps = [nccl_dump(r, 4, 9, 8, states={9: "scheduled" if r == 1 else "started"}) for r in range(4)]
    a = analyze_dumps(dumps, now=1020.0)
    assert (a.verdict, a.seq, a.culprit_ranks) == ("not_started", 9, (1,))


def test_every_rank_in_the_collective_names_the_one_stuck_longest():
    dumps = [nccl_dump(r, 4, 9, 8) for r in range(4)]
    a = analyze_dumps(dumps, now=1020.0)
    assert (a.verdict, a.seq, a.culprit_ranks) == ("stuck_longest", 9, (0,))  # it started first (t0 + 9 + 0)
    assert a.stuck_s == pytest.approx(1020.0 - 1009.0, abs=1e-6)


def test_a_rank_that_sent_no_dump_while_all_others_wait_is_named():
    dumps = [nccl_dump(r, 4, 9, 8) for r in (0, 1, 3)]
    a = analyze_dumps(dumps, now=1020.0)
    assert (a.verdict, a.culprit_ranks, a.no_dump_ranks) == ("no_dump", (2,), (2,))


def test_no_pending_collective_is_no_mismatch_and_no_recorder_is_said():
    assert analyze_dumps([nccl_dump(r, 2, 5, 5) for r in range(2)], now=1.0).verdict == "no_mismatch"
    off = [dict(unavailable("torch 2.1 has no flight-recorder dump API", "hang", "gloo"), rank=r) for r in range(2)]
    a = analyze_dumps(off, now=1.0)
    assert a.verdict == "unavailable" and a.evidence["unavailable"]["0"].startswith("torch 2.1")


def test_a_cross_group_ordering_deadlock_is_reported_as_a_cycle():
    # rank 0 waits in group A for rank 1; rank 1 waits in group B for rank 0
    a_dump = {"rank": 0, "groups": [{"name": "A", "ranks": [0, 1]}, {"name": "B", "ranks": [0, 1]}],
              "entries": [{"group": "A", "seq": 1, "op": "nccl:all_reduce", "state": "started", "created_ns": 10}]}
    b_dump = {"rank": 1, "groups": [{"name": "A", "ranks": [0, 1]}, {"name": "B", "ranks": [0, 1]}],
              "entries": [{"group": "B", "seq": 1, "op": "nccl:all_gather", "state": "started", "created_ns": 20}]}
    a = analyze_dumps([a_dump, b_dump], now=1.0)
    assert a.evidence["cycle"] is True and a.verdict == "missing" and a.group == "A" and a.culprit_ranks == (1,)


def test_bad_input_is_refused_with_the_field():
    with pytest.raises(DetectorError, match="rank"):
        analyze_dumps([{"rank": -1}], now=0.0)
    with pytest.raises(DetectorError, match="entries"):
        analyze_dumps([{"rank": 0, "entries": "x"}], now=0.0)


# --- the detector: rounds of dumps, timers ---------------------------------------------------------

def test_detector_is_registered_and_waits_for_all_members_or_settle_s():
    assert REGISTRY["flight_recorder"] is FlightRecorderAnalyzer
    det = FlightRecorderAnalyzer(settle_s=10.0)
    for r in (0, 1, 3):
        det.update(nccl_dump(r, 4, 9, 8), t=100.0 + r)
    assert det.finding is None and det.attribution is None
    det.tick(105.0)
    assert det.finding is None
    det.tick(110.0)  # settle_s after the first dump: analyse what is there
    f = det.finding
    assert f.kind == "collective_stuck" and f.severity == 2
    assert f.evidence["verdict"] == "no_dump" and f.evidence["rank"] == 2 and f.evidence["node"] is None
    assert f.onset == pytest.approx(1009.0)  # when the first rank entered the stuck collective
    det.update(nccl_dump(2, 4, 8, 8), t=112.0)  # rank 2's dump arrives late: analysed again
    f = det.finding
    assert f.evidence["verdict"] == "missing" and f.evidence["rank"] == 2 and f.evidence["node"] == "n2"
    assert "rank(s) 2 never entered collective 9" in f.evidence["summary"]


def test_detector_reports_an_unavailable_recorder_as_its_own_kind():
    det = FlightRecorderAnalyzer(settle_s=5.0)
    det.update(dict(unavailable("the flight recorder holds no entries", "hang", "gloo"), rank=0), t=1.0)
    det.tick(7.0)
    assert det.finding.kind == "flight_recorder_unavailable"
