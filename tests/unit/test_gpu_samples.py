"""A node's GPU samples in columns (``GpuSamples``): what the per-GPU events (``GpuTelemetry``) say, for less.

The same random rounds of 8 GPUs on a few nodes, with faults the test plants
(a hot, throttling GPU; a warm one that does not throttle; a slow clock; an ECC double-bit error; a burst of
NVLink errors; figures a GPU did not report), go through the detect stage once
as per-GPU events and once as one columnar event per node: the findings are
the same, and they name the planted faults; so are those of a plugin that
reads only per-GPU events (it is given each GPU's values as a view). The schema refuses what the
per-GPU event refuses, element by element, and columns that do not align.
"""

from __future__ import annotations

import random
import uuid

import pydantic
import pytest

from vigil.detectors import Detector, Finding
from vigil.schemas import GpuSamples, GpuTelemetry, Heartbeat, Source, decode, encode, encode_batch, from_seconds
from vigil.schemas.events import GPU_FIGURES
from vigil.schemas.tables import as_stored, column_values
from vigil.streams.engine.detection import DetectionEngine, EngineParams
from vigil.streams.stages import DetectStage, Place

NODES = ("n1", "n2", "n3")
#: (node, GPU, round) drawing more than its cap: n1's GPU 0, rounds 6 to 9 (the plugin's ground truth)
POWER = {("n1", 0, r) for r in range(6, 10)}
T0 = 1_000_000.0


def plant(round_: int, node: str, gpu: int) -> str | None:
    """The fault the test planted on this GPU in this round (the ground truth)."""
    if node == "n2" and gpu == 5 and 4 <= round_ < 14:
        return "hot"
    if node == "n3" and gpu == 2 and round_ >= 8:
        return "slow"
    if node == "n1" and gpu == 6 and 4 <= round_ < 9:
        return "warm"  # hotter than its peers, not throttling
    return None


def per_gpu_round(rng: random.Random, round_: int, node: str, counts: dict) -> list[GpuTelemetry]:
    t = from_seconds(T0 + round_)
    out = []
    for g in range(8):
        fault = plant(round_, node, g)
        if node == "n1" and g == 3 and round_ == 10:
            counts["dbe"] += 1  # an uncorrected ECC error: n1's GPU 3
        if node == "n3" and g == 6 and round_ >= 5:
            counts["nvl"] += 4  # NVLink errors on n3's GPU 6, past the threshold of 10 in a few rounds
        fields = dict(
            utilization_pct=97.0, memory_used_bytes=60 << 30, memory_total_bytes=80 << 30,
            temperature_c=(94.0 if fault == "hot" else 80.0 if fault == "warm" else 62.0) + rng.uniform(-2, 2),
            sm_clock_mhz=(1300.0 if fault == "slow" else 1980.0) * (1 + rng.uniform(-0.005, 0.005)),
            mem_clock_mhz=2619.0, power_w=(760.0 if (node, g, round_) in POWER else 650.0) + rng.uniform(-20, 20),
            throttle_reasons=0x40 if fault == "hot" else rng.choice([0, 0x4]),
            ecc_sbe=0, ecc_dbe=counts["dbe"] if (node, g) == ("n1", 3) else 0, pcie_replays=0,
            nvlink_errors={"crc_flit": counts["nvl"]} if (node, g) == ("n3", 6) and counts["nvl"] else {})
        if rng.random() < 0.05:  # a figure this GPU did not report this time
            fields[rng.choice(["temperature_c", "power_w", "retired_pages"])] = None
        out.append(GpuTelemetry(event_time=t, source=Source(cluster="c", node=node, gpu=g), **fields))
    return out


def columns_of(samples: list[GpuTelemetry]) -> GpuSamples:
    """The same samples as one columnar event (a figure none reported: an empty column)."""
    cols = {f: [getattr(s, f) for s in samples] for f in GPU_FIGURES}
    cols = {f: ([] if all(v is None or v == {} for v in vs) else vs) for f, vs in cols.items()}
    first = samples[0]
    return GpuSamples(event_time=first.event_time, source=first.source.model_copy(update={"gpu": None}),
                      gpus=[s.source.gpu for s in samples], **cols)


