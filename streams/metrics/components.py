"""One metrics class per vigil process, each reading that process's state when Prometheus scrapes.

:class:`WorkerMetrics` (``vigil worker``), :class:`HistoryMetrics` (``vigil
up``'s history sink), :class:`AgentMetrics` (``vigil agent``),
:class:`ScrapeMetrics` (``vigil scrape``), :class:`ActuatorMetrics` (``vigil
actuate``) and :class:`NotifyMetrics` (``vigil notify``); the agent and
scrape share the publisher's families.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from vigil.streams.metrics.counters import PublishCounters
from vigil.streams.metrics.detector_timer import DetectorTimer
from vigil.streams.metrics.serving import _LAG_DOC, ProcessMetrics, _Collector, _counter, _gauge, _lag_family


class WorkerMetrics(ProcessMetrics):
    """``vigil worker``: what it consumes, finds, raises and decides; its lag and its detectors' cost.

    :meth:`instrument` (the detector timer, before the worker is built) and
    :meth:`watch` (the worker once built) wire it; the worker counts what it
    publishes through its ``metrics`` attribute (:class:`PublishCounters`).
    """

    component = "worker"

    def __init__(self, detector_sample_every: int = 8) -> None:
        super().__init__()
        self.counters = PublishCounters(self.registry, ("finding", "alert", "decision", "dead_letter"))
        self.detectors = DetectorTimer(detector_sample_every)
        self.worker: Any = None
        self._stop: threading.Event | None = None
        self.register(_Collector(self._read, [
            _counter("vigil_events_consumed", "Events read from each telemetry topic (a message may carry many).",
                     ("topic",)),
            _gauge("vigil_consumer_lag_messages", _LAG_DOC, ("topic", "partition")),
            _gauge("vigil_open_incidents", "Incidents open in the correlating worker, by severity (0 elsewhere).",
                   ("severity",)),
            _gauge("vigil_tracked_subjects", "Jobs and nodes this worker's detectors follow.", ("per",)),
            _gauge("vigil_worker_assigned_partitions", "Partitions of the detection group this worker owns."),
            _gauge("vigil_worker_replaying_partitions", "Partitions it is rebuilding state from (a takeover)."),
            _gauge("vigil_worker_correlating", "1 on the worker that owns the findings partition (it correlates "
                   "and decides), else 0."),
        ]))
        self.register(_Collector(self.detectors.families, [
            HistogramMetricFamily("vigil_detector_update_seconds", "", labels=["detector"]),
            HistogramMetricFamily("vigil_detector_tick_seconds", "", labels=["detector"])]))

    def instrument(self, config: Any) -> Any:
        """``config`` (a :class:`~vigil.streams.config.StreamConfig`) with its detectors timed."""
        import dataclasses

        return dataclasses.replace(config, engine=dataclasses.replace(config.engine, instrument=self.detectors))

    def watch(self, worker: Any, stop: threading.Event | None = None) -> None:
        """Read ``worker`` when scraped, and count what it publishes; ``stop`` set: it is closing its consumer."""
        self.worker, self._stop = worker, stop
        worker.metrics = self.counters

    def _read(self) -> Iterator[Metric]:
        w = self.worker
        consumed = _counter("vigil_events_consumed", "Events read from each telemetry topic (a message may carry "
                            "many).", ("topic",))
        incidents = _gauge("vigil_open_incidents", "Incidents open in the correlating worker, by severity (0 "
                           "elsewhere).", ("severity",))
        subjects = _gauge("vigil_tracked_subjects", "Jobs and nodes this worker's detectors follow.", ("per",))
        if w is None:
            yield consumed
            return
        for topic, n in sorted(dict(w.detect.events_in).items()):
            consumed.add_metric([topic], n)
        yield consumed
        by_severity = {1: 0, 2: 0, 3: 0}
        if w.owns_correlation:
            for inc in list(w.correlate.correlator.incidents.values()):
                by_severity[inc.severity] = by_severity.get(inc.severity, 0) + 1
        for severity, n in sorted(by_severity.items()):
            incidents.add_metric([str(severity)], n)
        yield incidents
        engine = w.detect.engine
        subjects.add_metric(["job"], len(engine.jobs))
        subjects.add_metric(["node"], len(engine.nodes))
        yield subjects
        yield GaugeMetricFamily("vigil_worker_assigned_partitions", "Partitions of the detection group this worker "
                                "owns.", value=len(w.owned))
        yield GaugeMetricFamily("vigil_worker_replaying_partitions", "Partitions it is rebuilding state from (a "
                                "takeover).", value=len(w._replay_until))
        yield GaugeMetricFamily("vigil_worker_correlating", "1 on the worker that owns the findings partition (it "
                                "correlates and decides), else 0.", value=1 if w.owns_correlation else 0)
        stop = self._stop
        yield from _lag_family(getattr(w, "_consumer", None), lambda: stop is None or not stop.is_set())


class HistoryMetrics(ProcessMetrics):
    """``vigil up``: the history sink (rows inserted, retries while the store is down, lag), and the embedded
    broker's restarts when it runs one."""

    component = "history"

    _SINK = (
        ("vigil_sink_messages", "Messages the history sink consumed.", "messages"),
        ("vigil_sink_rows_inserted", "Rows the history sink inserted into ClickHouse (new events; duplicates "
         "dropped by id are not rows).", "stored"),
        ("vigil_sink_duplicates", "Events the store already held (a redelivery), dropped by id.", "duplicates"),
        ("vigil_sink_dead_letters", "Dead letters the sink wrote to the history (undecodable or refused).",
         "dead_letters"),
        ("vigil_sink_batches", "Batches consumed and stored.", "batches"),
        ("vigil_sink_retries", "Times the sink waited for a store that was down or full and tried again.", "retries"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.stack: Any = None
        self.register(_Collector(self._read, [
            *[_counter(name, doc) for name, doc, _ in self._SINK],
            _counter("vigil_sink_errors", "The sink's own failures on a batch (sink) and messages the broker could "
                     "not hand over (consume).", ("kind",)),
            _gauge("vigil_sink_running", "1 while the history sink's thread runs."),
            _counter("vigil_embedded_broker_restarts", "Times the embedded broker died and was started again."),
            _gauge("vigil_consumer_lag_messages", _LAG_DOC, ("topic", "partition")),
        ]))

    def watch(self, stack: Any) -> None:
        """Read ``stack`` (a :class:`vigil.stack.EmbeddedStack`) and its sink when scraped."""
        self.stack = stack

    def _read(self) -> Iterator[Metric]:
        stack = self.stack
        sink = getattr(stack, "sink", None)
        stats = getattr(sink, "stats", None)
        for name, doc, attr in self._SINK:
            fam = _counter(name, doc)
            if stats is not None:
                fam.add_metric([], getattr(stats, attr))
            yield fam
        errors = _counter("vigil_sink_errors", "The sink's own failures on a batch (sink) and messages the broker "
                          "could not hand over (consume).", ("kind",))
        if stats is not None:
            errors.add_metric(["sink"], stats.sink_errors)
            errors.add_metric(["consume"], stats.consume_errors)
        yield errors
        yield GaugeMetricFamily("vigil_sink_running", "1 while the history sink's thread runs.",
                                value=1 if sink is not None and sink.alive else 0)
        restarts = _counter("vigil_embedded_broker_restarts", "Times the embedded broker died and was started again.")
        if stack is not None and getattr(stack, "broker", None) is not None:
            restarts.add_metric([], stack.broker_restarts)
        yield restarts
        yield from _lag_family(getattr(sink, "_consumer", None),
                               lambda: sink is not None and sink.alive and not sink._stop.is_set())


def _publisher_families(publisher: Any) -> Iterator[Metric]:
    stats = getattr(publisher, "stats", None)
    for name, doc, attr in (
            ("vigil_publisher_messages_delivered", "Messages Kafka acknowledged (replayed ones included).",
             "delivered"),
            ("vigil_publisher_failures", "Deliveries that failed (then spooled, or dropped and reported).", "failed"),
            ("vigil_publisher_spooled_messages", "Messages written to the disk spool while the broker was away.",
             "spooled"),
            ("vigil_publisher_replayed_messages", "Spooled messages delivered once the broker was back.", "replayed"),
            ("vigil_publisher_dropped_events", "Events dropped (a full spool, a message Kafka refused for good); "
             "each drop is also published as an events_dropped record.", "dropped_events"),
            ("vigil_publisher_outages", "Times the publisher found the broker unreachable and began to spool.",
             "outages")):
        fam = _counter(name, doc)
        if stats is not None:
            fam.add_metric([], getattr(stats, attr))
        yield fam
    spool = getattr(publisher, "spool", None)
    pending = messages = 0
    if spool is not None:
        lock = getattr(publisher, "_lock", None)  # (the publisher's thread changes the spool under it)
        if lock is None:
            pending, messages = spool.pending_bytes, spool.pending_messages
        elif lock.acquire(timeout=1.0):
            try:
                pending, messages = spool.pending_bytes, spool.pending_messages
            finally:
                lock.release()
    yield GaugeMetricFamily("vigil_publisher_spool_bytes", "Bytes waiting in the disk spool for the broker (the "
                            "spool's depth).", value=pending)
    yield GaugeMetricFamily("vigil_publisher_spool_messages", "Messages waiting in the disk spool for the broker.",
                            value=messages)
    yield GaugeMetricFamily("vigil_publisher_spooling", "1 while the publisher spools (the broker is unreachable).",
                            value=1 if getattr(publisher, "spooling", False) else 0)


_PUBLISHER_DESCRIBED = [
    _counter("vigil_publisher_messages_delivered", ""), _counter("vigil_publisher_failures", ""),
    _counter("vigil_publisher_spooled_messages", ""), _counter("vigil_publisher_replayed_messages", ""),
    _counter("vigil_publisher_dropped_events", ""), _counter("vigil_publisher_outages", ""),
    _gauge("vigil_publisher_spool_bytes", ""), _gauge("vigil_publisher_spool_messages", ""),
    _gauge("vigil_publisher_spooling", ""),
]


class AgentMetrics(ProcessMetrics):
    """``vigil agent``: its publisher (deliveries, failures, the spool's depth) and its collectors; with
    ``--actuate``, the results of what it carried out."""

    component = "agent"

    def __init__(self) -> None:
        super().__init__()
        self.agent: Any = None
        self.counters = PublishCounters(self.registry, ("action_result", "alert", "dead_letter"))
        self.register(_Collector(self._read, [
            *_PUBLISHER_DESCRIBED,
            _counter("vigil_agent_collector_runs", "Collections run, by collector.", ("collector",)),
            _counter("vigil_agent_collector_failures", "Collections that raised, by collector.", ("collector",)),
        ]))

    def watch(self, agent: Any) -> None:
        """Read ``agent`` (a :class:`vigil.services.agent.NodeAgent`) when scraped; count its actuator's results."""
        self.agent = agent
        actuator = getattr(agent, "actuator", None)
        if actuator is not None:
            actuator.service.metrics = self.counters

    def _read(self) -> Iterator[Metric]:
        agent = self.agent
        yield from _publisher_families(getattr(agent, "publisher", None))
        runs = _counter("vigil_agent_collector_runs", "Collections run, by collector.", ("collector",))
        failures = _counter("vigil_agent_collector_failures", "Collections that raised, by collector.",
                            ("collector",))
        runner = getattr(agent, "runner", None)
        if runner is not None:
            for name, n in sorted(dict(runner.runs).items()):
                runs.add_metric([name], n)
            for name, n in sorted(dict(runner.failures).items()):
                failures.add_metric([name], n)
        yield runs
        yield failures


class ScrapeMetrics(ProcessMetrics):
    """``vigil scrape``: its publisher (deliveries, failures, the spool's depth)."""

    component = "scrape"

    def __init__(self) -> None:
        super().__init__()
        self.publisher: Any = None
        self.register(_Collector(lambda: _publisher_families(self.publisher), _PUBLISHER_DESCRIBED))

    def watch(self, publisher: Any) -> None:
        self.publisher = publisher


class ActuatorMetrics(ProcessMetrics):
    """``vigil actuate``: action results by action, state and backend; decisions handled; the circuit breaker;
    its alerts and dead letters; its lag."""

    component = "actuator"

    def __init__(self) -> None:
        super().__init__()
        self.service: Any = None
        self._stop: threading.Event | None = None
        self.counters = PublishCounters(self.registry, ("action_result", "alert", "dead_letter"))
        self.register(_Collector(self._read, [
            _counter("vigil_actuator_decisions", "Decisions the actuator handled (acted on, refused, or found done "
                     "in its ledger)."),
            _gauge("vigil_actuator_circuit_open", "1 while the blast-radius circuit breaker is open (no machine "
                   "action until a human resets it)."),
            _gauge("vigil_consumer_lag_messages", _LAG_DOC, ("topic", "partition")),
        ]))

    def watch(self, service: Any, stop: threading.Event | None = None) -> None:
        """Read ``service`` (an :class:`vigil.services.actuator.ActuatorService`) when scraped; count what it
        publishes."""
        self.service, self._stop = service, stop
        service.metrics = self.counters

    def _read(self) -> Iterator[Metric]:
        service = self.service
        handled = _counter("vigil_actuator_decisions", "Decisions the actuator handled (acted on, refused, or found "
                           "done in its ledger).")
        if service is not None:
            handled.add_metric([], service.handled)
        yield handled
        safety = getattr(getattr(service, "executor", None), "safety", None)
        yield GaugeMetricFamily("vigil_actuator_circuit_open", "1 while the blast-radius circuit breaker is open (no "
                                "machine action until a human resets it).",
                                value=1 if safety is not None and safety.circuit_open else 0)
        stop = self._stop
        yield from _lag_family(getattr(service, "_consumer", None), lambda: stop is None or not stop.is_set())


class NotifyMetrics(ProcessMetrics):
    """``vigil notify``: alerts handled, deliveries by outcome, dead letters, lag."""

    component = "notify"

    def __init__(self) -> None:
        super().__init__()
        self.service: Any = None
        self._stop: threading.Event | None = None
        self.register(_Collector(self._read, [
            _counter("vigil_notify_alerts", "Alert versions read from the alerts topic."),
            _counter("vigil_notify_deliveries", "Deliveries to a receiver by outcome: delivered, or dead (a "
                     "permanent failure, or retries exhausted: dead-lettered).", ("outcome",)),
            _counter("vigil_notify_dead_letters", "Messages notify dead-lettered (not an alert, undecodable, or "
                     "not delivered)."),
            _gauge("vigil_consumer_lag_messages", _LAG_DOC, ("topic", "partition")),
        ]))

    def watch(self, service: Any, stop: threading.Event | None = None) -> None:
        """Read ``service`` (a :class:`vigil.streams.notify.service.NotifyService`) when scraped."""
        self.service, self._stop = service, stop

    def _read(self) -> Iterator[Metric]:
        service = self.service
        alerts = _counter("vigil_notify_alerts", "Alert versions read from the alerts topic.")
        deliveries = _counter("vigil_notify_deliveries", "Deliveries to a receiver by outcome: delivered, or dead "
                              "(a permanent failure, or retries exhausted: dead-lettered).", ("outcome",))
        dead = _counter("vigil_notify_dead_letters", "Messages notify dead-lettered (not an alert, undecodable, or "
                        "not delivered).")
        if service is not None:
            alerts.add_metric([], service.handled)
            deliveries.add_metric(["delivered"], service.notifier.delivered)
            deliveries.add_metric(["dead"], service.notifier.dead)
            dead.add_metric([], service.dead_letters)
        yield alerts
        yield deliveries
        yield dead
        stop = self._stop
        yield from _lag_family(getattr(service, "_consumer", None), lambda: stop is None or not stop.is_set())
