"""The decision engine's fail-slow mitigation: a degradation's slowdowns start the ski rental
(:mod:`vigil.streams.engine.skirental`) on the strategies the job's layout allows, with what a
checkpoint-restart would cost the job, and the plan a strategy carries.

:class:`_Mitigation` is a part of :class:`~vigil.streams.engine.decisions.DecisionEngine` (its methods
use the engine's inventory and fail-slow context).
"""

from __future__ import annotations

from typing import Any

from vigil.schemas import Alert, Envelope, to_seconds
from vigil.streams.engine.attribution import GPU_CAUSES, LINK_CAUSES
from vigil.streams.engine.decisions_lifecycle import _JobInfo
from vigil.streams.engine.skirental import STRATEGIES


class _Mitigation:
    """The fail-slow part of :class:`~vigil.streams.engine.decisions.DecisionEngine`."""

    def _on_degradation(self, alert: Alert, now: float) -> list[Envelope]:
        for slow in alert.slowdowns:
            job, before, after = slow.job or alert.subject.job, slow.before_s, slow.after_s
            if not job or before is None or after is None or before <= 0:
                continue
            cls = slow.slowdown_class or "communication"
            node = alert.subject.node if alert.kind in GPU_CAUSES | LINK_CAUSES else slow.node
            self.mitigation.start(job, float(before), float(after), cls, now, onset=to_seconds(alert.onset_time),
                                  strategies=self._strategies(job),
                                  restart_shrink=self._restart_shrink(job, node if isinstance(node, str) else None))
            known = self._failslow_ctx.get(job)
            if known is None:
                self._failslow_ctx[job] = (node, float(before), float(after), cls)
            elif known[0] is None and node is not None:  # localized since: the plans can name the straggler
                self._failslow_ctx[job] = (node, *known[1:])
            answered = self._failslow_incident.setdefault(job, [])
            if alert.incident_id not in answered:
                answered.append(alert.incident_id)
        return []

    def _strategies(self, job: str) -> tuple[str, ...] | None:
        """The fail-slow strategies that can act on ``job``'s layout (None: layout unknown, all of them).

        Micro-batches move between data-parallel replicas (two or more), a
        topology adjustment moves work or traffic between pipeline stages (two
        or more); a checkpoint-restart always applies.
        """
        spec = self.jobs.get(job, _JobInfo()).spec
        if spec is None or not spec.nodes or len(spec.nodes) != spec.dp * spec.pp:
            return None
        return tuple(s for s in STRATEGIES if not (s == "rebalance_microbatches" and spec.dp < 2)
                     and not (s == "adjust_topology" and spec.pp < 2))

    def _restart_shrink(self, job: str, straggler: str | None) -> float:
        """The share of its nodes ``job`` gives up if a checkpoint-restart leaves ``straggler`` behind.

        0 when a known healthy node runs no job (it takes the straggler's
        place), or when the engine cannot tell (no inventory, no layout, a
        straggler named that the job does not run on). Otherwise the job
        loses the straggler's data-parallel replica (``pp`` nodes): a
        first-order price, since a re-plan may take the node from a job that
        needs it less. The straggler is often not localized yet when the
        episode starts; the price is the same for any of the job's nodes.
        """
        spec = self.jobs.get(job, _JobInfo()).spec
        if spec is None or not spec.nodes or not self.known_nodes or \
                (straggler is not None and straggler not in spec.nodes):
            return 0.0
        busy = set().union(*(set(other.nodes) for other in self._active_specs().values()))
        if self.known_nodes - self.nodes_down - busy:
            return 0.0
        n, pp = len(spec.nodes), max(1, spec.pp)
        kept = (n - 1) // pp * pp
        per_node = spec.gpus / n if spec.gpus else 8
        if kept * per_node < (spec.min_gpus or 0):
            return 1.0  # below its minimum the job cannot run at all
        return 1.0 - kept / n
    def _failslow_plan(self, job: str, strategy: str) -> dict[str, Any]:
        from vigil.streams.engine.planning import failslow_plan  # the planners import scipy: only when a fail-slow needs them

        info = self.jobs.get(job, _JobInfo())
        node, t_healthy, t_slow, cls = self._failslow_ctx.get(job, (None, 1.0, 1.0, "communication"))
        return failslow_plan(strategy, info.spec, node, t_healthy, t_slow, cls, sorted(info.nodes))
