"""vigil's own /metrics, scraped from running processes with Prometheus' text parser: a real `vigil worker`
and a real `vigil agent` on the real broker. Counters move as events flow, by at least what was sent (the
ground truth: the events these tests publish, and what the topics hold when read back)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import WorkerProcess, wait_for
from vigil.schemas import Heartbeat, Source, XidError, decode, encode, encode_batch, from_seconds
from vigil.streams.kafka import reader

Samples = dict[tuple[str, tuple], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> Samples:
    """Every sample of the endpoint, ``{(name, sorted labels): value}``; {} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    return sum(v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab))


def test_a_running_workers_counters_move_by_at_least_what_was_sent(config, tmp_path):
    port = free_port()
    worker = WorkerProcess(config, tmp_path / "worker", metrics_port=port)
    producer = Producer(config.kafka_conf())
    try:
        worker.wait_ready()
        assert wait_for(lambda: bool(scrape(port)), 30), worker.log.read_text()[-3000:]
        before = scrape(port)
        assert get(before, "vigil_build_info", component="worker", version=_version(before)) == 1
        hb_topic, xid_topic = config.topic("heartbeat"), config.topic("xid")
        assert get(before, "vigil_events_consumed_total", topic=hb_topic) == 0

        # The ground truth: 5 nodes x 4 heartbeats in 5 messages, one XID 79 (the GPU fell off the bus:
        # a sev1 incident), and one message that is not JSON.
        now = time.time()
        nodes = [f"m-n{i}" for i in range(5)]
        for node in nodes:
            beats = [Heartbeat(event_time=from_seconds(now - 3 + s), source=Source(cluster="m", node=node), seq=s,
                               interval_s=1.0) for s in range(4)]
            producer.produce(hb_topic, key=node.encode(), value=encode_batch(beats))
        xid = XidError(event_time=from_seconds(now), source=Source(cluster="m", node="m-n0", gpu=0), code=79,
                       message="GPU has fallen off the bus.")
        producer.produce(xid_topic, key=b"m-n0", value=encode(xid))
        producer.produce(hb_topic, key=b"m-n1", value=b"{not json")
        assert producer.flush(10) == 0

        # What the worker published, read back from its topics.
        alerts_in = reader(config.kafka_conf(), [config.topic("alert"), config.topic("decision")])
        published: list = []

        def read_back() -> None:
            msg = alerts_in.poll(0.1)
            if msg is not None and not msg.error():
                published.extend(decode(msg.value()).events)

        try:
            assert wait_for(lambda: any(getattr(e, "event_type", "") == "alert" and e.subject.node == "m-n0"
                                        for e in published), 60, read_back), worker.log.read_text()[-3000:]
            alert = next(e for e in published if e.event_type == "alert" and e.subject.node == "m-n0")
            assert alert.severity == 1 and alert.status == "open"

            def moved() -> bool:
                now_ = scrape(port)
                return (get(now_, "vigil_events_consumed_total", topic=hb_topic) >= 20
                        and get(now_, "vigil_events_consumed_total", topic=xid_topic) >= 1
                        and get(now_, "vigil_alerts_total", kind=alert.kind, severity="1", status="open") >= 1
                        and get(now_, "vigil_decode_errors_total", reason="not_json", topic=hb_topic) >= 1)

            assert wait_for(moved, 30), scrape(port)
            for _ in range(20):  # whatever else it published by now
                read_back()
        finally:
            alerts_in.close()
        after = scrape(port)
        assert get(after, "vigil_dead_letters_total", reason="not_json", topic=hb_topic) >= 1
        assert total(after, "vigil_findings_total", status="raised") >= 1
        # every alert and decision read back from the topics was counted
        for ev in published:
            if ev.event_type == "alert":
                assert get(after, "vigil_alerts_total", kind=ev.kind, severity=str(ev.severity), status=ev.status) >= \
                    sum(1 for e in published if e.event_type == "alert" and (e.kind, e.severity, e.status) ==
                        (ev.kind, ev.severity, ev.status))
            elif ev.event_type == "decision":
                assert get(after, "vigil_decisions_total", action=ev.action) >= \
                    sum(1 for e in published if e.event_type == "decision" and e.action == ev.action)
        # the only worker of its group correlates: the sev1 incident is open there
        assert get(after, "vigil_worker_correlating") == 1
        assert get(after, "vigil_open_incidents", severity="1") >= 1
        assert get(after, "vigil_tracked_subjects", per="node") >= len(nodes)
        # detector cost: the first instance of each detector is always timed
        assert get(after, "vigil_detector_update_seconds_count", detector="heartbeat_loss") >= 4
        assert get(after, "vigil_detector_update_seconds_count", detector="xid") >= 1
        assert get(after, "vigil_detector_update_seconds_bucket", detector="xid", le="+Inf") == \
            get(after, "vigil_detector_update_seconds_count", detector="xid")
        # lag: a series for each partition it read, and nothing left behind once it caught up
        assert wait_for(lambda: [v for (n, lab), v in scrape(port).items() if n == "vigil_consumer_lag_messages"
                                 and dict(lab)["topic"] == hb_topic] and
                        all(v == 0 for (n, _), v in scrape(port).items() if n == "vigil_consumer_lag_messages"), 30), \
            {k: v for k, v in scrape(port).items() if k[0] == "vigil_consumer_lag_messages"}
        assert get(after, "process_resident_memory_bytes") > 0
    finally:
        worker.stop()  # by its pid (Popen.terminate, then kill)


