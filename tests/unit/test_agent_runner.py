"""The agent runner: collectors fail independently, problems are reported once, process exits, no broker."""

from __future__ import annotations

import signal
import sys
import threading
import time
from datetime import datetime, timezone


from vigil.producers.agent import Agent, Collector, HeartbeatCollector, ProcessSupervisor
from vigil.producers.agent.process import PidWatcher
from vigil.producers.publisher import Publisher
from vigil.schemas import NODE_SAMPLES, GpuTelemetry, Heartbeat, NicCounters, ProcessExit, Source
from vigil.schemas.events import AgentHealth
from vigil.broker import free_port

SRC = Source(node="n1", cluster="c1")


class ListPublisher:
    def __init__(self) -> None:
        self.events: list = []
        self.messages: list = []  # (topic's event type or None for the group's own, events)
        self.lock = threading.Lock()

    def publish(self, events, topic_type=None) -> None:
        with self.lock:
            self.events.extend(events)
            self.messages.append((topic_type, list(events)))

    def poll(self, timeout_s: float = 0.0) -> None:
        time.sleep(min(timeout_s, 0.01))

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0


class Broken(Collector):
    name = "broken"

    def collect(self, now):
        raise OSError("sensor gone")


class Hanging(Collector):
    name = "hanging"

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.release = threading.Event()

    def collect(self, now):
        self.release.wait(10)
        return []


def wait_until(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_heartbeats_continue_while_other_collectors_fail_or_hang():
    pub = ListPublisher()
    hb = HeartbeatCollector(0.02, SRC)
    hang = Hanging(0.02, SRC)
    agent = Agent([hb, Broken(0.02, SRC), hang], pub, SRC)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, kwargs={"stop": stop})
    t.start()
    try:
        assert wait_until(lambda: sum(isinstance(e, Heartbeat) for e in pub.events) >= 10, 10)
        assert wait_until(lambda: agent.runs["broken"] >= 5, 10)
    finally:
        hang.release.set()
        stop.set()
        t.join(10)
    seqs = [e.seq for e in pub.events if isinstance(e, Heartbeat)]
    assert seqs == list(range(len(seqs)))
    health = [e for e in pub.events if isinstance(e, AgentHealth)]
    assert [(h.collector, h.status, h.problem) for h in health] == [("broken", "failed", "error:OSError")]
    assert "sensor gone" in health[0].detail


