"""A node back from repair or drain counts as capacity only once it passed its health check.

The decision engine's side (what the re-planner is given as healthy nodes) and the agent's
checks themselves (:mod:`vigil.producers.agent.health`) on known inputs: a disk with more or
less headroom than asked, a sysfs tree of RDMA ports in known states, and a stub NVML module
(no GPU here) with known error counters.
"""

from __future__ import annotations

import shutil

from vigil.producers.agent.health import health_checks, passed
from vigil.schemas import JobState, NodeState, Source, from_seconds
from vigil.streams.engine.decisions import DecisionEngine

T = from_seconds(1_700_000_000)


def state(node: str, what: str) -> NodeState:
    return NodeState(event_time=T, source=Source(node=node), state=what)


def planner():
    """A re-planner that records the healthy nodes it is given (the engine's capacity)."""
    seen: list[set[str]] = []

    def replan(jobs, healthy):
        seen.append(set(healthy))
        return {"allocations": {}}
    return replan, seen


def test_a_repaired_node_that_fails_its_check_stays_out_of_capacity_and_one_that_passes_comes_back():
    replan, seen = planner()
    eng = DecisionEngine(replan=replan)
    for n in ("n1", "n2", "n3"):
        eng.on_state(state(n, "joined"), 0)
    eng.on_state(state("n3", "drained"), 1)
    eng.on_state(state("n3", "repaired"), 2)           # back from repair: not yet checked
    eng.on_state(state("n3", "unhealthy"), 3)          # its agent's check failed
    eng.on_state(JobState(event_time=T, source=Source(job="a"), state="pending", gpus=24), 4)
    assert seen[-1] == {"n1", "n2"} and "n3" in eng.nodes_down
    (d,) = eng.on_state(state("n3", "joined"), 5)      # a later start passed the check
    assert d.action == "replan" and seen[-1] == {"n1", "n2", "n3"} and "n3" not in eng.nodes_down


def test_a_node_announced_repaired_is_no_capacity_before_its_check():
    """A node first heard of as ``repaired`` (the operator's word, the RMA desk's) waits for its agent's check."""
    replan, seen = planner()
    eng = DecisionEngine(replan=replan)
    eng.on_state(state("n1", "joined"), 0)
    eng.on_state(state("n9", "repaired"), 1)
    eng.on_state(JobState(event_time=T, source=Source(job="a"), state="pending", gpus=16), 2)
    assert seen[-1] == {"n1"}
    eng.on_state(state("n9", "unhealthy"), 3)
    eng.on_state(JobState(event_time=T, source=Source(job="a"), state="completed"), 4)
    assert seen[-1] == {"n1"}
    eng.on_state(state("n9", "joined"), 5)
    assert seen[-1] == {"n1", "n9"}


# -- the agent's checks ------------------------------------------------------------------------------


def test_health_disk_headroom_is_checked_against_what_is_asked(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert health_checks(disks=[tmp_path], min_free_bytes=0) == {f"disk:{tmp_path}": "ok"}
    asked = free + (1 << 50)  # 1 PiB more than there is
    (verdict,) = health_checks(disks=[tmp_path], min_free_bytes=asked).values()
    assert verdict.endswith(f" GiB free on {tmp_path}, below the {asked / 2**30:.1f} GiB needed")
    (missing,) = health_checks(disks=[tmp_path / "nope"], min_free_bytes=0).values()
    assert missing.startswith("cannot read") and not passed({"disk": missing})


def _port(root, dev: str, port: int, text: str) -> None:
    p = root / dev / "ports" / str(port)
    p.mkdir(parents=True)
    (p / "state").write_text(text + "\n")


def test_health_nic_check_reads_the_rdma_ports_state_from_sysfs(tmp_path):
    assert health_checks(nic_root=tmp_path / "absent") == {"nic": "ok"}  # no RDMA devices: nothing to check
    _port(tmp_path, "mlx5_0", 1, "4: ACTIVE")
    _port(tmp_path, "mlx5_1", 1, "4: ACTIVE")
    assert health_checks(nic_root=tmp_path) == {"nic": "ok"}
    _port(tmp_path, "mlx5_2", 1, "1: DOWN")
    _port(tmp_path, "mlx5_3", 2, "2: INIT")
    assert health_checks(nic_root=tmp_path) == {"nic": "ports not active: mlx5_2:1 1: DOWN, mlx5_3:2 2: INIT"}


class StubNvmlError(Exception):
    pass


class StubNvml:
    """pynvml's surface the check uses, with pynvml's constants: per GPU, pages pending retirement and
    uncorrected ECC counts by counter (volatile: since the last driver load; aggregate: its lifetime)."""

    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1

    def __init__(self, gpus: list[dict], fail_init: bool = False) -> None:
        self.gpus, self.fail_init, self.shutdowns = gpus, fail_init, 0

    def nvmlInit(self):
        if self.fail_init:
            raise StubNvmlError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        if self.gpus[h].get("pending") is None:
            raise StubNvmlError("Not Supported")
        return self.gpus[h]["pending"]

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        counts = self.gpus[h].get("dbe", {}) if error_type == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else {}
        return counts.get("volatile" if counter == self.NVML_VOLATILE_ECC else "aggregate", 0)


def test_health_gpu_check_on_stub_nvml_healthy_and_unsupported_queries_pass():
    nvml = StubNvml([{"pending": 0}, {"pending": None}])  # GPU 1 has no retirement query (an older GPU)
    assert health_checks(nvml=lambda: nvml) == {"gpu": "ok"} and nvml.shutdowns == 1


def test_health_gpu_check_on_stub_nvml_names_pending_retirement_and_uncorrected_errors():
    nvml = StubNvml([{"pending": 1}, {"pending": 0, "dbe": {"volatile": 2, "aggregate": 2}}])
    assert health_checks(nvml=lambda: nvml) == {
        "gpu": "GPU 0: retired pages pending (reset needed); GPU 1: 2 uncorrected ECC errors"}


def test_health_gpu_check_on_stub_nvml_counts_uncorrected_errors_since_the_reset_not_in_the_gpus_lifetime():
    """A GPU repaired by a reset (its bad pages retired) keeps its lifetime count: it must still pass."""
    nvml = StubNvml([{"pending": 0, "dbe": {"volatile": 0, "aggregate": 3}}])
    assert health_checks(nvml=lambda: nvml) == {"gpu": "ok"}


def test_health_gpu_check_on_stub_nvml_without_a_driver_fails():
    (verdict,) = health_checks(nvml=lambda: StubNvml([], fail_init=True)).values()
    assert verdict == "NVML unavailable: NVML Shared Library Not Found" and not passed({"gpu": verdict})
