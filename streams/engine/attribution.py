"""The attribution rules: which finding accounts for which (:func:`explains`), and the kinds they name.

The correlator (:mod:`vigil.streams.engine.incidents`) applies them where the cause could have caused
the symptom (it began before it, within the same run of the job) and still holds.
"""

from __future__ import annotations

import math

from vigil.schemas import DetectorFinding, Subject, to_seconds

TRANSIENT = {"process_exit", "cuda_error", "illegal_memory_access", "software_error", "nccl_timeout",
             "connection_reset", "connection_refused", "network_error"}
JOB_SYMPTOMS = {"task_hang", "nccl_timeout", "connection_reset", "connection_refused", "network_error",
                "process_exit", "fail_slow", "straggler", "iteration_period_lost"}
PEER_SYMPTOMS = {"task_hang", "nccl_timeout", "connection_reset", "connection_refused", "network_error"}
#: What many nodes silent together (a stalled telemetry path, a partition) can explain: waiting.
SILENCE_SYMPTOMS = PEER_SYMPTOMS | {"iteration_period_lost"}
GPU_CAUSES = {"throttle", "clock_below_peers", "temperature_outlier", "ecc_dbe", "ecc_sbe", "nvlink_errors"}
LINK_CAUSES = {"congestion", "link_flap", "transport_errors"}
#: A hung job's collective, compared across its ranks' flight recorders: the attributed cause of its hang.
COLLECTIVE_STUCK = "collective_stuck"
#: Findings that only annotate an incident (they never open one of their own).
ANNOTATIONS = {"flight_recorder_unavailable"}
#: A rank that ended: its job stalls and its peers time out waiting for it.
CRASHES = TRANSIENT


def subject_key(subject: Subject) -> str:
    return "/".join(f"{k}={v}" for k, v in subject.model_dump(exclude_none=True).items())


def _on_job_node(f: DetectorFinding, node: str | None) -> bool:
    return node is not None and (node in f.job_nodes or f.subject.node == node)


def _interval(value: object) -> float:
    """A heartbeat interval from evidence anyone can write: finite, in (0, 60] s, else the agents' 1 s."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 1.0
    return v if math.isfinite(v) and 0.0 < v <= 60.0 else 1.0


def _ran_after_silence(lost: DetectorFinding, symptom: DetectorFinding) -> bool:
    """Did ``symptom`` begin over one heartbeat interval after ``lost``'s last beat (both by the node's clock)?"""
    interval = _interval(lost.evidence.get("interval_s"))
    return to_seconds(symptom.onset_time) > to_seconds(lost.onset_time) + interval


def explains(cause: DetectorFinding, symptom: DetectorFinding) -> bool:
    """Does ``cause`` account for ``symptom``? (The attribution rules.)"""
    if cause.event_id == symptom.event_id:
        return False
    c, s = cause.kind, symptom.kind
    node = cause.subject.node
    job = cause.subject.job
    # The same kind of finding on the same subject continues one incident.
    if c == s and subject_key(cause.subject) == subject_key(symptom.subject):
        return True
    # The same symptom on many ranks of one job is one failure (1000 ranks, 1 incident).
    if c == s and job is not None and symptom.subject.job == job and s in JOB_SYMPTOMS | TRANSIENT:
        return True
    # Several signals of one GPU (throttling, low clock, heat) or one link are one cause.
    if c in GPU_CAUSES and s in GPU_CAUSES:
        return (node, cause.subject.gpu) == (symptom.subject.node, symptom.subject.gpu)
    if c in LINK_CAUSES and s in LINK_CAUSES:
        return cause.subject.link == symptom.subject.link
    if c == "node_lost":
        if s == "node_lost":
            return False
        if symptom.subject.node == node and s not in PEER_SYMPTOMS and _ran_after_silence(cause, symptom):
            # The node itself reported it, from after it should have beaten again: it was running then.
            # A running node's silence (a partition, a stalled telemetry path) makes jobs wait, it does
            # not crash a GPU or kill a process: what it reported is a fault of its own.
            return False
        return (s in JOB_SYMPTOMS and _on_job_node(symptom, node)) or symptom.subject.node == node
    if c in GPU_CAUSES:
        if s not in ("fail_slow", "straggler") or not _on_job_node(symptom, node):
            return False
        slow = symptom.slowdown
        return slow is None or (slow.slowdown_class in (None, "computation") and slow.node in (None, node))
    if c in LINK_CAUSES:
        slow = symptom.slowdown
        return s in ("fail_slow", "straggler") and _on_job_node(symptom, node) and \
            (slow is None or slow.slowdown_class in (None, "communication"))
    if c == "xid" and cause.severity <= 2:
        return s in CRASHES | {"task_hang"} and symptom.subject.node == node
    if c in CRASHES:
        return job is not None and symptom.subject.job == job and s in PEER_SYMPTOMS and not (
            s in CRASHES and c == "nccl_timeout")  # a timeout does not explain a crash
    if c == "fail_slow":
        return s == "straggler" and symptom.subject.job == cause.subject.job
    if c == COLLECTIVE_STUCK:  # the rank that never entered (or finished) the collective its peers wait in
        return job is not None and symptom.subject.job == job and s in PEER_SYMPTOMS
    if c == "task_hang" and s in ANNOTATIONS:
        return job is not None and symptom.subject.job == job
    return False
