"""The detection engine's timers: the feed's pulse (is the worker deaf?), silence judged in the
worker's time or, while it reads some feed far behind, in the log's own time, and the window
detectors aged a slice per tick.

:class:`_Timers` is a part of :class:`~vigil.streams.engine.detection.DetectionEngine` (its
methods use the engine's keys, timer registries and feeds).
"""

from __future__ import annotations

from typing import Any

from vigil.schemas import DetectorFinding


#: Nodes read from one partition for its silence as a whole, while others are read, to be taken for the
#: partition's delivery rather than all of them lost (fewer: a small cluster's partition, judged on arrival).
STALL_WRITERS = 3


class _Timers:
    """The timer part of :class:`~vigil.streams.engine.detection.DetectionEngine`."""

    # -- the feed's pulse --------------------------------------------------
    def heard(self, now: float) -> None:
        """Data, or the broker's answer, reached the worker at ``now``.

        The worker calls it for its broker contact too: one whose partitions
        carry few subjects may hear no data while they are all silent, and
        its broker contact says the silence is theirs (counted only while it
        consumes, not during a rebalance). After hearing nothing for
        ``deaf_after_s`` the worker was deaf: its subjects' silences count
        from now.
        """
        if now - self._last_heard > self.params.deaf_after_s and self._last_heard > float("-inf"):
            self._feed_back_at = now
        self._last_heard = max(self._last_heard, now)

    def resumed(self, now: float) -> None:
        """The worker consumes again (after a rebalance): its subjects' silences count from ``now``."""
        self._feed_back_at = max(self._feed_back_at, now)
        self._last_heard = max(self._last_heard, now)

    # -- timers ------------------------------------------------------------
    def tick(self, now: float) -> list[DetectorFinding]:
        """Advance every timer to ``now``; return what that raises or clears.

        ``now`` is the clock that event arrivals are stamped with. A silence
        detector may only fire once its timeout has passed with nothing
        arriving from its subject: a worker reading a backlog (after a
        takeover, or while lagging) sees old timestamps that are not silence
        in the cluster. While some feed is read far behind (:meth:`behind`),
        silence is judged in the log's own time instead: a subject whose feed
        has carried its timeout's worth of others' messages since its last
        one. Onsets stay in event time.

        Silence detectors are checked every tick (nodes first, then jobs); the
        others only age their windows (holds of minutes), so each is ticked
        once per ``window_tick_s``, a slice of them per tick: at 10 Hz over
        thousands of nodes, all at once would stall the worker once a second.
        """
        out: list[DetectorFinding] = []
        alone = len(self.nodes) + len(self.jobs) <= 1
        feed_back_at, last_heard = self._feed_back_at, self._last_heard
        behind, marks = self.behind(now), self._marks
        feed_heard, grace = self._feed_heard, self.params.late_feed_grace_s
        writers: dict[Any, int] = {}  # quiet feed -> its nodes heard until it went quiet (counted once a tick)
        for per_node, registry in zip((True, False), self._silence):
            for key, det in registry.values():
                timeout = det.timeout_s  # type: ignore[attr-defined]
                if behind:
                    # Judged in the log's own time: its feed carried others' messages for more than its
                    # timeout past its last sign of life (the gaps in the worker's reading are not silence;
                    # a silence in what was written is, however late it is read). The feed's progress is
                    # measured in the feed's time and counted on the subject's own clock: no skew.
                    # Only for subjects heard since the worker last went deaf: after an outage, producers
                    # deliver what they held in any order, and one not yet read is not silent.
                    mark = marks.get(key.feed)
                    if mark is None or mark - key.mark <= timeout or key.last_arrival < feed_back_at:
                        continue
                    det.tick(key.last_event + (mark - key.mark))
                    out += self._diff(key, det, now)
                    continue
                # Silent past its timeout as far as the worker can tell: only once it heard something
                # (data, or its broker) after the timeout ran out (a worker that cannot hear does not
                # know yet), unless it tracks this subject alone; not counting the time before its
                # feed came back. Inlined: thousands of subjects every tick.
                since = key.last_arrival if key.last_arrival > feed_back_at else feed_back_at
                if now - since <= timeout or not (alone or last_heard - since > timeout):
                    continue
                # Late, not silent: its own feed is still being read (a message within the timeout) but has
                # not carried its timeout's worth of others' news past its last sign of life (a partition
                # delivered late, in order: its next message may be the next one there).
                feed = key.feed
                if feed is not None and now - since <= timeout + grace:
                    last = feed_heard.get(feed, float("-inf"))
                    if now - last <= timeout:
                        if marks.get(feed, float("-inf")) - key.mark <= timeout:
                            continue
                    elif per_node:
                        # Its whole partition went quiet while others are read: with several nodes on it,
                        # that is the partition's delivery (a broker serving it late), not every one of
                        # them lost at once (a rack's nodes are spread over the partitions); held for the
                        # grace, then judged on arrival: a shared silence of its nodes.
                        # others heard first (a few feeds): a cluster-wide silence then scans no registry
                        if any(now - at <= timeout for f, at in feed_heard.items() if f != feed):
                            if feed not in writers:  # its nodes still heard when it went quiet
                                writers[feed] = len({k.name for k, _ in registry.values()
                                                     if k.feed == feed and k.last_arrival >= last - timeout})
                            if writers[feed] >= STALL_WRITERS:
                                continue
                det.tick(now)
                out += self._diff(key, det, now)
        out += self._tick_windows(now)
        return out

    def behind(self, now: float) -> bool:
        """Is the worker reading some feed far behind (see ``max_feed_lag_s``)?

        Judged at each tick from the messages read since the previous one; a
        feed stays behind until fresher messages are read from it, or for as
        long as it was behind (a partition whose writers all stopped has
        nothing fresher to show).
        """
        if self._feed_window:
            for feed, lag in self._feed_window.items():
                self._feeds[feed] = (now, lag)
            self._feed_window = {}
        limit = self.params.max_feed_lag_s
        return any(lag > limit and now - seen < lag for seen, lag in self._feeds.values())

    def _tick_windows(self, now: float) -> list[DetectorFinding]:
        """Tick the share of the window detectors due since the last tick (all of them per window_tick_s)."""
        out: list[DetectorFinding] = []
        windows = self._windows
        if not windows:
            self._windows_ticked_at = now
            return out
        last = self._windows_ticked_at
        share = 1.0 if last is None else min(1.0, max(0.0, now - last) / self.params.window_tick_s)
        self._windows_ticked_at = now
        self._window_credit = min(float(len(windows)), self._window_credit + share * len(windows))
        while self._window_credit >= 1.0:
            if not self._window_cycle:
                self._window_cycle = list(windows)
                self._window_cycle.reverse()  # popped from the end: oldest first
            ref = self._window_cycle.pop()
            self._window_credit -= 1.0
            entry = windows.get(ref)
            if entry is None:
                continue  # dropped since the cycle began
            key, det = entry
            det.tick(now)
            out += self._diff(key, det, now)
        return out

