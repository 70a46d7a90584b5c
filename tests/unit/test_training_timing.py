"""The hooks' step split on the host-clock (CPU) path, the wire format of its records, and the hang watchdog.

Simulated clocks throughout: each test advances time by what the code under
test is said to have done, so the expected figures are that arithmetic.
"""

from __future__ import annotations

import random
import threading

import pytest

from vigil.producers.training import CallbackSink, TrainingMonitor
from vigil.producers.training.timing import BLOCKED, COLLECTIVE, COMPUTE, WAIT, merge, minus_length, split_step, union_length
from vigil.producers.training.wire import Sink, records_to_events
from vigil.schemas import IterationTiming
from vigil.schemas.events import FlightRecorderDump


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


class Dist:
    """torch.distributed's functions on a simulated clock: each call lasts ``next_s``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.next_s = 0.0

    def _take(self, *a, **k):
        self.clock.t += self.next_s
        self.next_s = 0.0

    all_reduce = send = recv = _take

    def get_world_size(self):
        return 8

    def get_process_group_ranks(self, group):
        return [0, 1]


def _exact_minus(a, b):
    """|union(a) - union(b)| by sweeping every boundary (an independent computation)."""
    pts = sorted({x for iv in a + b for x in iv})
    total = 0.0
    for lo, hi in zip(pts, pts[1:]):
        mid = (lo + hi) / 2
        if any(s <= mid < e for s, e in a) and not any(s <= mid < e for s, e in b):
            total += hi - lo
    return total


def test_interval_arithmetic_against_a_sweep():
    rng = random.Random(4)
    for _ in range(500):
        a = [(x, x + rng.uniform(0, 3)) for x in (rng.uniform(0, 10) for _ in range(rng.randint(0, 6)))]
        b = [(x, x + rng.uniform(0, 3)) for x in (rng.uniform(0, 10) for _ in range(rng.randint(0, 6)))]
        assert minus_length(a, b) == pytest.approx(_exact_minus(a, b), abs=1e-9)
        assert union_length(a) == pytest.approx(_exact_minus(a, []), abs=1e-9)
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]


def test_split_without_marks_is_the_remainder_and_says_so():
    iv = [(COLLECTIVE | BLOCKED, 1.0, 1.5, "dp"), (WAIT | BLOCKED, 2.0, 2.25, "pp"), (COMPUTE, 99, 99, None)]
    s = split_step((0.0, 3.0), iv[:2], source="cuda_events")
    assert (s.compute_s, s.communication_s, s.wait_s) == (2.25, 0.5, 0.25)
    assert s.measured["compute_s"] == "cuda_events_remainder" and s.measured["wait_s"] == "cuda_events"


def make(**kw):
    clock = Clock()
    dist = Dist(clock)
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=1, dp=0, pp=1, tp=0, clock=clock,
                          flush_interval_s=0.0, **kw)
    mon.instrument_collectives(dist)
    return mon, clock, dist, got


def test_cpu_path_step_with_marks_collectives_p2p_and_a_marked_bubble():
    mon, clock, dist, got = make()
    tp = object()
    mon.name_group(tp, "tp:0")
    with mon.step(3):
        clock.t += 0.010  # data loading: unmarked, in no figure
        with mon.pipeline_wait():  # the schedule's warm-up bubble
            clock.t += 0.200
        with mon.compute():
            clock.t += 0.300
        dist.next_s = 0.050
        dist.all_reduce("x", group=tp)
        dist.next_s = 0.040
        dist.recv("x", 0)  # point-to-point: wait, kind pp
        with mon.compute():
            clock.t += 0.100
        with mon.pipeline_wait():
            dist.next_s = 0.070
            dist.recv("x", 0)  # inside a marked block: recorded, its time is the block's
    (it,) = [e for e in got if isinstance(e, IterationTiming)]
    assert it.compute_s == pytest.approx(0.400)
    assert it.communication_s == pytest.approx(0.050)
    assert it.wait_s == pytest.approx(0.200 + 0.040 + 0.070)
    assert it.communication_by_kind == pytest.approx({"tp": 0.050, "pp": 0.040, "bubble": 0.270})
    assert it.measured == {"compute_s": "cpu_wall", "communication_s": "cpu_wall", "wait_s": "cpu_wall"}
    assert it.duration_s == pytest.approx(0.770)
    calls = [e for e in got if e.event_type == "collective"]
    assert [(c.op.value, c.group) for c in calls] == [("all_reduce", "tp:0"), ("recv", "world"), ("recv", "world")]


def test_host_times_given_by_a_framework_are_collectives_and_waits():
    mon, clock, dist, got = make()
    with mon.step(0):
        t0 = clock.t
        clock.t += 1.0
        mon.record_collective("all_reduce", "dp:0", 10, t0 + 0.2, t0 + 0.5)
        mon.record_wait(t0 + 0.6, t0 + 0.7)
    (it,) = [e for e in got if isinstance(e, IterationTiming)]
    assert (it.compute_s, it.communication_s, it.wait_s) == pytest.approx((0.6, 0.3, 0.1), abs=1e-6)
    assert it.measured["compute_s"] == "cpu_wall_remainder"


def test_records_of_earlier_hooks_still_decode():
    src = {"cluster": "c", "node": "n", "job": "j", "rank": 0, "gpu": None}
    old = ["it", 1, 100.0, 101.0, 0.7, 0.3, 0, 0, 0]
    new = ["it", 2, 101.0, 102.0, 0.6, 0.3, 0, 0, 0, 0.1, {"dp": 0.3}, {"compute_s": "cpu_wall"}]
    (a, b), errors = records_to_events(src, [old, new])
    assert not errors
    assert a.wait_s is None and a.measured == {} and a.communication_by_kind == {}
    assert b.wait_s == 0.1 and b.communication_by_kind == {"dp": 0.3} and b.measured == {"compute_s": "cpu_wall"}
    _, errors = records_to_events(src, [old + [1]])
    assert errors and "9, 12 or 13 fields" in errors[0]


def test_timing_argument_is_checked_and_auto_stays_cpu_on_gloo():
    with pytest.raises(ValueError, match="timing"):
        TrainingMonitor(CallbackSink(lambda e: None), job="j", rank=0, timing="gpu")
    mon, *_ = make()
    assert mon.timing_path == "cpu"  # Dist.get_backend is absent: not NCCL


class _Events(Sink):
    def __init__(self) -> None:
        self.records: list = []
        self.dumped = threading.Event()

    def send(self, source, records, urgent=False):
        self.records.extend(records)
        if any(r[0] == "fr" for r in records):
            self.dumped.set()


def test_hang_watchdog_dumps_once_when_a_step_stays_open():
    clock = Clock()
    sink = _Events()
    mon = TrainingMonitor(sink, job="j", rank=0, clock=clock, flush_interval_s=0.0)
    for step in range(4):
        with mon.step(step):
            clock.t += 1.0
    mon.start_hang_watchdog(factor=3.0, min_timeout_s=0.0, poll_s=0.01, warmup_steps=3)
    try:
        with mon.step(4):
            clock.t += 2.5  # below 3 x the 1 s median: nothing
            assert not sink.dumped.wait(0.1)
            clock.t += 1.0  # 3.5 s: a hang
            assert sink.dumped.wait(10.0)
    finally:
        mon.stop_hang_watchdog()
    frs = [r for r in sink.records if r[0] == "fr"]
    assert len(frs) == 1 and frs[0][2]["trigger"] == "hang"
    (ev,), errors = records_to_events(mon.source, frs)
    assert not errors and isinstance(ev, FlightRecorderDump)
    # with no process group the payload says why there is no dump instead of failing; the recorder's buffer
    # is the process's, so after an earlier test's collectives in this process it holds those instead
    assert (ev.available is False and ev.unavailable_reason) or (ev.available and ev.entries_total > 0)
