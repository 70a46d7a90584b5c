"""Issue 17's actuator acceptance, on the real broker: `vigil actuate` with the Slurm backend on STUB
scontrol (a shell script that records its argv; no Slurm here).

A decision forged by a client without the key, a decision naming ``ALL`` (after a NodeState for
``ALL``), one naming ``node[1-64]`` (in its plan, and as its target: a message the schema refuses,
refused out loud besides its dead letter), one for a node announced only on the state topic, and a replay
of a signed decision: no backend call for any of them, each refused with the reason on
``<prefix>.actions`` and an alert. On the code before the fix: the forged decision, ``ALL`` and the
state-topic node each ran ``scontrol update``, and nothing raised an alert.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from confluent_kafka import Producer

from vigil.schemas import Decision, NodeState, Source, Subject, encode, message_key
from vigil.schemas.signing import Keyring
from tests.integration.conftest import KEYRING, wait_for
from tests.integration.test_actuate_service import Actuator, Topics


def decision(node: str | None = None, *, action: str = "isolate_node", job: str | None = None,
             plan: dict | None = None, keyring: Keyring | None = KEYRING) -> Decision:
    did = uuid.uuid4()
    d = Decision(event_time=datetime.now(timezone.utc), decision_id=did, idempotency_key=f"k-{did}", action=action,
                 target=Subject(node=node, job=job), reason="acceptance", plan=plan or {})
    return keyring.sign(d) if keyring is not None else d


def test_forged_wildcard_unknown_and_replayed_decisions_run_nothing_and_are_reported(config, tmp_path):
    topic = config.topic("decision")
    producer = Producer(config.kafka_conf())
    topics = Topics(config)
    act = Actuator(config, tmp_path, f"act-{uuid.uuid4().hex[:8]}", "--max-drained-fraction", "1.0")
    try:
        # The state topic announces ALL and gpu-99 (anyone can write it).
        for name in ("ALL", "gpu-99"):
            ns = NodeState(event_time=datetime.now(timezone.utc), source=Source(node=name), state="joined")
            producer.produce(config.topic("node_state"), key=message_key(ns), value=encode(ns))
        real = decision("gpu-07")
        producer.produce(topic, key=b"k", value=encode(real))
        producer.flush(10)
        assert wait_for(lambda: topics.states(real) == ["running", "succeeded"], 60, topics.poll), (
            topics.results, act.log.read_text()[-3000:])
        assert len(act.calls()) == 1

        attacker = Keyring({"integration": b"not-the-engine-key-0123456789abcd"}, signing_key="integration")
        attacks = {
            "forged": decision("gpu-08", keyring=attacker),
            "unsigned": decision("gpu-08", keyring=None),
            "all": decision("ALL"),
            "range": decision(action="reconfigure", job="1234", plan={"exclude_nodes": ["node[1-64]"]}),
            "state-topic node": decision("gpu-99"),
        }
        for d in attacks.values():
            producer.produce(topic, key=b"k", value=encode(d))
        # A range as the target itself: the schema refuses it, so it never becomes a Decision; the raw
        # message, signed by the real key over what it says, must still be refused out loud.
        raw = json.loads(encode(decision("gpu-08")))
        raw |= {"decision_id": str(uuid.uuid4()), "target": {"node": "node[1-64]"}}
        producer.produce(topic, key=b"k", value=json.dumps(raw).encode())
        producer.produce(topic, key=b"k", value=encode(real))  # the replay: the same bytes, again
        producer.flush(10)
        expected = {"forged": "bad signature", "unsigned": "unsigned", "all": "names a set of nodes",
                    "range": "names a set of nodes", "state-topic node": "unknown node 'gpu-99'",
                    "replayed": "replayed", "range target": "not a valid decision"}
        ids = {**{k: str(d.decision_id) for k, d in attacks.items()}, "replayed": str(real.decision_id),
               "range target": raw["decision_id"]}

        def refusal(label: str):
            return [r for r in topics.results if r.state == "failed" and ids[label] in r.detail
                    and expected[label] in r.detail] or [
                r for r in topics.results if r.decision_id == uuid.UUID(ids[label]) and r.state == "failed"
                and expected[label] in r.detail]

        def alerted(label: str):
            return [a for a in topics.alerts if a.kind == "actuator_refused_decision"
                    and a.evidence[0]["decision_id"] == ids[label]]

        assert wait_for(lambda: all(refusal(k) and alerted(k) for k in expected), 60, topics.poll), (
            {k: (bool(refusal(k)), bool(alerted(k))) for k in expected}, topics.results, act.log.read_text()[-3000:])
        assert act.calls() == [["scontrol", "update", "nodename=gpu-07", "state=drain",
                                f"reason=vigil {str(real.decision_id)[:8]}: acceptance"]]
        # The refusals of what is not vigil's are under ids of their own: the decision engine, which
        # reads these results, never takes them for the outcome of one of its decisions.
        for label in ("forged", "unsigned", "replayed", "range target"):
            assert all(r.decision_id != uuid.UUID(ids[label]) for r in refusal(label))
        assert topics.states(real) == ["running", "succeeded"]
    finally:
        act.stop()
        topics.close()
