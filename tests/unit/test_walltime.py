"""The walltime rules (grace, due, deadlines, the scheduler's answers) and the run-chain watch; time is an argument."""

from __future__ import annotations

import subprocess

import pytest

from vigil.detectors.chain import RunChain
from vigil.producers.agent.walltime import EXIT_S, due, grace_s, parse_deadline, queued_successors, slurm_end_time
from vigil.schemas import JobState, Source, from_seconds


def test_grace_is_safety_times_longest_step_plus_checkpoint_plus_the_exit():
    # steps of 1.5 s and 2.0 s, checkpoints of 40 s and 55 s: the longest of each, twice
    assert grace_s(2.0, 55.0) == pytest.approx(2 * (2.0 + 55.0) + EXIT_S)
    assert grace_s(2.0, 55.0, safety=3.0) == pytest.approx(3 * 57.0 + EXIT_S)
    assert grace_s(2.0, 55.0, exit_s=0.0) == pytest.approx(2 * 57.0)
    # before the hooks measured anything the operator's estimate stands in
    assert grace_s(2.0, None, default_checkpoint_s=120.0) == pytest.approx(2 * 122.0 + EXIT_S)
    with pytest.raises(ValueError):
        grace_s(1.0, 1.0, safety=0.5)


def test_due_when_time_left_falls_below_grace():
    deadline, grace = 10_000.0, grace_s(2.0, 55.0)  # 117 s
    assert not due(deadline, deadline - 117.1, grace)
    assert due(deadline, deadline - 117.0, grace)
    assert due(deadline, deadline + 5.0, grace)  # past it: at once
    assert not due(None, 1e12, grace)  # no known end: never


def test_deadline_forms():
    assert parse_deadline("+90m", 1000.0) == 1000.0 + 5400
    assert parse_deadline("1795566000", 0.0) == 1795566000.0
    assert parse_deadline("2026-11-25T00:00:00+00:00", 0.0) == 1795564800.0
    with pytest.raises(ValueError, match="not a deadline"):
        parse_deadline("tomorrow", 0.0)


def _squeue(stdout: str, code: int = 0):
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, code, stdout=stdout, stderr="")
    return run, calls


def test_end_time_from_the_environment_then_squeue():
    assert slurm_end_time({"SLURM_JOB_END_TIME": "1795566000"}) == 1795566000.0
    run, calls = _squeue("N/A\n")
    assert slurm_end_time({"SLURM_JOB_ID": "7"}, run=run) is None and calls[0][:4] == ["squeue", "-h", "-j", "7"]
    run, _ = _squeue("", code=1)
    assert slurm_end_time({"SLURM_JOB_ID": "7"}, run=run) is None


def test_queued_successors_of_an_array_and_of_a_named_chain():
    run, calls = _squeue("4711_3\n")
    assert queued_successors({"SLURM_JOB_ID": "4712", "SLURM_ARRAY_JOB_ID": "4711"}, run=run) == ["4711_3"]
    assert "-r" in calls[0] and "PENDING" in calls[0]
    run, calls = _squeue("900\n901\n")
    env = {"SLURM_JOB_ID": "900", "SLURM_JOB_NAME": "llm", "USER": "ada"}
    assert queued_successors(env, run=run) == ["901"]  # itself is not its successor
    assert queued_successors({"SLURM_JOB_ID": "1"}, run=run) == []  # nothing names the chain


def _state(job: str, state: str, t: float, run: str = "r", step: int | None = None) -> JobState:
    return JobState(event_time=from_seconds(t), source=Source(job=job), state=state, run=run, checkpoint_step=step)


