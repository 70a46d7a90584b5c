"""Straggler localization from per-rank compute and communication times: the algorithm.

Detection of a fail-slow runs on the job's iteration time (every rank of a
synchronous job sees the same one); *localization* needs what each rank did
with that time. Given per-rank records with data/pipeline/tensor-parallel
coordinates::

    {"rank": 17, "dp": 2, "pp": 1, "tp": 1, "compute": 0.81, "comm": 0.22,
     "ops": {"tp": 0.12, "pp": 0.03, "dp": 0.07}}        # ops optional

:func:`localize` names the culprit class and its location:

``worker``
    one rank computes longer than its peers (and they wait for it, in their
    collectives); location ``("rank", r)``.
``stage``
    every rank of one pipeline stage computes longer (stage imbalance);
    location ``("stage", p)``.
``link``
    a communication group is slow: its *transfer* time is longer for every
    member. Location ``("tp", dp, pp)`` (a tensor-parallel group),
    ``("dp", pp, tp)`` (a data-parallel group) or ``("pp", dp, tp)`` (a
    pipeline lane). Needs per-op timings (``ops``); without them a slow link
    cannot be told from the waits it causes and is reported as ``none``.
``cell``
    when only one rank per tensor-parallel group reports (the others are
    not sampled), a slow rank inside a TP group, or a slow TP link, shows
    only as its group being late: the reporter's compute plus its time in TP
    collectives (the TP group's compute phase: the slowest member plus the
    transfer). Location ``("cell", dp, pp)``: the TP group at those
    coordinates; which of its ranks (or its link) is not knowable from one
    reporter.
``spread``
    no persistent culprit, and the replicas' compute differs strongly from
    iteration to iteration (data-dependent imbalance: sequence lengths, MoE
    routing): every step waits for whichever replica drew the longest
    batch. Location ``None``; evidence ``replica_spread`` (robust standard
    deviation of the log replica factors, median over iterations) and
    ``step_stretch`` (how much longer the slowest replica took than the
    median one, median over iterations: what the imbalance costs per step).
``none``
    healthy, or no single culprit (two equal suspects).

Time waiting for peers outside collectives (``wait``: pipeline bubbles,
point-to-point waits) is not compute and is never used as such: records
whose compute included it would make the stage that waits most look slow.

How (robust statistics only: medians, lower medians and MADs):

1. *Stages*: each stage's compute is the lower median of its ranks; a stage is
   slow when it exceeds the lower median of the stages by ``stage_rel``.
2. *Ranks*: a rank's compute is normalised by its stage and by its replica
   (the lower median over the replica: the data factor every rank of a
   replica shares); a rank is a straggler when the residual exceeds
   ``worker_rel`` and ``z`` robust standard deviations of all residuals.
   With one rank per replica (pure data parallelism) the replica factor
   itself is compared across replicas.
3. *Links*: a collective lasts the wait for its last member plus the
   transfer, so the *minimum* duration over a group's members estimates its
   transfer. A group is slow when that minimum exceeds the lower median of
   the groups of its kind by ``link_rel`` and ``z`` robust deviations.
4. Every candidate carries its excess in seconds; the top one is the culprit
   when it beats the runner-up (at another location) by ``dominance``.
5. Otherwise, when the replica factors spread by ``spread_sigma`` or more
   (robust standard deviation of their logs), ``spread``; else ``none``.
   Ranked suspects carry their evidence.

"Lower median" here is the reference level: the median of three or more
values, the minimum of two (a fail-slow only adds time, so with two stages or
two members the reference is the healthy one). Group transfer estimates are
taken per iteration (min over members) and then their median over the window.

:func:`localize_window` takes several iterations and works on each rank's
median over them, which removes the per-iteration data-dependent imbalance
and keeps persistent culprits. :class:`~vigil.detectors.straggler.StragglerLocalizer`
(registered as ``straggler``) does that online. :func:`falcon_rule` and
:func:`falcon_localize` are Falcon's 1.1x-median rule, the baseline.

References
----------
Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for Large-Scale
Hybrid-Parallel Training" (2024) — the 1.1x-median rule and the
compute/communication split; Lin et al., "Understanding Stragglers in
Large Model Training Using What-if Analysis" (OSDI 2025) — stage imbalance
and data-dependent stragglers; Hampel (1974), the MAD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from vigil.detectors.base import DetectorError

__all__ = ["Suspect", "Localization", "localize", "localize_window", "falcon_rule", "falcon_localize"]

_KINDS = ("tp", "pp", "dp")
_MAD_K = 1.4826


@dataclass(frozen=True)
class Suspect:
    """One ranked suspect: its class, location, excess seconds, and evidence."""

    culprit: str
    location: tuple
    excess_s: float
    score: float
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Localization:
    """The verdict: ``culprit`` in worker/cell/stage/link/spread/none, its ``location`` and the ranked suspects."""

    culprit: str
    location: tuple | None
    suspects: tuple[Suspect, ...]
    evidence: dict[str, Any] = field(default_factory=dict)


def _lower_median(a: np.ndarray) -> float:
    """Reference level robust to one high outlier: the minimum of two, else the median."""
    return _sorted_lower_median(np.sort(np.asarray(a, dtype=float)))


def _sorted_median(v: Sequence[float]) -> float:
    """np.median of sorted ``v``: the same arithmetic, without its per-call overhead on a few values."""
    mid = len(v) // 2
    return float(v[mid]) if len(v) % 2 else float((v[mid - 1] + v[mid]) / 2)


def _sorted_lower_median(v: Sequence[float]) -> float:
    """:func:`_lower_median` of sorted ``v``."""
    return float(v[0]) if len(v) <= 2 else _sorted_median(v)


def _small_median(a: np.ndarray) -> float:
    """np.median of a few values."""
    return _sorted_median(sorted(a.tolist()))


def _group_medians(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (sorted) and each one's lower median of ``values``.

    Groups are a few ranks each: plain lists beat numpy's per-call overhead.
    """
    groups: dict[Any, list[float]] = {}
    for k, v in zip(keys.tolist(), values.tolist()):
        groups.setdefault(k, []).append(v)
    distinct = sorted(groups)
    return np.array(distinct), np.array([_sorted_lower_median(sorted(groups[k])) for k in distinct])


