"""vigil's own /metrics (vigil.streams.metrics), with no broker: each registry its own, names by the
Prometheus conventions, counters from known inputs, detector timing that changes nothing, the endpoint."""

from __future__ import annotations

import logging
import socket
import urllib.request
import uuid
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vigil.schemas import DecodeError, Heartbeat, Source, XidError, encode, from_seconds
from vigil.settings import METRICS_PORTS, Settings
from vigil.streams import metrics as m
from vigil.streams.config import StreamConfig
from vigil.streams.engine.detection import DetectionEngine, EngineParams
from vigil.streams.engine.incidents import Correlator
from vigil.streams.kafka import dead_letter, refused_event
from vigil.streams.stages import AlertFlow, CorrelateStage, DetectStage, Place, key_of_topics
from vigil.streams.worker import TELEMETRY

T0 = 1_780_000_000.0


def samples(metrics: m.ProcessMetrics) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of the registry's exposition, as Prometheus parses it."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(got: dict, name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def heartbeat(node: str, t: float, seq: int = 0) -> Heartbeat:
    return Heartbeat(event_time=from_seconds(t), source=Source(cluster="c", node=node), seq=seq, interval_s=1.0)


def test_metric_names_follow_the_prometheus_conventions():
    for name, labels in m.METRIC_NAMES.items():
        assert name.startswith("vigil_") and name == name.lower(), name
        assert not name.endswith("_count") and "__" not in name, name
        assert all(label == label.lower() and not label.startswith("__") for label in labels), name
    assert all(n.endswith("_seconds") for n in m.METRIC_NAMES if "detector" in n)


def test_every_component_has_its_own_registry_so_several_in_one_process_do_not_clash():
    made = [cls() for cls in (m.WorkerMetrics, m.WorkerMetrics, m.HistoryMetrics, m.AgentMetrics, m.ActuatorMetrics,
                              m.NotifyMetrics, m.ScrapeMetrics)]
    assert len({id(x.registry) for x in made}) == len(made)
    from prometheus_client import REGISTRY

    assert all(x.registry is not REGISTRY for x in made)
    for x in made:
        got = samples(x)  # nothing watched yet: every collector still answers
        assert value(got, "vigil_build_info", component=x.component, version=m._version()) == 1.0
        assert any(name == "process_cpu_seconds_total" for name, _ in got)
        exported = {name for name, _ in got}
        for name in exported:
            if name.startswith("vigil_"):
                base = name.removesuffix("_created")
                assert base in m.METRIC_NAMES or any(base == f"{k}{suffix}" for k in m.METRIC_NAMES
                                                     for suffix in ("_bucket", "_count", "_sum")), name


def _stages() -> tuple[DetectStage, AlertFlow, StreamConfig, m.DetectorTimer]:
    cfg = StreamConfig(bootstrap="unused:9092", topic_prefix="t")
    timer = m.DetectorTimer(every=2)
    return (DetectStage(DetectionEngine(EngineParams(instrument=timer)), key_of_topics(cfg, TELEMETRY)),
            AlertFlow(CorrelateStage(Correlator()), None), cfg, timer)


