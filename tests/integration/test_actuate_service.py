"""`vigil actuate` against the real broker, with the Slurm backend on STUB scontrol/sbatch/scancel.

The stubs (shell scripts first on the actuator's PATH) record their argv, one
line per call, so "executed once" is counted in that file.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

from confluent_kafka import Producer

from vigil.schemas import ActionResult, Alert, DeadLetter, Decision, NodeState, Subject, decode, encode
from vigil.streams.kafka import reader
from tests.integration.conftest import KEYRING, wait_for
from vigil.stack import wait_for_file

STUB = """#!/bin/sh
# STUB {name} (tests only): records its argv, succeeds.
{{ printf '%s' "{name}"; for a in "$@"; do printf '\\t%s' "$a"; done; printf '\\n'; }} >> "$STUB_ARGV_LOG"
exit 0
"""


class Actuator:
    """`python -m vigil.cli actuate ...` in a subprocess, stub scheduler commands first on its PATH."""

    def __init__(self, config, workdir: Path, group: str, *extra: str) -> None:
        bin_dir = workdir / "stub-bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name in ("scontrol", "sbatch", "scancel"):
            (bin_dir / name).write_text(STUB.format(name=name))
            (bin_dir / name).chmod(0o755)
        self.argv_log = workdir / "stub-argv.log"
        self.ready = workdir / f"ready-{uuid.uuid4().hex[:6]}"
        self.log = workdir / "actuator.log"
        env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
                   VIGIL_STATE_DIR=str(workdir), STUB_ARGV_LOG=str(self.argv_log),
                   PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "actuate", "--backend", "slurm", "--group-id", group,
                 "--node", "gpu-07", "--node", "gpu-08", "--node", "gpu-09", "--job", "1234",
                 "--ready-file", str(self.ready), "--log-level", "INFO", *extra],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not wait_for_file(self.ready, 60, alive=lambda: self.proc.poll() is None):
            self.stop()
            raise AssertionError(f"actuator not ready; log:\n{self.log.read_text()[-3000:]}")

    def calls(self) -> list[list[str]]:
        return [line.split("\t") for line in self.argv_log.read_text().splitlines()] if self.argv_log.exists() else []

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def decision(action: str, *, job: str | None = None, node: str | None = None, plan: dict | None = None) -> Decision:
    """A decision as vigil's decision engine makes it: signed with the tests' decision key."""
    did = uuid.uuid4()
    return KEYRING.sign(Decision(event_time=datetime.now(timezone.utc), decision_id=did, idempotency_key=f"k-{did}",
                                 action=action, target=Subject(job=job, node=node), reason="integration test",
                                 plan=plan or {}))


class Topics:
    """Everything the actuator says, read from the beginning of its topics."""

    def __init__(self, config) -> None:
        self.consumer = reader(config.kafka_conf(), [config.topic("action_result"), config.topic("dead_letter"),
                                                     config.topic("alert"), config.topic("node_state")])
        self.results: list[ActionResult] = []
        self.dead: list[DeadLetter] = []
        self.alerts: list[Alert] = []
        self.nodes: list[NodeState] = []

    def poll(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is not None and not msg.error():
            for ev in decode(msg.value()).events:
                {ActionResult: self.results, DeadLetter: self.dead, Alert: self.alerts,
                 NodeState: self.nodes}[type(ev)].append(ev)

    def drained(self) -> dict[str, set]:
        """node -> the ids of the ``drained`` announcements about it (a re-published one is the same id)."""
        out: dict[str, set] = {}
        for ev in self.nodes:
            if ev.state == "drained":
                out.setdefault(ev.source.node, set()).add(ev.event_id)
        return out

    def states(self, d: Decision) -> list[str]:
        # A re-published result is the same event (same id): count each once.
        return list({r.event_id: r.state for r in self.results if r.decision_id == d.decision_id}.values())

    def close(self) -> None:
        self.consumer.close()


def test_actuate_acts_once_per_decision_dead_letters_garbage_and_refuses_unknown_nodes(config, tmp_path):
    group = f"act-{uuid.uuid4().hex[:8]}"
    topic = config.topic("decision")
    producer = Producer(config.kafka_conf())
    topics = Topics(config)
    limits = ("--max-drained-fraction", "1.0")  # 3 known nodes: the default 10 % would allow one drain
    act = Actuator(config, tmp_path, group, *limits)
    try:
        drain = decision("isolate_node", node="gpu-07", plan={"reason": "xid 79"})
        garbage = b"\xff not a decision {"
        unknown = decision("isolate_node", node="gpu-99")
        requeue = decision("restart_process", job="1234")
        # One key: the messages stay in order in one partition.
        for value in (encode(drain), encode(drain), garbage, encode(unknown), encode(requeue)):
            producer.produce(topic, key=b"k", value=value)
        producer.flush(10)
        # (results are keyed by decision: across partitions they arrive in any order)
        assert wait_for(lambda: topics.states(requeue) == ["running", "succeeded"] and topics.dead
                        and topics.states(unknown) == ["failed"]
                        and topics.states(drain) == ["running", "succeeded"], 60, topics.poll), (
            topics.results, topics.dead, act.log.read_text()[-3000:])
        # The second copy of `drain` re-published the same result (same event id): still two states, one command.
        assert act.calls() == [["scontrol", "update", "nodename=gpu-07", "state=drain",
                                f"reason=vigil {str(drain.decision_id)[:8]}: xid 79"],
                               ["scontrol", "requeue", "1234"]]
        (failed,) = [r for r in topics.results if r.decision_id == unknown.decision_id]
        assert "unknown node 'gpu-99'" in failed.detail and failed.backend == "slurm"
        (dead,) = topics.dead
        assert dead.reason == "not_json" and dead.source_topic == topic and base64.b64decode(dead.raw_b64) == garbage

        # A restarted actuator (same ledger, same group) never acts twice on a redelivered decision.
        assert act.stop() == 0
        act = Actuator(config, tmp_path, group, *limits)
        later = decision("isolate_node", node="gpu-08")
        for value in (encode(drain), encode(later)):
            producer.produce(topic, key=b"k", value=value)
        producer.flush(10)
        assert wait_for(lambda: topics.states(later) == ["running", "succeeded"], 60, topics.poll), (
            topics.results, act.log.read_text()[-3000:])
        assert [c[2] for c in act.calls() if c[1] == "update"] == ["nodename=gpu-07", "nodename=gpu-08"]
        # each drain that ran is announced once on the node states topic (the scheduler took the node out);
        # the refused gpu-99 and the requeue took nothing out
        assert wait_for(lambda: set(topics.drained()) == {"gpu-07", "gpu-08"}, 30, topics.poll), topics.nodes
        assert [len(ids) for ids in topics.drained().values()] == [1, 1]
        assert all(str(drain.decision_id) in e.reason for e in topics.nodes if e.source.node == "gpu-07")
    finally:
        act.stop()
        topics.close()


def test_actuate_circuit_breaker_raises_a_sev1_alert_and_stays_open(config, tmp_path):
    topic = config.topic("decision")
    producer = Producer(config.kafka_conf())
    topics = Topics(config)
    act = Actuator(config, tmp_path, f"act-{uuid.uuid4().hex[:8]}", "--max-drained-nodes", "1",
                   "--max-drained-fraction", "1.0")
    try:
        first, second, third = (decision("isolate_node", node=n) for n in ("gpu-07", "gpu-08", "gpu-09"))
        for d in (first, second, third):
            producer.produce(topic, key=b"k", value=encode(d))
        producer.flush(10)
        assert wait_for(lambda: topics.states(third) == ["failed"] and topics.alerts
                        and topics.states(first) == ["running", "succeeded"] and topics.states(second) == ["failed"],
                        60, topics.poll), (topics.results, act.log.read_text()[-3000:])
        (alert,) = topics.alerts
        assert (alert.severity, alert.kind, alert.status, alert.subject.node) == (1, "actuator_circuit_open", "open",
                                                                                   "gpu-08")
        (refused,) = [r for r in topics.results if r.decision_id == third.decision_id]
        assert "circuit breaker open" in refused.detail
        assert len(act.calls()) == 1
        # A human resets it while the actuator runs: the alert is resolved.
        reset = subprocess.run([sys.executable, "-m", "vigil.cli", "actuate", "--reset-circuit"], capture_output=True,
                               text=True, timeout=60, env=dict(os.environ, VIGIL_STATE_DIR=str(tmp_path)))
        assert reset.returncode == 0 and "circuit breaker reset" in reset.stdout, reset.stderr
        assert wait_for(lambda: any(a.status == "resolved" for a in topics.alerts), 30, topics.poll)
    finally:
        act.stop()
        topics.close()


CRASHER = """
import os, sys
open(os.path.join(sys.argv[1], "run" + os.environ["VIGIL_RESTART_COUNT"]), "w").write(os.environ["RANK"])
sys.exit(3)
"""


def test_agent_actuate_restarts_its_ranks_then_gives_up_without_progress(config, tmp_path):
    import shutil
    import tempfile

    from vigil.schemas import ProcessExit

    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    (tmp_path / "kmsg").write_text("")
    ctl = tempfile.mkdtemp(prefix="vctl")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(tmp_path))
    log = tmp_path / "agent.log"
    consumer = reader(config.kafka_conf(), [config.topic("action_result"), config.topic("process_exit")])
    results: list[ActionResult] = []
    exits: list[ProcessExit] = []

    def poll() -> None:
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            for ev in decode(msg.value()).events:
                (results if isinstance(ev, ActionResult) else exits).append(ev)

    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "vigil.cli", "agent", "--node", "n1", "--job", "jx", "--no-gpu",
             "--kmsg", str(tmp_path / "kmsg"), "--nic-root", str(tmp_path / "no-nic"), "--control-dir", ctl,
             "--hooks-socket", str(tmp_path / "hooks.sock"), "--actuate", "--max-restarts-without-progress", "1",
             "--restart-grace", "1", "--", sys.executable, str(script), str(tmp_path)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    producer = Producer(config.kafka_conf())
    try:
        # The rank crashes; with --actuate the agent stays up and reports the exit.
        assert wait_for(lambda: any(e.exit_code == 3 for e in exits), 60, poll), log.read_text()[-3000:]
        assert agent.poll() is None
        first = decision("restart_process", job="jx")
        producer.produce(config.topic("decision"), key=b"jx", value=encode(first))
        producer.flush(10)
        done = lambda d: [r.state for r in results if r.decision_id == d.decision_id]  # noqa: E731
        assert wait_for(lambda: done(first) == ["running", "succeeded"], 60, poll), (results, log.read_text()[-3000:])
        assert wait_for(lambda: (tmp_path / "run1").exists(), 30)  # relaunched with VIGIL_RESTART_COUNT=1
        assert wait_for(lambda: len([e for e in exits if e.exit_code == 3]) == 2, 30, poll)
        # It crashed again with no training step seen: the guard refuses the next restart and the agent exits.
        second = decision("restart_process", job="jx")
        producer.produce(config.topic("decision"), key=b"jx", value=encode(second))
        producer.flush(10)
        assert wait_for(lambda: done(second) == ["failed"], 60, poll), (results, log.read_text()[-3000:])
        assert agent.wait(timeout=60) != 0
        assert "no-progress guard gave up on job jx" in log.read_text()
        refused = [r for r in results if r.decision_id == second.decision_id][0]
        assert "no progress after 1 restarts: last step unknown" in refused.detail
        assert not (tmp_path / "run2").exists()
        assert all(e.signal is None for e in exits)  # nothing the agent stopped itself was reported
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        consumer.close()
        shutil.rmtree(ctl, ignore_errors=True)


def test_agent_actuate_exits_0_when_every_rank_exits_0(config, tmp_path):
    (tmp_path / "kmsg").write_text("")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(tmp_path))
    p = subprocess.run(
        [sys.executable, "-m", "vigil.cli", "agent", "--node", "n1", "--job", "jok", "--no-gpu", "--nproc-per-node", "2",
         "--kmsg", str(tmp_path / "kmsg"), "--nic-root", str(tmp_path / "no-nic"),
         "--hooks-socket", str(tmp_path / "hooks.sock"), "--actuate", "--", sys.executable, "-c", "pass"],
        env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