def finding_facts(findings) -> list[tuple]:
    return [(f.status, f.kind, f.severity, f.subject.node, f.subject.gpu, f.onset_time, f.detector,
             sorted(f.evidence.items())) for f in findings]


class PowerOverCap(Detector):
    """A plugin that reads only per-GPU events (written before the columns): a GPU over 700 W, twice in a row."""

    name = "test_power_over_cap"
    version = "1"
    consumes = ("gpu_telemetry",)
    per = "node"

    def __init__(self) -> None:
        self._over: dict[int, list[float]] = {}

    def update(self, event: GpuTelemetry, *, t: float) -> None:
        if event.power_w is not None:
            over = self._over.setdefault(event.source.gpu, [])
            over[:] = [*over, t] if event.power_w > 700.0 else []

    @property
    def findings(self) -> list[Finding]:
        return [Finding("power_over_cap", 3, ts[0], ts[1], {"gpu": g}) for g, ts in sorted(self._over.items())
                if len(ts) >= 2]

    @property
    def finding(self) -> Finding | None:
        return (self.findings or [None])[0]


def run(columnar: bool) -> tuple[list[tuple], int]:
    stage = DetectStage(DetectionEngine(EngineParams(plugins=(PowerOverCap,))), {"vigil.telemetry.node": "node"})
    rng = random.Random(7)
    counts = {n: {"dbe": 0, "nvl": 0} for n in NODES}
    found, records = [], 0
    for r in range(24):
        for i, node in enumerate(NODES):
            gpus = per_gpu_round(rng, r, node, counts[node])
            beat = Heartbeat(event_time=gpus[0].event_time, source=Source(cluster="c", node=node), seq=r,
                             interval_s=1.0)
            value = encode_batch([beat, columns_of(gpus)] if columnar else [beat, *gpus])
            now = T0 + r + 0.05
            out = stage.on_message(Place("vigil.telemetry.node", 0, 3 * r + i, now), value, now)
            assert out.dead_letters == []
            found += out.findings
            records += out.records
        found += stage.tick(T0 + r + 0.5)
    return finding_facts(found), records


def test_columns_find_what_per_gpu_events_find():
    per_gpu, columnar = run(False), run(True)
    assert columnar == per_gpu
    facts, records = columnar
    assert records == 24 * len(NODES) * (1 + 8)  # a heartbeat and 8 GPUs per node and round: one record a GPU
    raised = {(kind, node, gpu) for status, kind, _, node, gpu, *_ in facts if status == "raised"}
    # the planted faults, and nothing else
    assert raised == {("temperature_outlier", "n2", 5), ("throttle", "n2", 5), ("clock_below_peers", "n3", 2),
                      ("ecc_dbe", "n1", 3), ("nvlink_errors", "n3", 6), ("power_over_cap", "n1", 0),
                      ("temperature_outlier", "n1", 6)}
    [power] = [f for f in facts if f[1] == "power_over_cap" and f[0] == "raised"]
    assert dict(power[-1])["gpu"] == 0 and power[5] == from_seconds(T0 + 6)  # from the rows, as from the events
    cleared = {(kind, node, gpu) for status, kind, _, node, gpu, *_ in facts if status == "cleared"}
    assert {("temperature_outlier", "n2", 5), ("throttle", "n2", 5)} <= cleared  # n2's GPU 5 cooled down


