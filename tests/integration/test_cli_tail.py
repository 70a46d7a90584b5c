"""`vigil tail alerts|decisions|actions|all` against a real broker: records the test published, filtered by
severity and job (a decision's and an action's known through the incidents they answer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from confluent_kafka import Producer

from vigil.schemas import ActionResult, Alert, Decision, Source, Subject, encode, from_seconds, message_key, \
    topic_name

NOW = from_seconds(__import__("time").time())


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def _alert(n: int, severity: int, kind: str, node: str, job: str, t: float) -> Alert:
    return Alert(event_time=at(t), incident_id=uuid.UUID(int=n), incident_version=1, status="open",
                 severity=severity, kind=kind, subject=Subject(node=node), onset_time=at(t - 1),
                 detection_time=at(t), detector="test", detector_version="1", source=Source(node=node),
                 jobs={job: [node]})


def _decision(n: int, action: str, job: str | None, answers: list[int], t: float) -> Decision:
    return Decision(event_time=at(t), decision_id=uuid.UUID(int=n), idempotency_key=f"k{n}", action=action,  # type: ignore[arg-type]
                    target=Subject(job=job), reason="test", answers=[uuid.UUID(int=a) for a in answers])


def _result(n: int, decision: int, state: str, t: float) -> ActionResult:
    return ActionResult(event_id=uuid.UUID(int=1000 + n), event_time=at(t), decision_id=uuid.UUID(int=decision),
                        state=state, backend="dry-run")  # type: ignore[arg-type]


# Ground truth: incident 1 (sev1) hits job "train-a"; incident 2 (sev3) hits "train-b"; decision 11
# answers 1 for train-a, 12 answers 2 for train-b, 13 is a re-plan about no job; results 21, 22.
RECORDS = [
    _alert(1, 1, "node_lost", "n1", "train-a", 1.0),
    _alert(2, 3, "xid", "n2", "train-b", 2.0),
    _decision(11, "reconfigure", "train-a", [1], 3.0),
    _decision(12, "retry_in_place", "train-b", [2], 4.0),
    _decision(13, "replan", None, [], 5.0),
    _result(21, 11, "succeeded", 6.0),
    _result(22, 12, "running", 7.0),
]


def _publish(config, events) -> None:
    producer = Producer(config.kafka_conf())
    for e in events:
        producer.produce(topic_name(e.event_type, config.topic_prefix), key=message_key(e), value=encode(e))
    producer.flush(30)


@pytest.fixture
def env(config, tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    e.update(VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
             VIGIL_STATE_DIR=str(tmp_path / "state"))
    return e


def tail(env, *args, timeout=60) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "vigil.cli", "tail", *args, "--json"], env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def ids(records: list[dict]) -> list[str]:
    return [r.get("decision_id") if r["event_type"] == "decision" else
            r.get("incident_id") if r["event_type"] == "alert" else r["event_id"] for r in records]


def test_each_kind_with_the_same_filters(config, env):
    _publish(config, RECORDS)
    u = lambda n: str(uuid.UUID(int=n))  # noqa: E731
    # decisions of one job
    assert ids(tail(env, "decisions", "--from-beginning", "--job", "train-a", "--max", "1")) == [u(11)]
    # actions whose decision answers a sev1 incident: only the reconfiguration's result
    assert ids(tail(env, "actions", "--from-beginning", "--severity", "1", "--max", "1")) == [u(1021)]
    # everything about train-b, in time order: its alert, its decision, that decision's result
    assert ids(tail(env, "all", "--from-beginning", "--job", "train-b", "--max", "3")) == [u(2), u(12), u(1022)]
    # sev2 or worse across all kinds: the sev1 alert, its decision and result (the re-plan has no severity)
    assert ids(tail(env, "all", "--from-beginning", "--severity", "2", "--max", "3")) == [u(1), u(11), u(1021)]
    # the old spelling still works
    assert ids(tail(env, "alerts", "--from-beginning", "--max-alerts", "2")) == [u(1), u(2)]


def test_a_live_tail_knows_the_decisions_made_before_it_started(config, env):
    """Not from the beginning: the last hour of alerts and decisions is read, not printed, so an
    action result arriving now is still filtered by its decision's job."""
    _publish(config, RECORDS)
    proc = subprocess.Popen([sys.executable, "-m", "vigil.cli", "tail", "actions", "--job", "train-a", "--json",
                             "--max", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "following actions" in proc.stderr.readline()  # assigned: what is published now is read
        _publish(config, [_result(23, 12, "succeeded", 8.0), _result(24, 11, "failed", 9.0)])
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    [record] = [json.loads(line) for line in out.splitlines()]
    assert record["event_id"] == str(uuid.UUID(int=1024)) and record["state"] == "failed"
