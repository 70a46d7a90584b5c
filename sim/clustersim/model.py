"""The physics of the cluster simulator: nodes, minipods, jobs, iteration time and throughput.

A job runs on a ``dp`` x ``pp`` grid of nodes of 8 GPUs (tensor parallelism
stays inside a node, as in Megatron on NVLink nodes): ``grid[d][s]`` is the
node of data-parallel replica ``d`` at pipeline stage ``s`` (the layout of
:mod:`vigil.actuators.planners.topology`). One iteration, Megatron 1F1B with a
fixed global batch of ``B`` micro-batches (one sequence each):

* every replica ``d`` runs ``m_d`` micro-batches (``ceil(B / dp)``, or the
  counts of a micro-batch rebalancing); stage ``s`` of replica ``d`` takes
  ``u[d, s] = t_mb * base[s] * share[s] * pp * f[d, s]`` per micro-batch:
  ``t_mb`` from the model's FLOPs and the GPUs' sustained FLOP/s, ``base``
  the natural stage imbalance (the first stage also runs the embedding, the
  last one the output layer and the loss), ``share`` the layer split (uniform
  unless a topology adjustment rebalanced it) and ``f >= 1`` the slowdown of
  the slowest GPU of that node (a tensor-parallel group waits for its
  slowest rank);
* a pipeline is paced by its slowest stage: ``T_d = (m_d + pp - 1) * max_s u[d, s]``
  (the ``pp - 1`` slots are the bubble);
* the replicas then all-reduce their gradients, which starts when the last
  replica is done: ``max_d T_d + A + P + overhead``. ``A`` is the exposed
  part of a ring all-reduce of the stage's gradients (bandwidth term
  ``2 (dp - 1) / dp * bytes / bw`` plus a latency term per ring step), ``P``
  the exposed pipeline point-to-point traffic.

So a slow GPU slows the whole synchronous job through ``max``: by its own
slowdown when compute is all there is, by less when the stage had slack or
communication takes part of the step. A congested link slows the
communication that crosses it: the all-reduce when it joins two nodes of one
stage (a DP group), the pipeline traffic when it joins neighbouring stages of
one replica (a PP group), nothing otherwise; a topology adjustment that turns
a DP link into a PP link therefore helps. Groups spread over several minipods
pay for crossing the spine (``A`` grows with ``log2`` of the DP spread, ``P``
with the share of split PP groups), which is what topology-aware placement
(Arnold) buys back.

Throughput ``T(x)`` (FLOP/s on ``x`` nodes) is non-linear: only multiples of
``pp`` are usable, the bubble grows as the replicas get fewer micro-batches,
and the all-reduce costs more with more replicas; past ``B`` replicas nothing
is gained. The calibrated curves (:data:`MODELS`) are for H100 nodes: 1.3B,
7B, 13B and 70B GPT models at MFU 0.35..0.42.

Jitter exists without any fault (:func:`sample_iterations`): a per-iteration
lognormal term, a per-replica data-dependent term (sequence lengths), rare
spikes (garbage collection, a slow data loader); the expected time
(:func:`iteration_time`) is used for the simulator's progress, the sampled
series only where a detector must see it.

Pure: numpy only, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from vigil.schemas import GPUS_PER_NODE

__all__ = [
    "HardwareSpec", "ModelSpec", "MODELS", "JobConfig", "StepFactors", "Topology",
    "iteration_time", "healthy_iteration_time", "throughput_table", "sample_iterations", "link_role",
    "unicron_case5", "mixed_jobs",
]



@dataclass(frozen=True)
class HardwareSpec:
    """A node type and its network."""

    gpu_flops: float = 989e12  # H100 SXM dense BF16
    node_bw_Bps: float = 50e9  # effective all-reduce bus bandwidth per node (8 x 400 Gb/s NICs, RoCE)
    allreduce_overlap: float = 0.5  # share of the all-reduce hidden behind the backward pass
    ring_latency_s: float = 0.002  # per ring step (log2 dp steps)
    pp_exposed: float = 0.3  # share of pipeline point-to-point traffic not hidden
    spine_penalty: float = 0.15  # A grows by this x log2(minipods spanned by a DP group)
    split_penalty: float = 0.5  # P grows by this x share of PP groups split across minipods
    overhead_s: float = 0.03  # optimizer step, data loader, Python per iteration


@dataclass(frozen=True)
class ModelSpec:
    """A GPT model and its parallel layout (tp = 8 inside a node)."""

    name: str
    params: float
    seq_len: int
    global_batch: int  # sequences (= micro-batches of one sequence) per iteration
    pp: int
    mfu: float  # sustained share of peak FLOP/s in the layers
    hidden: int
    skew_first: float = 0.03  # embedding on the first stage
    skew_last: float = 0.06  # output layer and loss on the last stage

    @property
    def flops_per_iteration(self) -> float:
        return 6.0 * self.params * self.seq_len * self.global_batch

    def t_mb(self, hw: HardwareSpec) -> float:
        """Seconds per micro-batch per stage on one node."""
        return 6.0 * self.params * self.seq_len / self.pp / (GPUS_PER_NODE * hw.gpu_flops * self.mfu)

    def stage_base(self) -> np.ndarray:
        base = np.ones(self.pp)
        if self.pp > 1:
            base[0] += self.skew_first
            base[-1] += self.skew_last
        return base

    @property
    def min_nodes(self) -> int:
        return self.pp


#: Calibrated models (H100 nodes, BF16). Layouts fit the memory of 80 GB GPUs with ZeRO-1.
MODELS: dict[str, ModelSpec] = {
    "1.3B": ModelSpec("1.3B", 1.3e9, 2048, 256, pp=1, mfu=0.35, hidden=2048),
    "7B": ModelSpec("7B", 6.7e9, 4096, 512, pp=1, mfu=0.42, hidden=4096),
    "13B": ModelSpec("13B", 13e9, 4096, 512, pp=2, mfu=0.42, hidden=5120),
    "70B": ModelSpec("70B", 70e9, 4096, 1024, pp=4, mfu=0.40, hidden=8192),
}


@dataclass(frozen=True)
class JobConfig:
    """A training job: its model, weight (priority) and the sizes it may run at, in nodes."""

    name: str
    model: ModelSpec
    weight: float
    size: int  # nodes requested (largest useful size)
    min_nodes: int = 0  # 0: one replica (model.pp)

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"job {self.name}: weight must be > 0, got {self.weight}")
        lo = self.min_nodes or self.model.pp
        if lo % self.model.pp or self.size % self.model.pp or not 0 < lo <= self.size:
            raise ValueError(f"job {self.name}: sizes must be multiples of pp={self.model.pp} "
                             f"with 0 < min_nodes <= size, got min {lo}, size {self.size}")

    @property
    def minimum(self) -> int:
        return self.min_nodes or self.model.pp


@dataclass
class StepFactors:
    """What slows one job's iteration, on its ``dp`` x ``pp`` grid.

    ``compute[d, s] >= 1``: slowdown of the slowest GPU of node ``(d, s)``;
    ``dp_comm``/``pp_comm >= 1``: slowdown of the all-reduce and of the
    pipeline traffic (congested links); ``microbatches``: per-replica counts
    (a rebalancing), else even; ``share``: per-stage layer shares (a topology
    adjustment), else uniform; ``dp_spread``/``pp_split_share`` from the
    placement.
    """

    compute: np.ndarray
    dp_comm: float = 1.0
    pp_comm: float = 1.0
    microbatches: np.ndarray | None = None
    share: np.ndarray | None = None
    dp_spread: int = 1
    pp_split_share: float = 0.0

    @classmethod
    def healthy(cls, dp: int, pp: int, dp_spread: int = 1, pp_split_share: float = 0.0) -> "StepFactors":
        return cls(np.ones((dp, pp)), dp_spread=dp_spread, pp_split_share=pp_split_share)


def _parts(model: ModelSpec, hw: HardwareSpec, dp: int, f: StepFactors) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Per-replica micro-batch counts, per-(replica, stage) micro-batch time, all-reduce, pipeline traffic."""
    pp = model.pp
    if f.microbatches is not None:
        m = np.asarray(f.microbatches, dtype=float)
    else:
        m = np.full(dp, float(math.ceil(model.global_batch / dp)))
    share = np.full(pp, 1.0 / pp) if f.share is None else np.asarray(f.share, dtype=float)
    u = model.t_mb(hw) * model.stage_base()[None, :] * (share * pp)[None, :] * f.compute
    if dp > 1:
        grad_bytes = 2.0 * model.params / pp
        a = (1.0 - hw.allreduce_overlap) * 2.0 * (dp - 1) / dp * grad_bytes / hw.node_bw_Bps
        a += hw.ring_latency_s * math.ceil(math.log2(dp))
        a *= 1.0 + hw.spine_penalty * math.log2(max(1, f.dp_spread))
    else:
        a = 0.0
    if pp > 1:
        act_bytes = 2.0 * model.seq_len * model.hidden  # BF16 activations of one micro-batch
        p = hw.pp_exposed * 2.0 * (pp - 1) * float(m.max()) * act_bytes / hw.node_bw_Bps
        p *= 1.0 + hw.split_penalty * f.pp_split_share
    else:
        p = 0.0
    return m, u, a * f.dp_comm, p * f.pp_comm


