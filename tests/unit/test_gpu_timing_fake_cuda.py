"""The hooks' CUDA path on a FAKE CUDA device (stub: no GPU here), and why it exists.

:mod:`vigil.sim.fake_cuda` stands in for CUDA and NCCL, which cannot exist
on this machine: kernels and collectives are queued on streams and run
after their call returns, a synchronous collective makes the current stream
(not the host) wait, and the host learns how long anything took only by
synchronising. The truth is what each test asks the fake device to do; the
monitor must recover it from events alone, within 2 %, without ever
synchronising; the host-clock (CPU) path, run on the same fake, must not.
"""

from __future__ import annotations

import random

import pytest

from vigil.producers.training import CallbackSink, TrainingMonitor
from vigil.schemas import IterationTiming
from vigil.sim.fake_cuda import FakeCuda, FakeDDP, FakeNccl


class Group:
    def __init__(self, ranks):
        self.ranks = ranks


def workload(dev, nccl, mon, steps, rng, sync_every=1):
    """A tp all-reduce, a pipeline recv (marked wait), an async dp all-reduce overlapping compute.

    Returns the truth per step: compute, communication, wait (device seconds).
    """
    tp, dp = Group([0, 1]), Group([0, 2])
    mon.name_group(tp, "tp:0")
    mon.name_group(dp, "dp:0")
    truth = {}
    for step in range(steps):
        fwd, bwd, prep, opt = (rng.uniform(0.02, 0.05), rng.uniform(0.04, 0.1), rng.uniform(0.002, 0.01),
                               rng.uniform(0.005, 0.01))
        tp_c = (rng.uniform(0.0, 0.01), rng.uniform(0.002, 0.006))  # (waiting for the last peer, transfer)
        pp_w = (rng.uniform(0.005, 0.03), rng.uniform(0.0005, 0.001))
        dp_c = (rng.uniform(0.0, 0.02), rng.uniform(0.01, 0.03))
        with mon.step(step):
            dev.host_work(0.002)  # the host prepares the batch: the device idles, nothing to count
            with mon.compute():
                dev.kernel(fwd)
            nccl.script.append(tp_c)
            nccl.all_reduce("act", group=tp)
            with mon.pipeline_wait():
                nccl.script.append(pp_w)
                nccl.recv("act", src=0)
            with mon.compute():
                dev.kernel(bwd)
            nccl.script.append(dp_c)
            work = nccl.all_reduce("grads", group=dp, async_op=True)
            with mon.compute():
                dev.kernel(prep)  # overlaps the data-parallel all-reduce
            work.wait()
            with mon.compute():
                dev.kernel(opt)
            if (step + 1) % sync_every == 0:
                dev.sync_host()  # loss.item()
        # truth: the async all-reduce starts after the backward, runs peer wait + transfer
        truth[step] = {"compute": fwd + bwd + prep + opt, "comm": sum(tp_c) + sum(dp_c), "wait": sum(pp_w)}
    return truth


def run(timing, steps=40, seed=0, sync_every=1, **kw):
    dev = FakeCuda()
    nccl = FakeNccl(dev)
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, dp=0, pp=1, tp=0, clock=dev.clock,
                          timing=timing, events=dev, flush_interval_s=0.0, **kw)
    mon.instrument_collectives(nccl)
    syncs_before = dev.host_syncs
    truth = workload(dev, nccl, mon, steps, random.Random(seed), sync_every=sync_every)
    workload_syncs = dev.host_syncs - syncs_before
    mon.flush()
    its = {e.step: e for e in got if isinstance(e, IterationTiming)}
    return dev, mon, truth, its, workload_syncs


def test_fake_cuda_path_recovers_compute_comm_wait_within_2pct():
    dev, mon, truth, its, syncs = run("cuda")
    assert mon.timing_path == "cuda"
    assert set(its) == set(truth)
    for step, want in truth.items():
        it = its[step]
        assert it.compute_s == pytest.approx(want["compute"], rel=0.02), step
        assert it.communication_s == pytest.approx(want["comm"], rel=0.02), step
        assert it.wait_s == pytest.approx(want["wait"], rel=0.02), step
        assert it.measured == {"compute_s": "cuda_events", "communication_s": "cuda_events", "wait_s": "cuda_events"}
        assert set(it.communication_by_kind) == {"tp", "dp", "bubble"}  # the recv sits in a marked wait
    assert dev.host_syncs == syncs  # the monitor itself never synchronised


def test_fake_cuda_host_clock_path_is_wrong_on_the_same_device():
    """Why the CUDA path exists: around a CUDA call the host clock sees only its launch."""
    _dev, mon, truth, its, _ = run("cpu")
    assert mon.timing_path == "cpu"
    comm_err = [its[s].communication_s / t["comm"] for s, t in truth.items()]
    wait_err = [its[s].wait_s / t["wait"] for s, t in truth.items()]
    compute_err = [its[s].compute_s / t["compute"] for s, t in truth.items()]
    assert max(comm_err) < 0.05  # the collectives "took" microseconds
    assert max(wait_err) < 0.05  # and so did the pipeline wait
    assert max(compute_err) < 0.05  # the marked blocks only launched kernels
    # ... the device time went to the .item() that ended each step, which no figure covers
    assert all(its[s].duration_s > 0.9 * (t["compute"] + t["wait"]) for s, t in truth.items())