def test_worker_metrics_count_events_findings_alerts_and_dead_letters_from_known_input():
    metrics = m.WorkerMetrics()
    detect, flow, cfg, _ = _stages()
    metrics.detectors = detect.engine.params.instrument
    worker = SimpleNamespace(detect=detect, correlate=flow.correlate, owned={("x", 0), ("y", 1)}, _replay_until={},
                             owns_correlation=True, _consumer=None, metrics=None)
    metrics.watch(worker)
    assert worker.metrics is metrics.counters
    hb_topic, xid_topic = cfg.topic("heartbeat"), cfg.topic("xid")
    now = T0
    published = []
    # 3 messages of 4 heartbeats each (one node each), then one XID 79 (fallen off the bus), then garbage
    for i in range(3):
        batch = b"[" + b",".join(encode(heartbeat(f"n{i}", now, seq)) for seq in range(4)) + b"]"
        out = detect.on_message(Place(hb_topic, i, 0), batch, now)
        published += out.findings + out.dead_letters
    xid = XidError(event_time=from_seconds(now), source=Source(cluster="c", node="n1", gpu=0), code=79)
    out = detect.on_message(Place(xid_topic, 0, 0), encode(xid), now)
    assert out.findings, "an XID 79 raises a finding"
    published += out.findings + out.dead_letters + flow.on_findings(out.findings, now)
    out = detect.on_message(Place(hb_topic, 0, 7), b"{not json", now)
    published += out.dead_letters
    published.append(refused_event(heartbeat("n9", now), "a detector refused it", hb_topic, 0, 8))
    worker.metrics.count(published)
    got = samples(metrics)
    assert value(got, "vigil_events_consumed_total", topic=hb_topic) == 12
    assert value(got, "vigil_events_consumed_total", topic=xid_topic) == 1
    alerts = [e for e in published if getattr(e, "event_type", "") == "alert"]
    assert alerts and value(got, "vigil_alerts_total", kind=alerts[0].kind, severity=str(alerts[0].severity),
                            status="open") == 1
    assert sum(v for (name, _), v in got.items() if name == "vigil_findings_total") == \
        sum(1 for e in published if getattr(e, "event_type", "") == "finding")
    assert value(got, "vigil_dead_letters_total", reason="not_json", topic=hb_topic) == 1
    assert value(got, "vigil_decode_errors_total", reason="not_json", topic=hb_topic) == 1
    assert value(got, "vigil_dead_letters_total", reason="refused", topic=hb_topic) == 1
    assert value(got, "vigil_decode_errors_total", reason="refused", topic=hb_topic) is None  # not a decode error
    assert value(got, "vigil_open_incidents", severity=str(alerts[0].severity)) == 1
    assert value(got, "vigil_tracked_subjects", per="node") == 3
    assert value(got, "vigil_worker_assigned_partitions") == 2 and value(got, "vigil_worker_correlating") == 1
    # the same label values reuse one child (no label lookup per event on the way)
    children = len(metrics.counters._children)
    metrics.counters.count(alerts * 5)
    assert len(metrics.counters._children) == children
    assert value(samples(metrics), "vigil_alerts_total", kind=alerts[0].kind, severity=str(alerts[0].severity),
                 status="open") == 6
    # a worker that does not correlate reports no open incidents (the correlating one has them)
    worker.owns_correlation = False
    assert value(samples(metrics), "vigil_open_incidents", severity=str(alerts[0].severity)) == 0


def test_detector_timing_samples_instances_and_changes_no_finding():
    timer = m.DetectorTimer(every=3)
    timed, plain = DetectionEngine(EngineParams(instrument=timer)), DetectionEngine(EngineParams())
    found: tuple[list, list] = ([], [])
    for step in range(30):
        now = T0 + step
        beats = [heartbeat(f"n{i}", now, step) for i in range(9) if not (i == 3 and step >= 10)]  # n3 goes silent
        xid = [XidError(event_time=from_seconds(now), source=Source(cluster="c", node="n2", gpu=0), code=79)] \
            if step == 5 else []
        for engine, out in zip((timed, plain), found):
            out += engine.on_events(beats + xid, now)
            engine.heard(now + 0.5)
            out += engine.tick(now + 0.5)
    assert [(f.kind, f.status, f.subject) for f in found[0]] == [(f.kind, f.status, f.subject) for f in found[1]]
    assert any(f.kind == "node_lost" for f in found[0]) and any(f.kind == "xid" for f in found[0])
    kinds = {n: type(k.detectors["heartbeat_loss"]).__name__ for n, k in timed.nodes.items()}
    assert sorted(n for n, name in kinds.items() if name.startswith("Timed")) == ["n0", "n3", "n6"]  # 1 in 3, first
    assert type(plain.nodes["n0"].detectors["heartbeat_loss"]).__name__ == "HeartbeatLoss"
    fams = {f.name: f for f in timer.families()}
    update = {(s.name, s.labels.get("le")): s.value for s in fams["vigil_detector_update_seconds"].samples
              if s.labels["detector"] == "heartbeat_loss"}
    assert update[("vigil_detector_update_seconds_count", None)] == 30 + 10 + 30  # n0, n3 (silent after 10), n6
    assert update[("vigil_detector_update_seconds_bucket", "+Inf")] == update[("vigil_detector_update_seconds_count",
                                                                                None)]
    tick = [s for s in fams["vigil_detector_tick_seconds"].samples if s.labels["detector"] == "heartbeat_loss"]
    assert tick, "the silence detector's ticks are timed too (n3's, once it is silent)"
    with pytest.raises(ValueError, match="every"):
        m.DetectorTimer(every=0)


