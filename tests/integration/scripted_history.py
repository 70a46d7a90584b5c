"""A small scripted failure history whose every analytic answer is known by hand.

Two days of a 16-node cluster (``lab``), from ``T0`` (2026-03-02 00:00 UTC):

- ``ettr-small`` (8 GPUs on n00): running at T0, a 60 s set-up, steps 0..59 of
  10 s each; its process exits at T0+665 s (during step 60); restarted 240 s
  later from the checkpoint of step 50, it re-runs steps 50..99 and completes
  at T0+1400 s. Productive 100 x 10 s = 1000 s of 1400 s available:
  **ETTR = 1000/1400**. Over the window [T0+600, T0+1000) only the final runs
  of steps 50..59 count (100 s of 400 s): **ETTR = 0.25**.
- ``big-a`` (64 GPUs on n08..n15) for day 1 and ``big-b`` (128 GPUs on all 16
  nodes) for day 2, with fail-stop incidents of every domain, a fail-slow
  incident of known size, a warning and an incident of vigil's own.
- ``n13`` fails six times on day 2: the planted **lemon**.
- ``dies-c`` (16 GPUs on n04, n05) starts at T0+2000 and trains from T0+2060:
  steps 0..39 of 10 s, then GPU 3 of n05 clocks below its peers at T0+2460
  and steps 40..63 take 12.5 s (a 25 % slowdown, 300 s: **60 s lost**), steps
  64..93 of 10 s again; at T0+3060 it hangs and trains no more. Its
  scheduler fails it at T0+3660. Productive 1000 s of 1660 s available:
  **ETTR = 1000/1660**, not 1.0 although every step it ran was kept. The
  GPU's incident is rooted at the GPU (kind ``clock_below_peers``, no job);
  its second version adds the job's fail-slow, as the correlator does.

Every node sends a heartbeat every 10 minutes for the two days. The
incidents are listed in :data:`INCIDENTS` with what the views must say about
them; the tests derive the expected counts from that list, not from the code
under test.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from vigil.schemas import (
    ActionResult, Alert, Decision, Heartbeat, IterationStep, JobState, Slowdown, Source, Subject, XidError,
)
from vigil.schemas.envelope import Envelope

T0 = datetime(2026, 3, 2, tzinfo=timezone.utc)
DAY = 86400.0
CLUSTER = "lab"
NODES = [f"n{i:02d}" for i in range(16)]
HEARTBEAT_S = 600.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Injected:
    """One scripted incident and the answers it implies."""

    name: str
    kind: str
    severity: int
    domain: str
    failure_class: str
    onset: float  # seconds after T0
    latency_s: float  # detection - onset
    detector: str
    job: str | None = None
    node: str | None = None
    xid: int | None = None
    rel_change: float | None = None
    slowdown_class: str | None = None
    resolved_after_s: float | None = None  # resolution - detection
    #: decisions: (action, result state, seconds after detection of the result)
    decisions: tuple[tuple[str, str, float], ...] = ()
    updates: int = 0  # extra 'update' versions between open and resolved
    #: a job this incident slowed down, and by how much (rel): from the first update on, its alerts carry
    #: the job's fail_slow evidence and a slowdown, as when a GPU's incident explains a job's fail-slow
    slowed: tuple[str, float] | None = None

    @property
    def incident_id(self) -> uuid.UUID:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"vigil-test/{self.name}")

    @property
    def detection(self) -> float:
        return self.onset + self.latency_s

    def recovered_after_s(self) -> tuple[str, float] | None:
        """(action credited, detection -> recovery seconds) by the MTTR rule, or None.

        Recovered: the first succeeded action result, or the resolution, whichever
        is first; credited to the action that succeeded, else to the last decision
        made, else to ``none``.
        """
        success = sorted((t, a) for a, state, t in self.decisions if state == "succeeded")
        times = [success[0][0]] if success else []
        if self.resolved_after_s is not None:
            times.append(self.resolved_after_s)
        if not times:
            return None
        action = success[0][1] if success else (self.decisions[-1][0] if self.decisions else "none")
        return action, min(times)


D1 = DAY  # big-b's day starts here

INCIDENTS: list[Injected] = [
    # ettr-small: the process exit that costs it 400 s.
    Injected("small-exit", "process_exit", 2, "system_software", "fail_stop", 665, 1.8, "process_exit",
             job="ettr-small", node="n00", resolved_after_s=60, decisions=(("restart_process", "succeeded", 41),)),
    # big-a, day 1: four fail-stop incidents.
    Injected("a-node-lost", "node_lost", 1, "hardware", "fail_stop", 3600, 5.0, "heartbeat_loss",
             node="n09", resolved_after_s=900,
             decisions=(("restart_process", "failed", 30), ("reconfigure", "succeeded", 200))),
    Injected("a-xid79", "xid", 1, "hardware", "fail_stop", 7200, 0.5, "xid", node="n10", xid=79,
             resolved_after_s=120),
    Injected("a-xid13", "xid", 2, "user_code", "fail_stop", 10800, 0.5, "xid", node="n11", xid=13,
             resolved_after_s=300, decisions=(("restart_process", "succeeded", 20),)),
    Injected("a-nccl", "nccl_timeout", 3, "network", "fail_stop", 14400, 0.3, "exception_classifier",
             job="big-a", resolved_after_s=100, decisions=(("retry_in_place", "succeeded", 15),)),
    # big-b, day 2: a cuda error, and n13 failing six times.
    Injected("b-cuda", "cuda_error", 2, "system_software", "fail_stop", D1 + 1000, 0.3, "exception_classifier",
             job="big-b", node="n02", resolved_after_s=50, decisions=(("restart_process", "succeeded", 35),)),
    Injected("b-n13-lost", "node_lost", 1, "hardware", "fail_stop", D1 + 5000, 5.0, "heartbeat_loss",
             node="n13", resolved_after_s=600, decisions=(("reconfigure", "succeeded", 180),)),
    Injected("b-n13-dbe1", "xid", 1, "hardware", "fail_stop", D1 + 9000, 0.5, "xid", node="n13", xid=48,
             resolved_after_s=400, updates=1),
    Injected("b-n13-dbe2", "xid", 1, "hardware", "fail_stop", D1 + 13000, 0.5, "xid", node="n13", xid=48,
             resolved_after_s=400),
    Injected("b-n13-bus1", "xid", 1, "hardware", "fail_stop", D1 + 17000, 0.5, "xid", node="n13", xid=79,
             resolved_after_s=300),
    Injected("b-n13-bus2", "xid", 1, "hardware", "fail_stop", D1 + 21000, 0.5, "xid", node="n13", xid=79,
             resolved_after_s=300),
    Injected("b-n13-nvlink", "xid", 1, "hardware", "fail_stop", D1 + 25000, 0.5, "xid", node="n13", xid=74),
    # Not failures: a fail-slow of known size, a straggler without a size, a warning, vigil's own.
    Injected("b-slow", "fail_slow", 3, "hardware", "fail_slow", D1 + 3600, 12.0, "bocd_verify", job="big-b",
             rel_change=0.5, slowdown_class="computation", resolved_after_s=1800 - 12.0,
             decisions=(("rebalance_microbatches", "succeeded", 90),)),
    Injected("b-straggler", "straggler", 3, "hardware", "fail_slow", D1 + 30000, 8.0, "straggler", job="big-b",
             node="n04", resolved_after_s=200),
    Injected("a-sbe", "ecc_sbe", 3, "hardware", "warning", 20000, 2.0, "gpu_degradation", node="n05",
             resolved_after_s=60),
    Injected("b-circuit", "actuator_circuit_open", 1, "system_software", "vigil", D1 + 40000, 0.0, "actuator",
             job="big-b"),
    # dies-c: a GPU that slows it down (rooted at the GPU), then the hang it never recovers from.
    Injected("c-gpu-slow", "clock_below_peers", 3, "hardware", "fail_slow", 2460, 2.0, "gpu_degradation",
             node="n05", resolved_after_s=2760 - 2462, updates=1, slowed=("dies-c", 0.25)),
    Injected("c-hang", "task_hang", 2, "system_software", "fail_stop", 3060, 30.0, "hang", job="dies-c",
             resolved_after_s=3660 - 3090),
]

#: job -> (GPUs, nodes, running from, terminal state at, terminal state)
JOBS: dict[str, tuple[int, list[str], float, float, str]] = {
    "ettr-small": (8, ["n00"], 0.0, 1400.0, "completed"),
    "big-a": (64, NODES[8:], 0.0, DAY, "completed"),
    "big-b": (128, NODES, DAY, 2 * DAY, "completed"),
    "dies-c": (16, ["n04", "n05"], 2000.0, 3660.0, "failed"),
}

ETTR_SMALL = 1000.0 / 1400.0
ETTR_DIES = 1000.0 / 1660.0
FAILSLOW_LOST_DIES_S = 300.0 * 0.25 / 1.25  # 24 steps of 12.5 s instead of 10 s
ETTR_SMALL_WINDOW = (600.0, 1000.0, 0.25)  # window start, end (s after T0), ETTR in it
FAILSLOW_LOST_S = 1800.0 * 0.5 / 1.5  # big-b: 30 min at 1.5x the iteration time
LEMON = "n13"


def small_job_steps() -> list[tuple[int, float]]:
    """(step, start in s after T0) of every executed step of ettr-small, 10 s each."""
    first = [(i, 60.0 + 10 * i) for i in range(60)]  # steps 0..59, T0+60 .. T0+660
    rerun = [(i, 900.0 + 10 * (i - 50)) for i in range(50, 100)]  # from checkpoint 50, T0+900 .. T0+1400
    return first + rerun


def big_b_steps() -> list[tuple[int, float, float]]:
    """(step, start, duration) of big-b's first three hours: 10 s steps, 15 s while slowed."""
    out, t, step = [], DAY + 60.0, 0
    slow_from, slow_to = DAY + 3600.0, DAY + 3600.0 + 1800.0
    while t < DAY + 3 * 3600.0:
        d = 15.0 if slow_from <= t < slow_to else 10.0
        out.append((step, t, d))
        t += d
        step += 1
    return out