def _per_element(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each element's group level (:func:`_group_medians` of the values sharing its key)."""
    distinct, levels = _group_medians(values, keys)
    return levels[np.searchsorted(distinct, keys)]


def _robust_sd(a: np.ndarray, floor: float) -> float:
    a = np.asarray(a, dtype=float)
    return max(_MAD_K * float(np.median(np.abs(a - np.median(a)))), floor)


def _validate(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if not isinstance(records, Sequence) or len(records) == 0:
        raise DetectorError("records must be a non-empty sequence of per-rank mappings")
    seen = set()
    for r in records:
        if not isinstance(r, Mapping):
            raise DetectorError(f"a per-rank record must be a mapping, got {type(r).__name__}")
        for k in ("rank", "dp", "pp", "tp"):
            v = r.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise DetectorError(f"record field {k!r} must be a non-negative int, got {v!r}")
        for k in ("compute", "comm", "wait"):
            v = r.get(k)
            if k == "wait" and v is None:
                continue  # optional
            if type(v) is float and 0.0 <= v < math.inf:
                continue  # the common case, checked fast
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v) or v < 0:
                raise DetectorError(f"rank {r.get('rank')}: {k!r} must be a finite non-negative number of seconds, got {v!r}")
        ts = r.get("tp_size")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, np.integer)) or ts < 1):
            raise DetectorError(f"rank {r.get('rank')}: 'tp_size' must be a positive int, got {ts!r}")
        if r["rank"] in seen:
            raise DetectorError(f"rank {r['rank']} appears twice in one iteration")
        seen.add(r["rank"])
    return list(records)