def test_chain_broken_after_timeout_and_cleared_by_the_next_job():
    chain = RunChain(timeout_s=600.0)
    chain.observe(_state("1", "running", 0.0), now=0.0)
    chain.observe(_state("1", "time_limit", 1000.0, step=480), now=1000.0)
    assert chain.tick(1599.9) == []
    (status, run, f), = chain.tick(1600.0)
    assert (status, run, f.kind, f.severity, f.onset) == ("raised", "r", "chain_broken", 2, 1000.0)
    assert f.evidence["checkpoint_step"] == 480 and f.evidence["last_job"] == "1"
    assert chain.tick(1700.0) == []  # raised once
    chain.observe(_state("2", "running", 1800.0), now=1800.0)
    assert [(s, r) for s, r, _ in chain.tick(1800.0)] == [("cleared", "r")]


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_a_run_that_ended_is_no_broken_chain(ending):
    chain = RunChain(timeout_s=10.0)
    chain.observe(_state("1", ending, 0.0), now=0.0)
    assert chain.tick(1e6) == []


def test_a_queued_successor_keeps_the_chain_alive_and_its_start_replaces_it():
    chain = RunChain(timeout_s=10.0)
    chain.observe(_state("4711_2", "pending", 0.0), now=0.0)  # announced by the job that left
    chain.observe(_state("4712", "time_limit", 0.0), now=0.0)
    assert chain.tick(1e4) == []  # queued, within the day a queued job may wait
    chain.observe(_state("4713", "running", 2e4), now=2e4)  # the array element runs under its own id
    chain.observe(_state("4713", "time_limit", 3e4), now=3e4)  # and leaves with nothing queued
    assert [s for s, _, _ in chain.tick(3e4 + 10.0)] == ["raised"]


def test_jobs_without_a_run_and_old_breaks_are_ignored():
    chain = RunChain(timeout_s=10.0, horizon_s=100.0)
    chain.observe(JobState(event_time=from_seconds(0.0), source=Source(job="x"), state="time_limit"), now=0.0)
    chain.observe(_state("1", "time_limit", 0.0), now=5000.0)  # read from an old log, long after
    assert chain.tick(5000.0) == []


def test_a_queued_successor_that_never_starts_breaks_the_chain():
    # the next array element was announced queued, then cancelled or dropped by the scheduler: no agent ever
    # runs for it, so nothing more is heard; past the queued job's lifetime the chain is broken
    chain = RunChain(timeout_s=600.0, pending_timeout_s=7200.0)
    chain.observe(_state("4712", "time_limit", 1000.0, step=900), now=1000.0)
    chain.observe(_state("4711_3", "pending", 1000.0), now=1000.0)
    assert chain.tick(1000.0 + 600.0) == []  # queued: past the chain timeout, still alive
    assert chain.tick(1000.0 + 7199.9) == []
    (status, run, f), = chain.tick(1000.0 + 7200.0)
    assert (status, run, f.kind, f.onset) == ("raised", "r", "chain_broken", 1000.0)
    assert f.evidence["queued_jobs"] == ["4711_3"] and f.evidence["checkpoint_step"] == 900
    assert chain.tick(1e5) == []  # raised once
    # the same announcement read again (a redelivery) does not clear it only for it to be raised again
    chain.observe(_state("4711_3", "pending", 1000.0), now=1e5)
    assert chain.tick(1e5) == [] and chain.broken() == ["r"]


def test_a_queued_successor_reported_cancelled_breaks_the_chain_and_does_not_end_the_run():
    chain = RunChain(timeout_s=600.0)
    chain.observe(_state("4711_3", "pending", 1000.0), now=1000.0)  # announced before or after the leaver
    chain.observe(_state("4712", "preempted", 1000.0, step=50), now=1000.0)
    chain.observe(_state("4711_3", "cancelled", 1200.0), now=1200.0)  # it never ran
    assert chain.tick(1599.9) == []
    (status, _, f), = chain.tick(1600.0)
    assert status == "raised" and f.evidence["last_job"] == "4712" and f.evidence["queued_jobs"] == []


