"""The cluster simulator publishes a run's events to the real broker in accelerated time.

A short vigil run (a crash, then a lost node) is played at 20,000x through a
real :class:`vigil.producers.publisher.Publisher`; every alert, decision and
action result the run produced arrives once on its topic, keyed as the live
producers key them, and the pacing stretched the playback to the run's span.
"""

from __future__ import annotations

import time

from vigil.sim.clustersim import simulate
from vigil.sim.clustersim.model import MODELS, JobConfig, Topology
from vigil.sim.clustersim.publish import AcceleratedPublisher
from vigil.sim.clustersim.traces import DAY, FailStop, FailureTrace
from vigil.producers.publisher import Publisher
from vigil.schemas import decode
from vigil.streams.kafka import reader
from tests.integration.conftest import wait_for


def test_a_simulated_run_lands_on_its_topics_once_in_accelerated_time(config):
    topo = Topology.build(3, 3)
    jobs = [JobConfig("sim-job", MODELS["1.3B"], 1.0, size=3)]
    stops = (FailStop(600.0, "node-000", 2, "process_exit", "", "restart"),
             FailStop(3000.0, "node-002", 1, "node_loss", "", "exclude", repair_s=DAY))
    trace = FailureTrace("e2e", tuple(topo.nodes), 3600.0, 0, stops, ())
    publisher = Publisher(config.kafka_conf(), config.topic_prefix)
    speedup = 20_000.0
    tap = AcceleratedPublisher(publisher, speedup=speedup, kinds={"alert", "decision", "action_result", "node_state"})
    started = time.monotonic()
    result = simulate("vigil", jobs, topo, trace, tap=tap)
    played = time.monotonic() - started
    assert publisher.flush(30.0) == 0

    last = max(e["t"] for e in result["log"] if e["event"] in ("alert", "decision", "action_result"))
    assert played >= last / speedup * 0.95  # paced: not faster than the accelerated clock
    want = {"decision": sum(result["decisions"].values()),
            "alert": sum(result["alerts"].values()),
            "action_result": sum(1 for e in result["log"] if e["event"] == "action_result")}
    assert {k: tap.published[k] for k in want} == want
    assert want["decision"] >= 3 and "restart_process" in result["decisions"]

    got: dict[str, list] = {k: [] for k in want}
    out = reader(config.kafka_conf(), [config.topic(k) for k in want])

    def poll():
        for msg in out.consume(200, timeout=0.05):
            if not msg.error():
                for ev in decode(msg.value()).events:
                    got[ev.event_type].append(ev)

    try:
        assert wait_for(lambda: all(len(got[k]) >= n for k, n in want.items()), 30, poll), \
            {k: len(v) for k, v in got.items()}
        poll()
        assert {k: len(v) for k, v in got.items()} == want  # each once
        assert len({e.event_id for e in got["decision"]}) == len(got["decision"])
        actions = [d.action for d in got["decision"] if d.target.job == "sim-job"]
        assert actions[0] == "restart_process" and "reconfigure" in actions
        assert any(a.kind == "node_lost" and a.severity == 1 for a in got["alert"])
    finally:
        out.close()