def _group_transfers(recs: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple, tuple[float, tuple[int, ...]]]]:
    """Per kind of collective, per group: (min duration over its members, member ranks).

    Groups are keyed by their location: ``("tp", dp, pp)``, ``("dp", pp, tp)``,
    ``("pp", dp, tp)``. Kinds missing from any record's ``ops``, and groups of
    one member, are left out.
    """
    if not all(isinstance(r.get("ops"), Mapping) for r in recs):
        return {}
    out: dict[str, dict[tuple, tuple[float, tuple[int, ...]]]] = {}
    coords = {"tp": ("dp", "pp"), "dp": ("pp", "tp"), "pp": ("dp", "tp")}
    for kind in _KINDS:
        if not all(kind in r["ops"] for r in recs):
            continue
        a, b = coords[kind]
        acc: dict[tuple, list] = {}
        for r in recs:
            v = r["ops"][kind]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v) or v < 0:
                raise DetectorError(f"rank {r['rank']}: ops[{kind!r}] must be a finite non-negative number, got {v!r}")
            acc.setdefault((kind, int(r[a]), int(r[b])), []).append((float(v), int(r["rank"])))
        groups = {loc: (min(v for v, _ in m), tuple(sorted(rk for _, rk in m))) for loc, m in acc.items() if len(m) >= 2}
        if groups:
            out[kind] = groups
    return out


