"""Fail-slow mitigation as ski rental (Falcon).

While a job runs slow, every slow iteration costs ``t_slow - t_healthy``
seconds of training. Acting also costs: each strategy has an overhead (the
time the job loses while it is applied). Falcon's rule, the deterministic
ski-rental strategy, is to keep paying the slowdown until it adds up to the
overhead of the next stronger strategy, then take it:

* S1 do nothing (the fail-slow may end by itself, most are short);
* S2 micro-batch rebalancing — computation stragglers only;
* S3 topology adjustment — computation or communication;
* S4 checkpoint and restart on healthy nodes.

It stops when the fail-slow ends. The accumulated slowdown is counted from
the start of the episode, so a strategy is bought only after as much time
was lost as it costs: never more than twice the optimum in hindsight.

Overheads are configured and then learned from the durations of past actions
(:meth:`FailSlowMitigation.observe_duration`, an exponentially weighted mean).
Pure bookkeeping: time is an argument.

Reference: Wu et al., "Falcon: Pinpointing and Mitigating Stragglers for
Large-Scale Hybrid-Parallel Training", 2024, §5.

Examples
--------
>>> m = FailSlowMitigation({"rebalance_microbatches": 10.0, "adjust_topology": 60.0, "checkpoint_restart": 300.0})
>>> m.start("job-1", t_healthy=1.0, t_slow=1.5, slowdown_class="computation", now=0.0)
>>> m.tick(10.0)   # 10 s at 1.5 s/it: ~6.7 slow iterations x 0.5 s = 3.3 s lost
[]
>>> [(job, action) for job, action, _ in m.tick(31.0)]   # 10.3 s lost >= S2's 10 s
[('job-1', 'rebalance_microbatches')]
>>> m.stop("job-1")
"""

from __future__ import annotations

from dataclasses import dataclass

#: Strategies after S1, in the order they are bought.
STRATEGIES = ("rebalance_microbatches", "adjust_topology", "checkpoint_restart")
#: Seconds each strategy costs the job before anything is learned (Falcon §6 orders of magnitude).
DEFAULT_OVERHEAD_S = {"rebalance_microbatches": 5.0, "adjust_topology": 60.0, "checkpoint_restart": 600.0}


@dataclass
class _Episode:
    t_healthy: float
    t_slow: float
    slowdown_class: str
    since: float
    lost_s: float = 0.0
    next_index: int = 0


class FailSlowMitigation:
    """Per job: the accumulated slowdown, and the strategy it has paid for.

    Parameters
    ----------
    overhead_s : dict
        Seconds of training each strategy costs, by action name.
    learning_rate : float
        Weight of one observed action duration in the learned overhead.
    """

    def __init__(self, overhead_s: dict[str, float] | None = None, learning_rate: float = 0.3) -> None:
        merged = {**DEFAULT_OVERHEAD_S, **(overhead_s or {})}
        for name, value in merged.items():
            if name not in STRATEGIES:
                raise ValueError(f"unknown strategy {name!r}; expected one of {STRATEGIES}")
            if not value >= 0:
                raise ValueError(f"overhead of {name} must be >= 0 s, got {value}")
        if not 0 < learning_rate <= 1:
            raise ValueError(f"learning_rate must be in (0, 1], got {learning_rate}")
        self.overhead_s = merged
        self.learning_rate = learning_rate
        self._episodes: dict[str, _Episode] = {}

    def start(self, job: str, t_healthy: float, t_slow: float, slowdown_class: str, now: float) -> None:
        """A fail-slow of ``job`` began (kept if one is already running)."""
        if job in self._episodes:
            return
        if not (t_healthy > 0 and t_slow > 0):
            raise ValueError(f"iteration times must be > 0 s, got healthy={t_healthy}, slow={t_slow}")
        self._episodes[job] = _Episode(t_healthy, max(t_slow, t_healthy), slowdown_class, since=now)

    def stop(self, job: str) -> None:
        """The fail-slow ended: back to S1 for the next one."""
        self._episodes.pop(job, None)

    def lost_s(self, job: str) -> float:
        ep = self._episodes.get(job)
        return ep.lost_s if ep else 0.0

    def tick(self, now: float) -> list[tuple[str, str, float]]:
        """Accumulate the slowdown up to ``now``; (job, strategy, seconds lost) for each new step up."""
        out = []
        for job, ep in self._episodes.items():
            if now > ep.since:
                # (now - since) / t_slow slow iterations, each (t_slow - t_healthy) too long.
                ep.lost_s += (now - ep.since) * (1.0 - ep.t_healthy / ep.t_slow)
                ep.since = now
            while ep.next_index < len(STRATEGIES):
                strategy = STRATEGIES[ep.next_index]
                if strategy == "rebalance_microbatches" and ep.slowdown_class != "computation":
                    ep.next_index += 1  # rebalancing cannot help a slow link
                    continue
                if ep.lost_s < self.overhead_s[strategy]:
                    break
                ep.next_index += 1
                out.append((job, strategy, ep.lost_s))
        return out

    def observe_duration(self, strategy: str, seconds: float) -> None:
        """An action of ``strategy`` took ``seconds``: move its overhead towards it."""
        if strategy in self.overhead_s and seconds >= 0:
            old = self.overhead_s[strategy]
            self.overhead_s[strategy] = (1 - self.learning_rate) * old + self.learning_rate * seconds
