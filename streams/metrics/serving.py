"""One process's metrics registry and its ``/metrics`` endpoint, and what its collectors are made of.

:class:`ProcessMetrics` owns a registry of its own and serves it; a
collector (``_Collector``) reads plain attributes only when Prometheus
scrapes; :func:`consumer_lag` computes a consumer's lag then, from cached
watermarks.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger(__name__)


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