def iteration_time(model: ModelSpec, dp: int, factors: StepFactors | None = None,
                   hw: HardwareSpec = HardwareSpec()) -> float:
    """Expected seconds per iteration of ``model`` on ``dp`` replicas (see the module docstring).

    >>> m = MODELS["7B"]
    >>> healthy = iteration_time(m, 4)
    >>> slow = StepFactors.healthy(4, 1); slow.compute[2, 0] = 1.5     # one GPU 50 % slower
    >>> round(iteration_time(m, 4, slow) / healthy, 3) < 1.5           # communication is not slowed
    True
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    f = factors if factors is not None else StepFactors.healthy(dp, model.pp)
    m, u, a, p = _parts(model, hw, dp, f)
    replica = (m + model.pp - 1) * u.max(axis=1)
    return float(replica.max() + a + p + hw.overhead_s)


def healthy_iteration_time(model: ModelSpec, dp: int, hw: HardwareSpec = HardwareSpec()) -> float:
    return iteration_time(model, dp, None, hw)


def throughput_table(model: ModelSpec, max_nodes: int, hw: HardwareSpec = HardwareSpec()) -> list[float]:
    """FLOP/s on ``x = 0 .. max_nodes`` nodes (ideal placement); 0 unless ``x`` is a multiple of ``pp``.

    >>> t = throughput_table(MODELS["13B"], 6)
    >>> [round(v / 1e15) for v in t]
    [0, 0, 6, 0, 12, 0, 18]
    """
    out = [0.0] * (max_nodes + 1)
    for x in range(model.pp, max_nodes + 1, model.pp):
        dp = x // model.pp
        if dp > model.global_batch:
            out[x] = out[x - model.pp]
            continue
        out[x] = model.flops_per_iteration / healthy_iteration_time(model, dp, hw)
    return out


def link_role(grid: Sequence[Sequence[str]], a: str, b: str) -> str | None:
    """``"dp"`` when nodes ``a`` and ``b`` hold the same stage of two replicas, ``"pp"`` when
    neighbouring stages of one replica, else ``None`` (the link carries nothing of this job)."""
    where = {n: (d, s) for d, row in enumerate(grid) for s, n in enumerate(row)}
    if a not in where or b not in where:
        return None
    (da, sa), (db, sb) = where[a], where[b]
    if sa == sb and da != db:
        return "dp"
    if da == db and abs(sa - sb) == 1:
        return "pp"
    return None


def sample_iterations(model: ModelSpec, dp: int, factors: StepFactors, n: int, rng: np.random.Generator,
                      hw: HardwareSpec = HardwareSpec(), jitter: float = 0.015, data_jitter: float = 0.01,
                      spike_rate: float = 0.005) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` noisy iterations: durations ``(n,)``, per-node compute and communication ``(n, dp, pp)``.

    A node's compute is its micro-batches' time (its replica's count times
    its stage's per-micro-batch time, with the data-dependent factor of the
    replica); its communication is the rest of the step (waiting for the
    slowest stage and replica, then the all-reduce). The duration's mean is
    :func:`iteration_time` up to the jitter.
    """
    m, u, a, p = _parts(model, hw, dp, factors)
    pp = model.pp
    data = np.exp(data_jitter * rng.standard_normal((n, dp)))  # sequence lengths of each replica's batch
    comp = (m[None, :, None] * u[None, :, :]) * data[:, :, None]
    replica = (m[None, :] + pp - 1) * (u.max(axis=1)[None, :] * data)
    dur = (replica.max(axis=1) + a + p + hw.overhead_s) * np.exp(jitter * rng.standard_normal(n))
    spikes = rng.random(n) < spike_rate
    dur[spikes] *= 1.0 + rng.uniform(0.2, 1.5, size=int(spikes.sum()))
    comp = np.minimum(comp, dur[:, None, None])
    return dur, comp, dur[:, None, None] - comp