def test_rows_read_like_the_per_gpu_events():
    rng = random.Random(3)
    samples = per_gpu_round(rng, 5, "n3", {"dbe": 0, "nvl": 4})
    cols = columns_of(samples)
    for row, per_gpu in zip(cols.rows(), samples):
        assert (row.event_type, row.event_time, row.version) == ("gpu_telemetry", per_gpu.event_time, 1)
        assert vars(row.source) == per_gpu.source.model_dump()
        assert {f: getattr(row, f) for f in GPU_FIGURES} == {f: getattr(per_gpu, f) for f in GPU_FIGURES}
    # the history's rows: one per GPU, the same columns as the per-GPU events but the ids, which are the
    # same for every delivery of the message and differ between GPUs
    again = decode(encode(cols)).events[0]
    ids = [r.event_id for r in as_stored([again], views=True)]
    assert ids == [t.event_id for t in cols.telemetry()] and len(set(ids)) == 8
    names, views = column_values("gpu_telemetry", as_stored([cols], views=True))
    _, models = column_values("gpu_telemetry", as_stored([cols]))
    _, originals = column_values("gpu_telemetry", samples)
    assert views == models
    ident = names.index("event_id")
    assert [c for i, c in enumerate(views) if i != ident] == [c for i, c in enumerate(originals) if i != ident]


def good(**change) -> dict:
    fields = dict(event_time=from_seconds(T0), source=Source(node="n1"), gpus=[0, 1],
                  utilization_pct=[97.0, None], sm_clock_mhz=[1980.0, 1975.0], nvlink_errors=[{}, {"crc": 2}])
    return {**fields, **change}


@pytest.mark.parametrize("field, value", [("utilization_pct", 101.0), ("sm_clock_mhz", -1.0),
                                          ("power_w", -0.5), ("ecc_dbe", -1), ("memory_used_bytes", 2**63),
                                          ("throttle_reasons", -4)])
def test_each_element_has_the_per_gpu_bounds(field, value):
    with pytest.raises(pydantic.ValidationError):
        GpuTelemetry(event_time=from_seconds(T0), source=Source(node="n1", gpu=0), **{field: value})
    with pytest.raises(pydantic.ValidationError):
        GpuSamples(**good(**{field: [None, value]}))


@pytest.mark.parametrize("change, why", [
    ({"sm_clock_mhz": [1980.0]}, "sm_clock_mhz has 1 elements, gpus has 2"),
    ({"nvlink_errors": [{}, {}, {}]}, "nvlink_errors has 3 elements"),
    ({"gpus": [1, 1]}, "names a GPU twice"),
    ({"source": Source(node="n1", gpu=0)}, "source.gpu must be unset"),
    ({"gpus": []}, "at least 1 item"),
    ({"gpus": [0, 1024]}, "less than or equal to 1023"),
])
def test_columns_must_align(change, why):
    with pytest.raises(pydantic.ValidationError, match=why):
        GpuSamples(**good(**change))


def test_accepted_on_the_gpu_and_node_topics_beside_the_per_gpu_event():
    from vigil.schemas import message_key, topic_accepts, topic_name

    cols = GpuSamples(**good())
    per_gpu = GpuTelemetry(event_time=from_seconds(T0), source=Source(node="n1", gpu=0), sm_clock_mhz=1980.0)
    for topic in ("vigil.telemetry.gpu", "vigil.telemetry.node"):
        d = decode(encode_batch([cols, per_gpu]), accept=topic_accepts(topic))
        assert d.errors == [] and [e.event_type for e in d.events] == ["gpu_samples", "gpu_telemetry"]
    assert decode(encode(cols), accept=topic_accepts("vigil.telemetry.heartbeats")).errors[0].reason == "wrong_topic"
    assert topic_name("gpu_samples", "vigil") == "vigil.telemetry.gpu" and message_key(cols) == b"n1"


def test_a_redelivered_message_is_routed_once():
    """The engine's duplicate check is on the message's event: a second delivery changes nothing."""
    engine = DetectionEngine(EngineParams())
    rng = random.Random(1)
    counts = {"dbe": 0, "nvl": 0}
    found = []
    for r in range(12):
        cols = columns_of(per_gpu_round(rng, r, "n2", counts))
        found += engine.on_events([cols], now=T0 + r + 0.05)
        assert engine.on_events([cols], now=T0 + r + 0.06) == []
        assert engine.on_events([GpuSamples(**{**cols.__dict__, "event_id": uuid.uuid4()})], now=T0 + r + 0.07) == []
    assert {(f.kind, f.subject.gpu) for f in found} == {("temperature_outlier", 5), ("throttle", 5)}
