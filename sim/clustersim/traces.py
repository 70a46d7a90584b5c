"""Failure traces for the cluster simulator: fail-stops by severity and fail-slows, per node.

A trace is the ground truth of what goes wrong in a cluster over a span of
time, independent of what runs there (the simulator maps each event to the
job on the node at that moment):

* **fail-stops**, Poisson per node, in Unicron's severity classes:

  - sev1, the node must leave (``node_loss``: heartbeats stop; ``xid`` 79
    fallen off the bus or 48 double-bit ECC): the node is unavailable for a
    repair time uniform in 1..7 days;
  - sev2, restart the process (``process_exit``, ``exception`` cuda_error /
    illegal_memory_access, ``hang``): cured by a restart;
  - sev3, retry in place (``exception`` nccl_timeout / connection_reset):
    cured by a retry 80 % of the time, else it needs a restart;

  ``cure`` records the least remedy that cures it (``retry``, ``restart``,
  ``exclude``): 73 % .. 77 % of the failures of the presets are transient,
  as in the field;
* **fail-slows** (Falcon's characterization): *computation* (a GPU computes
  slower: throttling, a bad part), rare and short (1..30 min, log-uniform),
  the GPU slowed 1.2..2.5x; *communication* (a congested link, with the CNP
  surge that comes with it), frequent and long (10 min..4 h, log-uniform,
  mean 72 min), the link's transfers slowed 1.5..8x. A link is named by one
  endpoint; the simulator pairs it with that node's all-reduce neighbour in
  the job it serves.

Events fall on nodes that are up at the time (a node under repair neither
fails nor slows) while any is up; a preset keeps its exact counts, so once
every node is down its remaining events land on nodes under repair and
change nothing (:meth:`FailureTrace.on_down_nodes` counts them). Presets
(:data:`PRESETS`) are Unicron's traces on 128 GPUs (16 nodes) with exact
counts — ``trace-a``: 8 weeks, 10 sev1 + 33 others; ``trace-b``: 20x the
rate, 7 days, 26 sev1 + 80 others — plus fail-slows at the same per-node
rates in both (trace-b: 20x). On another number of nodes a preset keeps
its per-node rates: counts scale with the node count (rounded), so a
preset names the *rate*, not the cluster.
:func:`poisson_trace` draws counts instead (the large-scale run).

Pure: numpy only; one seed drives everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["FailStop", "FailSlowFault", "FailureTrace", "PRESETS", "preset", "poisson_trace", "DAY"]

DAY = 86400.0
Cure = Literal["retry", "restart", "exclude"]

#: Kind, detail, weight within a severity.
SEV1_KINDS = (("node_loss", "", 0.5), ("xid", "79", 0.25), ("xid", "48", 0.25))
SEV2_KINDS = (("process_exit", "", 0.3), ("exception", "cuda_error", 0.3),
              ("exception", "illegal_memory_access", 0.1), ("hang", "", 0.3))
SEV3_KINDS = (("exception", "nccl_timeout", 0.5), ("exception", "connection_reset", 0.5))


@dataclass(frozen=True)
class FailStop:
    """One fail-stop: ``t`` seconds into the trace on ``node``."""

    t: float
    node: str
    severity: int
    kind: str  # node_loss | xid | process_exit | exception | hang
    detail: str  # XID code or exception category
    cure: Cure
    repair_s: float = 0.0  # sev1: how long the node is unavailable

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class FailSlowFault:
    """One fail-slow: ``node``'s GPU ``gpu`` (computation) or link (communication) runs ``factor`` x slower."""

    t: float
    node: str
    cause: Literal["computation", "communication"]
    factor: float
    duration_s: float
    gpu: int = 0
    cnp_surge: bool = False

    @property
    def end(self) -> float:
        return self.t + self.duration_s


@dataclass(frozen=True)
class FailureTrace:
    name: str
    nodes: tuple[str, ...]
    duration_s: float
    seed: int
    fail_stops: tuple[FailStop, ...]
    fail_slows: tuple[FailSlowFault, ...]

    def counts(self) -> dict[str, int]:
        c = {"sev1": 0, "sev2": 0, "sev3": 0, "fail_slow_computation": 0, "fail_slow_communication": 0}
        for f in self.fail_stops:
            c[f"sev{f.severity}"] += 1
        for s in self.fail_slows:
            c[f"fail_slow_{s.cause}"] += 1
        c["others"] = c["sev2"] + c["sev3"]
        return c

    def outages(self) -> list[tuple[str, float, float]]:
        """The sev1 repairs as the simulator plays them: ``(node, down at, back at)`` in time order.

        A fault on a node under repair changes nothing there (the first repair stands).

        >>> t = FailureTrace("x", ("n0",), 10 * DAY, 0, (FailStop(0.0, "n0", 1, "node_loss", "", "exclude", DAY),
        ...     FailStop(3600.0, "n0", 1, "xid", "79", "exclude", 5 * DAY)), ())
        >>> [(n, a, b / DAY) for n, a, b in t.outages()]
        [('n0', 0.0, 1.0)]
        """
        down_until: dict[str, float] = {}
        out = []
        for f in sorted(self.fail_stops, key=lambda f: f.t):
            # >=: the simulator plays a fault at the very instant of a repair before the repair
            if f.severity != 1 or down_until.get(f.node, -1.0) >= f.t:
                continue
            down_until[f.node] = f.t + f.repair_s
            out.append((f.node, f.t, f.t + f.repair_s))
        return out

    def on_down_nodes(self) -> int:
        """How many faults fall on a node under repair and so change nothing.

        :func:`preset` keeps its exact counts, so when every node is down
        (trace-b can take the whole cluster down) its faults land on nodes
        already under repair.
        """
        down = self.outages()

        def is_down(node: str, t: float) -> bool:
            return any(n == node and a < t <= b for n, a, b in down)
        starts = {(n, a) for n, a, _ in down}
        stops = sum(1 for f in self.fail_stops if (f.node, f.t) not in starts and is_down(f.node, f.t))
        return stops + sum(1 for s in self.fail_slows if is_down(s.node, s.t))