# -- topology ---------------------------------------------------------------


@dataclass
class Topology:
    """Node names and their minipods (leaf-switch groups)."""

    nodes: list[str]
    minipod: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, n_nodes: int, minipod_nodes: int) -> "Topology":
        if n_nodes < 1 or minipod_nodes < 1:
            raise ValueError(f"need n_nodes >= 1 and minipod_nodes >= 1, got {n_nodes}, {minipod_nodes}")
        width = max(3, len(str(n_nodes - 1)))
        nodes = [f"node-{i:0{width}d}" for i in range(n_nodes)]
        return cls(nodes, {n: i // minipod_nodes for i, n in enumerate(nodes)})

    @property
    def n_minipods(self) -> int:
        return max(self.minipod.values()) + 1 if self.minipod else 0

    def by_minipod(self, nodes: Sequence[str]) -> list[list[str]]:
        """``nodes`` grouped by minipod (every minipod listed, in node order)."""
        pods: list[list[str]] = [[] for _ in range(self.n_minipods)]
        for n in nodes:
            pods[self.minipod[n]].append(n)
        return pods


# -- workloads --------------------------------------------------------------


def unicron_case5() -> list[JobConfig]:
    """Unicron's case 5: six tasks (1.3B x 3, 7B x 2, 13B) weighted 2.0 .. 0.5 on 16 nodes (128 GPUs)."""
    weights = [2.0, 1.7, 1.4, 1.1, 0.8, 0.5]
    models = ["1.3B", "1.3B", "1.3B", "7B", "7B", "13B"]
    sizes = [2, 2, 2, 3, 3, 4]
    return [JobConfig(f"task{i + 1}-{m}", MODELS[m], w, size=s)
            for i, (m, w, s) in enumerate(zip(models, weights, sizes))]


def mixed_jobs(n_nodes: int, seed: int) -> list[JobConfig]:
    """A seeded mix of 1.3B .. 70B jobs whose requested sizes fill ``n_nodes`` (the large-scale run)."""
    rng = np.random.default_rng(seed)
    kinds = [("70B", 0.35, (32, 128)), ("13B", 0.3, (8, 48)), ("7B", 0.2, (4, 32)), ("1.3B", 0.15, (1, 8))]
    jobs: list[JobConfig] = []
    left = n_nodes
    i = 0
    while left > 0:
        k = int(rng.choice(len(kinds), p=[p for _, p, _ in kinds]))
        name, _, (lo, hi) = kinds[k]
        model = MODELS[name]
        size = int(rng.integers(lo, hi + 1))
        size = max(model.pp, min(size, left) // model.pp * model.pp)
        if size > left:
            name, model, size = "1.3B", MODELS["1.3B"], left
        weight = round(float(rng.uniform(0.5, 2.0)), 2)
        jobs.append(JobConfig(f"job{i:03d}-{name}", model, weight, size=size))
        left -= size
        i += 1
    return jobs
