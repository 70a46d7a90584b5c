"""vigil's own health for Prometheus: every metric a vigil process exports is defined here.

Each long-running process (``vigil worker``, ``vigil up`` with its history
sink, ``vigil agent``, ``vigil actuate``, ``vigil notify``, ``vigil scrape``)
builds one of the classes below, which owns a :class:`~prometheus_client.CollectorRegistry`
of its own (never the library's global one, so several components in one
process, as in the tests, do not clash), and serves it on ``/metrics``
(:meth:`ProcessMetrics.serve`; where and whether: :meth:`vigil.settings.Settings.metrics_address`).

The hot paths stay as they were. What a component already counts in plain
attributes (the sink's :class:`~vigil.streams.sink.SinkStats`, the
publisher's :class:`~vigil.producers.publisher.PublisherStats`, the detect
stage's events per topic, the correlator's open incidents) is read when
Prometheus scrapes, by a collector; consumer lag is computed then too, from
the consumer's position and the high watermark its last fetch brought
(cached by librdkafka: no request to the broker). Counters that only exist
here (alerts, decisions, findings, dead letters, action results) are
incremented where a component publishes, which is rare next to what it
consumes, through label children cached by label values. Detector cost is
timed on a sample of the instances only (:class:`DetectorTimer`).

Names follow Prometheus' conventions: the ``vigil_`` prefix, ``_total`` on
counters (added by the client library), seconds and bytes as units. Every
name and its labels is in :data:`METRIC_NAMES`; the README lists them and
the Grafana dashboard's "vigil's own health" row plots them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from bisect import bisect_left
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger(__name__)

__all__ = ["ActuatorMetrics", "AgentMetrics", "DetectorTimer", "HistoryMetrics", "METRIC_NAMES", "NotifyMetrics",
           "ProcessMetrics", "PublishCounters", "ScrapeMetrics", "WorkerMetrics", "consumer_lag"]

#: Every metric vigil defines (the client library adds ``_total`` to counters), with its labels.
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    # every process
    "vigil_build_info": ("component", "version"),
    # consumers: worker, history sink, actuator, notify
    "vigil_consumer_lag_messages": ("topic", "partition"),
    # worker
    "vigil_events_consumed_total": ("topic",),
    "vigil_findings_total": ("detector", "status"),
    "vigil_alerts_total": ("kind", "severity", "status"),
    "vigil_decisions_total": ("action",),
    "vigil_dead_letters_total": ("reason", "topic"),
    "vigil_decode_errors_total": ("reason", "topic"),
    "vigil_open_incidents": ("severity",),
    "vigil_tracked_subjects": ("per",),
    "vigil_worker_assigned_partitions": (),
    "vigil_worker_replaying_partitions": (),
    "vigil_worker_correlating": (),
    "vigil_detector_update_seconds": ("detector",),
    "vigil_detector_tick_seconds": ("detector",),
    # history sink (vigil up)
    "vigil_sink_messages_total": (),
    "vigil_sink_rows_inserted_total": (),
    "vigil_sink_duplicates_total": (),
    "vigil_sink_dead_letters_total": (),
    "vigil_sink_batches_total": (),
    "vigil_sink_retries_total": (),
    "vigil_sink_errors_total": ("kind",),
    "vigil_sink_running": (),
    "vigil_embedded_broker_restarts_total": (),
    # actuator (vigil actuate, vigil agent --actuate)
    "vigil_actions_total": ("action", "state", "backend"),
    "vigil_actuator_decisions_total": (),
    "vigil_actuator_circuit_open": (),
    # agent and scrape: the publisher with its spool
    "vigil_publisher_messages_delivered_total": (),
    "vigil_publisher_failures_total": (),
    "vigil_publisher_spooled_messages_total": (),
    "vigil_publisher_replayed_messages_total": (),
    "vigil_publisher_dropped_events_total": (),
    "vigil_publisher_outages_total": (),
    "vigil_publisher_spool_bytes": (),
    "vigil_publisher_spool_messages": (),
    "vigil_publisher_spooling": (),
    "vigil_agent_collector_runs_total": ("collector",),
    "vigil_agent_collector_failures_total": ("collector",),
    # notify
    "vigil_notify_alerts_total": (),
    "vigil_notify_deliveries_total": ("outcome",),
    "vigil_notify_dead_letters_total": (),
}

#: Dead-letter reasons that are not a message failing to decode (an event refused by a consumer or
#: the store, a sink's own failure, a message the broker could not hand over); every other reason is
#: a decode error (:class:`vigil.schemas.DecodeError`'s: not_json, invalid, unknown_event_type, ...).
NOT_DECODE_ERRORS = frozenset({"refused", "store_refused", "sink_error", "consume_error", "notify_failed",
                               "notify_retries_exhausted"})

#: Bucket bounds of the detector cost histograms, in seconds (1 µs to 1 s).
DETECTOR_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vigil")
    except Exception:  # noqa: BLE001 - running from a tree that is not installed
        return "unknown"


class ProcessMetrics:
    """One process's registry (its own, never the global one) and its ``/metrics`` endpoint.

    The registry holds the client library's process, platform and GC
    collectors (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
    ``python_gc_*``) and ``vigil_build_info{component, version}``.
    """

    component = "vigil"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info("vigil_build", "The vigil version and which of its processes this is.",
             registry=self.registry).info({"component": self.component, "version": _version()})
        self._server: Any = None
        #: Where it serves, once :meth:`serve` succeeded.
        self.url: str | None = None

    def serve(self, host: str, port: int) -> str | None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; return its URL.

        A port that cannot be bound (another process has it: two workers on one
        host with the same port) is logged as a warning, and the process runs
        on without an endpoint: its own health is not worth stopping detection
        for. Prometheus then shows the target down.
        """
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            log.warning("cannot serve /metrics on %s:%d (%s): this %s runs without it; give it a free port with "
                        "--metrics-port or VIGIL_METRICS_PORT (0 turns it off)", host, port, exc, self.component)
            return None
        bound = self._server.server_address[1]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{bound}/metrics"
        log.info("serving /metrics on %s", self.url)
        return self.url

    def close(self) -> None:
        """Stop serving (the tests' in-process components; a process's endpoint ends with it)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def register(self, collector: Any) -> None:
        self.registry.register(collector)


class _Collector:
    """A collector that reads plain attributes when Prometheus scrapes (no cost between scrapes)."""

    def __init__(self, read: Callable[[], Iterable[Metric]], described: Sequence[Metric]) -> None:
        self._read = read
        self._described = list(described)

    def describe(self) -> list[Metric]:
        return self._described

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._read()
        except Exception:  # noqa: BLE001 - a scrape must never fail the process, nor the other metrics
            log.debug("a metrics collector failed", exc_info=True)


def _counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


_LAG_DOC = ("Messages on the partition after this process's position (the high watermark of its last fetch "
            "minus the next offset it reads); only partitions it has read from.")


def consumer_lag(consumer: Any) -> list[tuple[str, int, int]]:
    """``(topic, partition, lag)`` of each assigned partition the consumer has read from.

    From librdkafka's cached high watermark (updated by every fetch; no request to the broker,
    so this is cheap, and right on tansu, whose ListOffsets *latest* is not) and the position.
    """
    out: list[tuple[str, int, int]] = []
    for tp in consumer.position(consumer.assignment()):
        if tp.offset < 0:
            continue  # nothing read yet
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if high >= 0:
            out.append((tp.topic, tp.partition, max(0, high - tp.offset)))
    return out


def _lag_family(consumer: Any, active: Callable[[], bool]) -> Iterator[Metric]:
    fam = _gauge("vigil_consumer_lag_messages", _LAG_DOC, ("topic", "partition"))
    if consumer is not None and active():
        for topic, partition, lag in consumer_lag(consumer):
            fam.add_metric([topic, str(partition)], lag)
    yield fam


class PublishCounters:
    """Counters of what a component publishes, each label child made once and kept.

    A component that publishes holds one as its ``metrics`` attribute (None: not counted) and calls
    :meth:`count` with what it published.
    """

    def __init__(self, registry: CollectorRegistry, kinds: Iterable[str]) -> None:
        kinds = set(kinds)
        self._metrics: dict[str, Counter] = {}
        docs = {
            "finding": ("vigil_findings", "Detector findings published, by detector and status (raised, cleared).",
                        ("detector", "status")),
            "alert": ("vigil_alerts", "Alert versions published, by incident kind, severity (1 worst) and status "
                      "(open, update, resolved).", ("kind", "severity", "status")),
            "decision": ("vigil_decisions", "Decisions published by the decision engine, by action.", ("action",)),
            "action_result": ("vigil_actions", "Action results published by an actuator, by the decision's action, "
                              "the state reached (succeeded, failed, timed_out, ...) and backend.",
                              ("action", "state", "backend")),
            "dead_letter": ("vigil_dead_letters", "Messages dead-lettered (kept whole with the reason), by reason "
                            "and the topic they were read from.", ("reason", "topic")),
        }
        for kind in kinds:
            name, doc, labels = docs[kind]
            self._metrics[kind] = Counter(name, doc, labels, registry=registry)
        if "dead_letter" in kinds:
            self._metrics["decode_error"] = Counter(
                "vigil_decode_errors", "Messages (or items of a batch) that did not decode into a valid event of "
                "their topic, by reason and topic (each is also a dead letter).", ("reason", "topic"),
                registry=registry)
        self._children: dict[tuple, Any] = {}

    def _inc(self, kind: str, *labels: str) -> None:
        key = (kind, *labels)
        child = self._children.get(key)
        if child is None:
            metric = self._metrics.get(kind)
            if metric is None:
                return
            child = self._children[key] = metric.labels(*labels)
        child.inc()

    def count(self, events: Iterable[Any], action: str | None = None) -> None:
        for ev in events:
            etype = getattr(ev, "event_type", None)
            if etype == "alert":
                self._inc("alert", ev.kind, str(ev.severity), ev.status)
            elif etype == "finding":
                self._inc("finding", ev.detector, ev.status)
            elif etype == "decision":
                self._inc("decision", ev.action)
            elif etype == "action_result":
                self._inc("action_result", action or "unknown", ev.state, ev.backend)
            elif etype == "dead_letter":
                self._inc("dead_letter", ev.reason, ev.source_topic)
                if ev.reason not in NOT_DECODE_ERRORS:
                    self._inc("decode_error", ev.reason, ev.source_topic)


class _Histogram:
    """A histogram kept in plain Python (one list increment per observation, no lock)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DETECTOR_BUCKETS) + 1)
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(DETECTOR_BUCKETS, seconds)] += 1
        self.sum += seconds

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.sum
        out, running = [], 0
        for bound, n in zip(DETECTOR_BUCKETS, counts):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", running + counts[-1]))
        return out, total


