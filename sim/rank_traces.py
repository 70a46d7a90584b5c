"""Synthetic multi-rank traces with exact ground truth (numpy only).

Two generators, used by the localization benchmark and the unit tests:

* :func:`make_localization_case` — a few iterations of per-rank records of a
  3D-parallel (dp x pp x tp) synchronous job, with per-op communication
  timings, heavy-ish jitter and data-dependent imbalance always present, and
  at most one persistent culprit: a slow worker, a slow pipeline stage, a slow
  communication group (tp group, dp group or pipeline lane), or none (only
  data-dependent imbalance, sometimes strong).
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
  ``max_p(cell) - cell_p + x_pp`` in send/recv;
* the data-parallel group (p, t) all-reduces when its last replica arrives:
  ``max_d(a) - a_r + x_dp``; what remains of the iteration is idle.

A collective's duration is the wait for the last member plus the transfer
``x`` of its group, so the last arriver's duration is the pure transfer:
that is what makes a slow link visible (every member of its group, including
the last to arrive, spends longer), as opposed to a slow rank (its peers wait
for it, it does not wait).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GRIDS", "CULPRIT_CLASSES", "make_localization_case", "make_collective_stream"]

#: (dp, pp, tp) layouts drawn by the generator (8 to 128 ranks).
GRIDS = [(4, 4, 2), (8, 2, 4), (2, 4, 8), (16, 1, 8), (8, 4, 1), (32, 1, 1), (4, 8, 2), (4, 2, 8), (2, 8, 4), (16, 2, 2)]
CULPRIT_CLASSES = ("worker", "stage", "link", "none")


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
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """One localization case: ``n_iters`` iterations of per-rank records and the truth.

    Returns ``(iterations, truth)``; each iteration is a list of records
    ``{"rank", "dp", "pp", "tp", "compute", "comm", "ops": {"tp"|"pp"|"dp": s}}``
    (``ops`` only with ``with_ops``; kinds whose groups have one member are left
    out); ``truth = {"culprit": class, "location": ..., "severity": s, "grid": (dp, pp, tp)}``
    with location ``("rank", r)``, ``("stage", p)``, ``("tp", d, p)``,
    ``("dp", p, t)``, ``("pp", d, t)`` or ``None``.
    """
    if grid is None:
        grid = GRIDS[int(rng.integers(len(GRIDS)))]
    dp, pp, tp = grid
    kinds = [k for k, n in (("tp", tp), ("pp", pp), ("dp", dp)) if n >= 2]
    # a slow group can only be told apart from other groups of its kind
    n_groups = {"tp": dp * pp, "pp": dp * tp, "dp": pp * tp}
    link_kinds = [k for k in kinds if n_groups[k] >= 2]
    if culprit is None:
        choices = ["worker", "none"] + (["stage"] if pp >= 2 else []) + (["link"] if link_kinds else [])
        culprit = str(rng.choice(choices))
    if culprit == "stage" and pp < 2:
        raise ValueError("a slow stage needs pp >= 2")
    if culprit == "link" and not link_kinds:
        raise ValueError("a slow link needs a kind of group with two members or more and two groups or more")

    base = float(rng.uniform(0.3, 2.0))  # seconds of compute per iteration
    stage_base = base * (1.0 + rng.uniform(-0.02, 0.02, size=pp))
    x = {"tp": base * rng.uniform(0.08, 0.25), "pp": base * rng.uniform(0.02, 0.06), "dp": base * rng.uniform(0.05, 0.2)}
    noisy = culprit == "none"
    sigma_data = rng.uniform(0.05, 0.12) if noisy else rng.uniform(0.01, 0.04)
    sigma_rank = rng.uniform(0.02, 0.05) if noisy else rng.uniform(0.005, 0.015)
    sigma_jit = 0.01
    slow_rank = np.ones((dp, pp, tp))
    link_where: tuple | None = None
    location: tuple | None = None
    if culprit == "worker":
        s = severity if severity is not None else float(rng.uniform(0.1, 0.9))
        d, p, t = int(rng.integers(dp)), int(rng.integers(pp)), int(rng.integers(tp))
        slow_rank[d, p, t] = 1.0 + s
        location = ("rank", _rank_of(d, p, t, dp, pp, tp))
    elif culprit == "stage":
        s = severity if severity is not None else float(rng.uniform(0.1, 0.6))
        p = int(rng.integers(pp))
        slow_rank[:, p, :] = 1.0 + s
        location = ("stage", p)
    elif culprit == "link":
        s = severity if severity is not None else float(rng.uniform(0.3, 3.0))
        kind = str(rng.choice(link_kinds))
        if kind == "tp":
            link_where = ("tp", int(rng.integers(dp)), int(rng.integers(pp)))
        elif kind == "pp":
            link_where = ("pp", int(rng.integers(dp)), int(rng.integers(tp)))
        else:
            link_where = ("dp", int(rng.integers(pp)), int(rng.integers(tp)))
        location = link_where
    elif culprit == "none":
        s = 0.0
    else:
        raise ValueError(f"unknown culprit class {culprit!r}; expected one of {CULPRIT_CLASSES}")

    def xfer(kind: str, shape: tuple[int, ...], sl: tuple | None) -> np.ndarray:
        v = x[kind] * np.exp(rng.normal(0, 0.03, size=shape))
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
        arrive = lane_max[:, None, None] + x_pp[:, None, :] + np.zeros((dp, pp, tp))
        # data parallel group (p, t)
        x_dp = xfer("dp", (pp, tp), link_where[1:] if link_where and link_where[0] == "dp" else None) if dp >= 2 else np.zeros((pp, tp))
        amax = arrive.max(axis=0)  # (pp, tp)
        dp_op = (amax[None] - arrive) + x_dp[None]
        # per-rank measurement noise on op durations (timer resolution, launch skew)
        ops = {"tp": tp_op, "pp": pp_op, "dp": dp_op}
        for k in ops:
            ops[k] = np.maximum(ops[k] * np.exp(rng.normal(0, 0.01, size=ops[k].shape)), 0.0)
        records = []
        for d in range(dp):
            for p in range(pp):
                for t in range(tp):
                    rop = {k: float(ops[k][d, p, t]) for k in kinds}
                    rec: dict[str, Any] = {
                        "rank": _rank_of(d, p, t, dp, pp, tp),
                        "dp": d,
                        "pp": p,
                        "tp": t,
                        "compute": float(c[d, p, t]),
                        "comm": float(sum(rop.values())),
                    }
                    if with_ops:
                        rec["ops"] = rop
                    records.append(rec)
        records.sort(key=lambda r: r["rank"])
        iterations.append(records)
    truth = {"culprit": culprit, "location": location, "severity": s, "grid": (dp, pp, tp)}
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