def test_history_agent_actuator_and_notify_read_their_components_counters():
    history = m.HistoryMetrics()
    sink = SimpleNamespace(stats=SimpleNamespace(messages=10, stored=7, duplicates=2, dead_letters=1, batches=3,
                                                 retries=4, sink_errors=0, consume_errors=1),
                           alive=True, _stop=SimpleNamespace(is_set=lambda: False), _consumer=None)
    history.watch(SimpleNamespace(sink=sink, broker=object(), broker_restarts=2))
    got = samples(history)
    assert value(got, "vigil_sink_rows_inserted_total") == 7 and value(got, "vigil_sink_retries_total") == 4
    assert value(got, "vigil_sink_errors_total", kind="consume") == 1 and value(got, "vigil_sink_running") == 1
    assert value(got, "vigil_embedded_broker_restarts_total") == 2

    agent = m.AgentMetrics()
    publisher = SimpleNamespace(stats=SimpleNamespace(delivered=5, failed=2, spooled=3, replayed=1, dropped_events=0,
                                                      outages=1),
                                spool=SimpleNamespace(pending_bytes=4096, pending_messages=12), spooling=True,
                                _lock=None)
    agent.watch(SimpleNamespace(publisher=publisher, runner=SimpleNamespace(runs={"heartbeat": 9}, failures={}),
                                actuator=None))
    got = samples(agent)
    assert value(got, "vigil_publisher_failures_total") == 2 and value(got, "vigil_publisher_spooling") == 1
    assert value(got, "vigil_agent_collector_runs_total", collector="heartbeat") == 9
    assert value(got, "vigil_publisher_spool_bytes") == 4096 and value(got, "vigil_publisher_spool_messages") == 12

    actuator = m.ActuatorMetrics()
    service = SimpleNamespace(handled=4, executor=SimpleNamespace(safety=SimpleNamespace(circuit_open=True)),
                              _consumer=None, metrics=None)
    actuator.watch(service)
    from vigil.schemas import ActionResult

    service.metrics.count([ActionResult(event_time=from_seconds(T0), decision_id=uuid.uuid4(), state="succeeded",
                                        backend="slurm")], action="restart_process")
    got = samples(actuator)
    assert value(got, "vigil_actions_total", action="restart_process", state="succeeded", backend="slurm") == 1
    assert value(got, "vigil_actuator_decisions_total") == 4 and value(got, "vigil_actuator_circuit_open") == 1

    notify = m.NotifyMetrics()
    notify.watch(SimpleNamespace(handled=3, dead_letters=1, alerts_topic="t.alerts", _consumer=None,
                                 notifier=SimpleNamespace(delivered=5, dead=1)))
    got = samples(notify)
    assert value(got, "vigil_notify_deliveries_total", outcome="delivered") == 5
    assert value(got, "vigil_notify_dead_letters_total") == 1


def test_decode_error_reasons_are_the_decoders():
    topic = "t.telemetry.heartbeats"
    counters = m.PublishCounters(m.ProcessMetrics().registry, ("dead_letter",))
    counters.count([dead_letter(DecodeError(r, "x", b"x"), topic, 0, i) for i, r in
                    enumerate(("not_json", "invalid", "unknown_event_type", "sink_error", "consume_error"))])
    assert {k[1] for k in counters._children if k[0] == "decode_error"} == {"not_json", "invalid", "unknown_event_type"}
    assert len([k for k in counters._children if k[0] == "dead_letter"]) == 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_endpoint_serves_and_a_taken_port_is_a_warning_not_a_crash(caplog):
    first, second = m.WorkerMetrics(), m.AgentMetrics()
    port = _free_port()
    try:
        url = first.serve("127.0.0.1", port)
        assert url == f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        assert 'vigil_build_info{component="worker"' in body
        with caplog.at_level(logging.WARNING, logger="vigil.streams.metrics"):
            assert second.serve("127.0.0.1", port) is None
        assert f"127.0.0.1:{port}" in caplog.text and "VIGIL_METRICS_PORT" in caplog.text
    finally:
        first.close()
        second.close()


def test_metrics_address_option_then_environment_then_the_components_default(monkeypatch):
    assert len(set(METRICS_PORTS.values())) == len(METRICS_PORTS)  # all of them fit on one host
    assert METRICS_PORTS["worker"] == 9464
    s = Settings()
    assert s.metrics_address("agent") == ("127.0.0.1", METRICS_PORTS["agent"])  # this host only by default
    assert s.metrics_address("agent", port=9999, host="0.0.0.0") == ("0.0.0.0", 9999)
    monkeypatch.setenv("VIGIL_METRICS_PORT", "0")
    monkeypatch.setenv("VIGIL_METRICS_HOST", "0.0.0.0")
    s = Settings()
    assert s.metrics_address("worker") == ("0.0.0.0", 0)  # 0: none
    assert s.metrics_address("worker", port=9100) == ("0.0.0.0", 9100)


def test_every_long_running_command_takes_metrics_options():
    from typer.testing import CliRunner

    from vigil.cli import app

    for cmd in (["worker"], ["up"], ["agent"], ["actuate"], ["notify"], ["scrape"]):
        out = CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200).output
        assert "--metrics-port" in out and "--metrics-host" in out, cmd



def test_the_readme_lists_exactly_the_metrics_vigil_defines():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("**Prometheus scrapes vigil.**"):readme.index("**vigil reads your exporters**")]
    named = {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"\b(vigil_[a-z_]+)", section)}
    assert named == set(m.METRIC_NAMES)
    for component, port in METRICS_PORTS.items():
        assert f"| {port} |" in section, component