def localize(
    records: Sequence[Mapping[str, Any]],
    *,
    stage_rel: float = 0.06,
    worker_rel: float = 0.06,
    link_rel: float = 0.15,
    z: float = 5.0,
    dominance: float = 1.5,
    max_suspects: int = 5,
    spread_sigma: float = 0.05,
    tp_size: int | None = None,
    _transfers: dict | None = None,
    _spread: tuple[float, float] | None = None,
    _series: dict | None = None,
    _persistence: dict[int, float] | None = None,
) -> Localization:
    """Localize the straggler of one iteration (or of per-rank medians over several).

    Parameters
    ----------
    records : sequence of mapping
        One record per rank: ``rank, dp, pp, tp, compute, comm``, optionally
        ``wait`` (seconds waiting for peers outside collectives; evidence
        only, never compute), ``ops`` (mapping ``"tp"|"pp"|"dp"`` -> seconds
        in that kind of operation; other kinds, e.g. ``bubble``, are ignored)
        and ``tp_size``.
    stage_rel, worker_rel, link_rel : float
        Minimum relative excess of a stage, a rank, a group's transfer time.
    z : float
        Minimum robust z-score (vs 1.4826 x MAD) of a rank or group.
    dominance : float
        The top suspect must exceed the runner-up (elsewhere) by this factor.
    spread_sigma : float
        Replica spread (robust sd of the log replica factors) from which a
        job with no single culprit is ``spread`` rather than ``none``.
    tp_size : int, optional
        Tensor-parallel size of the job (else the records' ``tp_size``, else
        inferred: ``ops`` with a ``tp`` time, or a record with ``tp >= 1``).
        With one record per (dp, pp) and ``tp_size > 1``, ranks are located
        as their TP group's cell.

    Examples
    --------
    One step of a dp 4 x pp 2 x tp 2 job in which rank 5 computes 30 % longer
    (and so waits less for its peers):

    >>> import numpy as np
    >>> rng = np.random.default_rng(3)
    >>> def step(slow_rank=None, slow_stage=None):
    ...     records = []
    ...     for r in range(16):
    ...         d, p, t = (r // 2) % 4, r // 8, r % 2
    ...         compute = 1.0 + 0.01 * rng.standard_normal()
    ...         compute *= 1.3 if r == slow_rank else 1.2 if p == slow_stage else 1.0
    ...         records.append({"rank": r, "dp": d, "pp": p, "tp": t, "compute": compute, "comm": 1.5 - compute})
    ...     return records
    >>> loc = localize(step(slow_rank=5))
    >>> loc.culprit, loc.location
    ('worker', ('rank', 5))
    """
    recs = _validate(records)
    n = len(recs)
    rank = np.array([r["rank"] for r in recs])
    dpc = np.array([r["dp"] for r in recs])
    ppc = np.array([r["pp"] for r in recs])
    tpc = np.array([r["tp"] for r in recs])
    comp = np.array([float(r["compute"]) for r in recs])
    comm = np.array([float(r["comm"]) for r in recs])
    wait = np.array([float(r.get("wait") or 0.0) for r in recs])
    stages = np.unique(ppc)
    replicas = np.unique(dpc)
    suspects: list[Suspect] = []
    ev: dict[str, Any] = {"ranks": n, "compute_median": float(np.median(comp)), "comm_median": float(np.median(comm))}
    if any(r.get("wait") is not None for r in recs):
        ev["wait_median"] = float(np.median(wait))
    cells = _cell_mode(recs, tp_size)
    if cells:
        # one reporter per TP group: its compute plus its TP time is the group's compute phase
        comp = _effective_compute(recs, True)
        ev["one_reporter_per_tp_group"] = True

    # 1. stages
    S = {int(p): _lower_median(comp[ppc == p]) for p in stages}
    if len(stages) >= 2:
        sref = _lower_median(np.array(list(S.values())))
        ev["stage_compute"] = S
        for p, sp in S.items():
            rel = sp / sref - 1.0 if sref > 0 else 0.0
            if rel >= stage_rel:
                members = ppc == p
                frac = float(np.mean(comp[members] > sref * (1 + stage_rel / 2)))
                suspects.append(
                    Suspect("stage", ("stage", p), (sp - sref), rel / stage_rel,
                            {"stage_compute": sp, "reference": sref, "rel_excess": rel, "ranks_elevated": frac})
                )

    # 2. ranks, normalised by stage and replica
    resid = _rank_residuals(comp, ppc, dpc)
    lres = np.log1p(resid)
    sd = _robust_sd(lres, 0.005)
    med = float(np.median(lres))
    for i in np.argsort(-resid)[: max_suspects + 1]:
        zi = (lres[i] - med) / sd
        if resid[i] >= worker_rel and zi >= z:
            persist = None if _persistence is None else _persistence.get(int(rank[i]))
            if persist is not None and persist < 0.75:  # slow in a few iterations only: data, not a straggler
                ev.setdefault("transient", {})[int(rank[i])] = persist
                continue
            expected = comp[i] / (1.0 + resid[i])
            others = np.ones(n, dtype=bool)
            others[i] = False
            sev = {"rank": int(rank[i]), "dp": int(dpc[i]), "pp": int(ppc[i]), "tp": int(tpc[i]),
                   "compute": float(comp[i]), "expected": float(expected), "rel_excess": float(resid[i]),
                   "z": float(zi), "comm": float(comm[i]), "peers_comm_median": float(np.median(comm[others])),
                   "wait": float(wait[i]), "peers_wait_median": float(np.median(wait[others])),
                   "iterations_slow": persist}
            if cells:
                sev.update(reporting_rank=sev.pop("rank"), tp="any rank of the TP group (one reports)",
                           cell_time=sev.pop("compute"))
                suspects.append(Suspect("cell", ("cell", int(dpc[i]), int(ppc[i])), float(comp[i] - expected),
                                        float(zi / z), sev))
            else:
                suspects.append(Suspect("worker", ("rank", int(rank[i])), float(comp[i] - expected), float(zi / z), sev))
    if _spread is not None:
        ev["replica_spread"], ev["step_stretch"] = _spread
    elif len(replicas) >= 2:
        ev["replica_spread"], ev["step_stretch"] = _replica_spread(comp, ppc, dpc)

    # 3. communication groups: min over members estimates the transfer time
    transfers = _transfers if _transfers is not None else _group_transfers(recs)
    ev["ops"] = bool(transfers)
    for kind, groups in transfers.items():
        if len(groups) < 2:
            continue
        locs = list(groups)
        mins = np.array([groups[g][0] for g in locs])
        ref = _lower_median(mins)
        if ref <= 0:
            continue
        gsd = _robust_sd(mins, 0.02 * ref)
        series = (_series or {}).get(kind)
        for gi in np.argsort(-mins)[: max_suspects + 1]:
            rel = mins[gi] / ref - 1.0
            zg = (mins[gi] - ref) / gsd
            loc = locs[gi]
            if len(groups) == 2:
                # Two groups: no spread to score against (a MAD of two values caps z near 1.35). Over a
                # window, the slower one must be slower by link_rel/2 in 7 of 8 iterations or more.
                if series is None or rel < link_rel:
                    continue
                other = locs[1 - gi]
                a, b = np.asarray(series[loc]), np.asarray(series[other])
                consistency = float(np.mean(a > b * (1.0 + link_rel / 2)))
                if consistency < 0.875:
                    continue
                suspects.append(
                    Suspect("link", loc, float(mins[gi] - ref), float(rel / link_rel),
                            {"kind": kind, "transfer_estimate": float(mins[gi]), "reference": ref, "rel_excess": float(rel),
                             "z": None, "iterations_slower": consistency, "members": list(groups[loc][1])})
                )
            elif rel >= link_rel and zg >= z:
                suspects.append(
                    Suspect("link", loc, float(mins[gi] - ref), float(zg / z),
                            {"kind": kind, "transfer_estimate": float(mins[gi]), "reference": ref, "rel_excess": float(rel),
                             "z": float(zg), "members": list(groups[loc][1])})
                )

    suspects.sort(key=lambda s: (-s.excess_s, -s.score))
    suspects = suspects[:max_suspects]
    if suspects:
        top = suspects[0]
        runner = next((s for s in suspects[1:] if s.location != top.location), None)
        if runner is None or top.excess_s >= dominance * runner.excess_s:
            return Localization(top.culprit, top.location, tuple(suspects), ev)
        ev["ambiguous"] = True
    if ev.get("replica_spread", 0.0) >= spread_sigma:
        return Localization("spread", None, tuple(suspects), ev)
    return Localization("none", None, tuple(suspects), ev)


