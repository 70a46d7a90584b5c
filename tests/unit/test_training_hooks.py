"""Training hooks without a broker: steps, collectives (real torch.distributed, gloo, world of 1), sinks."""

from __future__ import annotations

import time

import pytest

from vigil.producers.training import CallbackSink, NodeBatcher, TrainingMonitor, UnixDatagramSink
from vigil.schemas import CollectiveCall, IterationTiming
from vigil.schemas.events import EventsDropped


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def make(clock=None, **kw):
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j1", rank=3, node="n1", dp=1, pp=0, tp=1,
                          clock=clock or time.time, **kw)
    return mon, got


class Messages:
    """A publisher for the node batcher that keeps each message it publishes (a list of events)."""

    def __init__(self) -> None:
        self.messages: list[list] = []

    def publish(self, events) -> None:
        self.messages.append(list(events))

    def poll(self, timeout_s: float = 0.0) -> None:
        pass


def test_step_records_compute_and_communication_with_coordinates():
    clock = FakeClock()
    mon, got = make(clock, flush_interval_s=0.0)
    with mon.step(7):
        clock.t += 0.30  # compute
        mon.record_collective("all_reduce", "dp:1", 1024, clock.t, clock.t + 0.10)
        clock.t += 0.10
    (it,) = [e for e in got if isinstance(e, IterationTiming)]
    assert (it.step, it.dp, it.pp, it.tp) == (7, 1, 0, 1)
    assert it.duration_s == pytest.approx(0.4) and it.communication_s == pytest.approx(0.1)
    assert it.compute_s == pytest.approx(0.3)
    assert (it.source.job, it.source.rank, it.source.node) == ("j1", 3, "n1")
    (cc,) = [e for e in got if isinstance(e, CollectiveCall)]
    assert (cc.op.value, cc.group, cc.nbytes) == ("all_reduce", "dp:1", 1024)


def test_explicit_compute_blocks_override_the_remainder():
    clock = FakeClock()
    mon, got = make(clock, flush_interval_s=0.0)
    with mon.step(0):
        with mon.compute():
            clock.t += 0.2
        clock.t += 0.5  # e.g. data loading: neither compute nor communication
    (it,) = got
    assert it.compute_s == pytest.approx(0.2) and it.communication_s == 0 and it.duration_s == pytest.approx(0.7)


def test_records_are_batched_per_flush_interval():
    clock = FakeClock()
    batches: list = []
    mon = TrainingMonitor(CallbackSink(batches.append), job="j", rank=0, clock=clock, flush_interval_s=1.0)
    for i in range(10):
        with mon.step(i):
            clock.t += 0.25
    # not one send per step; and a send at the step end after which the next would be late: none waits over 1 s
    assert [len(b) for b in batches] == [3, 3, 3]
    mon.flush()
    assert sum(len(b) for b in batches) == 10


@pytest.fixture
def gloo_world_of_one():
    import os

    import torch.distributed as dist
    from vigil.broker import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_real_torch_distributed_collectives_are_instrumented(gloo_world_of_one):
    import torch

    dist = gloo_world_of_one
    mon, got = make(flush_interval_s=0.0)
    original = dist.all_reduce
    mon.instrument_collectives(dist)
    try:
        group = dist.new_group([0])
        mon.name_group(group, "tp:0")
        t = torch.ones(256)
        with mon.step(0):
            dist.all_reduce(t)
            dist.all_reduce(t, group=group)
            dist.broadcast(t, 0)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            dist.barrier()
            out = [torch.empty(256)]
            dist.all_gather(out, t)
    finally:
        mon.uninstrument_collectives()
    assert dist.all_reduce is original
    calls = [e for e in got if isinstance(e, CollectiveCall)]
    assert [(c.op.value, c.group) for c in calls] == [
        ("all_reduce", "world"), ("all_reduce", "tp:0"), ("broadcast", "world"), ("all_reduce", "world"),
        ("barrier", "world"), ("all_gather", "world")]
    assert calls[0].nbytes == 1024 and calls[4].nbytes == 0 and calls[5].nbytes == 1024
    assert all(c.end >= c.start for c in calls)
    (it,) = [e for e in got if isinstance(e, IterationTiming)]
    assert it.communication_s == pytest.approx(sum((c.end - c.start).total_seconds() for c in calls), abs=1e-3)


