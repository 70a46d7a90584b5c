"""`vigil node STATE NODE` on the real broker: the operator's word lands on the node states topic as said."""

from __future__ import annotations

import os
import subprocess
import sys

from vigil.schemas import NodeState, decode
from vigil.streams.kafka import reader
from tests.integration.conftest import wait_for


def _vigil_node(config, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix)
    return subprocess.run([sys.executable, "-m", "vigil.cli", "node", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_vigil_node_publishes_the_operators_statement_and_refuses_what_is_no_node_state(config):
    said = [("drained", "gpu-07", "fan swap, INC-1234"), ("maintenance", "gpu-08", ""), ("repaired", "gpu-07", "RMA back")]
    for state, node, why in said:
        done = _vigil_node(config, state, node, "--cluster", "east", *(("--reason", why) if why else ()))
        assert done.returncode == 0, done.stderr
        assert f"node {node}: {state} published to {config.topic('node_state')}" in done.stdout.replace("\n", "")
    refused = [_vigil_node(config, "joined", "gpu-07"),  # the agent's word, after its check: not an operator's
               _vigil_node(config, "drained", "gpu[01-04]")]  # a set of nodes is no node
    assert [r.returncode for r in refused] == [2, 2]

    consumer = reader(config.kafka_conf(), [config.topic("node_state")])
    seen: list[NodeState] = []

    def poll() -> None:
        for m in consumer.consume(100, timeout=0.2):
            if m.error() is None and m.value() is not None:
                seen.extend(e for e in decode(m.value()).events if isinstance(e, NodeState))
    try:
        assert wait_for(lambda: len(seen) >= len(said), 30, poll), seen
        wait_for(lambda: False, 1.0, poll)  # nothing more comes (the refused ones were never sent)
    finally:
        consumer.close()
    got = sorted((e.source.node, e.state, e.source.cluster) for e in seen)
    assert got == sorted((node, state, "east") for state, node, _ in said)
    for state, node, why in said:
        (ev,) = [e for e in seen if (e.source.node, e.state) == (node, state)]
        assert ev.reason.startswith(why or "no reason given") and "(vigil node by " in ev.reason
