"""The GPU detector's event path (``observe_batch``, which skips re-validating validated events) finds
exactly what its general path (``update`` with the same readings as plain fields) finds.

Random rounds of 8 GPU samples with planted throttling, slow clocks, heat, idle
GPUs, missing fields, ECC and NVLink counts that grow and reset, and repeated
deliveries: after every round both detectors report the same findings.
"""

from __future__ import annotations

import random

import pydantic
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.gpu import GpuDegradation
from vigil.schemas import GpuTelemetry, Source, from_seconds


def readings(items: list[GpuTelemetry]) -> dict:
    """What a caller of ``update`` passes for these samples (the fields by their detector names)."""
    out = {}
    for s in items:
        row = {k: v for k, v in (("sm_clock", s.sm_clock_mhz), ("temperature", s.temperature_c),
                                 ("power", s.power_w), ("utilization", s.utilization_pct),
                                 ("throttle_reasons", s.throttle_reasons), ("ecc_sbe", s.ecc_sbe),
                                 ("ecc_dbe", s.ecc_dbe)) if v is not None}
        if s.nvlink_errors:
            row["nvlink_errors"] = sum(s.nvlink_errors.values())
        out[s.source.gpu] = row
    return out


def sample(rng: random.Random, t: float, gpu: int, state: dict) -> GpuTelemetry:
    hot = gpu == state["hot"]
    slow = gpu == state["slow"]
    if rng.random() < 0.03:
        state["sbe"][gpu] += rng.randrange(1, 60)
    if rng.random() < 0.01:
        state["dbe"][gpu] += 1
    if rng.random() < 0.02:
        state["nvl"][gpu] += rng.randrange(1, 8)
    if rng.random() < 0.01:
        state["sbe"][gpu] = 0  # a driver reload resets the counters
    fields = dict(utilization_pct=0.0 if gpu == state["idle"] else 97.0, sm_clock_mhz=(1300.0 if slow else 1980.0)
                  * (1 + rng.uniform(-0.01, 0.01)), temperature_c=(93.0 if hot else 62.0) + rng.uniform(-2, 2),
                  power_w=650.0, throttle_reasons=0x40 if hot else rng.choice([0, 0x4]), ecc_sbe=state["sbe"][gpu],
                  ecc_dbe=state["dbe"][gpu], nvlink_errors={"crc": state["nvl"][gpu]} if state["nvl"][gpu] else {})
    for k in ("temperature_c", "power_w", "ecc_sbe"):
        if rng.random() < 0.05:
            fields[k] = None
    return GpuTelemetry(event_time=from_seconds(t), source=Source(node="n1", gpu=gpu), **fields)


def snapshot(det: GpuDegradation):
    return [(f.kind, f.severity, f.onset, f.detected_at, f.evidence) for f in det.findings]


@pytest.mark.parametrize("seed", range(6))
def test_event_path_equals_general_path(seed):
    rng = random.Random(seed)
    fast, general = GpuDegradation(node="n1"), GpuDegradation(node="n1")
    state = {"sbe": [0] * 8, "dbe": [0] * 8, "nvl": [0] * 8, "hot": None, "slow": None, "idle": None}
    t = 1000.0
    for round_ in range(400):
        if round_ % 40 == 0:
            state.update(hot=rng.choice([None, rng.randrange(8)]), slow=rng.choice([None, rng.randrange(8)]),
                         idle=rng.choice([None, rng.randrange(8)]))
        t += rng.choice([10.0, 10.0, 10.0, 0.0])  # now and then the same round again (a redelivery)
        items = [sample(rng, t, g, state) for g in range(8)]
        fast.observe_batch(items, t=t)
        general.update(readings(items), t=t)
        if round_ % 7 == 0:
            fast.tick(t + 5.0)
            general.tick(t + 5.0)
        assert snapshot(fast) == snapshot(general), round_
    assert snapshot(fast)  # the planted faults were found


def test_event_path_refuses_what_the_general_path_refuses():
    det = GpuDegradation(node="n1")
    ok = GpuTelemetry(event_time=from_seconds(20.0), source=Source(node="n1", gpu=0), sm_clock_mhz=1900.0)
    det.observe_batch([ok], t=20.0)
    older = GpuTelemetry(event_time=from_seconds(10.0), source=Source(node="n1", gpu=0), sm_clock_mhz=1900.0)
    with pytest.raises(DetectorError, match="older"):
        det.observe_batch([older], t=10.0)
    # The schema refuses a negative counter now (U64); one built past validation is still refused here.
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 0"):
        GpuTelemetry(event_time=from_seconds(30.0), source=Source(node="n1", gpu=1), nvlink_errors={"crc": -3})
    negative = GpuTelemetry(event_time=from_seconds(30.0), source=Source(node="n1", gpu=1)).model_copy(
        update={"nvlink_errors": {"crc": -3}})
    with pytest.raises(DetectorError, match="nvlink_errors must be a non-negative int"):
        det.observe_batch([negative], t=30.0)


