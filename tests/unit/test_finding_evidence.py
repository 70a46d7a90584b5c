"""What correlation reads of a finding's evidence is typed, checked once when the finding is made or
decoded, and the wire format is the one stored history already holds."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from vigil.schemas import DetectorFinding, Subject, decode, encode
from vigil.schemas.evidence import FindingEvidence, NodesSilentEvidence, SilenceEvidence, XidEvidence
from vigil.streams.engine.detection import detector_finding
from vigil.streams.engine.incidents import Correlator

# A node_lost finding as the worker wrote it before the evidence was typed (the history holds such rows).
STORED = (b'{"event_id":"8f5b3c1e-4a57-5f7e-9a53-0e3c1c2d9a10","version":1,"event_time":"2026-01-01T00:00:03Z",'
          b'"source":{"cluster":"c"},"event_type":"finding","status":"raised","kind":"node_lost","severity":1,'
          b'"subject":{"node":"n1"},"onset_time":"2026-01-01T00:00:00Z","detector":"heartbeat_loss",'
          b'"detector_version":"1","job_nodes":[],"affected_jobs":["gpt"],'
          b'"evidence":{"silence_s":3.1,"interval_s":1.0,"missed_intervals":2.5,"silent_peers":["n2","n3"]}}')


def lost(node: str, onset: float, **evidence) -> DetectorFinding:
    return detector_finding("raised", "node_lost", 1, Subject(node=node), onset, "heartbeat_loss", "1", evidence, "c",
                            [], onset + 3.0, [], None)


def test_stored_history_decodes_to_the_typed_view_and_encodes_back_the_same():
    decoded = decode(STORED)
    assert decoded.errors == []
    f = decoded.events[0]
    assert isinstance(f.facts, SilenceEvidence)
    assert (f.facts.silence_s, f.facts.silent_peers) == (3.1, ["n2", "n3"])
    # keys no view names are kept as they came
    assert json.loads(encode(f))["evidence"] == json.loads(STORED)["evidence"]


@pytest.mark.parametrize("evidence,where", [
    ({"silent_peers": 5}, "evidence.silent_peers"),
    ({"silent_peers": ["n2", "bad name\n"]}, "evidence.silent_peers.1"),
    ({"silence_s": "3.1"}, "evidence.silence_s"),  # no text becomes a number, as everywhere in the decoder
    ({"quiet_nodes": 5}, "evidence.quiet_nodes"),
    ({"quiet_nodes": ["n1", "bad name\n"]}, "evidence.quiet_nodes.1"),
])
def test_a_forged_finding_whose_evidence_breaks_its_kind_is_refused_at_decode(evidence, where):
    raw = json.loads(STORED)
    raw["evidence"] = evidence
    decoded = decode(json.dumps(raw).encode())
    assert decoded.events == []
    assert decoded.errors[0].reason == "invalid" and where in decoded.errors[0].detail


def test_a_detector_cannot_make_a_finding_its_kind_cannot_read():
    with pytest.raises(ValidationError, match="evidence.code of a xid finding"):
        detector_finding("raised", "xid", 1, Subject(node="n1"), 0.0, "xid", "1", {"code": "79"}, "c", [], 1.0,
                         [], None)


def test_kinds_without_a_view_keep_free_evidence():
    f = detector_finding("raised", "throttle", 2, Subject(node="n1", gpu=0), 0.0, "gpu", "1",
                         {"silent_peers": "anything", "sm_clock_mhz": 900}, "c", [], 1.0, [], None)
    assert f.facts == FindingEvidence()


def test_a_copy_with_another_kind_gets_its_own_view():
    f = lost("n1", 100.0, silence_s=3.0)
    copy = f.model_copy(update={"kind": "nodes_silent", "evidence": {"nodes": ["n1", "n2"]}})
    assert isinstance(copy.facts, NodesSilentEvidence) and copy.facts.nodes == ["n1", "n2"]
    assert isinstance(f.facts, SilenceEvidence)
    assert isinstance(f.model_copy(update={"severity": 2}).facts, SilenceEvidence)


def test_a_node_lost_naming_silent_peers_is_held_back_one_alone_opens_at_once():
    c = Correlator(silence_group=3, silence_hold_s=1.5)
    assert c.on_finding(lost("n1", 100.0, silence_s=3.0, silent_peers=["n2", "n3"]), 103.0) == []
    assert [(a.kind, a.status) for a in c.tick(104.6)] == [("node_lost", "open")]  # no peer was lost after all
    alone = c.on_finding(lost("n9", 200.0, silence_s=3.0, silent_peers=["n2"]), 203.0)  # 1 peer + itself < 3
    assert [(a.kind, a.status, a.subject.node) for a in alone] == [("node_lost", "open", "n9")]
    assert "no heartbeat for 3.0 s" in alone[0].summary


def test_summaries_read_the_typed_view():
    c = Correlator()
    xid = detector_finding("raised", "xid", 1, Subject(node="n1", gpu=3), 0.0, "xid", "1",
                           {"code": 79, "mnemonic": "GPU_FELL_OFF_BUS", "action": "drain", "gpu": "3"}, "c", [], 1.0,
                           [], None)
    assert isinstance(xid.facts, XidEvidence)
    assert c.on_finding(xid, 1.0)[0].summary == "xid node=n1 gpu=3: XID 79 GPU_FELL_OFF_BUS -> drain"
    hang = detector_finding("raised", "task_hang", 2, Subject(job="gpt"), 0.0, "hang", "2",
                            {"silence_s": 2.5, "timeout_s": None}, "c", [], 3.0, [], None)  # a NaN timeout: null
    assert c.on_finding(hang, 3.0)[0].summary == "task_hang job=gpt: no iteration for 2.5 s (timeout 0.00 s)"