@dataclass(frozen=True)
class _Preset:
    days: float
    sev1: int
    others: int
    computation: int
    communication: int
    nodes: int = 16


#: Unicron's traces on 16 nodes (128 GPUs), with fail-slows at Falcon-like rates.
PRESETS: dict[str, _Preset] = {
    "trace-a": _Preset(days=56, sev1=10, others=33, computation=4, communication=12),
    "trace-b": _Preset(days=7, sev1=26, others=80, computation=10, communication=30),
}


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _pick(rng: np.random.Generator, table: tuple[tuple[str, str, float], ...]) -> tuple[str, str]:
    w = np.array([p for *_, p in table])
    k = int(rng.choice(len(table), p=w / w.sum()))
    return table[k][0], table[k][1]


def _build(name: str, nodes: list[str], duration_s: float, seed: int, n_sev1: int, n_others: int,
           n_comp: int, n_comm: int) -> FailureTrace:
    rng = np.random.default_rng(seed)
    # What happens, then when (uniform order statistics: a Poisson process given its count).
    what = ["sev1"] * n_sev1 + ["other"] * n_others + ["comp"] * n_comp + ["comm"] * n_comm
    times = np.sort(rng.uniform(0.0, duration_s, size=len(what)))
    order = rng.permutation(len(what))
    down_until = {n: -1.0 for n in nodes}
    stops: list[FailStop] = []
    slows: list[FailSlowFault] = []
    for t, k in zip(times.tolist(), order.tolist()):
        kind = what[k]
        up = [n for n in nodes if down_until[n] < t]
        node = up[int(rng.integers(len(up)))] if up else nodes[int(rng.integers(len(nodes)))]
        if kind == "sev1":
            fk, detail = _pick(rng, SEV1_KINDS)
            repair = float(rng.uniform(1.0, 7.0)) * DAY
            if down_until[node] < t:  # on a node under repair it changes nothing (the first repair stands)
                down_until[node] = t + repair
            stops.append(FailStop(t, node, 1, fk, detail, "exclude", repair))
        elif kind == "other":
            if rng.random() < 0.5:
                fk, detail = _pick(rng, SEV2_KINDS)
                stops.append(FailStop(t, node, 2, fk, detail, "restart"))
            else:
                fk, detail = _pick(rng, SEV3_KINDS)
                stops.append(FailStop(t, node, 3, fk, detail, "retry" if rng.random() < 0.8 else "restart"))
        elif kind == "comp":
            slows.append(FailSlowFault(t, node, "computation", _loguniform(rng, 1.2, 2.5), _loguniform(rng, 60, 1800),
                                  gpu=int(rng.integers(8))))
        else:
            slows.append(FailSlowFault(t, node, "communication", _loguniform(rng, 1.5, 8.0),
                                  _loguniform(rng, 600, 4 * 3600), cnp_surge=True))
    return FailureTrace(name, tuple(nodes), float(duration_s), seed, tuple(stops), tuple(slows))


def preset(name: str, nodes: list[str], seed: int = 0) -> FailureTrace:
    """Preset ``name`` on ``nodes``: exact counts on 16 nodes, scaled with the node count otherwise.

    >>> t = preset("trace-a", [f"n{i}" for i in range(16)], seed=1)
    >>> c = t.counts(); c["sev1"], c["others"], t.duration_s / DAY
    (10, 33, 56.0)
    """
    if name not in PRESETS:
        raise ValueError(f"unknown trace preset {name!r}; expected one of {sorted(PRESETS)}")
    p = PRESETS[name]
    scale = len(nodes) / p.nodes
    n = lambda c: int(round(c * scale))  # noqa: E731
    return _build(name, list(nodes), p.days * DAY, seed, n(p.sev1), n(p.others), n(p.computation),
                  n(p.communication))


def poisson_trace(base: str, nodes: list[str], days: float, seed: int = 0) -> FailureTrace:
    """A trace at the per-node rates of preset ``base`` over ``days``, with Poisson counts."""
    if base not in PRESETS:
        raise ValueError(f"unknown trace preset {base!r}; expected one of {sorted(PRESETS)}")
    if not days > 0:
        raise ValueError(f"days must be > 0, got {days}")
    p = PRESETS[base]
    rng = np.random.default_rng([seed, 7])
    node_days = len(nodes) * days / (p.nodes * p.days)
    lam = [p.sev1, p.others, p.computation, p.communication]
    counts = [int(rng.poisson(c * node_days)) for c in lam]
    return _build(f"{base}-poisson", list(nodes), days * DAY, seed, *counts)