def dies_c_steps() -> list[tuple[int, float, float]]:
    """(step, start, duration) of dies-c: 10 s steps, 12.5 s while its GPU is slow, none after T0+3060."""
    out, t = [], 2060.0
    for step in range(94):
        d = 12.5 if 40 <= step < 64 else 10.0
        out.append((step, t, d))
        t += d
    assert t == 3060.0
    return out


def _step_event(job: str, step: int, start: float, duration: float, nodes: list[str]) -> IterationStep:
    ranks = list(range(8))
    return IterationStep(
        event_time=at(start + duration), source=Source(cluster=CLUSTER, job=job), step=step, start=at(start),
        end=at(start + duration), duration_s=duration, ranks=ranks, nodes=[nodes[0]] * 8, gpus=ranks,
        compute_s=[duration * 0.7] * 8, communication_s=[duration * 0.3] * 8, dp=ranks, pp=[0] * 8, tp=[0] * 8)


def _alerts(inc: Injected) -> list[Alert]:
    subject = Subject(job=inc.job, node=inc.node)
    evidence: dict = {"kind": inc.kind, "subject": subject.model_dump(exclude_none=True), "detector": inc.detector}
    if inc.xid is not None:
        evidence.update(code=inc.xid, codes=[inc.xid])
    if inc.rel_change is not None:
        evidence.update(rel_change=inc.rel_change, slowdown_class=inc.slowdown_class)
    versions = [("open", inc.detection)] + [("update", inc.detection + 1 + i) for i in range(inc.updates)]
    if inc.resolved_after_s is not None:
        versions.append(("resolved", inc.detection + inc.resolved_after_s))
    slowed_evidence, slowdowns = [], []
    if inc.slowed is not None:
        job, rel = inc.slowed
        slowed_evidence = [{"kind": "fail_slow", "subject": {"job": job}, "detector": "fail_slow", "rel_change": rel,
                            "slowdown_class": "computation"}]
        slowdowns = [Slowdown(job=job, before_s=10.0, after_s=10.0 * (1 + rel), rel_change=rel,
                              slowdown_class="computation", node=inc.node, gpu=3)]
    return [
        Alert(event_id=uuid.uuid5(inc.incident_id, str(v)), event_time=at(t),
              source=Source(cluster=CLUSTER, job=inc.job, node=inc.node), incident_id=inc.incident_id,
              incident_version=v, status=status, severity=inc.severity, kind=inc.kind, subject=subject,  # type: ignore[arg-type]
              onset_time=at(inc.onset), detection_time=at(inc.detection), summary=f"{inc.name}",
              evidence=[evidence] + (slowed_evidence if v > 1 else []), evidence_count=1 + (v > 1) * len(slowed_evidence),
              detector=inc.detector, detector_version="1", slowdowns=slowdowns if v > 1 else [])
        for v, (status, t) in enumerate(versions, start=1)
    ]


