"""The node agent: every collector on its own thread and interval; one publisher; survives anything.

Each collector runs in its own daemon thread at its own interval, so a slow
or hung collector (NVML can hang on a sick GPU) delays nobody else. A run
that raises, or reports problems, goes through the :class:`HealthTracker`:
each problem is published once as an ``agent_health`` event, and again as
``recovered`` when it clears. Events of one run are grouped by type and key
into one Kafka message each.

The main thread serves the publisher (``poll``), which is what notices a
broker outage, spools, and replays the spool when the broker is back; the
agent itself never stops for the broker. With a process supervisor the agent
exits once every supervised process has exited (after a last collection, so
their exits are published), with torchrun's exit code.

GPU samples and NIC counters ride with the next heartbeat: one message per
node per interval on the node-samples topic, so a detection worker pays one
message's overhead for the node's ten-odd records. A sample waits at most one
heartbeat interval (1.5 if the heartbeat is late; then it goes alone).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any, Callable, Sequence

from vigil.producers.agent.base import Collector, HealthTracker
from vigil.schemas import NODE_SAMPLE_TYPES, NODE_SAMPLES, Envelope, Heartbeat, Source, message_key
from vigil.schemas.envelope import utcnow

log = logging.getLogger(__name__)

__all__ = ["Agent"]


class Agent:
    def __init__(self, collectors: Sequence[Collector], publisher: Any, source: Source, *,
                 clock: Callable[[], datetime] = utcnow, supervisor: Any = None, batcher: Any = None) -> None:
        self.collectors = list(collectors)
        self.publisher = publisher
        self.source = source
        self.health = HealthTracker(source)
        self.supervisor = supervisor
        self.batcher = batcher
        self._clock = clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.runs: dict[str, int] = {c.name: 0 for c in self.collectors}
        self.failures: dict[str, int] = {c.name: 0 for c in self.collectors}
        beats = [c.interval_s for c in self.collectors if c.name == "heartbeat"]
        #: How long a sample may wait for a heartbeat to ride with; None: no heartbeat, samples go alone.
        self.sample_wait_s: float | None = 1.5 * beats[0] if beats else None
        self._samples: list[Envelope] = []
        self._samples_since = 0.0  # monotonic time of the oldest waiting sample
        self._samples_lock = threading.Lock()

    # -- one collection (also what tests drive) ------------------------------------------------------

    def run_once(self, collector: Collector, now: datetime) -> list[Envelope]:
        """Collect once; return its events followed by any health events. Never raises."""
        try:
            events = list(collector.collect(now))
        except Exception as exc:  # a collector failing is data, not a crash
            events = []
            collector.problem(f"error:{type(exc).__name__}", f"{collector.name}: {exc}")
            self.failures[collector.name] = self.failures.get(collector.name, 0) + 1
        self.runs[collector.name] = self.runs.get(collector.name, 0) + 1
        try:
            health = self.health.update(collector.name, collector.take_problems(), now)
        except Exception:  # pragma: no cover - the tracker builds plain events
            log.exception("health tracking failed for %s", collector.name)
            health = []
        for h in health:
            (log.warning if h.status == "failed" else log.info)("%s %s: %s", collector.name, h.status, h.detail)
        return events + list(health)

    def publish(self, events: Sequence[Envelope]) -> None:
        if self.sample_wait_s is not None:
            events = self._with_samples(events)
        # With a heartbeat to ride on, a node's samples and the beat make one message.
        self._publish_groups(self._grouped(events, bundle=self.sample_wait_s is not None))

    @staticmethod
    def _grouped(events: Sequence[Envelope], bundle: bool) -> dict[tuple[str, bytes], list[Envelope]]:
        """One group per message: by event type and key (node samples together when ``bundle``)."""
        groups: dict[tuple[str, bytes], list[Envelope]] = {}
        for ev in events:
            kind = NODE_SAMPLES if bundle and ev.event_type in NODE_SAMPLE_TYPES else ev.event_type  # type: ignore[attr-defined]
            groups.setdefault((kind, message_key(ev)), []).append(ev)
        return groups

    def _with_samples(self, events: Sequence[Envelope]) -> list[Envelope]:
        """``events`` less the samples that now wait, plus those that waited for a heartbeat here."""
        rest: list[Envelope] = []
        waiting: list[Envelope] = []
        for ev in events:
            sample = ev.event_type in NODE_SAMPLE_TYPES and not isinstance(ev, Heartbeat)  # type: ignore[attr-defined]
            (waiting if sample else rest).append(ev)
        with self._samples_lock:
            if waiting:
                if not self._samples:
                    self._samples_since = time.monotonic()
                self._samples.extend(waiting)
            if any(isinstance(ev, Heartbeat) for ev in rest) and self._samples:
                rest += self._samples
                self._samples = []
        return rest

    def flush_samples(self, older_than_s: float = 0.0) -> None:
        """Publish the samples still waiting for a heartbeat, if the oldest waited ``older_than_s``."""
        with self._samples_lock:
            if not self._samples or time.monotonic() - self._samples_since < older_than_s:
                return
            alone, self._samples = self._samples, []
        self._publish_groups(self._grouped(alone, bundle=False))

    def _publish_groups(self, groups: dict[tuple[str, bytes], list[Envelope]]) -> None:
        for (kind, _), group in groups.items():
            try:
                if kind == NODE_SAMPLES:
                    self.publisher.publish(group, topic_type=NODE_SAMPLES)
                else:
                    self.publisher.publish(group)
            except Exception:
                log.exception("publishing %d %s events failed", len(group), group[0].event_type)  # type: ignore[attr-defined]

    # -- running ---------------------------------------------------------------------------------------

    def _loop(self, c: Collector) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.publish(self.run_once(c, self._clock()))
            next_at += c.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow run, a starved thread): run now, then keep the interval from
                # here; no burst of the runs missed, and no skipped run either (a heartbeat skipped on a busy
                # node is a gap of two intervals: most of the way to being declared lost)
                next_at = time.monotonic()
                delay = 0.0
            if c.pause(delay, self._stop):
                break

    def start(self) -> None:
        if self.batcher is not None:
            self.batcher.start()
        if self.supervisor is not None:
            self.supervisor.start()
        for c in self.collectors:
            t = threading.Thread(target=self._loop, args=(c,), name=f"vigil-agent:{c.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None,
            keep_publisher: bool = False) -> int:
        """Run until ``stop`` is set, ``duration_s`` passes, or the supervised processes are done.

        ``keep_publisher``: leave the publisher open (the caller publishes its last words, then
        :meth:`close_publisher`)."""
        self.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop.is_set():
                self.publisher.poll(0.1)
                if self.sample_wait_s is not None:
                    self.flush_samples(older_than_s=self.sample_wait_s)
                if stop is not None and stop.is_set():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self.supervisor is not None and self.supervisor.done:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            self.stop(close_publisher=not keep_publisher)
        return self.supervisor.exit_code if self.supervisor is not None else 0

    def close_publisher(self, flush_timeout_s: float = 5.0) -> None:
        """Deliver what is pending (what cannot wait stays in the spool) and close the publisher."""
        left = self.publisher.flush(flush_timeout_s)
        if left:
            log.warning("%d messages not delivered at exit; they stay in the spool for the next start", left)
        close = getattr(self.publisher, "close", None)
        if close is not None:
            close(0.1)

    def stop(self, flush_timeout_s: float = 5.0, close_publisher: bool = True) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5.0)
        if self.supervisor is not None:
            if not self.supervisor.done:
                self.supervisor.terminate()
            self.publish(self.run_once(self.supervisor, self._clock()))  # their exits
        if self.batcher is not None:
            self.batcher.stop()
        self.flush_samples()
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("closing %s", c.name)
        if close_publisher:
            self.close_publisher(flush_timeout_s)
