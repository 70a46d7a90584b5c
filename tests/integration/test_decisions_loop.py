"""Alerts become decisions on the decisions topic; action results feed back through the broker.

A crashed rank (ground truth: the exit this test publishes) gets a restart
decision; a failed restart climbs to reconfiguration and then to a human; a
restart that worked resolves the incident.
"""

from __future__ import annotations

import os
import time

from vigil.producers.publisher import Publisher
from vigil.schemas import ActionResult, Alert, Decision, ProcessExit, Source, decode, from_seconds
from vigil.streams.kafka import reader
from tests.integration.conftest import wait_for


def test_a_crash_is_restarted_escalated_on_failure_and_resolved_on_success(config, worker):
    publisher = Publisher(config.kafka_conf(), config.topic_prefix)
    out = reader(config.kafka_conf(), [config.topic("decision"), config.topic("alert")])
    decisions: list[Decision] = []
    alerts: list[Alert] = []

    def poll():
        for msg in out.consume(100, timeout=0.05):
            if not msg.error():
                for ev in decode(msg.value()).events:
                    (decisions if isinstance(ev, Decision) else alerts).append(ev)

    def crash(job: str) -> None:
        publisher.publish([ProcessExit(event_time=from_seconds(time.time()),
                                       source=Source(cluster="c", node="n1", job=job, rank=2),
                                       pid=os.getpid(), signal=9, local_rank=2)])
        publisher.flush()

    def answer(d: Decision, state: str, detail: str = "") -> None:
        publisher.publish([ActionResult(event_time=from_seconds(time.time()), source=Source(cluster="c"),
                                        decision_id=d.decision_id, state=s, backend="test", detail=detail)
                           for s in ("running", state)])
        publisher.flush()

    def decided(job: str, action: str) -> Decision | None:
        return next((d for d in decisions if d.target.job == job and d.action == action), None)

    try:
        crash("doomed")
        assert wait_for(lambda: decided("doomed", "restart_process") is not None, 30, poll), decisions
        restart = decided("doomed", "restart_process")
        opened = next(a for a in alerts if a.subject.job == "doomed" and a.status == "open")
        assert restart.answers == [opened.incident_id] and restart.plan == {"nodes": ["n1"]}

        answer(restart, "failed", "processes exit at once")
        assert wait_for(lambda: decided("doomed", "reconfigure") is not None, 30, poll), decisions
        reconf = decided("doomed", "reconfigure")
        assert reconf.plan == {"exclude_nodes": ["n1"]} and "restart_process failed" in reconf.reason

        answer(reconf, "failed", "local backend cannot re-plan")
        assert wait_for(lambda: decided("doomed", "notify_human") is not None, 30, poll), decisions
        assert wait_for(lambda: any(a.kind == "recovery_failed" for a in alerts), 30, poll)
        human = next(a for a in alerts if a.kind == "recovery_failed")
        assert human.severity == 1 and human.subject.job == "doomed"

        crash("lucky")
        assert wait_for(lambda: decided("lucky", "restart_process") is not None, 30, poll), decisions
        answer(decided("lucky", "restart_process"), "succeeded")
        assert wait_for(lambda: any(a.subject.job == "lucky" and a.status == "resolved" for a in alerts), 30, poll)
        resolved = next(a for a in alerts if a.subject.job == "lucky" and a.status == "resolved")
        assert "recovered by restart_process" in resolved.summary
        # one decision per step: nothing was decided twice
        assert len({d.decision_id for d in decisions}) == len(decisions) == 4
    finally:
        out.close()
