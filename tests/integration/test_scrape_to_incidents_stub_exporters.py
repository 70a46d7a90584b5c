"""`vigil scrape` (a real subprocess) reads STUB dcgm-exporter and node_exporter endpoints
(tests/stub_exporters.py) and a real `vigil worker` turns what it publishes into vigil's incidents:
an XID 79 appearing on one GPU (sev1) and a thermally throttled GPU; then, the exporters of one node
going silent, its heartbeats stop and the node is reported lost -- with no vigil agent anywhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import wait_for
from tests.stub_exporters import StubExporters, StubNode
from vigil.schemas import Alert, decode
from vigil.streams.kafka import reader


def test_stub_exporters_through_scrape_and_a_real_worker_raise_the_right_incidents(config, worker, tmp_path: Path):
    nodes = [StubNode("gpu-07"), StubNode("gpu-08")]
    sick = nodes[0].gpus[1]
    sick.reasons, sick.sm_clock, sick.temp = 0x40 | 0x20, 1100.0, 93.0   # HW + SW thermal slowdown
    with StubExporters(nodes) as stub:
        log = tmp_path / "scrape.log"
        env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
                   VIGIL_STATE_DIR=str(tmp_path))
        args = [sys.executable, "-m", "vigil.cli", "scrape", "--interval", "0.5", "--cluster", "c1", "--log-level", "INFO"]
        for n in ("gpu-07", "gpu-08"):
            args += ["--dcgm", stub.dcgm_url(n), "--node-exporter", stub.node_url(n)]
        with open(log, "ab") as out:
            proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        consumer = reader(config.kafka_conf(), [config.topic("alert")])
        alerts: list[Alert] = []

        def poll() -> None:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                alerts.extend(e for e in decode(msg.value()).events if isinstance(e, Alert))

        try:
            # The first scrape is the XID baseline; the XID appears after it.
            assert wait_for(lambda: stub.hits.get("/dcgm/gpu-08/metrics", 0) >= 2 or proc.poll() is not None, 60)
            assert proc.poll() is None, log.read_text()[-3000:]
            nodes[1].gpus[3].xid = 79

            def found(pred) -> bool:
                return any(pred(a) for a in alerts)

            xid = lambda a: a.kind == "xid" and a.subject.node == "gpu-08" and a.status != "resolved"  # noqa: E731
            hot = lambda a: a.subject.node == "gpu-07" and a.subject.gpu == 1 and a.status != "resolved"  # noqa: E731
            assert wait_for(lambda: found(xid) and found(hot), 90, poll), \
                f"alerts: {[(a.kind, a.subject, a.severity) for a in alerts]}\n{log.read_text()[-2000:]}"
            x = next(a for a in alerts if xid(a))
            assert x.severity == 1 and x.source.cluster == "c1", x.evidence
            assert (x.evidence[0]["code"], x.evidence[0]["gpu"]) == (79, "0000:48:00")  # GPU 3's PCI bus id
            h = next(a for a in alerts if hot(a))
            assert h.severity == 3 and h.kind in ("throttle", "clock_below_peers", "temperature_outlier")
            assert not any(a.subject.node == "gpu-07" and a.subject.gpu not in (None, 1) for a in alerts)

            # gpu-07's exporters stop answering: no heartbeat for it, so heartbeat loss says it is lost.
            stub.down.add("gpu-07")
            lost = lambda a: a.kind == "node_lost" and a.subject.node == "gpu-07"  # noqa: E731
            assert wait_for(lambda: found(lost), 60, poll), [(a.kind, a.subject) for a in alerts]
            assert not any(a.kind == "node_lost" and a.subject.node == "gpu-08" for a in alerts)
        finally:
            consumer.close()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        assert proc.returncode == 0, log.read_text()[-3000:]