def _version(samples: Samples) -> str:
    return next(dict(lab)["version"] for (n, lab) in samples if n == "vigil_build_info")


def test_a_running_agents_publisher_counters_move_by_at_least_what_reached_kafka(config, tmp_path):
    port = free_port()
    (tmp_path / "kmsg").write_text("")
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(tmp_path / "state"), VIGIL_METRICS_PORT=str(port))
    log = tmp_path / "agent.log"
    node = "m-agent"
    topic = config.topic("node_samples")
    consumer = reader(config.kafka_conf(), [topic])
    beats: list[Heartbeat] = []
    messages = [0]

    def read_back() -> None:
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            events = [e for e in decode(msg.value()).events if e.source.node == node]
            if events:
                messages[0] += 1
                beats.extend(e for e in events if isinstance(e, Heartbeat))

    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "vigil.cli", "agent", "--node", node, "--no-gpu", "--no-health-check",
             "--heartbeat-interval", "0.2", "--kmsg", str(tmp_path / "kmsg"), "--nic-root", str(tmp_path / "no-nic"),
             "--hooks-socket", str(tmp_path / "hooks.sock"), "--log-level", "INFO"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: bool(scrape(port)), 30), log.read_text()[-3000:]
        first = scrape(port)
        assert get(first, "vigil_build_info", component="agent", version=_version(first)) == 1
        assert wait_for(lambda: len(beats) >= 10, 60, read_back), log.read_text()[-3000:]
        seen_messages, seen_beats = messages[0], len(beats)

        # Everything read back was delivered, and every heartbeat is a run of the heartbeat collector
        # (the counters catch up within the agent's next poll).
        def caught_up() -> bool:
            s = scrape(port)
            return (get(s, "vigil_publisher_messages_delivered_total") >= seen_messages
                    and get(s, "vigil_agent_collector_runs_total", collector="heartbeat") >= seen_beats)

        assert wait_for(caught_up, 30), scrape(port)
        later = scrape(port)
        assert get(later, "vigil_publisher_messages_delivered_total") > \
            get(first, "vigil_publisher_messages_delivered_total")
        assert get(later, "vigil_agent_collector_runs_total", collector="heartbeat") > \
            get(first, "vigil_agent_collector_runs_total", collector="heartbeat")
        # the broker is up: nothing failed, nothing waits in the spool
        assert get(later, "vigil_publisher_failures_total") == 0
        assert get(later, "vigil_publisher_spooling") == 0 and get(later, "vigil_publisher_spool_bytes") == 0
        assert ("vigil_publisher_spool_bytes", ()) in later
    finally:
        if agent.poll() is None:  # by its pid: SIGTERM, then SIGKILL
            agent.terminate()
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        consumer.close()
