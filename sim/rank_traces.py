"""Synthetic multi-rank traces with exact ground truth (numpy only).

Two generators, used by the localization benchmark and the unit tests:

* :func:`make_localization_case` — a few iterations of per-rank records of a
  3D-parallel (dp x pp x tp) synchronous job, with per-op communication
  timings, jitter and data-dependent imbalance always present, and one class
  of truth: a slow worker, a slow pipeline stage, a slow communication group
  (tp group, dp group or pipeline lane), ``spread`` (strong data-dependent
  imbalance across replicas that moves from iteration to iteration, e.g.
  sequence lengths, and no persistent culprit) or ``none`` (healthy: only
  mild imbalance). Options: pipeline bubbles (waits whose size depends on
  the stage), and only one rank per tensor-parallel group reporting.
* :func:`make_collective_stream` — the (op, group, timestamp) stream of
  collective calls one training process issues (tensor-parallel collectives
  per layer and micro-batch, pipeline send/recv, data-parallel bucketed
  reduce-scatter, ZeRO all-gather, grad-norm all-reduce, an occasional logging
  all-reduce and a one-off set-up prefix), with the true calls-per-iteration
  and the true start time of every iteration.

The timing model of one iteration (per rank ``r`` at coordinates d, p, t):

* compute ``c_r = B_p * f_d * g_r * j_r`` — stage base (small natural stage
  imbalance), a per-iteration data factor of the replica (sequence lengths),
  a per-iteration per-rank data factor (e.g. MoE routing), and jitter;
* tensor-parallel collectives are interleaved with compute, so a tp group
  finishes at ``max(c) + x_tp``: rank ``r`` spends ``max(c) - c_r + x_tp`` in tp ops;
* the pipeline lane (d, t) is paced by its slowest stage: each stage spends
  ``max_p(cell) - cell_p + x_pp`` in send/recv (waiting for its neighbours
  and transferring);
* with bubbles, each stage also waits in the schedule's warm-up and
  cool-down (1F1B: stage p waits ~p forward micro-batches before its first
  one, and ~pp-1-p backward ones after its last): ``bubble_p = beta *
  B * f_d * (a * p + b * (pp - 1 - p)) / (pp - 1)``, with ``beta`` up to 1 (a
  bubble as long as the compute) and the shape ``a, b`` drawn per case, so
  one end of the pipeline waits much longer than the other (the loop marks
  them with ``pipeline_wait()``: kind ``bubble``);
* the data-parallel group (p, t) all-reduces when its last replica arrives:
  ``max_d(a) - a_r + x_dp``; what remains of the iteration is idle.

A collective's duration is the wait for the last member plus the transfer
``x`` of its group, so the last arriver's duration is the pure transfer:
that is what makes a slow link visible (every member of its group, including
the last to arrive, spends longer), as opposed to a slow rank (its peers wait
for it, it does not wait).

Each record holds ``compute`` (the true compute), ``comm`` (time in
collectives: tp and dp), ``wait`` (time waiting for peers outside
collectives: pipeline send/recv and bubbles), ``ops`` (per kind: tp, dp, pp =
send/recv, and bubble) and, with ``parts=True``, the pieces of the rank's
iteration in order, for replaying it through the training hooks
(:mod:`vigil.sim.hook_replay`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GRIDS", "CULPRIT_CLASSES", "make_localization_case", "make_collective_stream"]

#: (dp, pp, tp) layouts drawn by the generator (8 to 128 ranks).
GRIDS = [(4, 4, 2), (8, 2, 4), (2, 4, 8), (16, 1, 8), (8, 4, 1), (32, 1, 1), (4, 8, 2), (4, 2, 8), (2, 8, 4), (16, 2, 2)]
CULPRIT_CLASSES = ("worker", "stage", "link", "spread", "none")


def _rank_of(d: int, p: int, t: int, dp: int, pp: int, tp: int) -> int:
    # Megatron order: tp fastest, then dp, then pp
    return (p * dp + d) * tp + t


def make_localization_case(
    rng: np.random.Generator,
    culprit: str | None = None,
    grid: tuple[int, int, int] | None = None,
    n_iters: int = 8,
    severity: float | None = None,
    with_ops: bool = True,
    bubbles: bool | None = False,
    one_reporter_per_tp_group: bool = False,
    parts: bool = False,
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """One localization case: ``n_iters`` iterations of per-rank records and the truth.

    Returns ``(iterations, truth)``; each iteration is a list of records
    ``{"rank", "dp", "pp", "tp", "compute", "comm", "wait", "ops": {"tp"|"pp"|"dp"|"bubble": s}}``
    (``ops`` only with ``with_ops``; kinds whose groups have one member are
    left out); ``truth = {"culprit": class, "location": ..., "severity": s,
    "grid": (dp, pp, tp), "bubbles": bool, "one_reporter": bool}`` with location ``("rank", r)``,
    ``("stage", p)``, ``("tp", d, p)``, ``("dp", p, t)``, ``("pp", d, t)``,
    ``("cell", d, p)`` or ``None`` (``spread``, ``none``).

    ``bubbles``: pipeline bubbles (True, False, or None: drawn, half of the
    cases with ``pp >= 2``). ``one_reporter_per_tp_group``: only the ranks
    with ``tp == 0`` report; anything slow inside a tensor-parallel group
    (one of its ranks, or its link) is then located as its cell
    ``("cell", d, p)``, class ``cell``, and data-parallel groups and pipeline
    lanes are slowed only where the reporters are. ``parts``: each record
    also carries ``parts``, the pieces of its iteration (see
    :mod:`vigil.sim.hook_replay`).
    """
    if grid is None:
        grid = GRIDS[int(rng.integers(len(GRIDS)))]
    dp, pp, tp = grid
    kinds = [k for k, n in (("tp", tp), ("pp", pp), ("dp", dp)) if n >= 2]
    # a slow group can only be told apart from other groups of its kind
    n_groups = {"tp": dp * pp, "pp": dp * tp, "dp": pp * tp}
    link_kinds = [k for k in kinds if n_groups[k] >= 2]
    if one_reporter_per_tp_group:
        # reporters (tp == 0) see a tp group as their cell; dp groups and lanes only at tp == 0
        link_kinds = [k for k in link_kinds if k == "tp" or (k == "dp" and pp >= 2) or (k == "pp" and dp >= 2)]
    if culprit is None:
        choices = ["worker", "spread", "none"] + (["stage"] if pp >= 2 else []) + (["link"] if link_kinds else [])
        culprit = str(rng.choice(choices))
    if culprit == "stage" and pp < 2:
        raise ValueError("a slow stage needs pp >= 2")
    if culprit == "link" and not link_kinds:
        raise ValueError("a slow link needs a kind of group with two members or more and two groups or more")
    if bubbles is None:
        bubbles = bool(pp >= 2 and rng.random() < 0.5)
    bubbles = bool(bubbles and pp >= 2)

    base = float(rng.uniform(0.3, 2.0))  # seconds of compute per iteration
    stage_base = base * (1.0 + rng.uniform(-0.02, 0.02, size=pp))
    x = {"tp": base * rng.uniform(0.08, 0.25), "pp": base * rng.uniform(0.02, 0.06), "dp": base * rng.uniform(0.05, 0.2)}
    if culprit == "spread":  # data-dependent imbalance across replicas (and ranks), no persistent culprit
        sigma_data = rng.uniform(0.08, 0.15)
        sigma_rank = rng.uniform(0.02, 0.05)
    else:  # healthy background
        sigma_data = rng.uniform(0.005, 0.025)
        sigma_rank = rng.uniform(0.005, 0.015)
    sigma_jit = 0.01
    if bubbles:
        beta = float(rng.uniform(0.2, 1.0))
        a, b = rng.uniform(0.0, 1.0, size=2)
        if max(a, b) < 0.5:
            a, b = (1.0, b) if rng.random() < 0.5 else (a, 1.0)
        shape = np.array([(a * p + b * (pp - 1 - p)) / (pp - 1) for p in range(pp)])
        warm_share = np.array([a * p / max(a * p + b * (pp - 1 - p), 1e-12) for p in range(pp)])
    else:
        beta, shape, warm_share = 0.0, np.zeros(pp), np.zeros(pp)
    slow_rank = np.ones((dp, pp, tp))
    link_where: tuple | None = None
    location: tuple | None = None
    truth_class = culprit
    t_rep = 0
    if culprit == "worker":
        s = severity if severity is not None else float(rng.uniform(0.1, 0.9))
        d, p, t = int(rng.integers(dp)), int(rng.integers(pp)), int(rng.integers(tp))
        slow_rank[d, p, t] = 1.0 + s
        location = ("rank", _rank_of(d, p, t, dp, pp, tp))
        if one_reporter_per_tp_group and tp >= 2:
            truth_class, location = "cell", ("cell", d, p)
    elif culprit == "stage":
        s = severity if severity is not None else float(rng.uniform(0.1, 0.6))
        p = int(rng.integers(pp))
        slow_rank[:, p, :] = 1.0 + s
        location = ("stage", p)
    elif culprit == "link":
        s = severity if severity is not None else float(rng.uniform(0.3, 3.0))
        kind = str(rng.choice(link_kinds))
        t_link = t_rep if one_reporter_per_tp_group else int(rng.integers(tp))
        if kind == "tp":
            link_where = ("tp", int(rng.integers(dp)), int(rng.integers(pp)))
        elif kind == "pp":
            link_where = ("pp", int(rng.integers(dp)), t_link)
        else:
            link_where = ("dp", int(rng.integers(pp)), t_link)
        location = link_where
        if one_reporter_per_tp_group and kind == "tp":
            truth_class, location = "cell", ("cell",) + link_where[1:]
    elif culprit in ("spread", "none"):
        s = 0.0
    else:
        raise ValueError(f"unknown culprit class {culprit!r}; expected one of {CULPRIT_CLASSES}")

    def xfer(kind: str, shape_: tuple[int, ...], sl: tuple | None) -> np.ndarray:
        v = x[kind] * np.exp(rng.normal(0, 0.03, size=shape_))
        if sl is not None:
            v[sl] *= 1.0 + s
        return v

    iterations = []
    for _ in range(n_iters):
        f_d = np.exp(rng.normal(0, sigma_data, size=(dp, 1, 1)))
        g = np.exp(rng.normal(0, sigma_rank, size=(dp, pp, tp)))
        j = np.exp(rng.normal(0, sigma_jit, size=(dp, pp, tp)))
        c = stage_base[None, :, None] * f_d * g * j * slow_rank
        # tensor parallel: group (d, p)
        x_tp = xfer("tp", (dp, pp), link_where[1:] if link_where and link_where[0] == "tp" else None) if tp >= 2 else np.zeros((dp, pp))
        cmax = c.max(axis=2)  # (dp, pp)
        tp_op = (cmax[:, :, None] - c) + x_tp[:, :, None]
        cell = cmax + x_tp  # (dp, pp)
        # pipeline lane (d, t): paced by the slowest stage
        x_pp = xfer("pp", (dp, tp), link_where[1:] if link_where and link_where[0] == "pp" else None) if pp >= 2 else np.zeros((dp, tp))
        lane_max = cell.max(axis=1)  # (dp,)
        pp_op = (lane_max[:, None, None] - cell[:, :, None]) + x_pp[:, None, :]
        # bubbles: the schedule's waits for the *other* stages' micro-batches (a slow stage's own bubble does not grow)
        others = (cell.sum(axis=1, keepdims=True) - cell) / max(pp - 1, 1)  # (dp, pp)
        bub = beta * others[:, :, None] * shape[None, :, None] * np.exp(rng.normal(0, 0.01, size=(dp, pp, tp)))
        # the lane reaches the data-parallel all-reduce after its pace, its transfers and its schedule's bubbles
        arrive = (lane_max * (1.0 + beta * float(shape.max())))[:, None, None] + x_pp[:, None, :] + np.zeros((dp, pp, tp))
        # data parallel group (p, t)
        x_dp = xfer("dp", (pp, tp), link_where[1:] if link_where and link_where[0] == "dp" else None) if dp >= 2 else np.zeros((pp, tp))
        amax = arrive.max(axis=0)  # (pp, tp)
        dp_op = (amax[None] - arrive) + x_dp[None]
        # per-rank measurement noise on op durations (timer resolution, launch skew)
        ops = {"tp": tp_op, "pp": pp_op, "dp": dp_op}
        for k in ops:
            ops[k] = np.maximum(ops[k] * np.exp(rng.normal(0, 0.01, size=ops[k].shape)), 0.0)
        idle = 0.002 * base * np.exp(rng.normal(0, 0.1, size=(dp, pp, tp)))  # the host between steps (data loading)
        records = []
        for d in range(dp):
            for p in range(pp):
                for t in range(tp):
                    if one_reporter_per_tp_group and t != t_rep:
                        continue
                    rop = {k: float(ops[k][d, p, t]) for k in kinds}
                    b_ = float(bub[d, p, t])
                    if bubbles:
                        rop["bubble"] = b_
                    rec: dict[str, Any] = {
                        "rank": _rank_of(d, p, t, dp, pp, tp),
                        "dp": d,
                        "pp": p,
                        "tp": t,
                        "compute": float(c[d, p, t]),
                        "comm": float(rop.get("tp", 0.0) + rop.get("dp", 0.0)),
                        "wait": float(rop.get("pp", 0.0) + b_),
                    }
                    if with_ops:
                        rec["ops"] = rop
                    if one_reporter_per_tp_group:
                        rec["tp_size"] = tp
                    if parts:
                        rec["parts"] = {"idle": float(idle[d, p, t]), "bubble_warm": b_ * float(warm_share[p]),
                                        "compute": float(c[d, p, t]), "tp": float(ops["tp"][d, p, t]) if tp >= 2 else 0.0,
                                        "pp": float(ops["pp"][d, p, t]) if pp >= 2 else 0.0,
                                        "bubble_cool": b_ * (1.0 - float(warm_share[p])),
                                        "dp": float(ops["dp"][d, p, t]) if dp >= 2 else 0.0}
                    records.append(rec)
        records.sort(key=lambda r: r["rank"])
        iterations.append(records)
    truth = {"culprit": truth_class, "location": location, "severity": s, "grid": (dp, pp, tp), "bubbles": bubbles,
             "one_reporter": one_reporter_per_tp_group, "planted": culprit}
    return iterations, truth


def make_collective_stream(
    rng: np.random.Generator,
    n_iters: int = 30,
    layers: int | None = None,
    microbatches: int | None = None,
    iter_time: float | None = None,
    log_every: int | None = None,
) -> tuple[list[tuple[str, str, float]], dict[str, Any]]:
    """The collective calls of one rank over ``n_iters`` iterations, with the truth.

    Returns ``(calls, truth)``: ``calls`` is a list of ``(op, group, t)``;
    ``truth = {"period": calls per regular iteration, "iter_starts": [t...],
    "iter_times": [s...], "prefix": set-up calls before iteration 0}``.
    Iteration times jitter (log-normal, sigma 2-4%) with occasional spikes;
    every ``log_every``-th iteration issues one extra logging all-reduce.
    """
    L = int(layers if layers is not None else rng.integers(4, 25))
    M = int(microbatches if microbatches is not None else rng.integers(1, 5))
    T = float(iter_time if iter_time is not None else rng.uniform(0.5, 8.0))
    log_every = int(log_every if log_every is not None else rng.integers(20, 60))
    first_stage = bool(rng.random() < 0.3)
    seq_parallel = bool(rng.random() < 0.5)
    buckets = int(rng.integers(2, 8))
    zero = bool(rng.random() < 0.6)
    tp_fwd = [("all_gather", "tp"), ("reduce_scatter", "tp")] * 2 if seq_parallel else [("all_reduce", "tp")] * 2
    tp_bwd = [("all_gather", "tp"), ("reduce_scatter", "tp")] * 2 if seq_parallel else [("all_reduce", "tp")] * 2
    one: list[tuple[str, str, float]] = []  # (op, group, relative position in [0, 1))
    fwd_share, bwd_share = 0.3, 0.55
    for m in range(M):
        if not first_stage:
            one.append(("recv", "pp", 0.0))
        for _ in range(L):
            one.extend((o, g, 0.0) for o, g in tp_fwd)
        one.append(("send", "pp", 0.0))
    for m in range(M):
        one.append(("recv", "pp", 1.0))
        for _ in range(L):
            one.extend((o, g, 1.0) for o, g in tp_bwd)
        if not first_stage:
            one.append(("send", "pp", 1.0))
    one.extend([("reduce_scatter" if zero else "all_reduce", "dp", 2.0)] * buckets)
    one.append(("all_reduce", "world", 2.0))  # grad norm
    if zero:
        one.extend([("all_gather", "dp", 2.0)] * buckets)
    P = len(one)
    # positions within the iteration: forward, backward, then the optimizer step
    n_f = sum(1 for c in one if c[2] == 0.0)
    n_b = sum(1 for c in one if c[2] == 1.0)
    n_o = P - n_f - n_b
    frac = np.concatenate(
        [
            np.sort(rng.uniform(0.0, fwd_share, n_f)),
            np.sort(rng.uniform(fwd_share, fwd_share + bwd_share, n_b)),
            np.sort(rng.uniform(fwd_share + bwd_share, 0.99, n_o)),
        ]
    )
    calls: list[tuple[str, str, float]] = []
    t = float(rng.uniform(0, 100))
    prefix = int(rng.integers(3, 12))
    for i in range(prefix):  # set-up: broadcasts of parameters, barriers
        calls.append((str(rng.choice(["broadcast", "barrier", "all_reduce"])), str(rng.choice(["world", "dp", "tp"])), t))
        t += float(rng.uniform(0.01, 0.5))
    starts, times = [], []
    for it in range(n_iters):
        dur = T * float(np.exp(rng.normal(0, rng.uniform(0.02, 0.04))))
        if rng.random() < 0.03:  # GC pause / slow data loader
            dur *= float(rng.uniform(1.3, 2.0))
        if it == 0:
            dur *= 1.5  # warm-up iteration
        # the same call pattern each iteration, each call slightly displaced
        pos = np.clip(frac + rng.normal(0, 0.002, P), 0, 0.995)
        pos = np.maximum.accumulate(pos)
        starts.append(t)
        times.append(dur)
        for (op, grp, _), q in zip(one, pos):
            calls.append((op, grp, t + float(q) * dur))
        if (it + 1) % log_every == 0:
            calls.append(("all_reduce", "world", t + 0.996 * dur))  # logging/metrics
        t += dur
    truth = {"period": P, "iter_starts": starts, "iter_times": times, "prefix": prefix, "layers": L, "microbatches": M}
    return calls, truth
