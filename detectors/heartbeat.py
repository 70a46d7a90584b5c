"""Heartbeat loss: a node is lost after a number of missed heartbeat intervals, plus its recent delivery delay."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from vigil.detectors.base import (
    Detector, DetectorError, Finding, KeyContext, _check_positive, _check_positive_ints, _check_time, register,
)
from vigil.schemas import Heartbeat, to_seconds


@register
class HeartbeatLoss(Detector):
    """Per node: fires after ``missed_intervals`` heartbeat intervals of silence.

    The interval is the one the agent announces with each heartbeat (so agents
    with different intervals need no configuration), else ``interval_s``. A
    node never seen cannot be lost. The finding clears when a heartbeat comes
    back; :attr:`recovered_at` says when.

    Silence is counted from the last beat's send time, so a node whose whole
    stream arrives late (a busy host, a slow broker, a clock a little behind)
    would look silent by its delay: the timeout also allows the longest
    delivery delay (arrival minus send time) of the last ``lag_window``
    beats, at most one interval. The engine tells the arrival (``arrived``
    of its key context); without it no delay is allowed.

    Parameters
    ----------
    missed_intervals : float
        Silence, in heartbeat intervals, after which the node is lost (>= 1).
    interval_s : float
        Interval assumed when a heartbeat does not say.
    lag_window : int
        Heartbeats whose delivery delay is remembered.

    Examples
    --------
    >>> det = HeartbeatLoss(missed_intervals=2.5)
    >>> for seq in range(5):
    ...     det.update(t=100.0 + seq, interval_s=1.0, seq=seq)
    >>> det.tick(106.0)                  # 2.0 s since the last beat at 104.0
    >>> det.finding is None
    True
    >>> det.tick(106.6)                  # 2.6 s > 2.5 intervals
    >>> det.finding.kind, det.finding.severity, det.finding.onset
    ('node_lost', 1, 104.0)
    >>> det.update(t=110.0, interval_s=1.0, seq=0)   # agent restarted
    >>> det.finding is None, det.recovered_at
    (True, 110.0)
    >>> det.update(t=111.0, interval_s=1.0, seq=1, lag_s=0.6)   # arrived 0.6 s after it was sent
    >>> det.tick(113.8); det.finding is None      # 2.8 s < 2.5 intervals + 0.6 s of delay
    True

    References
    ----------
    He et al., "Unicron", 2023: node loss detected in-band in 5.6 s; lost
    connection is severity 1 (the node must leave the job).
    """

    name = "heartbeat_loss"
    version = "2"
    consumes = ("heartbeat",)
    per = "node"
    silence = True

    def __init__(self, missed_intervals: float = 2.5, interval_s: float = 1.0, lag_window: int = 20) -> None:
        if not missed_intervals >= 1:
            raise DetectorError(f"missed_intervals must be >= 1, got {missed_intervals!r}")
        _check_positive_ints(lag_window=lag_window)
        self.missed_intervals = float(missed_intervals)
        self.interval_s = _check_positive(interval_s, "interval_s")
        self.lag_window = lag_window
        self._reset()

    def _reset(self) -> None:
        self._last_seen: float | None = None
        self._last_seq: int | None = None
        self._interval = self.interval_s
        self._finding: Finding | None = None
        self._recovered_at: float | None = None
        self._lags: deque[float] = deque(maxlen=self.lag_window)

    def update(self, *, t: float, interval_s: float | None = None, seq: int | None = None,
               lag_s: float | None = None) -> None:
        """Record a heartbeat sent at ``t`` and heard ``lag_s`` seconds later."""
        t = _check_time(t, "t")
        if interval_s is not None:
            self._interval = _check_positive(interval_s, "interval_s")
        if lag_s is not None and lag_s == lag_s:  # not NaN
            self._lags.append(max(0.0, float(lag_s)))
        if self._last_seen is not None and t <= self._last_seen:
            return  # a late or redelivered heartbeat says nothing new about liveness
        self._last_seen = t
        self._last_seq = seq
        if self._finding is not None:
            self._finding = None
            self._recovered_at = t

    def observe(self, item: Heartbeat, *, t: float, context: KeyContext | None = None) -> None:
        """A node agent's heartbeat: its send time, announced interval and sequence number."""
        sent = to_seconds(item.event_time)
        arrived = getattr(context, "arrived", None)
        self.update(t=sent, interval_s=item.interval_s, seq=item.seq,
                    lag_s=None if arrived is None else arrived - sent)

    def tick(self, now: float) -> None:
        now = _check_time(now, "now")
        if self._finding is not None or self._last_seen is None:
            return
        silence = now - self._last_seen
        lag = self.delivery_lag_s
        if silence > self.missed_intervals * self._interval + lag:
            self._finding = Finding(
                kind="node_lost", severity=1, onset=self._last_seen, detected_at=now,
                evidence={"silence_s": round(silence, 6), "interval_s": self._interval,
                          "missed_intervals": round(silence / self._interval, 3), "last_seq": self._last_seq,
                          "delivery_lag_s": round(lag, 6)},
            )

    @property
    def finding(self) -> Finding | None:
        return self._finding

    @property
    def timeout_s(self) -> float:
        """Silence after which the node is lost, at the current interval."""
        return self.missed_intervals * self._interval

    @property
    def delivery_lag_s(self) -> float:
        """The delay allowed on top of the missed intervals: the longest recent one, at most an interval."""
        return min(max(self._lags, default=0.0), self._interval)

    @property
    def last_seen(self) -> float | None:
        return self._last_seen

    @property
    def recovered_at(self) -> float | None:
        return self._recovered_at

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"missed_intervals": 2.5}

    @classmethod
    def _conformance_feed(cls, seed: int):
        rng = random.Random(seed)
        calls = []
        for seq in range(200):
            t = seq + rng.uniform(0, 0.05)
            calls.append(("update", (), {"t": t, "interval_s": 1.0, "seq": seq}))
            calls.append(("tick", (t + rng.uniform(0, 2.0),), {}))
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 400
