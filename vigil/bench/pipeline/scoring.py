"""Scoring a load run (pure): which alert answers which injected fault, latency distributions, targets.

Targets (p99; :data:`TARGETS`): exception <= 0.2 s, process exit <= 0.5 s,
xid <= 0.5 s, node lost <= 3 s, hang <= k x D_iter + 1 s, fail-slow <= 5
iterations after onset, with no fault missed; RSS <= 1 GiB; a p99 needs 100
samples (below, ``p99`` is null and ``max`` is given).
"""

from __future__ import annotations

import math
from typing import Any

from vigil.detectors.hang import DEFAULT_K
from vigil.schemas import Alert, to_seconds
from vigil.sim.load import KINDS, Injection

__all__ = ["HANG_K", "MIN_P99_SAMPLES", "RSS_TARGET_MB", "TARGETS", "match", "names_cause", "percentile",
           "quantile_ci", "summarize", "targets_met"]

#: p99 targets in seconds (hang: excess over k x D_iter; fail-slow: iterations after onset).
TARGETS: dict[str, float] = {"exception": 0.2, "process_exit": 0.5, "xid": 0.5, "node_lost": 3.0, "hang": 1.0,
                             "fail_slow": 5.0}
#: The hang detector's multiple of the mean iteration time (its default, from the detector).
HANG_K = DEFAULT_K
RSS_TARGET_MB = 1024.0
MIN_P99_SAMPLES = 100
#: Alert kinds that name each fault's root cause.
_GPU_CAUSES = ("throttle", "clock_below_peers", "temperature_outlier")
_ALERT_KINDS: dict[str, tuple[str, ...]] = {"exception": ("cuda_error",), "process_exit": ("process_exit",),
                                            "xid": ("xid",), "node_lost": ("node_lost",), "hang": ("task_hang",),
                                            "fail_slow": (*_GPU_CAUSES, "fail_slow", "straggler")}


def names_cause(inj: Injection, alert: Alert) -> bool:
    """Does ``alert`` name ``inj``'s root cause (its kind and subject)?"""
    if alert.status == "resolved" or alert.kind not in _ALERT_KINDS[inj.kind]:
        return False
    subject = alert.subject
    if inj.kind in ("exception", "process_exit", "hang"):
        return subject.job == inj.job
    if inj.kind in ("xid", "node_lost"):
        return subject.node == inj.fault.target
    # fail-slow: the slowed GPU, or the job's slowdown
    if alert.kind in _GPU_CAUSES:
        return subject.node == inj.fault.target and subject.gpu == inj.fault.gpu
    return subject.job == inj.job


def _job_fail_slow(inj: Injection, alert: Alert) -> bool:
    """The job-level change-point detection of a fail-slow: its own alert, or evidence in its cause's."""
    if alert.status == "resolved":
        return False
    if alert.kind == "fail_slow" and alert.subject.job == inj.job:
        return True
    return any(e.get("kind") == "fail_slow" and (e.get("subject") or {}).get("job") == inj.job for e in alert.evidence)


#: Unexplained incidents told in full per run (their first alert); the rest are only counted.
UNEXPLAINED_KEPT = 20


