"""Escalation of fail-stop recovery (Unicron): retry in place, restart, reconfigure, a human.

Each failure enters the ladder at the rung its severity names — sev3 retry
in place, sev2 restart the process(es), sev1 reconfigure (isolate the node
and re-plan the job on healthy nodes) — and climbs one rung when the remedy
fails (the actuator reports failed or timed out) or when the same failure of
the same job returns within ``window_s`` of the remedy. A restart is given
``max_restarts`` chances inside the window before the ladder moves on, since
a fresh process often is the whole fix. Past reconfiguration only a human
can help: the top rung is ``notify_human``.

"Same failure" is (job, failure kind): a hang after a crash is a new
failure, entered at its own rung. Pure bookkeeping: time is an argument.

Reference: Unicron (He et al., 2023), §4.2 and Table 1.

Examples
--------
>>> esc = Escalation(window_s=600, max_restarts=1)
>>> esc.next_action("job-1", "nccl_timeout", severity=3, now=0.0)
'retry_in_place'
>>> esc.acted("job-1", "nccl_timeout", "retry_in_place", at=0.0)
>>> esc.next_action("job-1", "nccl_timeout", severity=3, now=60.0)   # it came back
'restart_process'
>>> esc.acted("job-1", "nccl_timeout", "restart_process", at=60.0)
>>> esc.failed("job-1", "nccl_timeout", "restart_process", at=70.0)  # the restart failed
'reconfigure'
>>> esc.next_action("job-1", "nccl_timeout", severity=3, now=5000.0)  # much later: a new failure
'retry_in_place'
>>> esc.next_action("job-1", "nccl_timeout", severity=3, now=5000.0, began=100.0)  # began soon after, seen late
'reconfigure'
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The rungs, lowest first.
LADDER = ("retry_in_place", "restart_process", "reconfigure", "notify_human")
#: The rung a failure of each severity enters at.
ENTRY = {3: 0, 2: 1, 1: 2}


@dataclass
class _Attempts:
    rung: int
    at: float
    restarts: int = 0
    history: list[tuple[float, str]] = field(default_factory=list)


class Escalation:
    """Which remedy a job's failure gets next.

    Parameters
    ----------
    window_s : float
        A failure that returns within this many seconds of the last remedy
        counts as that remedy failing.
    max_restarts : int
        Restarts tried for one failure inside the window before reconfiguring.
    """

    def __init__(self, window_s: float = 600.0, max_restarts: int = 3) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if max_restarts < 1:
            raise ValueError(f"max_restarts must be >= 1, got {max_restarts}")
        self.window_s = window_s
        self.max_restarts = max_restarts
        self._attempts: dict[tuple[str, str], _Attempts] = {}

    def next_action(self, job: str, kind: str, severity: int, now: float, began: float | None = None) -> str:
        """The remedy for this failure now: its entry rung, or above the last one if it returned.

        ``began`` is when the failure started (its onset), ``now`` by default:
        a failure that came back a minute after its remedy but was detected
        only at a 30-minute collective timeout still came back.
        """
        if severity not in ENTRY:
            raise ValueError(f"severity must be 1, 2 or 3, got {severity}")
        entry = ENTRY[severity]
        if not self.returned(job, kind, now if began is None else began):
            return LADDER[entry]
        return LADDER[max(entry, self._climb(self._attempts[(job, kind)]))]

    def returned(self, job: str, kind: str, began: float) -> bool:
        """Did this failure start within the window of its last remedy?"""
        last = self._attempts.get((job, kind))
        return last is not None and began - last.at <= self.window_s

    def _climb(self, last: _Attempts) -> int:
        if LADDER[last.rung] == "restart_process" and last.restarts < self.max_restarts:
            return last.rung
        return min(last.rung + 1, len(LADDER) - 1)

    def acted(self, job: str, kind: str, action: str, at: float) -> None:
        """Record that ``action`` was decided for this failure at ``at``."""
        rung = LADDER.index(action)
        prev = self._attempts.get((job, kind))
        fresh = prev is None or at - prev.at > self.window_s
        restarts = (0 if fresh else prev.restarts) + (action == "restart_process")  # type: ignore[union-attr]
        history = [] if fresh else prev.history  # type: ignore[union-attr]
        history.append((at, action))
        self._attempts[(job, kind)] = _Attempts(rung=rung, at=at, restarts=restarts, history=history)

    def failed(self, job: str, kind: str, action: str, at: float) -> str:
        """The remedy ``action`` failed: the rung above it (a failed restart is not retried)."""
        rung = LADDER.index(action)
        nxt = LADDER[min(rung + 1, len(LADDER) - 1)]
        prev = self._attempts.get((job, kind))
        if prev is not None:
            prev.at = at
        return nxt

    def history(self, job: str, kind: str) -> list[tuple[float, str]]:
        """The remedies decided for this failure in its current window, oldest first."""
        a = self._attempts.get((job, kind))
        return list(a.history) if a else []

    def forget_job(self, job: str) -> None:
        """The job starts a new run (its scheduler requeued it): its failures start at their entry rungs."""
        for key in [k for k in self._attempts if k[0] == job]:
            del self._attempts[key]

    def forget_before(self, t: float) -> None:
        """Drop failures whose last remedy is older than ``t`` (bounded memory)."""
        for key in [k for k, a in self._attempts.items() if a.at < t]:
            del self._attempts[key]