def test_a_queued_successor_that_starts_keeps_the_chain_quiet():
    chain = RunChain(timeout_s=600.0, pending_timeout_s=7200.0)
    chain.observe(_state("4712", "time_limit", 1000.0), now=1000.0)
    chain.observe(_state("4711_3", "pending", 1000.0), now=1000.0)
    chain.observe(_state("4713", "running", 5000.0), now=5000.0)  # the element runs under its own id
    assert chain.tick(5000.0) == [] and chain.tick(1000.0 + 7200.0 + 1.0) == [] and chain.tick(1e6) == []
    assert chain.broken() == []
    # a successor announced late, after the break was raised, clears it
    chain = RunChain(timeout_s=600.0, pending_timeout_s=7200.0)
    chain.observe(_state("4712", "time_limit", 0.0), now=0.0)
    assert [s for s, _, _ in chain.tick(600.0)] == ["raised"]
    chain.observe(_state("4711_3", "pending", 700.0), now=700.0)
    assert [s for s, _, _ in chain.tick(700.0)] == ["cleared"]
    chain.observe(_state("4713", "running", 800.0), now=800.0)
    assert chain.tick(1e5) == []


def test_the_chain_settings_reach_the_watch_and_unset_ones_leave_its_defaults(monkeypatch):
    from vigil.settings import Settings

    monkeypatch.setenv("VIGIL_CHAIN_PENDING_TIMEOUT_S", "3600")
    chain = RunChain(**Settings().stream_config("k:9092").chain)
    assert chain.pending_timeout_s == 3600.0 and chain.timeout_s == RunChain().timeout_s


def test_the_batcher_learns_the_longest_step_and_checkpoint_the_grace_is_computed_from(tmp_path):
    """Known step and checkpoint durations, through the hooks' real datagrams, in; ``timings`` out."""
    import time

    from vigil.producers.training import NodeBatcher, TrainingMonitor, UnixDatagramSink

    class Pub:
        def publish(self, events):
            pass

        def poll(self, timeout_s=0.0):
            pass

    class Clock:
        t = 1_700_000_000.0

        def __call__(self):
            return self.t

    batcher = NodeBatcher(tmp_path / "h.sock", Pub(), max_delay_s=0.0)
    clock = Clock()

    def mon(job, rank):
        return TrainingMonitor(UnixDatagramSink(str(tmp_path / "h.sock")), job=job, rank=rank, node="n",
                               clock=clock, flush_interval_s=0.0)

    def run(m, step_s=(), ckpts=()):
        """Steps of the given durations, then checkpoints ``(step, seconds, ok)``; delivered before returning."""
        for i, d in enumerate(step_s):
            with m.step(i):
                clock.t += d
        for step, d, ok in ckpts:
            try:
                with m.checkpoint(step):
                    clock.t += d
                    if not ok:
                        raise OSError("disk full")
            except OSError:
                pass
        m.flush()
        before = batcher.received
        deadline = time.monotonic() + 10.0
        while batcher.received == before and time.monotonic() < deadline:
            batcher.step(time.monotonic())
        for _ in range(3):  # what else the kernel queued
            batcher.step(time.monotonic())

    try:
        assert batcher.timings("j") == (None, None, None)  # nothing measured: the grace's defaults stand in
        r0, r1, other = mon("j", 0), mon("j", 1), mon("k", 0)
        run(r0, step_s=[0.5, 1.25, 0.75], ckpts=[(10, 3.0, True)])
        saved_at = clock.t
        run(r1, step_s=[2.0, 0.25], ckpts=[(20, 7.5, True), (30, 100.0, False)])  # a failed save is no measure
        run(other, step_s=[50.0], ckpts=[(5, 60.0, True)])  # another job's are its own
        run(r0, ckpts=[(40, 4.0, True)])
        step_s, ckpt_s, last = batcher.timings("j")
        assert step_s == pytest.approx(2.0) and ckpt_s == pytest.approx(7.5)
        assert last[0] == 40 and last[1] == pytest.approx(4.0)  # the latest completed save, not the longest
        assert grace_s(step_s, ckpt_s) == pytest.approx(2 * (2.0 + 7.5) + EXIT_S)
        k_step, k_ckpt, k_last = batcher.timings("k")
        assert (k_step, k_ckpt, k_last[0]) == (pytest.approx(50.0), pytest.approx(60.0), 5)
        # rank 1's last completed save was before rank 0's latest; both saved since rank 0's first
        assert batcher.saved_since("j", saved_at, [0, 1]) and not batcher.saved_since("j", clock.t - 1.0, [0, 1])
    finally:
        batcher.stop()
