"""`vigil scrape`'s scraper against STUB dcgm-exporter / node_exporter HTTP endpoints (tests/stub_exporters.py).

The stubs serve the exporters' documented text expositions over real HTTP; the
scraper's events are checked field by field and fed to vigil's own detectors
(XID 79, a thermally throttled GPU, a CNP surge on one port), with time as an
argument. The publisher is a recorder: publishing to Kafka is the integration
tests' part.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.stub_exporters import StubExporters, StubNode
from vigil.detectors.gpu import GpuDegradation
from vigil.detectors.nic import NicCongestion
from vigil.detectors.xid import XidDetector
from vigil.producers.exporters import ScrapeError, Scraper, XidTracker, load_targets_file, parse_target
from vigil.schemas import NODE_SAMPLES, GpuTelemetry, Heartbeat, NicCounters, XidError, decode, encode
from vigil.schemas.events import AgentHealth

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


class Recorder:
    def __init__(self) -> None:
        self.groups: list[tuple[str | None, list]] = []

    def publish(self, events, topic_type=None):
        self.groups.append((topic_type, list(events)))
        for ev in events:  # every event survives the wire format
            assert decode(encode(ev)).events == [ev]

    def poll(self, timeout_s=0.0):
        pass

    def of(self, cls):
        return [e for _, g in self.groups for e in g if isinstance(e, cls)]


@pytest.fixture
def stub():
    with StubExporters([StubNode("gpu-07"), StubNode("gpu-08")]) as s:
        yield s


def scraper_for(stub, rec, tmp_path, **kw):
    targets = [parse_target("dcgm", stub.dcgm_url(n)) for n in stub.nodes] + \
              [parse_target("node", stub.node_url(n)) for n in stub.nodes]
    return Scraper(targets, rec, cluster="c1", interval_s=5.0, timeout_s=5.0,
                   xids=XidTracker(tmp_path / "xid.json"), **kw)


def test_one_scrape_maps_dcgm_and_node_exporter_fields_and_beats_per_node(stub, tmp_path):
    g = stub.nodes["gpu-07"].gpus[2]
    g.temp, g.sm_clock, g.power, g.util, g.reasons = 71.0, 1755.0, 612.5, 99.0, 0x4
    g.ecc_sbe, g.ecc_dbe, g.remapped_corr, g.remapped_unc, g.nvlink_crc_flit, g.nvlink_replay = 5, 1, 2, 1, 7, 3
    p = stub.nodes["gpu-07"].ports[("mlx5_1", 1)]
    p.np_cnp_sent, p.rp_cnp_handled, p.np_ecn_marked, p.xmit_wait, p.link_downed, p.rcv_data_words = 10, 11, 12, 13, 2, 2**33
    rec = Recorder()
    report = scraper_for(stub, rec, tmp_path).scrape_once(T0)
    assert report.nodes == {"gpu-07", "gpu-08"} and not report.failed_targets
    assert (report.gpu_samples, report.nic_samples, report.xids) == (8, 4, 0)

    node_groups = [(tt, grp) for tt, grp in rec.groups if tt == NODE_SAMPLES]
    assert len(node_groups) == 2  # one message per node: its heartbeat with its samples
    for _, grp in node_groups:
        assert isinstance(grp[0], Heartbeat) and grp[0].seq == 0 and grp[0].interval_s == 5.0
        assert {e.source.node for e in grp} == {grp[0].source.node}
    gpu = next(e for e in rec.of(GpuTelemetry) if e.source.node == "gpu-07" and e.source.gpu == 2)
    assert gpu.event_time == T0 and gpu.source.cluster == "c1"
    assert (gpu.temperature_c, gpu.sm_clock_mhz, gpu.power_w, gpu.utilization_pct, gpu.throttle_reasons) == \
        (71.0, 1755.0, 612.5, 99.0, 0x4)
    assert (gpu.ecc_sbe, gpu.ecc_dbe, gpu.remapped_rows, gpu.mem_clock_mhz) == (5, 1, 3, 2619.0)
    assert gpu.memory_used_bytes == 40000 * 2**20 and gpu.memory_total_bytes == 81000 * 2**20
    assert gpu.nvlink_errors == {"crc_flit": 7, "replay": 3}
    nic = next(e for e in rec.of(NicCounters) if e.source.node == "gpu-07" and e.device == "mlx5_1")
    assert nic.port == 1 and nic.port_state == "ACTIVE"
    assert nic.counters == {"np_cnp_sent": 10, "rp_cnp_handled": 11, "np_ecn_marked_roce_packets": 12,
                            "port_xmit_wait": 13, "link_downed": 2, "symbol_error": 0, "port_rcv_data": 2**33}

    scraper = scraper_for(stub, Recorder(), tmp_path)
    scraper.scrape_once(T0)
    second = scraper.scrape_once(T0 + timedelta(seconds=5))
    assert sorted(e.seq for e in second.events if isinstance(e, Heartbeat)) == [1, 1]


def test_node_name_from_configuration_beats_the_hostname_label(tmp_path):
    # On Kubernetes dcgm-exporter's Hostname is the pod's name: the target's node wins.
    with StubExporters([StubNode("dcgm-exporter-x7k2p")]) as s:
        rec = Recorder()
        Scraper([parse_target("dcgm", f"gpu-31={s.dcgm_url('dcgm-exporter-x7k2p')}")], rec,
                xids=XidTracker(None)).scrape_once(T0)
    assert {e.source.node for _, g in rec.groups for e in g} == {"gpu-31"}
    with StubExporters([StubNode("gpu-32")], hostname_label=False) as s:
        rec = Recorder()
        Scraper([parse_target("dcgm", s.dcgm_url("gpu-32"))], rec, xids=XidTracker(None)).scrape_once(T0)
    assert {e.source.node for _, g in rec.groups for e in g} == {"127.0.0.1"}  # no label, no config: the host


def test_xid_79_is_published_once_on_change_and_not_again_after_a_restart(stub, tmp_path):
    rec = Recorder()
    scraper_for(stub, rec, tmp_path).scrape_once(T0)            # baseline: 0 everywhere
    stub.nodes["gpu-08"].gpus[3].xid = 79
    s = scraper_for(stub, rec, tmp_path)                         # a restarted scraper: the state file
    s.scrape_once(T0 + timedelta(seconds=5))
    s.scrape_once(T0 + timedelta(seconds=10))                    # still 79: the same fault
    xids = rec.of(XidError)
    assert [(x.code, x.source.node, x.source.gpu, x.pci_bus_id, x.message) for x in xids] == \
        [(79, "gpu-08", 3, "0000:48:00", "GPU has fallen off the bus")]
    [(topic_type, group)] = [(tt, g) for tt, g in rec.groups if any(isinstance(e, XidError) for e in g)]
    assert topic_type is None and group == xids                   # its own topic, not the node samples
    scraper_for(stub, rec, tmp_path).scrape_once(T0 + timedelta(seconds=15))  # restart again: nothing new
    assert len(rec.of(XidError)) == 1
    assert json.loads((tmp_path / "xid.json").read_text())["gpu-08/3"] == 79

    det = XidDetector(node="gpu-08")
    det.update(xids[0].code, xids[0].pci_bus_id, t=xids[0].event_time.timestamp(), message=xids[0].message)
    assert det.finding is not None and det.finding.severity == 1   # fallen off the bus: sev1


def test_an_xid_present_at_the_first_scrape_is_a_baseline_unless_asked(stub, tmp_path):
    stub.nodes["gpu-07"].gpus[0].xid = 13
    rec = Recorder()
    scraper_for(stub, rec, tmp_path).scrape_once(T0)
    assert rec.of(XidError) == []
    rec2 = Recorder()
    Scraper([parse_target("dcgm", stub.dcgm_url("gpu-07"))], rec2,
            xids=XidTracker(tmp_path / "other.json", report_existing=True)).scrape_once(T0)
    assert [x.code for x in rec2.of(XidError)] == [13]


def test_a_thermally_throttled_gpu_is_found_by_the_gpu_detector(stub, tmp_path):
    sick = stub.nodes["gpu-07"].gpus[1]
    sick.reasons, sick.sm_clock, sick.temp = 0x40 | 0x20, 1100.0, 93.0   # HW + SW thermal slowdown
    rec = Recorder()
    scraper = scraper_for(stub, rec, tmp_path)
    det = GpuDegradation(node="gpu-07")
    for i in range(4):
        now = T0 + timedelta(seconds=5 * i)
        before = len(rec.of(GpuTelemetry))
        scraper.scrape_once(now)
        samples = [e for e in rec.of(GpuTelemetry)[before:] if e.source.node == "gpu-07"]
        det.update({s.source.gpu: {"sm_clock": s.sm_clock_mhz, "temperature": s.temperature_c, "power": s.power_w,
                                   "utilization": s.utilization_pct, "throttle_reasons": s.throttle_reasons}
                    for s in samples}, t=now.timestamp())
    found = {f.kind: f for f in det.findings}
    assert {f.evidence["gpu"] for f in det.findings} == {"1"}        # that GPU, and only it
    throttle = found["throttle"]
    assert throttle.severity == 3 and "hw_thermal_slowdown" in throttle.evidence["reasons"]
    assert throttle.onset == T0.timestamp()


def test_violation_counters_throttle_a_gpu_held_down_by_its_thermal_limiter_and_no_other(stub, tmp_path):
    """dcgm-exporter with the violation counters enabled and no clocks-event bitmask reading (0): one GPU held
    below its clocks by the thermal limiter all the time, one power-capped all the time (normal under load), one
    thermally limited 10 % of the time. The counters move once per 30 s refresh, as dcgm-exporter's do, while
    vigil scrapes every 5 s; the GPU detector finds the first GPU throttled (sw_thermal_slowdown) and no other."""
    gpus = stub.nodes["gpu-07"].gpus
    for g in gpus:
        g.power_violation, g.thermal_violation = 0, 0
    hot, capped, mild = gpus[1], gpus[2], gpus[3]
    rec = Recorder()
    scraper = scraper_for(stub, rec, tmp_path)
    det = GpuDegradation(node="gpu-07")
    reasons: dict[int, list] = {i: [] for i in range(4)}
    for i in range(37):  # 180 s
        now = T0 + timedelta(seconds=5 * i)
        if i and i % 6 == 0:  # dcgm-exporter's refresh: 30 s of violation time, in ns
            hot.thermal_violation += 30 * 10**9
            capped.power_violation += 30 * 10**9
            mild.thermal_violation += 3 * 10**9
        before = len(rec.of(GpuTelemetry))
        scraper.scrape_once(now)
        samples = [e for e in rec.of(GpuTelemetry)[before:] if e.source.node == "gpu-07"]
        for s in samples:
            reasons[s.source.gpu].append(s.throttle_reasons)
        det.update({s.source.gpu: {"sm_clock": s.sm_clock_mhz, "temperature": s.temperature_c, "power": s.power_w,
                                   "utilization": s.utilization_pct, "throttle_reasons": s.throttle_reasons}
                    for s in samples}, t=now.timestamp())
    # the first refresh after the start is a baseline; from the second (60 s) on, each GPU's own limiter
    assert reasons[1][:12] == [0] * 12 and set(reasons[1][12:]) == {0x20}
    assert reasons[2][:12] == [0] * 12 and set(reasons[2][12:]) == {0x4}
    assert set(reasons[0]) == set(reasons[3]) == {0}
    found = [(f.kind, f.evidence["gpu"]) for f in det.findings]
    assert found == [("throttle", "1")]
    assert det.findings[0].evidence["reasons"] == ["sw_thermal_slowdown"]


def test_violation_counter_reset_and_garbage_are_no_evidence():
    from vigil.producers.exporters.dcgm import ViolationTracker

    t, v = ViolationTracker(), "DCGM_FI_DEV_THERMAL_VIOLATION"
    assert [t.reasons("n", 0, {v: x}, now) for x, now in ((5e9, 0.0), (35e9, 30.0), (65e9, 60.0))] == [None, None, 0x20]
    assert t.reasons("n", 0, {v: 10**9}, 90.0) is None      # lower: the exporter restarted, a new baseline
    assert t.reasons("n", 0, {v: 10**9}, 90.0 + 64.0) is None
    assert t.reasons("n", 0, {v: 10**9}, 90.0 + 65.0) == 0  # still for VIOLATION_HOLD_S: the limiter is off
    t.reasons("n", 0, {v: 2 * 10**9}, 200.0)
    # 1e15 "ns" in 30 s is no time at all: not evidence (nor a bit)
    assert t.reasons("n", 0, {v: 10**15}, 230.0) is None


def test_a_cnp_surge_on_one_port_is_found_by_the_nic_detector(stub, tmp_path):
    rec = Recorder()
    scraper = scraper_for(stub, rec, tmp_path)
    det = NicCongestion(node="gpu-08")
    port = stub.nodes["gpu-08"].ports[("mlx5_0", 1)]
    onset = None
    for i in range(30):
        surge = i >= 20
        port.np_cnp_sent += 60_000 if surge else 40 + (i % 3) * 5      # per 5 s interval
        port.rp_cnp_handled += 30 + (i % 2) * 4
        port.np_ecn_marked += 70_000 if surge else 50 + (i % 4)
        if surge and onset is None:
            onset = (T0 + timedelta(seconds=5 * (i - 1))).timestamp()  # the interval the surge began in
        now = T0 + timedelta(seconds=5 * i)
        before = len(rec.of(NicCounters))
        scraper.scrape_once(now)
        for ev in rec.of(NicCounters)[before:]:
            if ev.source.node == "gpu-08":
                det.update(ev.counters, t=ev.event_time.timestamp(), port=f"{ev.device}:{ev.port}")
    f = det.finding
    assert f is not None and f.kind == "congestion"
    assert f.onset == onset and "np_cnp_sent" in f.evidence["signals"]


def test_a_dead_or_garbled_target_is_reported_once_and_its_recovery_once(stub, tmp_path):
    rec = Recorder()
    scraper = scraper_for(stub, rec, tmp_path)
    stub.down.add("gpu-08")
    r1 = scraper.scrape_once(T0)
    r2 = scraper.scrape_once(T0 + timedelta(seconds=5))
    assert r1.nodes == r2.nodes == {"gpu-07"}                      # no heartbeat for gpu-08: heartbeat loss
    assert set(r1.failed_targets) == {stub.dcgm_url("gpu-08"), stub.node_url("gpu-08")}
    assert "HTTP 503" in r1.failed_targets[stub.dcgm_url("gpu-08")]
    stub.down.clear()
    stub.garbage.add("gpu-08")
    r3 = scraper.scrape_once(T0 + timedelta(seconds=10))
    assert "not serve a Prometheus exposition" in r3.failed_targets[stub.dcgm_url("gpu-08")]
    stub.garbage.clear()
    r4 = scraper.scrape_once(T0 + timedelta(seconds=15))
    assert r4.nodes == {"gpu-07", "gpu-08"}
    health = rec.of(AgentHealth)
    assert [(h.status, h.collector, h.source.node) for h in health] == [
        ("failed", "scrape.dcgm", "127.0.0.1"), ("failed", "scrape.node", "127.0.0.1"),
        ("recovered", "scrape.dcgm", "127.0.0.1"), ("recovered", "scrape.node", "127.0.0.1")]
    assert health[2].occurrences == 3 and health[3].occurrences == 3


def test_targets_file_in_prometheus_file_sd_format_is_read_and_reread(stub, tmp_path):
    port = stub.server.server_address[1]
    f = tmp_path / "targets.json"
    f.write_text(json.dumps([
        {"targets": [f"127.0.0.1:{port}"], "labels": {"exporter": "dcgm", "node": "gpu-07",
                                                       "__metrics_path__": "/dcgm/gpu-07/metrics"}}]))
    rec = Recorder()
    s = Scraper([], rec, targets_file=f, xids=XidTracker(None))
    assert s.scrape_once(T0).nodes == {"gpu-07"}
    f.write_text(json.dumps([
        {"targets": [f"127.0.0.1:{port}"], "labels": {"exporter": "node_exporter", "node": "gpu-08",
                                                       "__metrics_path__": "/node/gpu-08/metrics"}}]))
    import os
    os.utime(f, (T0.timestamp() + 60, T0.timestamp() + 60))
    assert s.scrape_once(T0).nodes == {"gpu-08"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"targets": ["x:1"], "labels": {"exporter": "snmp"}}]))
    with pytest.raises(ScrapeError, match="labels.exporter must be dcgm or node"):
        load_targets_file(bad)
    with pytest.raises(ScrapeError, match="expected an http"):
        parse_target("dcgm", "ftp://x/metrics")