def _rank_residuals(comp: np.ndarray, ppc: np.ndarray, dpc: np.ndarray) -> np.ndarray:
    """Each rank's compute over its stage's level and its replica's factor, minus 1."""
    x = comp / _per_element(comp, ppc)
    if len(np.unique(dpc)) == len(dpc):  # one rank per replica: compare the replicas
        return x / _lower_median(x) - 1.0 if len(x) >= 3 else np.zeros(len(x))
    return x / _per_element(x, dpc) - 1.0


def _effective_compute(recs: Sequence[Mapping[str, Any]], cells: bool) -> np.ndarray:
    comp = np.array([float(r["compute"]) for r in recs])
    if cells:
        comp = comp + np.array([float(r["ops"]["tp"]) if isinstance(r.get("ops"), Mapping) and "tp" in r["ops"]
                                else 0.0 for r in recs])
    return comp


def _cell_mode(recs: Sequence[Mapping[str, Any]], tp_size: int | None) -> bool:
    """One record per (dp, pp) of a job with tensor parallelism: ranks stand for their TP group."""
    cells = {(int(r["dp"]), int(r["pp"])) for r in recs}
    if len(cells) != len(recs):
        return False
    if tp_size is None:
        sizes = [int(r["tp_size"]) for r in recs if r.get("tp_size") is not None]
        if sizes:
            tp_size = max(sizes)
        elif any(int(r["tp"]) >= 1 for r in recs) or any(
                isinstance(r.get("ops"), Mapping) and float(r["ops"].get("tp", 0.0)) > 0 for r in recs):
            tp_size = 2  # some TP exists; its size does not matter here
        else:
            tp_size = 1
    return tp_size > 1


def _replica_factors(comp: np.ndarray, ppc: np.ndarray, dpc: np.ndarray) -> np.ndarray:
    """Each replica's compute factor in one iteration (replicas in np.unique(dpc)'s order): lower median over
    its ranks of compute / stage level."""
    return _group_medians(comp / _per_element(comp, ppc), dpc)[1]


def _replica_spread(comp: np.ndarray, ppc: np.ndarray, dpc: np.ndarray) -> tuple[float, float]:
    """(robust sd of the log replica factors, slowest replica / median replica - 1) of one iteration."""
    rv = _replica_factors(comp, ppc, dpc)
    return float(_robust_sd(np.log(rv), 0.0)), float(rv.max() / np.median(rv) - 1.0)


