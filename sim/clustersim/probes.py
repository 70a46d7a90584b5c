"""Detection in the simulator: the live detectors and correlator, fed only where they matter.

Weeks of per-iteration telemetry of a whole cluster cannot go through the
detection engine in minutes, and need not: between failures every event
says "healthy". So the simulator runs the real code on bounded windows:

* :class:`FailStopProbe` — at each fail-stop, a small
  :class:`vigil.sim.simulator.ClusterSimulator` (the event generator of the
  demo) plays the failing job on the failing node and one peer, with the
  job's iteration time, for a warm-up window and then the fault, and its
  events go through a fresh :class:`vigil.streams.engine.detection.DetectionEngine` into
  the simulation's shared :class:`vigil.streams.engine.incidents.Correlator` until the
  first alert: heartbeat loss for a lost node (2.5 missed 1 s intervals),
  the process-exit, exception and XID detectors, the hang detector's 3 x
  mean iteration time. Its latency (plus ``transport_s`` for the Kafka hop)
  and its alerts are what the decision engine gets.
* :class:`FailSlowProbe` — one per job incarnation (a layout the job runs
  on): a fresh :class:`~vigil.streams.engine.detection.DetectionEngine` fed columnar
  :class:`vigil.schemas.IterationStep` events sampled from the job's iteration-time
  model (:func:`vigil.sim.clustersim.model.sample_iterations`, with jitter,
  data-dependent imbalance and spikes) in windows around each change of the
  job's speed — 64 iterations at the old level, then the new level until
  BOCD + verification raises or clears its finding (or a cap) — so the
  delay in iterations, the measured before/after levels and the
  computation/communication class are the detector's own. Up to 8 nodes of
  the job report per step (the slow ones always).

Alerts come out of the shared correlator exactly as in the live pipeline,
one incident per root cause. Probe clocks are absolute seconds (the
simulation's ``T0`` plus simulated time).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from vigil.sim.clustersim.model import HardwareSpec, ModelSpec, StepFactors, sample_iterations
from vigil.sim.clustersim.traces import FailStop
from vigil.sim.simulator import ClusterSimulator, Fault, SimJob
from vigil.schemas import GPUS_PER_NODE, Alert, Envelope, IterationStep, Source, from_seconds
from vigil.streams.engine.detection import DetectionEngine
from vigil.streams.engine.incidents import Correlator
from vigil.streams.engine.pipeline import InProcessPipeline

__all__ = ["FailStopProbe", "FailSlowProbe"]


class FailStopProbe:
    """Detection latency and alerts of one fail-stop, from the live detectors (see the module docstring).

    ``correlator``: the incidents the alerts belong to (shared with the
    decision engine that resolves them), or ``None`` for a fresh one per
    fault when only the latency matters.
    """

    def __init__(self, correlator: Correlator | None, cluster: str = "sim", transport_s: float = 0.05,
                 tick_s: float = 0.25, seed: int = 0) -> None:
        self.correlator = correlator
        self.cluster = cluster
        self.transport_s = transport_s
        self.tick_s = tick_s
        self.seed = seed
        self.probes = 0

    def detect(self, fault: FailStop, job: str, job_nodes: list[str], iteration_s: float,
               at: float, emit: Callable[[list[Envelope]], None] | None = None,
               follow_s: float = 10.0) -> list[tuple[float, list[Alert]]]:
        """``[(latency_s, alerts), ...]`` of ``fault`` hitting ``job`` at absolute time ``at``; ``[]`` if missed.

        The first entry is the detection; the probe then runs ``follow_s``
        more seconds, since a graver cause often shows a moment later (a
        lost node's job hangs before its heartbeats are missed) and
        re-roots the incident.
        """
        self.probes += 1
        peers = [n for n in job_nodes if n != fault.node][:1]
        nodes = [fault.node] + peers
        it = max(0.05, float(iteration_s))
        warm = max(12.0, 8.0 * it)
        spec = SimJob(job, tuple(nodes), dp=len(nodes), pp=1, tp=GPUS_PER_NODE, iteration_s=it)
        rank = 0  # the failing node's first rank
        if fault.kind in ("node_loss", "xid"):
            f = Fault(fault.kind, fault.node, at=warm, code=int(fault.detail or 79))
        elif fault.kind == "exception":
            f = Fault("exception", job, at=warm, rank=rank, category=fault.detail)
        else:
            f = Fault(fault.kind, job, at=warm, rank=rank)
        start = at - warm
        sim = ClusterSimulator(nodes, [spec], [f], start=start, heartbeat_interval_s=1.0, cluster=self.cluster,
                               seed=self.seed + self.probes, step_batches=True)
        # None: a fresh correlator per probe (a caller that only wants the latency keeps no incidents)
        pipe = InProcessPipeline(correlator=self.correlator if self.correlator is not None else Correlator())
        limit = at + max(60.0, 10.0 * it)
        fine = max(self.tick_s, it / 40.0)  # timer resolution: well under every detector's timeout
        t = start
        out: list[tuple[float, list[Alert]]] = []
        while t < limit:
            # Coarse steps through the warm-up (nothing to time there; steps stay well under the
            # engine's 300 s event-age limit), fine ones from the fault on.
            t = min(limit, t + (min(30.0, at - t) if t < at else fine))
            alerts: list[Alert] = []
            for group in sim.advance(t):
                if emit is not None:
                    emit(group)
                alerts += pipe.feed(group, now=t)
            alerts += pipe.tick(t)
            opened = [a for a in alerts if a.status != "resolved"]
            if opened and t >= at:
                if not out:
                    limit = min(limit, t + follow_s)
                out.append((t - at + self.transport_s, opened))
        return out


class FailSlowProbe:
    """The fail-slow path of one job incarnation: iteration steps in, alerts out (see the module docstring)."""

    def __init__(self, job: str, model: ModelSpec, correlator: Correlator, rng: np.random.Generator,
                 hw: HardwareSpec = HardwareSpec(), cluster: str = "sim", max_nodes: int = 8) -> None:
        self.job = job
        self.model = model
        self.correlator = correlator
        self.rng = rng
        self.hw = hw
        self.cluster = cluster
        self.max_nodes = max_nodes
        self.engine = DetectionEngine()
        self.step = 0
        self.fed = 0
        self.last_t: float | None = None

    def feed(self, grid: list[list[str]], factors: StepFactors, n: int, t_end: float,
             slow_gpu: dict[str, int] | None = None,
             emit: Callable[[list[Envelope]], None] | None = None) -> list[tuple[float, list[Alert], list[str]]]:
        """``n`` iterations at ``factors`` ending at ``t_end``; ``(time, alerts, finding transitions)`` per step that had any."""
        if n <= 0:
            return []
        dp, pp = len(grid), len(grid[0])
        dur, comp, comm = sample_iterations(self.model, dp, factors, n, self.rng, self.hw)
        ends = t_end - np.concatenate((np.cumsum(dur[::-1])[::-1][1:], [0.0]))
        if self.last_t is not None:
            ends = np.maximum(ends, self.last_t + 1e-3 * np.arange(1, n + 1))
        cells = [(d, s) for d in range(dp) for s in range(pp)]
        slow = [(d, s) for d, s in cells if factors.compute[d, s] > 1.0]
        rest = [c for c in cells if c not in slow]
        pick = (slow + rest)[:self.max_nodes]
        pick.sort()
        gpu_of = slow_gpu or {}
        out: list[tuple[float, list[Alert], list[str]]] = []
        for i in range(n):
            end = float(ends[i])
            start = end - float(dur[i])
            nodes = [grid[d][s] for d, s in pick]
            gpus = [gpu_of.get(node, 0) for node in nodes]
            step = IterationStep(
                event_time=from_seconds(end), source=Source(cluster=self.cluster, job=self.job), step=self.step,
                start=from_seconds(start), end=from_seconds(end), duration_s=float(dur[i]),
                ranks=[(d * pp + s) * GPUS_PER_NODE + g for (d, s), g in zip(pick, gpus)], nodes=nodes, gpus=gpus,
                compute_s=[float(comp[i, d, s]) for d, s in pick],
                communication_s=[float(comm[i, d, s]) for d, s in pick],
                dp=[d for d, _ in pick], pp=[s for _, s in pick], tp=gpus)
            self.step += 1
            self.fed += 1
            if emit is not None:
                emit([step])
            findings = self.engine.on_events([step], now=end)
            alerts: list[Alert] = []
            for f in findings:
                alerts += self.correlator.on_finding(f, end)
            kinds = [f"{f.status}:{f.kind}" for f in findings if f.kind in ("fail_slow", "recovery")]
            if alerts or kinds:
                out.append((end, alerts, kinds))
        self.last_t = float(ends[-1])
        return out

    @property
    def slow_finding(self) -> bool:
        """Whether the detector holds a fail-slow in progress for this job."""
        det = self.engine.detector("job", self.job, "fail_slow")
        return det is not None and det.finding is not None
