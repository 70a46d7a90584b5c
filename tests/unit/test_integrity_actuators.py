"""Issue 17, actuators without a broker: decisions from vigil only, targets from the operator only.

The backend is a real command backend whose one command appends to a file, so "nothing ran" is
counted on disk. On the code before the fix these failed: unsigned and forged decisions ran, a
NodeState for ``ALL`` made ``isolate_node ALL`` run (counted as one node), ``node-07\\n`` passed
the name check, a replayed decision was only re-acknowledged. (Keyring, inventory sources and
host-range expansion did not exist.)
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vigil.actuators.backends.base import CommandBackend
from vigil.actuators.errors import PlanError
from vigil.actuators.executor import REFUSED_ALERT_KIND, Executor
from vigil.actuators.inventory import Inventory, KubernetesSource, SlurmSource, expand_hostlist
from vigil.actuators.ledger import Ledger
from vigil.actuators.plans import Action, check_name
from vigil.actuators.safety import Safety, SafetyLimits
from vigil.schemas import ActionResult, Alert, Decision, NodeState, Source, Subject, decode, encode, to_seconds
from vigil.schemas.signing import Keyring, canonical

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
KEY = b"engine-key-0123456789abcdef012345"
ENGINE = Keyring({"k2026": KEY}, signing_key="k2026")
ACTUATOR = Keyring({"k2026": KEY})  # verifies only


class Recording(CommandBackend):
    name = "recording"
    supports = frozenset({"isolate_node", "restart_process", "reconfigure"})

    def __init__(self, log: Path) -> None:
        super().__init__(30)
        self.log = log

    def commands(self, action: Action):
        return [[sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')", str(self.log),
                 f"{action.action} {action.job or action.node} {','.join(action.drains)}"]], []

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def make(tmp_path):
    ledgers = []

    def executor(nodes=("n1", "n2", "n3"), jobs=("j1",), keyring=ACTUATOR, inventory=None, limits=None) -> Executor:
        ledger = Ledger(tmp_path / f"ledger-{len(ledgers)}.sqlite", now=to_seconds(T0))
        ledgers.append(ledger)
        return Executor(Recording(tmp_path / "ran.log"), ledger, inventory or Inventory(nodes, jobs),
                        Safety(limits or SafetyLimits(max_drained_fraction=1.0)), keyring=keyring,
                        source=Source(cluster="c", node="act"))

    yield executor
    for ledger in ledgers:
        ledger.close()


def decision(action="isolate_node", *, node=None, job=None, plan=None, at=T0, sign=ENGINE, did=None) -> Decision:
    did = did or uuid.uuid4()
    d = Decision(event_time=at, decision_id=did, idempotency_key=f"k-{did}", action=action,
                 target=Subject.model_construct(node=node, job=job), reason="test", plan=plan or {})
    return sign.sign(d) if sign is not None else d


def split(out):
    return [e for e in out if isinstance(e, ActionResult)], [e for e in out if isinstance(e, Alert)]


def test_a_signed_decision_acts_once(make):
    ex = make()
    d = decision(node="n1")
    results, alerts = split(ex.handle(d, T0, origin="t/0/1"))
    assert [r.state for r in results] == ["running", "succeeded"] and not alerts
    assert ex.backend.lines() == ["isolate_node n1 n1"]


@pytest.mark.parametrize("forge, why", [
    (lambda d: d, "unsigned"),
    (lambda d: Keyring({"k2026": b"attacker-key-0123456789abcdefgh"}, signing_key="k2026").sign(d), "bad signature"),
    (lambda d: Keyring({"other": KEY}, signing_key="other").sign(d), "unknown key id 'other'"),
    (lambda d: ENGINE.sign(d).model_copy(update={"target": Subject(node="n2")}), "bad signature"),
    (lambda d: d.model_copy(update={"signature": "v1:k2026:" + "A" * 43}), "bad signature"),
])
def test_a_decision_not_signed_by_the_engine_is_refused_reported_and_never_recorded(make, forge, why):
    ex = make()
    d = forge(decision(node="n1", sign=None))
    results, alerts = split(ex.handle(d, T0, origin="t/0/1"))
    (result,) = results
    assert result.state == "failed" and why in result.detail and str(d.decision_id) in result.detail
    # Its own id: the decision engine never takes it for the outcome of a decision of its own.
    assert result.decision_id != d.decision_id
    (alert,) = alerts
    assert alert.kind == REFUSED_ALERT_KIND and alert.severity == 2 and "unauthenticated" in alert.summary
    assert ex.backend.lines() == [] and ex.ledger.count() == 0


def test_a_forged_copy_of_a_real_decision_does_not_block_it(make):
    ex = make()
    real = decision(node="n1")
    forged = real.model_copy(update={"signature": None, "target": Subject(node="n2")})
    ex.handle(forged, T0, origin="t/1/5")
    results, _ = split(ex.handle(real, T0, origin="t/0/7"))
    assert [r.state for r in results] == ["running", "succeeded"] and ex.backend.lines() == ["isolate_node n1 n1"]


def test_a_replayed_signed_decision_is_refused_a_redelivered_one_is_acknowledged(make):
    ex = make()
    d = decision(node="n1")
    ex.handle(d, T0, origin="t/0/1")
    # Redelivered from the same place (a consumer restart): the recorded result again, no alert.
    again, alerts = split(ex.handle(d, T0, origin="t/0/1"))
    assert [r.state for r in again] == ["succeeded"] and again[0].decision_id == d.decision_id and not alerts
    # The same bytes published again (another offset): a replay.
    replayed, alerts = split(ex.handle(decode(encode(d)).events[0], T0 + timedelta(seconds=5), origin="t/0/9"))
    (r,) = replayed
    assert r.state == "failed" and "replayed" in r.detail and "t/0/1" in r.detail and r.decision_id != d.decision_id
    assert [a.kind for a in alerts] == [REFUSED_ALERT_KIND]
    assert ex.backend.lines() == ["isolate_node n1 n1"]


def test_keys_rotate_by_id(make):
    old = Keyring({"old": b"old-key-0123456789abcdef0123456789"}, signing_key="old")
    new = Keyring({"new": b"new-key-0123456789abcdef0123456789"}, signing_key="new")
    both = Keyring({**old.keys, **new.keys})
    ex = make(keyring=both)
    assert split(ex.handle(decision(node="n1", sign=old), T0))[0][-1].state == "succeeded"
    assert split(ex.handle(decision(node="n2", sign=new), T0))[0][-1].state == "succeeded"
    retired = make(keyring=Keyring(new.keys))
    (r,), _ = split(retired.handle(decision(node="n3", sign=old), T0))
    assert "unknown key id 'old'" in r.detail


def test_the_signature_covers_what_is_acted_on_and_survives_the_wire():
    d = decision(action="reconfigure", job="j1", plan={"exclude_nodes": ["n1"], "workers": 3, "x": 1.5})
    back = decode(encode(d)).events[0]
    assert back.signature == d.signature and ACTUATOR.check(back) is None
    assert canonical(back) == canonical(d)
    for field, value in (("plan", {"exclude_nodes": ["n2"], "workers": 3, "x": 1.5}), ("event_time", T0 + timedelta(hours=1)),
                         ("action", "restart_process"), ("idempotency_key", "other")):
        assert ACTUATOR.check(back.model_copy(update={field: value})) is not None, field


def test_unsigned_decisions_are_taken_only_when_the_operator_says_so(make):
    ex = make(keyring=Keyring(allow_unsigned=True))
    assert split(ex.handle(decision(node="n1", sign=None), T0))[0][-1].state == "succeeded"
    # ...but a signature that is there must be right
    (r,), _ = split(ex.handle(decision(node="n2", sign=Keyring({"x": KEY}, signing_key="x")), T0))
    assert r.state == "failed"


@pytest.mark.parametrize("d, why", [
    (decision(node="ALL"), "names a set of nodes"),
    (decision(node="all"), "names a set of nodes"),
    (decision(action="reconfigure", job="j1", plan={"exclude_nodes": ["node[1-64]"]}), "names a set of nodes"),
    (decision(action="reconfigure", job="j1", plan={"exclude_nodes": ["n1,n2"]}), "names a set of nodes"),
    (decision(node="n1\n"), "not a valid name"),
    (decision(node="n9"), "unknown node 'n9'"),
    (decision(node="n1", at=T0 + timedelta(hours=2)), "ahead of this actuator's clock"),
])
def test_targets_that_are_sets_unknown_or_odd_are_refused_with_an_alert(make, d, why):
    ex = make(nodes=("n1", "n2", "n3"))
    results, alerts = split(ex.handle(d, T0, origin="t/0/3"))
    (r,) = results
    assert r.state == "failed" and why in r.detail, r.detail
    assert [a.kind for a in alerts] == [REFUSED_ALERT_KIND] and ex.backend.lines() == []


def test_an_inventory_cannot_list_all():
    with pytest.raises(PlanError, match="names a set of nodes"):
        Inventory(nodes=["n1", "ALL"])


def test_a_node_announced_on_the_state_topic_is_not_a_target(make):
    ex = make(nodes=("n1",))
    for name in ("n9", "ALL"):
        assert ex.observe(NodeState(event_time=T0, source=Source(node=name), state="joined"))
    assert ex.inventory.nodes == {"n1"}
    (r,), (alert,) = split(ex.handle(decision(node="n9"), T0))
    assert "unknown node 'n9'" in r.detail and alert.kind == REFUSED_ALERT_KIND and ex.backend.lines() == []


def test_names_are_matched_whole():
    for bad in ("node-07\n", "node-07\nx", "ALL", "node[1-64]", "a,b", "n*"):
        with pytest.raises(PlanError):
            check_name(bad, "target.node")
    assert check_name("node-07", "target.node") == "node-07"


def test_host_ranges_in_the_operators_inventory_are_expanded_and_each_node_counts(make, tmp_path):
    assert expand_hostlist("gpu-[01-03,07],login1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "login1"]
    inv_file = tmp_path / "inv.json"
    inv_file.write_text(json.dumps({"nodes": ["gpu-[01-20]"], "jobs": {"j1": ["gpu-[01-04]"]}}))
    inv = Inventory.load(inv_file)
    assert len(inv.nodes) == 20 and inv.job_nodes["j1"] == ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
    # The breaker counts every node: 10 % of 20 known nodes is 2.
    ex = make(inventory=inv, limits=SafetyLimits(max_drained_nodes=10, max_drained_fraction=0.10))
    plan = {"exclude_nodes": ["gpu-01", "gpu-02", "gpu-03"]}
    (r,), (alert,) = split(ex.handle(decision(action="reconfigure", job="j1", plan=plan), T0))
    assert "blast radius" in r.detail and alert.kind == "actuator_circuit_open"
    with pytest.raises(ValueError, match="set of nodes|not a valid name"):
        inv_file.write_text(json.dumps({"nodes": ["ALL"]}))
        Inventory.load(inv_file)


STUB = """#!/bin/sh
# STUB {name} (tests only): prints a canned answer.
cat "{answer}"
"""


def stub(tmp_path: Path, name: str, answer: str) -> str:
    (tmp_path / f"{name}.out").write_text(answer)
    path = tmp_path / name
    path.write_text(STUB.format(name=name, answer=tmp_path / f"{name}.out"))
    path.chmod(0o755)
    return str(path)


def test_inventory_from_stub_scontrol_and_squeue(tmp_path, make):
    scontrol = stub(tmp_path, "scontrol", "NodeName=gpu-01 Arch=x86_64 State=IDLE\nNodeName=gpu-02 State=MIXED\n"
                                         "NodeName=bad;name State=IDLE\n")
    squeue = stub(tmp_path, "squeue", "1234\n1235\n")
    inv = Inventory(source=SlurmSource(scontrol=scontrol, squeue=squeue), refresh_s=60)
    inv.refresh(0.0)
    assert inv.nodes == {"gpu-01", "gpu-02"} and inv.jobs == {"1234", "1235"}
    ex = make(inventory=inv)
    assert split(ex.handle(decision(node="gpu-02"), T0))[0][-1].state == "succeeded"


def test_inventory_from_a_stub_kubernetes_api(tmp_path):
    nodes = {"items": [{"metadata": {"name": "k8s-gpu-1"}}, {"metadata": {"name": "k8s-gpu-2"}}]}
    pods = {"items": [{"metadata": {"labels": {"job-name": "train-a"}}}, {"metadata": {"labels": {"job-name": "train-a"}}}]}
    script = tmp_path / "kubectl"
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    script.write_text(f'#!/bin/sh\n# STUB kubectl (tests only): the API\'s answers from files.\n'
                      f'case "$2" in nodes) cat "{tmp_path}/nodes.json";; pods) cat "{tmp_path}/pods.json";; esac\n')
    script.chmod(0o755)
    inv = Inventory(source=KubernetesSource(kubectl=str(script)))
    inv.refresh(0.0)
    assert inv.nodes == {"k8s-gpu-1", "k8s-gpu-2"} and inv.jobs == {"train-a"}


def test_a_source_that_fails_keeps_its_last_answer(tmp_path):
    calls = []

    def source():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("scontrol: slurmctld not responding")
        return {"n1"}, {"j1"}

    inv = Inventory(source=source, refresh_s=10)
    inv.refresh(0.0)
    inv.refresh(5.0)  # not due
    inv.refresh(20.0)
    assert len(calls) == 2 and inv.nodes == {"n1"} and "not responding" in inv.last_error


def test_a_flood_of_refusals_raises_a_bounded_number_of_alerts(make):
    ex = make()
    alerts = []
    for _ in range(50):
        alerts += split(ex.handle(decision(node="n1", sign=None), T0))[1]
    assert len(alerts) == 10
    later = split(ex.handle(decision(node="n1", sign=None), T0 + timedelta(seconds=61)))[1]
    assert len(later) == 1 and later[0].evidence_count == 41 and "40 more" in later[0].summary


@pytest.mark.parametrize("raw", [
    None,  # a signed decision whose target is a range (the schema refuses the name)
    b'{"event_type": "decision", "action": "isolate_node", "target": {"node": "ALL\\n"}}',
    b"\xff not json",
    b'[1, 2]',
])
def test_a_message_on_the_decisions_topic_that_is_no_decision_is_refused_with_a_result_and_an_alert(make, raw):
    ex = make()
    did = uuid.uuid4()
    if raw is None:
        body = json.loads(encode(decision(node="n1", did=did)))
        body["target"] = {"node": "node[1-64]"}
        raw = json.dumps(body).encode()
    decoded = decode(raw, ["decision"])
    assert decoded.errors and not decoded.events  # it never becomes a Decision
    out = ex.undecodable(raw, f"{decoded.errors[0].reason}: {decoded.errors[0].detail}", T0, "d/0/7")
    results, alerts = split(out)
    [result] = results
    assert result.state == "failed" and "not a valid decision" in result.detail
    assert result.decision_id != did  # an id of its own: never the outcome of a decision the engine made
    [alert] = alerts
    assert alert.kind == REFUSED_ALERT_KIND and alert.severity == 2 and alert.evidence[0]["refusal"] == "undecodable"
    if b"node[1-64]" in raw:
        assert alert.evidence[0]["decision_id"] == str(did) and str(did) in result.detail
    assert not (ex.backend.log.exists())  # nothing ran
    # the same message again (a redelivery) gives the same events, so downstream keeps one of each
    assert [e.event_id for e in ex.undecodable(raw, "again", T0, "d/0/7")][:1] == [result.event_id]
