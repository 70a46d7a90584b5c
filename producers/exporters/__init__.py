"""Scraping the exporters a cluster already runs (dcgm-exporter, node_exporter) into vigil's node events.

:mod:`~vigil.producers.exporters.exposition` reads the Prometheus text format,
:mod:`~vigil.producers.exporters.dcgm` and :mod:`~vigil.producers.exporters.node_exporter`
map each exporter's metrics to vigil's events, and
:mod:`~vigil.producers.exporters.scraper` runs ``vigil scrape``.
"""

from vigil.producers.exporters.dcgm import ViolationTracker, XidTracker, gpu_events, read_dcgm
from vigil.producers.exporters.exposition import ExpositionError, Sample, parse
from vigil.producers.exporters.node_exporter import nic_events, read_node_exporter
from vigil.producers.exporters.scraper import ScrapeError, ScrapeReport, Scraper, Target, load_targets_file, parse_target

__all__ = [
    "ViolationTracker", "XidTracker", "gpu_events", "read_dcgm", "ExpositionError", "Sample", "parse", "nic_events", "read_node_exporter",
    "ScrapeError", "ScrapeReport", "Scraper", "Target", "load_targets_file", "parse_target",
]
