"""Fail-slow mitigation as ski rental (Falcon), priced with what the episode is expected to cost from now on.

While a job runs slow, every slow iteration costs ``t_slow - t_healthy``
seconds of training. Acting also costs: each strategy has an overhead (the
time the job loses while it is applied). The ladder is Falcon's:

* S1 do nothing (the fail-slow may end by itself, most are short);
* S2 micro-batch rebalancing — computation stragglers, two replicas or more;
* S3 topology adjustment — two pipeline stages or more (consolidate slow
  GPUs into a stage, move a congested link out of the data-parallel ring);
* S4 checkpoint and restart on healthy nodes.

A strategy pays off when the slowdown it removes from now on exceeds its
overhead. A checkpoint-restart with no idle node to take the straggler's
place removes less: the job runs on without the straggler's replica, so it
saves only the slowdown beyond that share (``restart_shrink``). How long the
episode will still last is the unknown:

* **with history** — the durations of the episodes of the same slowdown
  class that the engine has seen end (:class:`EpisodeDurations`, a
  Kaplan–Meier estimate in which an episode that a mitigation or a relaunch
  cut short counts only as "lasted at least this long") give the expected
  remaining duration ``R(age)`` of an episode that has lasted ``age`` so
  far (from the onset the detector reported). The next strategy is bought
  when ``loss rate x R(age) >= overhead`` (the loss rate is
  ``1 - t_healthy / t_slow`` seconds per second): early when episodes of
  this kind tend to run on, never for an episode that is expected to end
  before the strategy pays back. Falcon's characterization (computation
  fail-slows short and rare, communication ones long and frequent) is what
  such a history shows; nothing of it is assumed. After each step the
  episode is watched before the next is priced this way (a cheap step may
  have cured it: see :class:`FailSlowMitigation`).
* **without history** — too few past episodes outlived the current age
  (``min_at_risk``), or all those that did were cut short and the bound
  they give does not justify buying: Falcon's rule, the classic
  deterministic ski rental. Keep paying the slowdown until what it has
  cost since the episode began adds up to the overhead of the next strategy,
  then take it: never more than twice the optimum in hindsight.

It stops when the fail-slow ends (:meth:`FailSlowMitigation.stop`, which
also records the episode's duration, as an end or as a lower bound). An
episode cut short by a checkpoint-restart that left its straggler node
behind is completed when that node comes back into service
(:meth:`FailSlowMitigation.node_back`): without it, every episode the
policy cuts short would teach only "at least", and the long ones, those
that need a restart, would never be learned.

Overheads are configured and then learned from the durations of past actions
(:meth:`FailSlowMitigation.observe_duration`, an exponentially weighted mean).
Pure bookkeeping: time is an argument.

Reference: Wu et al., "Falcon: Pinpointing and Mitigating Stragglers for
Large-Scale Hybrid-Parallel Training", 2024, §5 (the ladder, the ski-rental
rule) and §3 (durations by kind); Kaplan and Meier, 1958.

Examples
--------
No history: the classic rule.

>>> m = FailSlowMitigation({"rebalance_microbatches": 10.0, "adjust_topology": 60.0, "checkpoint_restart": 300.0})
>>> m.start("job-1", t_healthy=1.0, t_slow=1.5, slowdown_class="computation", now=0.0)
>>> m.tick(10.0)   # 10 s at 1.5 s/it: ~6.7 slow iterations x 0.5 s = 3.3 s lost
[]
>>> [(job, action) for job, action, _ in m.tick(31.0)]   # 10.3 s lost >= S2's 10 s
[('job-1', 'rebalance_microbatches')]
>>> m.stop("job-1", now=600.0)   # it ended long after S2 (S2 did not cure it): a 600 s episode
>>> m.durations.count("computation")
(1, 1)

With history: communication episodes that ran for an hour or more.

>>> m = FailSlowMitigation({"adjust_topology": 60.0, "checkpoint_restart": 300.0})
>>> for d in (3600.0, 5400.0, 4000.0, 7200.0, 3000.0):
...     _ = m.durations.observe("communication", d, ended=True)
>>> m.start("job-2", t_healthy=1.0, t_slow=1.25, slowdown_class="communication", now=0.0, strategies=("checkpoint_restart",))
>>> [(job, action) for job, action, _ in m.tick(10.0)]   # 0.2 s lost per s x ~4.6 k s to go: restart now
[('job-2', 'checkpoint_restart')]
>>> print(m.explain("job-2"))
expected to last another 4630 s (5 past communication episodes), 0.20 s lost per s: 926 s to save >= 300 s overhead
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["DEFAULT_OVERHEAD_S", "STRATEGIES", "EpisodeDurations", "FailSlowMitigation"]

#: Strategies after S1, in the order they are bought.
STRATEGIES = ("rebalance_microbatches", "adjust_topology", "checkpoint_restart")
#: Seconds each strategy costs the job before anything is learned (Falcon §6 orders of magnitude).
DEFAULT_OVERHEAD_S = {"rebalance_microbatches": 5.0, "adjust_topology": 60.0, "checkpoint_restart": 600.0}


class EpisodeDurations:
    """How long fail-slow episodes last, by slowdown class: Kaplan–Meier, and the expected remaining duration.

    An episode that ended by itself is an *event*; one that was cut short
    (a mitigation made the slowdown go away, the job was relaunched
    elsewhere) is *censored*: it lasted at least that long. The survival
    curve ``S(t)`` is the product-limit estimate over the last
    ``max_episodes`` episodes of the class, and the expected remaining
    duration of an episode of age ``a`` is ``R(a) = integral_a^tau S / S(a)``,
    ``tau`` the longest recorded duration. When the longest one was censored
    the tail past it is unknown and ``R`` is only a lower bound.

    Parameters
    ----------
    min_at_risk : int
        Episodes that must have lasted longer than ``age`` for an estimate at that age.
    max_episodes : int
        Episodes kept per class (the oldest go first).

    Examples
    --------
    >>> h = EpisodeDurations(min_at_risk=2)
    >>> for d in (100.0, 200.0, 300.0):
    ...     _ = h.observe("computation", d, ended=True)
    >>> r, exact = h.expected_remaining("computation", 0.0); round(r, 6), exact   # the mean
    (200.0, True)
    >>> r, exact = h.expected_remaining("computation", 150.0); round(r, 6), exact   # 200 or 300 s in all
    (100.0, True)
    >>> h.expected_remaining("computation", 250.0) is None   # one episode lasted that long: no estimate
    True
    >>> _ = h.observe("computation", 400.0, ended=False)   # cut short at 400 s
    >>> r, exact = h.expected_remaining("computation", 250.0); round(r, 6), exact   # up to 300 s only: a lower bound
    (50.0, False)
    """

    def __init__(self, min_at_risk: int = 5, max_episodes: int = 1000) -> None:
        if not (isinstance(min_at_risk, int) and min_at_risk >= 1):
            raise ValueError(f"min_at_risk must be an integer >= 1, got {min_at_risk!r}")
        if not (isinstance(max_episodes, int) and max_episodes >= 1):
            raise ValueError(f"max_episodes must be an integer >= 1, got {max_episodes!r}")
        self.min_at_risk = min_at_risk
        self.max_episodes = max_episodes
        self._reset()

    def _reset(self) -> None:
        self._episodes: dict[str, list[tuple[float, bool, int]]] = {}
        self._curves: dict[str, tuple[list[float], list[float], list[float], list[float], bool]] = {}
        self._next_id = 0

    @staticmethod
    def _check(duration_s: float) -> float:
        if not (duration_s >= 0 and math.isfinite(duration_s)):
            raise ValueError(f"duration_s must be finite and >= 0, got {duration_s}")
        return float(duration_s)

    def observe(self, slowdown_class: str, duration_s: float, ended: bool) -> int:
        """An episode of ``slowdown_class`` lasted ``duration_s``: to its end (``ended``), or at least that long.
        Returns the record's id (see :meth:`revise`)."""
        duration_s = self._check(duration_s)
        self._next_id += 1
        eps = self._episodes.setdefault(slowdown_class, [])
        eps.append((duration_s, bool(ended), self._next_id))
        del eps[:-self.max_episodes]
        self._curves.pop(slowdown_class, None)
        return self._next_id

    def revise(self, slowdown_class: str, record: int, duration_s: float, ended: bool) -> bool:
        """Correct a recorded episode (one cut short whose end was seen later); False if it is no longer kept."""
        duration_s = self._check(duration_s)
        eps = self._episodes.get(slowdown_class, [])
        for i, (_, _, rid) in enumerate(eps):
            if rid == record:
                eps[i] = (duration_s, bool(ended), rid)
                self._curves.pop(slowdown_class, None)
                return True
        return False

    def count(self, slowdown_class: str) -> tuple[int, int]:
        """(episodes recorded, of which ended by themselves) for ``slowdown_class``."""
        eps = self._episodes.get(slowdown_class, [])
        return len(eps), sum(1 for _, e, _ in eps if e)

    def _curve(self, slowdown_class: str) -> tuple[list[float], list[float], list[float], list[float], bool]:
        """Sorted durations; knots of S (0 and each event time) with S just after and the integral up to them;
        whether the longest episode ended by itself."""
        cached = self._curves.get(slowdown_class)
        if cached is not None:
            return cached
        eps = sorted((d, e) for d, e, _ in self._episodes.get(slowdown_class, []))
        durations = [d for d, _ in eps]
        knots, surv, area = [0.0], [1.0], [0.0]
        n = len(eps)
        i = 0
        while i < n:
            t = eps[i][0]
            at_risk = n - i
            events = 0
            while i < n and eps[i][0] == t:
                events += eps[i][1]
                i += 1
            if events:
                area.append(area[-1] + surv[-1] * (t - knots[-1]))
                knots.append(t)
                surv.append(surv[-1] * (1.0 - events / at_risk))
        complete = bool(eps) and any(e for d, e in eps if d == durations[-1])
        curve = (durations, knots, surv, area, complete)
        self._curves[slowdown_class] = curve
        return curve

    def _integral(self, knots: list[float], surv: list[float], area: list[float], x: float) -> float:
        k = bisect_right(knots, x) - 1
        return area[k] + surv[k] * (x - knots[k])

    def expected_remaining(self, slowdown_class: str, age_s: float) -> tuple[float, bool] | None:
        """``(R, exact)``: expected seconds left of an episode that has lasted ``age_s``.

        None with fewer than ``min_at_risk`` episodes longer than ``age_s``.
        ``exact`` is False when the longest episode was cut short: the tail
        past the ``min_at_risk``-th longest is then left out, and ``R`` is a
        lower bound.
        """
        durations, knots, surv, area, complete = self._curve(slowdown_class)
        longer = len(durations) - bisect_right(durations, age_s)
        if longer < self.min_at_risk:
            return None
        horizon = durations[-1] if complete else durations[-self.min_at_risk]
        s_age = surv[bisect_right(knots, age_s) - 1]
        if s_age <= 0.0:  # cannot happen with episodes still at risk; kept for safety
            return None
        rest = self._integral(knots, surv, area, horizon) - self._integral(knots, surv, area, age_s)
        return max(0.0, rest) / s_age, complete