def test_datagram_sink_to_node_batcher_batches_by_type_and_key(tmp_path):
    pub = Messages()
    published = pub.messages
    batcher = NodeBatcher(tmp_path / "h.sock", pub, max_delay_s=0.05)
    clock = FakeClock()
    mons = [TrainingMonitor(UnixDatagramSink(str(tmp_path / "h.sock")), job="j", rank=r, node="n", clock=clock,
                            flush_interval_s=0.0) for r in range(4)]
    for step in range(3):
        for m in mons:
            with m.step(step):
                m.record_collective("all_reduce", "world", 8, clock.t, clock.t + 0.01)
                clock.t += 0.01
    for _ in range(40):
        batcher.step(time.monotonic())
        for m in mons:  # what the kernel's datagram queue could not take waits in the sink
            m.flush()
        if sum(len(g) for g in published) >= 24:
            break
    batcher.stop()
    # 4 ranks x 3 steps of iterations and of collectives -> a handful of messages, one per (type, job)
    kinds = {(g[0].event_type, len({e.source.rank for e in g})) for g in published}
    assert sum(len(g) for g in published) == 24
    assert all(len({e.event_type for e in g}) == 1 for g in published)
    assert len(published) < 24 and ("iteration", 4) in kinds


def test_a_second_batcher_refuses_a_socket_someone_receives_on_and_takes_a_stale_one(tmp_path):
    """A per-job agent started on a node whose daemon listens on the hooks socket used to unlink it and bind its
    own: the daemon's hooks went to the job's agent, and nowhere once it exited."""
    import socket as socket_

    path = tmp_path / "h.sock"
    first = NodeBatcher(path, Messages())
    try:
        with pytest.raises(ValueError, match="already receives the training hooks on .*h.sock"):
            NodeBatcher(path, Messages())
        probe = socket_.socket(socket_.AF_UNIX, socket_.SOCK_DGRAM)
        probe.sendto(b"still the first's", str(path))  # the first still receives on its socket
        probe.close()
        assert first._sock.recv(100) == b"still the first's"
    finally:
        first.stop()
    stale = socket_.socket(socket_.AF_UNIX, socket_.SOCK_DGRAM)  # bound, then its process died without unlinking
    stale.bind(str(path))
    stale.close()
    assert path.is_socket()
    NodeBatcher(path, Messages()).stop()


def test_datagram_sink_without_batcher_keeps_records_and_reports_drops(tmp_path):
    path = str(tmp_path / "later.sock")
    sink = UnixDatagramSink(path, max_pending=3)
    mon = TrainingMonitor(sink, job="j", rank=0, flush_interval_s=0.0)
    for i in range(5):
        with mon.step(i):
            pass
    assert sink.pending == 3  # two oldest dropped, counted
    published: list = []

    class Pub:
        def publish(self, events):
            published.extend(events)

        def poll(self, timeout_s=0.0):
            pass

    batcher = NodeBatcher(path, Pub())
    with mon.step(5):
        pass
    for _ in range(10):
        batcher.step(time.monotonic())
    batcher.stop()
    drops = [e for e in published if isinstance(e, EventsDropped)]
    assert [(d.count, d.reason) for d in drops] == [(2, "hook_buffer_full")]
    assert sorted(e.step for e in published if isinstance(e, IterationTiming)) == [2, 3, 4, 5]


# -- a change of configuration announced by the training process ------------------------------------------------------

class RecordSink:
    """The raw records as they leave the process (what a node agent reads)."""

    def __init__(self) -> None:
        self.records: list = []
        self.source: dict = {}

    def send(self, source, records, urgent=False):
        self.source = source
        self.records += records

    def close(self):
        pass


def test_a_change_announced_between_steps_rides_on_the_next_step_only():
    clock = FakeClock()
    mon, got = make(clock, flush_interval_s=0.0)
    for step in range(4):
        if step == 2:
            mon.note_change("sequence length 4k -> 8k")
        with mon.step(step):
            clock.t += 1.0
    its = {e.step: e.config_change for e in got if isinstance(e, IterationTiming)}
    assert its == {0: None, 1: None, 2: "sequence length 4k -> 8k", 3: None}