def _window_spread(iterations: Sequence[Sequence[Mapping[str, Any]]], tp_size: int | None) -> tuple[float, float] | None:
    """(spread, step stretch) over a window: the part of the log replica factors that moves between iterations.

    ``log R[i, d] = a_i + b_d + e[i, d]``: ``a_i`` is the iteration's level,
    ``b_d`` a persistent offset of replica ``d`` (a culprit's business, not
    spread); the spread is the standard deviation of ``e`` (two-way residuals,
    ``(iterations - 1) x (replicas - 1)`` degrees of freedom, so two replicas
    over eight iterations are enough). The stretch is the median over
    iterations of slowest / median replica - 1.
    """
    rows, stretch = [], []
    replicas: np.ndarray | None = None
    for it in iterations:
        dpc = np.array([r["dp"] for r in it])
        reps = np.unique(dpc)
        if len(reps) < 2 or (replicas is not None and not np.array_equal(reps, replicas)):
            return None
        replicas = reps
        ppc = np.array([r["pp"] for r in it])
        comp = _effective_compute(it, _cell_mode(it, tp_size))
        rv = _replica_factors(comp, ppc, dpc)
        rows.append(np.log(rv))
        stretch.append(float(rv.max() / _small_median(rv) - 1.0))
    if len(rows) < 2:
        return None
    L = np.array(rows)
    e = L - L.mean(axis=1, keepdims=True) - L.mean(axis=0, keepdims=True) + L.mean()
    dof = (L.shape[0] - 1) * (L.shape[1] - 1)
    return float(np.sqrt((e ** 2).sum() / dof)), float(np.median(stretch))


def _median_records(iterations: Sequence[Sequence[Mapping[str, Any]]], validated: bool = False) -> list[dict[str, Any]]:
    its = [list(it) if validated else _validate(it) for it in iterations]
    ranks = [r["rank"] for r in its[0]]
    if all(len(it) == len(ranks) and [r["rank"] for r in it] == ranks for it in its):
        return _median_records_aligned(its)
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for it in its:
        for r in it:
            by_rank.setdefault(int(r["rank"]), []).append(r)
    out = []
    for rk, rs in sorted(by_rank.items()):
        rec: dict[str, Any] = {k: int(rs[-1][k]) for k in ("rank", "dp", "pp", "tp")}
        rec["compute"] = float(np.median([r["compute"] for r in rs]))
        rec["comm"] = float(np.median([r["comm"] for r in rs]))
        if any(r.get("wait") is not None for r in rs):
            rec["wait"] = float(np.median([float(r.get("wait") or 0.0) for r in rs]))
        if rs[-1].get("tp_size") is not None:
            rec["tp_size"] = int(rs[-1]["tp_size"])
        if all(isinstance(r.get("ops"), Mapping) for r in rs):
            kinds = set.intersection(*(set(r["ops"]) for r in rs))
            rec["ops"] = {k: float(np.median([r["ops"][k] for r in rs])) for k in sorted(kinds)}
        out.append(rec)
    return out


