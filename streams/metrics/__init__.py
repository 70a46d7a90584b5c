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

The package, by what each module holds:

- :mod:`.names`: every metric name and its labels (:data:`METRIC_NAMES`),
  and which dead-letter reasons are not decode errors;
- :mod:`.serving`: :class:`ProcessMetrics` (a process's own registry and its
  ``/metrics`` endpoint), the scrape-time collector and consumer lag;
- :mod:`.counters`: :class:`PublishCounters`, what a component publishes;
- :mod:`.detector_timer`: :class:`DetectorTimer`, detector cost on a sample;
- :mod:`.components`: one class per vigil process (worker, history, agent,
  scrape, actuator, notify) reading that process's state when scraped.
"""

from __future__ import annotations

from vigil.streams.metrics.components import (ActuatorMetrics, AgentMetrics, HistoryMetrics, NotifyMetrics,
                                              ScrapeMetrics, WorkerMetrics)
from vigil.streams.metrics.counters import PublishCounters
from vigil.streams.metrics.detector_timer import DETECTOR_BUCKETS, DetectorTimer  # noqa: F401 - the old module's names
from vigil.streams.metrics.names import METRIC_NAMES, NOT_DECODE_ERRORS  # noqa: F401
from vigil.streams.metrics.serving import ProcessMetrics, _version, consumer_lag  # noqa: F401 - (_version: the tests)

__all__ = ["ActuatorMetrics", "AgentMetrics", "DetectorTimer", "HistoryMetrics", "METRIC_NAMES", "NotifyMetrics",
           "ProcessMetrics", "PublishCounters", "ScrapeMetrics", "WorkerMetrics", "consumer_lag"]