def test_fake_cuda_host_clock_remainder_counts_comm_and_wait_as_compute():
    """Without marked blocks the host path's compute is the step minus almost nothing."""
    dev = FakeCuda()
    nccl = FakeNccl(dev)
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, clock=dev.clock, timing="cpu",
                          flush_interval_s=0.0)
    mon.instrument_collectives(nccl)
    with mon.step(0):
        dev.kernel(0.05)
        nccl.script.append((0.03, 0.01))
        nccl.all_reduce("grads")
        dev.sync_host()
    (it,) = [e for e in got if isinstance(e, IterationTiming)]
    assert it.compute_s == pytest.approx(0.09, rel=0.01)  # 0.05 of compute + 0.04 of all-reduce
    assert it.communication_s < 1e-4
    assert it.measured["compute_s"] == "cpu_wall_remainder"


def test_fake_cuda_records_wait_for_their_events_without_synchronising():
    """The host runs ahead (synchronises every 5 steps): records leave once their events completed."""
    dev, mon, truth, its, syncs = run("cuda", steps=23, sync_every=5)
    assert dev.host_syncs == syncs
    # steps after the last host synchronisation (20..22) cannot be known yet: nothing blocked for them
    assert set(its) == set(range(20))
    for step in range(20):
        assert its[step].compute_s == pytest.approx(truth[step]["compute"], rel=0.02)
        assert its[step].communication_s == pytest.approx(truth[step]["comm"], rel=0.02)
    assert len(mon._pending) == 3
    got_after: list = []
    mon.sink = CallbackSink(got_after.extend)
    mon.close()  # closing may block (not the hot path): the last steps come out
    assert sorted(e.step for e in got_after if isinstance(e, IterationTiming)) == [20, 21, 22]


def test_fake_cuda_pending_steps_are_bounded_and_drops_counted():
    from vigil.schemas.events import EventsDropped

    dev = FakeCuda()
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, clock=dev.clock, timing="cuda", events=dev,
                          flush_interval_s=0.0, max_pending_steps=4)
    for step in range(10):  # a device far behind the host: nothing completes
        with mon.step(step):
            dev.kernel(10.0)
    mon.flush()
    assert not [e for e in got if isinstance(e, IterationTiming)]
    assert sum(e.count for e in got if isinstance(e, EventsDropped)) == 6
    assert len(mon._pending) == 4


def test_fake_cuda_ddp_comm_hook_times_overlapping_buckets_and_the_final_wait():
    dev = FakeCuda()
    nccl = FakeNccl(dev)
    got: list = []
    mon = TrainingMonitor(CallbackSink(got.extend), job="j", rank=0, clock=dev.clock, timing="cuda", events=dev,
                          flush_interval_s=0.0)
    mon.instrument_collectives(nccl)
    model = FakeDDP(dev)

    def user_hook(state, bucket):  # what torch's allreduce_hook does
        return nccl.all_reduce(bucket.buffer(), async_op=True).get_future()

    mon.register_ddp_comm_hook(model, hook=user_hook)
    rng = random.Random(3)
    for step in range(12):
        fwd = rng.uniform(0.02, 0.04)
        chunks = [rng.uniform(0.005, 0.02) for _ in range(4)]
        for _ in chunks:
            nccl.script.append((rng.uniform(0.0, 0.01), rng.uniform(0.004, 0.012)))
        first = len(nccl.log)
        with mon.step(step):
            with mon.compute():
                dev.kernel(fwd)
                model.backward(chunks)
            dev.sync_host()
        buckets = nccl.log[first:]
        assert len(buckets) == 4  # every bucket went through the hook
        union = []
        for _op, _g, s, e in sorted((b for b in buckets), key=lambda b: b[2]):
            if union and s <= union[-1][1]:
                union[-1][1] = max(union[-1][1], e)
            else:
                union.append([s, e])
        want_comm = sum(e - s for s, e in union)
        (it,) = [e for e in got if isinstance(e, IterationTiming) and e.step == step]
        assert it.communication_s == pytest.approx(want_comm, rel=0.02)
        # compute = the forward and every bucket's gradients; DDP's final wait is not compute
        assert it.compute_s == pytest.approx(fwd + sum(chunks), rel=0.02)
        assert it.communication_by_kind == {"dp": pytest.approx(want_comm, rel=0.02)}


def test_fake_cuda_a_second_ddp_hook_is_refused_with_advice():
    dev = FakeCuda()
    mon = TrainingMonitor(CallbackSink(lambda e: None), job="j", rank=0, clock=dev.clock, timing="cuda", events=dev)
    model = FakeDDP(dev)
    model.register_comm_hook(None, lambda s, b: None)
    with pytest.raises(RuntimeError, match="pass it as"):
        mon.register_ddp_comm_hook(model)
