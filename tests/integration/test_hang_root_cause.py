"""A real hang's root cause, on demand: the worker detects the hang, the agent takes every rank's flight recorder
before restarting, and the hang incident names the rank that never joined the collective.

A 2-rank torch job (gloo on CPU, ``tests/fixtures/resilient_train.py``) runs
under ``vigil agent --actuate`` next to a real detection worker on the real
broker. The test makes rank 1 sleep forever at the start of a step, so the
ground truth is known: rank 1 never enters that step's gradient all-reduce,
and rank 0 waits in it.

* recorder on (``TORCH_FR_BUFFER_SIZE=200``; gloo records in torch 2.13):
  the incident is re-rooted on ``collective_stuck``, rank 1, verdict
  ``missing``;
* recorder off (``TORCH_FR_BUFFER_SIZE=0``): the incident stays the hang and
  says why no culprit could be named (``flight_recorder_unavailable``, the
  reason per rank).

Either way the restart goes on and the job trains again.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.conftest import WorkerProcess, wait_for
from vigil.bench.hooks_workload import _free_port
from tests.integration.resilient_job import FIXTURE, LoopOutputs, progress
from vigil.schemas import Alert

pytest.importorskip("torch")

JOB, NODE = "hung", "node-h"


@pytest.mark.parametrize("recorder", ["on", "off"])
def test_a_real_hang_restart_takes_the_flight_recorders_and_the_incident_says_who(config, tmp_path, monkeypatch,
                                                                                 recorder):
    ckpt, faults, state = tmp_path / "ckpt", tmp_path / "faults", tmp_path / "state"
    for d in (ckpt, faults, state):
        d.mkdir()
    monkeypatch.setenv("VIGIL_HEARTBEAT_MISSED_INTERVALS", "10")  # torch starting up starves the 2 cores
    monkeypatch.setenv("VIGIL_HANG_MIN_TIMEOUT_S", "3")
    worker = WorkerProcess(config, tmp_path / "worker")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(state))
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.pop(name, None)
    env["TORCH_FR_BUFFER_SIZE"] = "200" if recorder == "on" else "0"  # (torch 2.13 records by default)
    agent_log = tmp_path / "agent.log"
    agent = None
    out = LoopOutputs(config)
    alerts, decisions, results, poll = out.alerts, out.decisions, out.results, out.poll

    def log() -> str:
        seen = [(a.kind, a.status, a.incident_id, [e["kind"] for e in a.evidence]) for a in alerts]
        return f"alerts {seen}\nagent log:\n{agent_log.read_text()[-3000:]}"

    try:
        worker.wait_ready()
        with open(agent_log, "ab") as f:
            agent = subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "agent", "--actuate", "--job", JOB, "--node", NODE,
                 "--cluster", "c", "--nproc-per-node", "2", "--master-port", str(_free_port()), "--no-gpu",
                 "--heartbeat-interval", "1", "--hooks-socket", str(tmp_path / "hooks.sock"),
                 "--control-dir", str(tmp_path / "ctl"), "--restart-grace", "2", "--log-level", "INFO",
                 "--", sys.executable, str(FIXTURE), str(ckpt), str(faults), "1000000"],
                env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # past the hang detector's warm-up (5 steps) and the 10 step times it learns its timeout from
        assert wait_for(lambda: len(p := progress(ckpt, 2)) == 2 and min(s for s, _ in p.values()) > 16, 90, poll), \
            (progress(ckpt, 2), log())

        (faults / "hang.rank1").touch()  # rank 1 sleeps forever at the start of its next step
        assert wait_for(lambda: any(a.kind == "task_hang" and a.status == "open" for a in alerts), 60, poll), alerts
        hang = next(a for a in alerts if a.kind == "task_hang" and a.status == "open")
        assert wait_for(lambda: any(d.action == "restart_process" and hang.incident_id in d.answers
                                    for d in decisions), 30, poll), decisions
        restart = next(d for d in decisions if d.action == "restart_process" and hang.incident_id in d.answers)
        assert restart.plan.get("collect_diagnostics") == ["flight_recorder"]

        def told() -> list[Alert]:
            """Later versions of the hang's incident: an update, or (when the restart's own news came first
            and closed it) a further resolved version."""
            return [a for a in alerts if a.incident_id == hang.incident_id and a.incident_version > hang.incident_version]

        if recorder == "on":
            assert wait_for(lambda: any(a.kind == "collective_stuck" for a in told()), 60, poll), (alerts, log())
            cause = next(a for a in told() if a.kind == "collective_stuck")
            assert cause.subject.job == JOB and cause.subject.rank == 1 and cause.severity == 2
            [ev] = [e for e in cause.evidence if e["kind"] == "collective_stuck"]
            assert ev["verdict"] == "missing" and ev["culprit_ranks"] == [1] and ev["waiting_ranks"] == [0]
            assert ev["op"] == "gloo:all_reduce" and "rank(s) 1 never entered" in cause.summary
        else:
            assert wait_for(lambda: any(e["kind"] == "flight_recorder_unavailable" for a in told() for e in a.evidence),
                            60, poll), (alerts, log())
            note = next(e for a in told() for e in a.evidence if e["kind"] == "flight_recorder_unavailable")
            assert set(note["unavailable"]) == {"0", "1"}
            assert all("TORCH_FR_BUFFER_SIZE" in why for why in note["unavailable"].values())
            assert all(a.kind == "task_hang" for a in told())  # annotated, still the hang

        assert not [a for a in alerts if a.status == "open" and a.incident_id != hang.incident_id]  # no other page
        assert wait_for(lambda: any(r.decision_id == restart.decision_id and r.state == "succeeded"
                                    for r in results), 60, poll), (results, log())
        done = next(r for r in results if r.decision_id == restart.decision_id and r.state == "succeeded")
        assert "answered by [0, 1]" in done.detail, done.detail
        assert wait_for(lambda: len(p := progress(ckpt, 2)) == 2 and all(rc == 1 for _, rc in p.values()), 90, poll), \
            (progress(ckpt, 2), log())
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