def test_a_change_announced_inside_a_step_rides_on_that_step_and_two_are_both_named():
    clock = FakeClock()
    mon, got = make(clock, flush_interval_s=0.0)
    with mon.step(0):
        mon.note_change("dp 8 -> 16")
        mon.note_change("global batch 2M tokens")
        clock.t += 1.0
    with mon.step(1):
        clock.t += 1.0
    assert [e.config_change for e in got] == ["dp 8 -> 16; global batch 2M tokens", None]


def test_a_long_reason_is_cut_and_an_empty_one_refused():
    mon, got = make(FakeClock(), flush_interval_s=0.0)
    with pytest.raises(ValueError, match="reason"):
        mon.note_change("  ")
    with pytest.raises(ValueError, match="reason"):
        mon.note_change(None)  # type: ignore[arg-type]
    mon.note_change("x" * 5000)
    with mon.step(0):
        pass
    assert got[0].config_change == "x" * 2000


def test_a_step_with_no_change_leaves_as_the_twelve_fields_an_older_agent_reads():
    from vigil.producers.training.wire import records_to_events

    clock = FakeClock()
    sink = RecordSink()
    mon = TrainingMonitor(sink, job="j", rank=0, node="n1", clock=clock, flush_interval_s=0.0)
    with mon.step(0):
        clock.t += 1.0
    mon.note_change("resized")
    with mon.step(1):
        clock.t += 1.0
    its = [r for r in sink.records if r[0] == "it"]
    assert [len(r) for r in its] == [12, 13]
    events, errors = records_to_events(sink.source, its + [its[0][:9]])  # and one from hooks before wait_s
    assert errors == [] and [e.config_change for e in events] == [None, "resized", None]
    _, errors = records_to_events(sink.source, [its[1] + ["extra"]])
    assert errors and "13 fields" in errors[0]


def test_on_the_cuda_path_the_change_waits_with_its_step_and_survives_a_dropped_step():
    from vigil.sim.fake_cuda import FakeCuda

    dev = FakeCuda()
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, clock=dev.clock, timing="cuda", events=dev,
                          flush_interval_s=0.0, max_pending_steps=2)
    for step in range(5):  # the device far behind: steps 0..2 are dropped, 3 and 4 wait
        if step == 1:
            mon.note_change("pp 2 -> 4")
        with mon.step(step):
            dev.kernel(10.0)
    dev.sync_host()
    mon.flush()
    its = {e.step: e.config_change for e in got if isinstance(e, IterationTiming)}
    assert its == {3: "pp 2 -> 4", 4: None}  # step 1's change passed on to the oldest step left


def test_a_step_every_local_rank_reported_leaves_at_once_and_a_partial_one_waits_for_the_delay(tmp_path):
    """The batcher used to hold every step for its 0.2 s delay: latency in each hang and fail-slow alert."""
    from vigil.producers.training.wire import Sink, encode_datagram

    sent: list = []

    class Raw(Sink):  # what a rank would put in its datagrams
        def send(self, source, records, urgent=False):
            sent.append((source, records))

    pub = Messages()
    published = pub.messages
    batcher = NodeBatcher(tmp_path / "h.sock", pub, max_delay_s=10.0, min_gap_s=1.0)
    try:
        mons = [TrainingMonitor(Raw(), job="j", rank=r, node="n", clock=FakeClock(), flush_interval_s=0.0)
                for r in range(2)]
        for step in range(2):
            for m in mons:
                with m.step(step):
                    m._clock.t += 0.1
        datagrams = [encode_datagram(src, recs) for src, recs in sent]
        steps_of = lambda: sorted((e.source.rank, e.step) for g in published for e in g  # noqa: E731
                                  if e.event_type == "iteration")
        t = 100.0
        for d in datagrams[:3]:  # rank 0 steps 0 and 1, rank 1 step 0: step 0 is complete
            batcher._ingest(d, t)
        batcher.step(t)
        assert steps_of() == [(0, 0), (0, 1), (1, 0)]
        batcher._ingest(datagrams[3], t + 0.5)  # rank 1 step 1: complete, but within min_gap of the last send
        batcher.step(t + 0.5)
        assert len(steps_of()) == 3
        batcher.step(t + 1.0)
        assert steps_of() == [(0, 0), (0, 1), (1, 0), (1, 1)]
        batcher._ingest(encode_datagram(*sent[0]), t + 5.0)  # only rank 0 (a re-sent step 0): not complete
        batcher.step(t + 6.0)
        assert len(steps_of()) == 4
    finally:
        batcher.stop()