def _median_records_aligned(its: list[list[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """:func:`_median_records` when every iteration holds the same ranks in the same order (vectorised)."""
    last = its[-1]
    comp = np.median(np.array([[r["compute"] for r in it] for it in its], dtype=float), axis=0)
    comm = np.median(np.array([[r["comm"] for r in it] for it in its], dtype=float), axis=0)
    has_wait = [any(it[i].get("wait") is not None for it in its) for i in range(len(last))]
    wait = np.median(np.array([[float(r.get("wait") or 0.0) for r in it] for it in its]), axis=0) if any(has_wait) else None
    all_ops = all(isinstance(r.get("ops"), Mapping) for it in its for r in it)
    ops_med: dict[str, np.ndarray] = {}
    if all_ops:
        common = set.intersection(*(set(r["ops"]) for it in its for r in it))
        for k in sorted(common):
            ops_med[k] = np.median(np.array([[r["ops"][k] for r in it] for it in its], dtype=float), axis=0)
    out = []
    for i, r in enumerate(last):
        rec: dict[str, Any] = {k: int(r[k]) for k in ("rank", "dp", "pp", "tp")}
        rec["compute"] = float(comp[i])
        rec["comm"] = float(comm[i])
        if wait is not None and has_wait[i]:
            rec["wait"] = float(wait[i])
        if r.get("tp_size") is not None:
            rec["tp_size"] = int(r["tp_size"])
        if all_ops:
            rec["ops"] = {k: float(v[i]) for k, v in ops_med.items()}
        out.append(rec)
    return sorted(out, key=lambda x: x["rank"])


def localize_window(iterations: Sequence[Sequence[Mapping[str, Any]]], **params: Any) -> Localization:
    """:func:`localize` on each rank's median over several iterations.

    Examples
    --------
    Eight steps of a dp 2 x pp 2 job whose second stage computes 20 % longer:

    >>> import numpy as np
    >>> rng = np.random.default_rng(7)
    >>> steps = [[{"rank": r, "dp": r % 2, "pp": r // 2, "tp": 0,
    ...            "compute": (1.2 if r // 2 == 1 else 1.0) * (1 + 0.01 * rng.standard_normal()), "comm": 0.3}
    ...           for r in range(4)] for _ in range(8)]
    >>> loc = localize_window(steps)
    >>> loc.culprit, loc.location
    ('stage', ('stage', 1))
    """
    if not isinstance(iterations, Sequence) or len(iterations) == 0:
        raise DetectorError("iterations must be a non-empty sequence of per-rank record lists")
    iterations = [_validate(it) for it in iterations]
    per_it = [_group_transfers(it) for it in iterations]
    spread = _window_spread(iterations, params.get("tp_size"))
    if spread is not None:
        params = dict(params, _spread=spread)
    transfers: dict[str, dict[tuple, tuple[float, tuple[int, ...]]]] = {}
    series: dict[str, dict[tuple, list[float]]] = {}
    if all(per_it):
        for kind in set.intersection(*(set(g) for g in per_it)):
            locs = set.intersection(*(set(g[kind]) for g in per_it))
            series[kind] = {loc: [g[kind][loc][0] for g in per_it] for loc in sorted(locs)}
            transfers[kind] = {loc: (float(np.median(series[kind][loc])), per_it[-1][kind][loc][1]) for loc in sorted(locs)}
    # how often each rank is slow, iteration by iteration (a straggler is slow in (nearly) all of them)
    slow_count: dict[int, int] = {}
    seen: dict[int, int] = {}
    worker_rel = params.get("worker_rel", 0.06)
    for it in iterations:
        cells = _cell_mode(it, params.get("tp_size"))
        resid = _rank_residuals(_effective_compute(it, cells), np.array([r["pp"] for r in it]),
                                np.array([r["dp"] for r in it]))
        for r, e in zip(it, resid):
            k = int(r["rank"])
            seen[k] = seen.get(k, 0) + 1
            slow_count[k] = slow_count.get(k, 0) + int(e >= worker_rel / 2)
    persistence = {k: slow_count[k] / seen[k] for k in seen} if len(iterations) >= 4 else None
    return localize(_median_records(iterations, validated=True), _transfers=transfers, _series=series,
                    _persistence=persistence, **params)


def falcon_rule(times: Sequence[float] | np.ndarray, factor: float = 1.1) -> np.ndarray:
    """Falcon's baseline: indices whose time exceeds ``factor`` x the median.

    >>> falcon_rule([1.0, 1.02, 0.99, 1.3, 1.01]).tolist()
    [3]
    """
    a = np.asarray(times, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise DetectorError("times must be a non-empty 1-D sequence")
    return np.flatnonzero(a > factor * np.median(a))


def falcon_localize(records: Sequence[Mapping[str, Any]], factor: float = 1.1) -> Localization:
    """Baseline localizer from :func:`falcon_rule` on compute times.

    One flagged rank -> ``worker``; the flagged ranks are exactly one stage ->
    ``stage``; else ``none`` (it has no notion of a slow link).
    """
    recs = _validate(records)
    comp = np.array([float(r["compute"]) for r in recs])
    flagged = falcon_rule(comp, factor)
    if len(flagged) == 1:
        r = recs[int(flagged[0])]
        return Localization("worker", ("rank", int(r["rank"])), ())
    if len(flagged) > 1:
        stages = {int(recs[i]["pp"]) for i in flagged}
        if len(stages) == 1:
            p = stages.pop()
            if len(flagged) == sum(1 for r in recs if r["pp"] == p):
                return Localization("stage", ("stage", p), ())
    return Localization("none", None, ())