class DetectorTimer:
    """Times detector updates and ticks on a sample of the detector instances.

    The detection engine calls it on each detector class it runs
    (:attr:`vigil.streams.engine.detection.EngineParams.instrument`); it
    returns a subclass whose ``for_key`` makes one instance in ``every`` (the
    first one always) a timed one and the others plain instances of the
    detector itself, which cost nothing more. A timed instance measures each
    ``observe`` (or its own ``observe_batch``) and ``tick`` with
    ``time.perf_counter`` into plain counters that Prometheus reads when it
    scrapes (``vigil_detector_update_seconds``, ``vigil_detector_tick_seconds``).
    The detectors know nothing of it and stay pure.
    """

    def __init__(self, every: int = 8) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.update: dict[str, _Histogram] = {}
        self.tick: dict[str, _Histogram] = {}
        self._made: dict[type, type] = {}

    def __call__(self, cls: type) -> type:
        made = self._made.get(cls)
        if made is None:
            made = self._made[cls] = self._timed(cls)
        return made

    def _timed(self, base: Any) -> type:
        from vigil.detectors import Detector  # (only where a worker runs detectors)

        update = self.update.setdefault(base.name, _Histogram())
        tick = self.tick.setdefault(base.name, _Histogram())
        every, serial = self.every, itertools.count()
        clock = time.perf_counter
        busy = [False]  # inside a timed call (an observe_batch calling observe is timed once)
        base_for_key = base.for_key.__func__
        base_observe, base_batch, base_tick = base.observe, base.observe_batch, base.tick

        def for_key(cls: type, key: str, **params: Any) -> Any:
            if next(serial) % every:
                return base.for_key(key, **params)  # a plain instance: no cost at all
            return base_for_key(cls, key, **params)

        def observe(self: Any, item: Any, *, t: float, context: Any = None) -> None:
            if busy[0]:
                return base_observe(self, item, t=t, context=context)
            busy[0] = True
            start = clock()
            try:
                base_observe(self, item, t=t, context=context)
            finally:
                update.add(clock() - start)
                busy[0] = False

        def observe_batch(self: Any, items: list[Any], *, t: float, context: Any = None) -> None:
            busy[0] = True
            start = clock()
            try:
                base_batch(self, items, t=t, context=context)
            finally:
                update.add(clock() - start)
                busy[0] = False

        def timed_tick(self: Any, now: float) -> None:
            start = clock()
            try:
                base_tick(self, now)
            finally:
                tick.add(clock() - start)

        namespace: dict[str, Any] = {"for_key": classmethod(for_key), "observe": observe,
                                     "__module__": __name__, "__doc__": base.__doc__}
        if base.observe_batch is not Detector.observe_batch:  # (the default one calls observe: timed there)
            namespace["observe_batch"] = observe_batch
        if base.tick is not Detector.tick:  # (the engine skips classes that keep the base tick)
            namespace["tick"] = timed_tick
        return type(f"Timed{base.__name__}", (base,), namespace)

    def families(self) -> Iterator[Metric]:
        for name, doc, hists in (
                ("vigil_detector_update_seconds", "Seconds a detector takes to take one input (or one message's "
                 "inputs for a key), on a sample of its instances.", self.update),
                ("vigil_detector_tick_seconds", "Seconds a detector's timer tick takes, on a sample of its "
                 "instances.", self.tick)):
            fam = HistogramMetricFamily(name, doc, labels=["detector"])
            for detector, hist in list(hists.items()):
                buckets, total = hist.buckets()
                if buckets[-1][1]:
                    fam.add_metric([detector], buckets, sum_value=total)
            yield fam


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