def events() -> list[Envelope]:
    """Every scripted event, in time order."""
    out: list[Envelope] = []
    for node in NODES:
        for i in range(int(2 * DAY / HEARTBEAT_S)):
            out.append(Heartbeat(event_time=at(i * HEARTBEAT_S), source=Source(cluster=CLUSTER, node=node), seq=i,
                                 interval_s=HEARTBEAT_S))
    for job, (gpus, nodes, start, end, final) in JOBS.items():
        for state, t in (("running", start), (final, end)):
            out.append(JobState(event_time=at(t), source=Source(cluster=CLUSTER, job=job), state=state,  # type: ignore[arg-type]
                                nodes=nodes, gpus=gpus))
    out += [_step_event("ettr-small", step, start, 10.0, ["n00"]) for step, start in small_job_steps()]
    out += [_step_event("big-b", step, start, d, NODES) for step, start, d in big_b_steps()]
    out += [_step_event("dies-c", step, start, d, ["n04", "n05"]) for step, start, d in dies_c_steps()]
    for inc in INCIDENTS:
        out += _alerts(inc)
        if inc.xid is not None:
            out.append(XidError(event_time=at(inc.onset), source=Source(cluster=CLUSTER, node=inc.node, gpu=3),
                                code=inc.xid, message="scripted"))
        for k, (action, state, after) in enumerate(inc.decisions):
            decision_id = uuid.uuid5(inc.incident_id, f"decision-{k}")
            decided = inc.detection + 0.5 + k
            out.append(Decision(event_time=at(decided), source=Source(cluster=CLUSTER, job=inc.job),
                                decision_id=decision_id, idempotency_key=f"{inc.name}-{k}", action=action,  # type: ignore[arg-type]
                                target=Subject(job=inc.job, node=inc.node), reason="scripted",
                                answers=[inc.incident_id]))
            out.append(ActionResult(event_time=at(decided + 0.1), source=Source(cluster=CLUSTER),
                                    decision_id=decision_id, state="running", backend="dry-run"))
            out.append(ActionResult(event_time=at(inc.detection + after), source=Source(cluster=CLUSTER),
                                    decision_id=decision_id, state=state, backend="dry-run"))  # type: ignore[arg-type]
    out.sort(key=lambda e: e.event_time)
    return out