@dataclass
class _Episode:
    t_healthy: float
    t_slow: float
    slowdown_class: str
    since: float
    onset: float
    delay: float  # how long the detector took to raise it
    strategies: tuple[str, ...]
    lost_s: float = 0.0
    next_index: int = 0
    watch_until: float = -math.inf  # an end seen before this may be the doing of the last action
    basis: str = ""
    left: set[str] = field(default_factory=set)  # straggler nodes the job left with a checkpoint-restart
    restart_shrink: float = 0.0  # share of its speed the job gives up by leaving the straggler (no spare node)


class FailSlowMitigation:
    """Per job: the accumulated slowdown, and the strategy it has paid for.

    After a step is taken (or anything else acts on the job, see
    :meth:`touched`) the episode is watched for the step's overhead plus
    twice the time the detector took to raise it plus ``confirm_s``: a step
    that cured the slowdown shows as the fail-slow ending within that
    window. Until then the next step is not priced by expectation (only the
    classic rule may buy it), and an end seen within it counts only as
    "lasted at least this long"; an end seen later is the episode's own.

    Parameters
    ----------
    overhead_s : dict
        Seconds of training each strategy costs, by action name.
    learning_rate : float
        Weight of one observed action duration in the learned overhead.
    durations : EpisodeDurations, optional
        The episodes seen so far, which price the strategies (a fresh history
        by default; until it holds enough, the classic rule applies).
    confirm_s : float
        Margin of the watch window for the incident to be resolved once the
        detector sees the level back.
    remaining : callable, optional
        ``remaining(job, slowdown_class, age_s) -> (seconds, exact) | None``:
        another estimate of the remaining duration in place of ``durations``
        (a simulator's bound that knows the truth; None where it has none).
    """

    def __init__(self, overhead_s: dict[str, float] | None = None, learning_rate: float = 0.3,
                 durations: EpisodeDurations | None = None, confirm_s: float = 60.0,
                 remaining: Callable[[str, str, float], tuple[float, bool] | None] | None = None) -> None:
        merged = {**DEFAULT_OVERHEAD_S, **(overhead_s or {})}
        for name, value in merged.items():
            if name not in STRATEGIES:
                raise ValueError(f"unknown strategy {name!r}; expected one of {STRATEGIES}")
            if not value >= 0:
                raise ValueError(f"overhead of {name} must be >= 0 s, got {value}")
        if not 0 < learning_rate <= 1:
            raise ValueError(f"learning_rate must be in (0, 1], got {learning_rate}")
        if not (confirm_s >= 0 and math.isfinite(confirm_s)):
            raise ValueError(f"confirm_s must be finite and >= 0 s, got {confirm_s}")
        self.overhead_s = merged
        self.learning_rate = learning_rate
        self.durations = durations if durations is not None else EpisodeDurations()
        self.confirm_s = confirm_s
        self.remaining = remaining
        self._episodes: dict[str, _Episode] = {}
        #: straggler node left behind -> (slowdown class, record of its episode, onset): its return ends it
        self._left: dict[str, tuple[str, int, float]] = {}

    def start(self, job: str, t_healthy: float, t_slow: float, slowdown_class: str, now: float,
              onset: float | None = None, strategies: tuple[str, ...] | None = None,
              restart_shrink: float = 0.0) -> None:
        """A fail-slow of ``job`` began at ``onset`` (default ``now``) and is known at ``now`` (kept if one is
        already running). ``strategies``: those that can act on this job (default all; S2 only ever for
        computation fail-slows). ``restart_shrink``: the share of its speed the job gives up while a
        checkpoint-restart keeps it off the straggler (0 when a spare node takes its place): S4 then saves
        only the slowdown beyond it."""
        if job in self._episodes:
            return
        if not (t_healthy > 0 and t_slow > 0):
            raise ValueError(f"iteration times must be > 0 s, got healthy={t_healthy}, slow={t_slow}")
        if not 0.0 <= restart_shrink <= 1.0:
            raise ValueError(f"restart_shrink must be in [0, 1], got {restart_shrink}")
        usable = tuple(s for s in STRATEGIES if strategies is None or s in strategies)
        if slowdown_class != "computation":
            usable = tuple(s for s in usable if s != "rebalance_microbatches")  # rebalancing cannot help a slow link
        begun = now if onset is None else min(onset, now)
        self._episodes[job] = _Episode(t_healthy, max(t_slow, t_healthy), slowdown_class, since=now, onset=begun,
                                       delay=now - begun, strategies=usable, restart_shrink=restart_shrink)

    def _watch(self, ep: _Episode, now: float, overhead: float) -> None:
        ep.watch_until = max(ep.watch_until, now + overhead + 2.0 * ep.delay + self.confirm_s)

    def touched(self, job: str, now: float) -> None:
        """Something other than the ski rental acted on ``job`` at ``now`` (a restart, a move): an end of its
        fail-slow seen soon after may be that action's doing."""
        ep = self._episodes.get(job)
        if ep is not None:
            self._watch(ep, now, 0.0)

    def stop(self, job: str, now: float | None = None, ended: bool = True) -> None:
        """The fail-slow is over for ``job``: back to S1 for the next one.

        With ``now``, its duration since the onset is recorded: as an end when
        it ``ended`` and not within the watch window of an action (see the
        class), else as a lower bound.
        """
        ep = self._episodes.pop(job, None)
        if ep is None or now is None:
            return
        natural = ended and now >= ep.watch_until
        record = self.durations.observe(ep.slowdown_class, max(0.0, now - ep.onset), ended=natural)
        if not natural:
            for node in ep.left:
                self._left[node] = (ep.slowdown_class, record, ep.onset)

    def straggler_left(self, job: str, node: str) -> None:
        """``node`` left service while ``job``'s fail-slow was being cured by a checkpoint-restart: the job no
        longer sees that fail-slow, but the node coming back healthy (:meth:`node_back`) says when it ended."""
        ep = self._episodes.get(job)
        if ep is not None and "checkpoint_restart" in ep.strategies[:ep.next_index]:
            ep.left.add(node)

    def node_back(self, node: str, now: float) -> None:
        """``node`` is back in service: the episode that made a job leave it (if any) lasted until ``now``."""
        left = self._left.pop(node, None)
        if left is not None:
            cls, record, onset = left
            self.durations.revise(cls, record, max(0.0, now - onset), ended=True)

    def node_gone(self, node: str) -> None:
        """``node`` failed or was lost: its return will say nothing about the fail-slow it was left for."""
        self._left.pop(node, None)

    def lost_s(self, job: str) -> float:
        ep = self._episodes.get(job)
        return ep.lost_s if ep else 0.0

    def explain(self, job: str) -> str:
        """Why the last strategy of ``job``'s episode was bought."""
        ep = self._episodes.get(job)
        return ep.basis if ep else ""

    def _worth(self, job: str, ep: _Episode, strategy: str, now: float) -> tuple[bool, str]:
        overhead = self.overhead_s[strategy]
        lost_rate = 1.0 - ep.t_healthy / ep.t_slow
        # What the strategy saves per second from now on: all of the slowdown, except a checkpoint-restart with
        # no spare node, after which the job runs healthy but short of the straggler's share.
        rate = lost_rate - (ep.restart_shrink if strategy == "checkpoint_restart" else 0.0)
        if rate <= 0.0:
            return False, (f"{strategy} would leave the job {ep.restart_shrink:.2f} short with no spare node, "
                           f"more than the {lost_rate:.2f} the fail-slow costs")
        age = max(0.0, now - ep.onset)
        if self.remaining is not None:
            est, source = self.remaining(job, ep.slowdown_class, age), "told"
        else:
            est = self.durations.expected_remaining(ep.slowdown_class, age)
            source = f"{self.durations.count(ep.slowdown_class)[0]} past {ep.slowdown_class} episodes"
        if est is not None and now >= ep.watch_until:
            remaining, exact = est
            why = (f"expected to last another {remaining:.0f} s ({source}), "
                   f"{rate:.2f} s lost per s: {rate * remaining:.0f} s to save")
            if rate * remaining >= overhead:
                return True, f"{why} >= {overhead:.0f} s overhead"
            if exact:
                return False, f"{why} < {overhead:.0f} s overhead"
        # Classic rule on what the strategy would save: the slowdown paid so far, scaled to the saved share.
        saved = ep.lost_s * rate / lost_rate if lost_rate > 0 else 0.0
        return saved >= overhead, (f"fail-slow has cost {ep.lost_s:.1f} s ({saved:.1f} s of it {strategy} would "
                                   f"save), the overhead of {strategy} ({overhead:.1f} s): classic ski rental")

    def tick(self, now: float) -> list[tuple[str, str, float]]:
        """Accumulate the slowdown up to ``now``; (job, strategy, seconds lost) for each new step up."""
        out = []
        for job, ep in self._episodes.items():
            if now > ep.since:
                # (now - since) / t_slow slow iterations, each (t_slow - t_healthy) too long.
                ep.lost_s += (now - ep.since) * (1.0 - ep.t_healthy / ep.t_slow)
                ep.since = now
            while ep.next_index < len(ep.strategies):
                strategy = ep.strategies[ep.next_index]
                buy, why = self._worth(job, ep, strategy, now)
                if not buy:
                    break
                ep.next_index += 1
                ep.basis = why
                self._watch(ep, now, self.overhead_s[strategy])
                out.append((job, strategy, ep.lost_s))
        return out

    def observe_duration(self, strategy: str, seconds: float) -> None:
        """An action of ``strategy`` took ``seconds``: move its overhead towards it."""
        if strategy in self.overhead_s and seconds >= 0:
            old = self.overhead_s[strategy]
            self.overhead_s[strategy] = (1 - self.learning_rate) * old + self.learning_rate * seconds
