"""The whole loop on a real training job: fault -> alert -> decision -> local actuator -> training resumes.

A 2-rank torch job (gloo on CPU, checkpoints every 5 steps;
``tests/fixtures/resilient_train.py``) runs under ``vigil agent --actuate``
(the local backend on the agent's own process supervisor), next to a real
detection worker on the real broker. Faults are injected by the test, so the
ground truth is known:

1. a rank is SIGKILLed -> a sev2 process-exit incident -> restart_process ->
   every rank relaunched, resuming from the last checkpoint, steps rising;
2. the same restart decision published again (a replay) -> refused, not executed twice;
3. a rank sleeps forever inside a step -> task_hang -> restart;
4. every launch exits at once -> restarts keep failing -> the no-progress
   guard stops restarting, the failed action escalates to reconfiguration
   (the sev1 rung), and the agent gives up with a reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.producers.publisher import Publisher
from vigil.schemas import Decision
from tests.integration.conftest import WorkerProcess, wait_for
from tests.integration.resilient_job import FIXTURE, LoopOutputs, progress
from vigil.bench.hooks_workload import _free_port

pytest.importorskip("torch")

JOB, NODE = "resilient", "node-a"
# Two ranks are a data-parallel job as much as four (a kill breaks the peer's all-reduce, a hang stalls it), and
# each rank's torch start-up costs seconds of CPU at each of the job's three launches on a 2-core machine.
RANKS = 2


def resumed(ckpt: Path, rank: int = 0) -> list[tuple[int, int]]:
    """(restart count, first step) of each launch of ``rank``."""
    try:
        return [tuple(map(int, line.split())) for line in (ckpt / f"resumed.rank{rank}").read_text().splitlines()]
    except FileNotFoundError:
        return []


def test_a_training_job_heals_itself_and_stops_when_healing_cannot_work(config, tmp_path, monkeypatch):
    ckpt, faults, state = tmp_path / "ckpt", tmp_path / "faults", tmp_path / "state"
    for d in (ckpt, faults, state):
        d.mkdir()
    # Four torch processes starting at once starve a 2-core machine for seconds: the node is not
    # lost and the job does not hang, however late its heartbeats and step records arrive.
    monkeypatch.setenv("VIGIL_HEARTBEAT_MISSED_INTERVALS", "10")
    monkeypatch.setenv("VIGIL_HANG_MIN_TIMEOUT_S", "3")
    # The ladder would reconfigure after 3 restarts of one failure; give it 5, so that what stops
    # the crash loop is the agent's no-progress guard (2 restarts without a new step).
    monkeypatch.setenv("VIGIL_MAX_RESTARTS", "5")
    worker = WorkerProcess(config, tmp_path / "worker")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(state))
    agent_log = tmp_path / "agent.log"
    agent = None
    out = LoopOutputs(config)
    alerts, decisions, results, poll = out.alerts, out.decisions, out.results, out.poll

    def succeeded(d: Decision) -> bool:
        return any(r.decision_id == d.decision_id and r.state == "succeeded" for r in results)

    def steps_after(restarts: int, beyond: int) -> bool:
        p = progress(ckpt, RANKS)
        return len(p) == RANKS and all(rc == restarts and s > beyond for s, rc in p.values())

    try:
        worker.wait_ready()
        with open(agent_log, "ab") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "agent", "--actuate", "--job", JOB, "--node", NODE,
                 "--cluster", "c", "--nproc-per-node", str(RANKS), "--master-port", str(_free_port()), "--no-gpu",
                 "--heartbeat-interval", "1", "--hooks-socket", str(tmp_path / "hooks.sock"),
                 "--control-dir", str(tmp_path / "ctl"), "--restart-grace", "2",
                 # the crash loop's relaunches wait 0.5, 1, 2, 4 s instead of 1, 2, 4, 8: what stops it is a
                 # count of restarts without progress, whatever their pace
                 "--restart-backoff", "0.5",
                 "--max-restarts-without-progress", "2", "--log-level", "INFO",
                 "--", sys.executable, str(FIXTURE), str(ckpt), str(faults), "1000000"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # past step 5, so rank 0 has written a checkpoint for the restart to resume from
        assert wait_for(lambda: steps_after(0, 6), 90), (progress(ckpt, RANKS), agent_log.read_text()[-3000:])

        # 1. kill a rank: sev2 -> restart -> resume from the last checkpoint, steps keep rising
        (faults / "kill.rank1").touch()
        assert wait_for(lambda: any(d.action == "restart_process" for d in decisions), 60, poll), \
            (alerts, agent_log.read_text()[-3000:])
        restart = next(d for d in decisions if d.action == "restart_process")
        crash = max((a for a in alerts if a.incident_id in restart.answers), key=lambda a: a.incident_version)
        # whichever symptom of the kill reaches the correlator first roots the incident (the exit,
        # the peers' broken connections, the job's stall); either way one sev2 incident of the job
        assert crash.severity == 2 and crash.subject.job == JOB
        assert crash.kind in ("process_exit", "connection_reset", "task_hang")
        assert wait_for(lambda: succeeded(restart), 60, poll), (results, agent_log.read_text()[-3000:])
        killed_at = max(s for s, _ in progress(ckpt, RANKS).values())
        assert wait_for(lambda: steps_after(1, killed_at + 5), 90, poll), \
            (progress(ckpt, RANKS), decisions, alerts, agent_log.read_text()[-3000:])
        restarts, first_step = resumed(ckpt)[-1]
        assert restarts == 1 and first_step > 0 and first_step % 5 == 0 and first_step <= killed_at
        assert wait_for(lambda: any(a.incident_id == crash.incident_id and a.status == "resolved" for a in alerts),
                        30, poll)

        # 2. the same decision published again (a replay): refused with the reason, nothing restarts
        def answered() -> int:
            return sum(r.decision_id == restart.decision_id and r.state == "succeeded" for r in results)

        assert answered() == 1
        publisher = Publisher(config.kafka_conf(), config.topic_prefix)
        publisher.publish([restart])
        publisher.flush()
        assert wait_for(lambda: any(r.state == "failed" and "replayed" in r.detail
                                    and str(restart.decision_id) in r.detail for r in results), 30, poll), results
        assert answered() == 1
        # (each rank rewrites its progress file every step: a read may catch one empty, so read until both answer)
        assert wait_for(lambda: [rc for _, rc in progress(ckpt, RANKS).values()] == [1] * RANKS, 10, poll), progress(ckpt, RANKS)
        assert len(resumed(ckpt)) == 2

        # 3. a rank sleeps forever: hang -> restart, once the hang detector has learned this run's step time
        # (its warm-up of 5 steps after the restart, then 10 step times)
        resumed_at = max(s for s, _ in progress(ckpt, RANKS).values())
        assert wait_for(lambda: steps_after(1, resumed_at + 16), 60, poll), (progress(ckpt, RANKS), agent_log.read_text()[-3000:])
        before = max(s for s, _ in progress(ckpt, RANKS).values())
        (faults / "hang.rank1").touch()
        assert wait_for(lambda: any(a.kind == "task_hang" and a.status == "open" for a in alerts), 60, poll), alerts
        hang = next(a for a in alerts if a.kind == "task_hang" and a.status == "open")
        assert hang.severity == 2 and hang.subject.job == JOB
        assert wait_for(lambda: steps_after(2, before), 120, poll), (progress(ckpt, RANKS), agent_log.read_text()[-3000:])

        # 4. every launch fails at once: the guard stops restarting, the failure climbs to sev1
        (faults / "crashloop").touch()
        (faults / "kill.rank0").touch()
        assert wait_for(lambda: agent.poll() is not None, 180, poll), agent_log.read_text()[-3000:]
        assert agent.returncode != 0
        assert "no-progress guard gave up" in agent_log.read_text()
        refused = [r for r in results if r.state == "failed" and "no progress" in r.detail]
        assert refused, results
        assert wait_for(lambda: any(d.action == "reconfigure" and d.target.job == JOB for d in decisions), 30, poll), \
            decisions
        escalated = next(d for d in decisions if d.action == "reconfigure")
        assert "(sev1)" in escalated.reason and "no progress" in escalated.reason
    finally:
        out.close()
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        worker.stop()