@dataclass
class Expected:
    """What the views must answer, computed from the script (by hand where the docstring says)."""

    by_kind: dict[str, int] = field(default_factory=dict)
    by_domain: dict[str, int] = field(default_factory=dict)
    by_xid: dict[int, int] = field(default_factory=dict)
    latency_by_detector: dict[str, list[float]] = field(default_factory=dict)
    mttr_by_action: dict[str, list[float]] = field(default_factory=dict)
    job_failures: dict[str, int] = field(default_factory=dict)
    node_failures: dict[str, int] = field(default_factory=dict)


def expected() -> Expected:
    e = Expected()
    node_of_job = {job: nodes for job, (_, nodes, _, _, _) in JOBS.items()}
    span = {job: (start, end) for job, (_, _, start, end, _) in JOBS.items()}
    for inc in INCIDENTS:
        e.by_kind[inc.kind] = e.by_kind.get(inc.kind, 0) + 1
        e.by_domain[inc.domain] = e.by_domain.get(inc.domain, 0) + 1
        if inc.xid is not None:
            e.by_xid[inc.xid] = e.by_xid.get(inc.xid, 0) + 1
        if inc.failure_class != "vigil":
            e.latency_by_detector.setdefault(inc.detector, []).append(inc.latency_s)
        if inc.failure_class in ("fail_stop", "fail_slow"):
            rec = inc.recovered_after_s()
            if rec is not None:
                e.mttr_by_action.setdefault(rec[0], []).append(rec[1])
        if inc.failure_class == "fail_stop":
            jobs = [inc.job] if inc.job else [j for j, nodes in node_of_job.items()
                                              if inc.node in nodes and span[j][0] <= inc.onset <= span[j][1]]
            for j in jobs:
                e.job_failures[j] = e.job_failures.get(j, 0) + 1
            if inc.node and inc.domain != "user_code":
                e.node_failures[inc.node] = e.node_failures.get(inc.node, 0) + 1
    return e


def populate(store) -> list[Envelope]:
    """Insert the scripted history into ``store`` (a migrated HistoryStore); return the events."""
    evs = events()
    store.insert_events(evs)
    return evs