@pytest.mark.parametrize("seed", range(4))
def test_quiet_rounds_taken_short_find_what_the_full_path_finds(seed, monkeypatch):
    """Most rounds of most nodes change nothing but the time, and are taken short (``_quiet``): a detector
    that takes them short reports, after every round, what one taking the full path every time reports.
    Faults come and go (heat, a slow clock, counts that grow now and then, short windows), so the feed
    leaves and re-enters the quiet state many times."""
    rng = random.Random(seed)
    short, full = GpuDegradation(node="n1", hold=60.0, window=60.0), GpuDegradation(node="n1", hold=60.0, window=60.0)
    monkeypatch.setattr(full, "_quiet", lambda items, t: False)
    taken = []
    quiet = short._quiet
    monkeypatch.setattr(short, "_quiet", lambda items, t: taken.append(quiet(items, t)) or taken[-1])
    counts = {"sbe": [0] * 8, "dbe": [0] * 8, "nvl": [0] * 8}
    t, hot, slow, idle = 1000.0, None, None, None
    for round_ in range(400):
        if round_ % 50 == 0:
            hot, slow, idle = (rng.choice([None, None, rng.randrange(8)]) for _ in range(3))
        if round_ % 50 == 12:
            hot = slow = None
        t += rng.choice([10.0] * 8 + [0.0, 3.0])
        items = []
        for g in range(8):
            for k, p, step in (("sbe", 0.003, 200), ("dbe", 0.001, 2), ("nvl", 0.003, 20)):
                if rng.random() < p:
                    counts[k][g] += rng.randrange(1, step)
            items.append(GpuTelemetry(
                event_time=from_seconds(t), source=Source(node="n1", gpu=g), utilization_pct=0.0 if g == idle else 97.0,
                sm_clock_mhz=(1300.0 if g == slow else 1980.0) * (1 + rng.uniform(-0.01, 0.01)),
                temperature_c=None if rng.random() < 0.02 else (95.0 if g == hot else 62.0) + rng.uniform(-2, 2),
                throttle_reasons=0x40 if g == hot else rng.choice([0, 0x4]), ecc_sbe=counts["sbe"][g],
                ecc_dbe=counts["dbe"][g], nvlink_errors={"crc": counts["nvl"][g]} if counts["nvl"][g] else {}))
        short.observe_batch(items, t=t)
        full.observe_batch(items, t=t)
        if round_ % 7 == 0:
            short.tick(t + 5.0)
            full.tick(t + 5.0)
        assert snapshot(short) == snapshot(full), round_
    assert sum(taken) > 100 and not all(taken)  # both ways were taken, many times


def test_engine_keeps_each_nodes_samples_apart_in_one_message():
    """The engine joins a node's GPU samples into one batch without routing each again: samples of two
    nodes interleaved in one message, with a heartbeat and a duplicate among them, still reach each
    node's own detector, in rounds; the planted fault (node n2's GPU 5 hot and throttling from round 3)
    is found on n2 alone, as when each node's samples come in messages of their own."""
    from vigil.schemas import Heartbeat
    from vigil.streams.engine.detection import DetectionEngine

    def round_of(node: str, t: float, hot: bool) -> list[GpuTelemetry]:
        return [GpuTelemetry(event_time=from_seconds(t), source=Source(node=node, gpu=g), utilization_pct=97.0,
                             sm_clock_mhz=1410.0 if hot and g == 5 else 1980.0,
                             temperature_c=93.0 if hot and g == 5 else 62.0, power_w=650.0,
                             throttle_reasons=0x40 if hot and g == 5 else 0, ecc_sbe=0, ecc_dbe=0)
                for g in range(8)]

    mixed, apart = DetectionEngine(), DetectionEngine()
    found: dict[str, list] = {"mixed": [], "apart": []}
    for i in range(8):
        t = 1000.0 + 10.0 * i
        n1, n2 = round_of("n1", t, False), round_of("n2", t, i >= 3)
        beat = Heartbeat(event_time=from_seconds(t), source=Source(node="n1"), seq=i, interval_s=10.0)
        message = [n1[0], n1[1], n2[0], n2[1], beat, n1[2], n1[2], *n2[2:], *n1[3:]]  # n1[2] twice: redelivered
        found["mixed"] += mixed.on_events(message, now=t + 0.1)
        found["apart"] += apart.on_events([beat, *n1], now=t + 0.1) + apart.on_events(n2, now=t + 0.1)
    raised = {name: sorted((f.kind, f.subject.node, f.subject.gpu) for f in fs if f.status == "raised")
              for name, fs in found.items()}
    assert raised["mixed"] == raised["apart"]
    assert raised["mixed"] and {(node, gpu) for _, node, gpu in raised["mixed"]} == {("n2", 5)}