def match(injections: list[Injection], alerts: list[tuple[Alert, float]], margin_s: float = 30.0) -> dict[str, Any]:
    """Each fault's first alert naming its cause, and the incidents no fault explains.

    ``alerts`` are ``(alert, arrival time)`` in arrival order. An incident
    answers one fault: a later fault of the same job or node is not credited
    with an update of an earlier fault's incident, and an earlier fault is not
    credited with what came after a later fault of its job or node was
    injected. A fault's ``incidents`` are the distinct incidents naming its
    cause from its injection until ``margin_s`` after it ended, or until the
    next fault of its job or node (1 when alerted once).
    """
    claimed: dict[Any, int] = {}
    out: list[dict[str, Any]] = []
    ordered = sorted(enumerate(injections), key=lambda p: p[1].injected_at)
    for n, (idx, inj) in enumerate(ordered):
        t0 = inj.injected_at
        until = (inj.ended_at if inj.ended_at is not None else t0) + margin_s
        later = next((o.injected_at for _, o in ordered[n + 1:] if o.injected_at > t0 and (
            o.fault.target == inj.fault.target or (inj.job is not None and o.job == inj.job))), None)
        if later is not None:
            until = min(until, later)
        hits = [(a, at) for a, at in alerts if at >= t0 and at <= until and names_cause(inj, a)
                and claimed.get(a.incident_id, idx) == idx]
        row: dict[str, Any] = {"kind": inj.kind, "target": inj.fault.target, "job": inj.job, "injected_at": t0,
                               "d_iter": inj.iteration_s, "delay_s": None,
                               "incidents": len({a.incident_id for a, _ in hits})}
        if hits:
            first, at = hits[0]
            for a, _ in hits:
                claimed.setdefault(a.incident_id, idx)
            row.update(delay_s=at - t0, alert_kind=first.kind, incident=str(first.incident_id))
            if inj.kind == "hang" and inj.iteration_s:
                row["excess_s"] = at - t0 - HANG_K * inj.iteration_s
        if inj.kind == "fail_slow" and inj.fault.onset_at is not None and inj.slowed_iteration_s:
            onset, per = inj.fault.onset_at, inj.slowed_iteration_s
            if hits:
                row["iterations"] = (hits[0][1] - onset) / per
            job_hit = next((at for a, at in alerts if t0 <= at <= until and _job_fail_slow(inj, a)), None)
            row["job_iterations"] = None if job_hit is None else (job_hit - onset) / per
        out.append(row)
    explained = set(claimed)
    unexplained: dict[str, int] = {}
    told: list[dict[str, Any]] = []  # each one's first alert, enough to look into it afterwards
    seen: set[Any] = set()
    for a, at in alerts:
        if a.incident_id in explained or a.incident_id in seen:
            continue
        seen.add(a.incident_id)
        unexplained[a.kind] = unexplained.get(a.kind, 0) + 1
        if len(told) < UNEXPLAINED_KEPT:
            told.append({"kind": a.kind, "severity": a.severity, "subject": a.subject.model_dump(exclude_none=True),
                         "arrived_at": at, "onset": to_seconds(a.onset_time), "summary": a.summary[:300]})
    return {"faults": out, "unexplained_incidents": unexplained, "unexplained": told}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``math.inf`` counts as a value: a missed fault)."""
    if not values:
        return None
    ordered = sorted(values)
    v = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
    return None if math.isinf(v) else round(v, 4)


def quantile_ci(values: list[float], q: float, level: float = 0.95) -> list[float | None] | None:
    """A distribution-free interval for the ``q`` quantile: order statistics ``x(l) .. x(u)`` with
    ``P(l <= B < u) >= level``, ``B ~ Binomial(n, q)``, as near symmetric as the ranks allow.

    An end the sample cannot bound (too few values beyond the quantile) is None; a missed fault
    (``math.inf``) as an end is None too. None when there are no values.
    """
    n = len(values)
    if n == 0:
        return None
    ordered = sorted(values)
    cdf, acc = [], 0.0  # cdf[k] = P(B <= k)
    for k in range(n + 1):
        acc += math.comb(n, k) * q ** k * (1 - q) ** (n - k)
        cdf.append(acc)
    tail = (1 - level) / 2
    # lower rank l (1-based): the largest with P(B < l) <= tail; upper u: the smallest with P(B < u) >= 1 - tail
    lo = max((k for k in range(1, n + 1) if cdf[k - 1] <= tail), default=None)
    hi = min((k for k in range(1, n + 1) if cdf[k - 1] >= 1 - tail), default=None)

    def at(rank: int | None) -> float | None:
        if rank is None or math.isinf(ordered[rank - 1]):
            return None
        return round(ordered[rank - 1], 4)

    return [at(lo), at(hi)]


def _dist(values: list[float], n: int, missed: int) -> dict[str, Any]:
    """p50, p99 (only from >= 100 samples, else the max of n), n, missed; 95 % intervals of p50 and p99
    (:func:`quantile_ci`; an end the sample cannot bound is null)."""
    allv = values + [math.inf] * missed
    out: dict[str, Any] = {"p50": percentile(allv, 0.5), "p99": percentile(allv, 0.99) if n >= MIN_P99_SAMPLES else None,
                           "n": n, "missed": missed}
    if allv:
        out["p50_ci95"] = quantile_ci(allv, 0.5)
    if n >= MIN_P99_SAMPLES:
        out["p99_ci95"] = quantile_ci(allv, 0.99)
    if n < MIN_P99_SAMPLES:
        out["max"] = None if missed else (round(max(values), 4) if values else None)
    return out


def summarize(matched: dict[str, Any]) -> dict[str, Any]:
    """Per kind: the delay distribution; hang's excess over k x D_iter; fail-slow in iterations."""
    rows = matched["faults"]
    latency: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        delays = [r["delay_s"] for r in mine if r["delay_s"] is not None]
        missed = len(mine) - len(delays)
        entry = _dist(delays, len(mine), missed)
        entry["alerted_more_than_once"] = sum(1 for r in mine if r["incidents"] > 1)
        if kind == "hang":
            excess = _dist([r["excess_s"] for r in mine if "excess_s" in r], len(mine), missed)
            entry["excess_over_k_d_iter"] = {k: excess[k] for k in ("p50", "p99", "max") if k in excess}
            entry["d_iter_s"] = {"min": round(min(r_d for r_d in _d_iters(mine)), 3),
                                 "max": round(max(r_d for r_d in _d_iters(mine)), 3)} if _d_iters(mine) else None
        if kind == "fail_slow":
            its = [r["iterations"] for r in mine if r.get("iterations") is not None]
            entry["iterations"] = _dist(its, len(mine), len(mine) - len(its))
            job_its = [r["job_iterations"] for r in mine if r.get("job_iterations") is not None]
            entry["job_change_point_iterations"] = _dist(job_its, len(mine), len(mine) - len(job_its))
        latency[kind] = entry
    return latency


def _d_iters(rows: list[dict[str, Any]]) -> list[float]:
    return [r["d_iter"] for r in rows if r.get("d_iter")]


def targets_met(latency: dict[str, Any], rss_mb: float | None) -> dict[str, bool]:
    """Each target: met only with >= 100 faults, none missed, and the p99 within it."""
    def ok(entry: dict[str, Any] | None, value: float | None, target: float) -> bool:
        return entry is not None and entry["n"] >= MIN_P99_SAMPLES and entry["missed"] == 0 and value is not None \
            and value <= target
    met = {}
    for kind, target in TARGETS.items():
        e = latency.get(kind)
        if kind == "hang":
            value = (e or {}).get("excess_over_k_d_iter", {}).get("p99")
        elif kind == "fail_slow":
            value = (e or {}).get("iterations", {}).get("p99")
        else:
            value = (e or {}).get("p99")
        met[kind] = ok(e, value, target)
    met["rss"] = rss_mb is not None and rss_mb <= RSS_TARGET_MB
    return met