def test_supervisor_launches_ranks_like_torchrun_and_reports_exits(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, signal, sys\n"
        "open(os.path.join(sys.argv[1], 'env' + os.environ['LOCAL_RANK']), 'w').write("
        "','.join(os.environ[k] for k in ('RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE','MASTER_ADDR','MASTER_PORT','VIGIL_JOB','VIGIL_NODE')))\n"
        "lr = int(os.environ['LOCAL_RANK'])\n"
        "if lr == 1: sys.exit(3)\n"
        "if lr == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    src = Source(node="n1", job="job-9")
    sup = ProcessSupervisor(0.05, src, [sys.executable, str(script), str(tmp_path)], nproc=3, nnodes=2, node_rank=1,
                            master_addr="10.0.0.1", master_port=29511)
    pub = ListPublisher()
    agent = Agent([sup], pub, src, supervisor=sup)
    code = agent.run(duration_s=30)
    exits = sorted((e for e in pub.events if isinstance(e, ProcessExit)), key=lambda e: e.local_rank)
    assert [(e.local_rank, e.exit_code, e.signal) for e in exits] == [(0, 0, None), (1, 3, None), (2, None, signal.SIGKILL)]
    assert [e.source.rank for e in exits] == [3, 4, 5]
    assert code == 3
    env0 = (tmp_path / "env0").read_text().split(",")
    assert env0 == ["3", "0", "6", "3", "10.0.0.1", "29511", "job-9", "n1"]


def test_pid_watcher_reports_an_exit(tmp_path):
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    w = PidWatcher(0.05, SRC, [p.pid])
    now = datetime.now(timezone.utc)
    assert wait_until(lambda: w.collect(now) == [] and "sleep" in w._cmd.get(p.pid, ""), 10)
    p.kill()
    p.wait()
    (e,) = w.collect(now)
    assert isinstance(e, ProcessExit) and e.pid == p.pid and e.exit_code is None and "sleep" in e.command
    assert w.collect(now) == [] and w.done


def test_agent_runs_with_no_broker_at_all_and_spools(tmp_path):
    """No broker listening: the agent keeps collecting; heartbeats wait in the spool."""
    pub = Publisher({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, "t", spool_dir=tmp_path / "spool",
                    message_timeout_ms=1000, probe_interval_s=0.2)
    hb = HeartbeatCollector(0.05, SRC)
    agent = Agent([hb, Broken(0.05, SRC)], pub, SRC)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, kwargs={"stop": stop})
    t.start()
    try:
        # the spool also holds the agent's own health records, so count beats, not spool entries
        assert wait_until(lambda: hb.seq >= 10 and pub.spooling and pub.spool is not None and len(pub.spool) >= 10, 15)
    finally:
        stop.set()
        t.join(15)
    assert not t.is_alive()
    assert hb.seq >= 10


class GpuAndNic(Collector):
    """Stands in for the NVML and NIC collectors (no GPU here): one GPU sample and one port's counters."""

    name = "samples"

    def collect(self, now):
        return [GpuTelemetry(event_time=now, source=Source(node="n1", cluster="c1", gpu=0), sm_clock_mhz=1980.0),
                NicCounters(event_time=now, source=SRC, device="mlx5_0", port=1, counters={"np_cnp_sent": 1})]


def test_samples_ride_with_the_next_heartbeat_as_one_node_message():
    pub = ListPublisher()
    hb, samples = HeartbeatCollector(1.0, SRC), GpuAndNic(1.0, SRC)
    agent = Agent([hb, samples], pub, SRC)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    agent.publish(agent.run_once(samples, now))
    assert pub.messages == []  # waiting for the beat
    agent.publish(agent.run_once(hb, now))
    [(topic, events)] = pub.messages
    assert topic == NODE_SAMPLES
    assert sorted(e.event_type for e in events) == ["gpu_telemetry", "heartbeat", "nic_counters"]
    agent.publish(agent.run_once(hb, now))  # a beat with nothing waiting still goes to the node topic
    assert pub.messages[-1][0] == NODE_SAMPLES and [e.event_type for e in pub.messages[-1][1]] == ["heartbeat"]


def test_samples_do_not_wait_forever_for_a_late_heartbeat_and_stop_flushes_them():
    pub = ListPublisher()
    hb, samples = HeartbeatCollector(1.0, SRC), GpuAndNic(1.0, SRC)
    agent = Agent([hb, samples], pub, SRC)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    agent.publish(agent.run_once(samples, now))
    agent.flush_samples(older_than_s=agent.sample_wait_s)  # not that old yet
    assert pub.messages == []
    agent.flush_samples(older_than_s=0.0)  # what the run loop does once they waited 1.5 intervals
    assert sorted((t, e[0].event_type) for t, e in pub.messages) == [(None, "gpu_telemetry"), (None, "nic_counters")]
    agent.publish(agent.run_once(samples, now))
    agent.stop(flush_timeout_s=0.1)
    assert len(pub.events) == 4


def test_without_a_heartbeat_collector_samples_go_at_once():
    pub = ListPublisher()
    samples = GpuAndNic(1.0, SRC)
    agent = Agent([samples], pub, SRC)
    assert agent.sample_wait_s is None
    agent.publish(agent.run_once(samples, datetime(2026, 1, 1, tzinfo=timezone.utc)))
    assert sorted(e[0].event_type for _, e in pub.messages) == ["gpu_telemetry", "nic_counters"]


def test_a_run_that_overran_its_interval_is_followed_at_once_not_skipped():
    """A starved or slow run (a busy node) must not cost a beat: skipping one leaves a two-interval gap in the
    heartbeats, most of the way to the node being declared lost."""
    starts: list[float] = []

    class SlowOnce(Collector):
        name = "slow_once"

        def collect(self, now):
            starts.append(time.monotonic())
            if len(starts) == 2:
                time.sleep(0.6)  # overruns its 0.5 s interval
            return []

    agent = Agent([SlowOnce(0.5, SRC)], ListPublisher(), SRC)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, kwargs={"stop": stop})
    t.start()
    try:
        assert wait_until(lambda: len(starts) >= 3, 10)
    finally:
        stop.set()
        t.join(10)
    # skipping would start the third run an interval after the slow one ended (1.1 s after it began)
    assert starts[2] - starts[1] < 0.85, starts
