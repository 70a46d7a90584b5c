"""``vigil scrape``: read the exporters a cluster already runs and publish vigil's node events.

Each interval the scraper GETs every target (in parallel, each with a
timeout), reads dcgm-exporter targets with :mod:`~vigil.producers.exporters.dcgm`
and node_exporter targets with :mod:`~vigil.producers.exporters.node_exporter`,
and publishes through the :class:`~vigil.producers.publisher.Publisher` (with
its disk spool, so a broker outage loses nothing):

* per node, one message on the node-samples topic: a ``Heartbeat`` (``seq``
  +1 per scrape since the scraper started, ``interval_s`` = the scrape
  interval) with the node's ``GpuTelemetry`` and ``NicCounters`` -- the same
  shape the node agent sends, so the detection workers need nothing new;
* ``XidError`` events to the XID topic, one per change of a GPU's last-XID
  gauge (see :class:`~vigil.producers.exporters.dcgm.XidTracker`);
* ``AgentHealth`` events (collector ``scrape.dcgm`` / ``scrape.node``, problem
  = the target URL) once when a target stops answering or serves something
  that is not an exposition, and once when it recovers.

A node gets its heartbeat when at least one of its targets answered. A node
whose exporters all stop answering therefore goes silent and vigil's
heartbeat-loss detector reports it lost after its usual number of missed
intervals: with no vigil agent on the node, "its exporters do not answer" is
the sign of life there is. (Many nodes silent at once share a cause -- the
scraper itself, or the network -- and the correlator treats them so.)

Targets come from ``--dcgm`` / ``--node-exporter`` URLs or from a file in
Prometheus' ``file_sd`` format (JSON, or YAML with PyYAML installed), re-read
when it changes::

    [{"targets": ["gpu-07:9400"], "labels": {"exporter": "dcgm", "node": "gpu-07"}},
     {"targets": ["gpu-07:9100"], "labels": {"exporter": "node", "node": "gpu-07"}}]

``labels.node`` names the node (on Kubernetes, dcgm-exporter's ``Hostname``
label is the pod's host name unless the exporter runs with the host network,
so name the node there); ``__scheme__`` and ``__metrics_path__`` work as in
Prometheus.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from vigil.producers.exporters.dcgm import ViolationTracker, XidTracker, gpu_events, read_dcgm
from vigil.producers.exporters.exposition import ExpositionError, parse
from vigil.producers.exporters.node_exporter import nic_events, read_node_exporter
from vigil.schemas import NODE_SAMPLES, Envelope, Heartbeat, Source, message_key
from vigil.schemas.envelope import utcnow
from vigil.schemas.events import AgentHealth

log = logging.getLogger(__name__)

__all__ = ["ScrapeError", "Target", "Scraper", "ScrapeReport", "http_get", "parse_target", "load_targets_file"]

KINDS = ("dcgm", "node")
_ALIASES = {"dcgm": "dcgm", "dcgm-exporter": "dcgm", "node": "node", "node_exporter": "node", "node-exporter": "node"}
#: Most bytes read from one target (a node_exporter with many cores serves a few hundred KB).
MAX_BODY = 16 << 20


class ScrapeError(ValueError):
    """A target or targets file is malformed; the message names it and says what was expected."""


@dataclass(frozen=True)
class Target:
    """One exporter endpoint: its kind (``dcgm`` or ``node``), URL and, optionally, the node it serves."""

    kind: str
    url: str
    node: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScrapeError(f"target {self.url}: kind must be one of {KINDS}, got {self.kind!r}")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ScrapeError(f"target {self.url!r}: expected an http(s)://host:port/path URL")

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or self.url


def parse_target(kind: str, spec: str) -> Target:
    """``[NODE=]URL`` -> a :class:`Target`; a bare ``host:port`` gets ``http://`` and ``/metrics``.

    >>> parse_target("dcgm", "gpu-07=http://10.0.0.7:9400/metrics")
    Target(kind='dcgm', url='http://10.0.0.7:9400/metrics', node='gpu-07')
    >>> parse_target("node", "10.0.0.7:9100")
    Target(kind='node', url='http://10.0.0.7:9100/metrics', node=None)
    """
    node: str | None = None
    head, sep, rest = spec.partition("=")
    if sep and "://" not in head and "/" not in head:
        node, spec = head.strip() or None, rest
    return Target(kind, _as_url(spec.strip()), node)


def _as_url(address: str, scheme: str = "http", path: str = "/metrics") -> str:
    if "://" in address:
        return address
    return f"{scheme}://{address}{path if path.startswith('/') else '/' + path}"


def load_targets_file(path: str | Path) -> list[Target]:
    """Targets from a Prometheus ``file_sd`` file: a list of ``{"targets": [...], "labels": {...}}``.

    ``labels.exporter`` (``dcgm`` or ``node``) is required; ``labels.node`` is optional.
    """
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ScrapeError(f"{path}: YAML targets need PyYAML (pip install pyyaml), or write them as JSON") from None
        groups = yaml.safe_load(text)
    else:
        try:
            groups = json.loads(text)
        except ValueError as exc:
            raise ScrapeError(f"{path}: not JSON: {exc}") from None
    if not isinstance(groups, list):
        raise ScrapeError(f"{path}: expected a list of target groups (Prometheus file_sd), got {type(groups).__name__}")
    out: list[Target] = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ScrapeError(f"{path}: group {i}: expected {{\"targets\": [...], \"labels\": {{...}}}}")
        labels = group.get("labels") or {}
        kind = _ALIASES.get(str(labels.get("exporter", "")).lower())
        if kind is None:
            raise ScrapeError(f"{path}: group {i}: labels.exporter must be dcgm or node, got {labels.get('exporter')!r}")
        for address in group["targets"]:
            url = _as_url(str(address), labels.get("__scheme__", "http"), labels.get("__metrics_path__", "/metrics"))
            out.append(Target(kind, url, labels.get("node") or None))
    return out


def http_get(url: str, timeout_s: float) -> str:
    """GET ``url`` and return its body as text; raise on a non-200 answer or a network error."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "vigil-scrape"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - operator-configured URLs
        body = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ScrapeError(f"{url}: body larger than {MAX_BODY} bytes")
    return body.decode("utf-8", errors="replace")


@dataclass
class ScrapeReport:
    """What one scrape found and published."""

    nodes: set[str] = field(default_factory=set)
    gpu_samples: int = 0
    nic_samples: int = 0
    xids: int = 0
    failed_targets: dict[str, str] = field(default_factory=dict)
    events: list[Envelope] = field(default_factory=list)


class Scraper:
    """Scrape ``targets`` every ``interval_s`` and publish through ``publisher``.

    ``publisher`` needs ``publish(events, topic_type=None)`` (a
    :class:`~vigil.producers.publisher.Publisher`); ``fetch(url, timeout_s)``
    returns a body or raises (default :func:`http_get`); ``clock`` is the only
    clock read.
    """

    def __init__(self, targets: Sequence[Target], publisher: Any, *, cluster: str = "default",
                 interval_s: float = 5.0, timeout_s: float | None = None, xids: XidTracker | None = None,
                 fetch: Callable[[str, float], str] = http_get, clock: Callable[[], datetime] = utcnow,
                 targets_file: str | Path | None = None, workers: int = 16) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._static = list(targets)
        self.targets = list(targets)
        self.targets_file = Path(targets_file) if targets_file is not None else None
        self._targets_mtime: float | None = None
        self.publisher = publisher
        self.cluster = cluster
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else min(10.0, 0.8 * self.interval_s)
        self.xids = xids or XidTracker(None)
        self.violations = ViolationTracker()
        self.fetch = fetch
        self.clock = clock
        self.workers = workers
        self.scrapes = 0
        self._seq: dict[str, int] = {}
        self._open: dict[str, tuple[str, str, str, int]] = {}  # url -> (collector, node, detail, count)
        self._reload_targets()

    # -- targets ----------------------------------------------------------------------------------------

    def _reload_targets(self) -> None:
        if self.targets_file is None:
            return
        try:
            mtime = self.targets_file.stat().st_mtime
        except OSError as exc:
            if self._targets_mtime is None:
                raise ScrapeError(f"targets file {self.targets_file}: {exc.strerror}") from None
            log.warning("targets file %s unreadable (%s): keeping the last targets", self.targets_file, exc.strerror)
            return
        if mtime == self._targets_mtime:
            return
        try:
            loaded = load_targets_file(self.targets_file)
        except (ScrapeError, OSError) as exc:
            if self._targets_mtime is None:
                raise
            log.error("targets file %s: %s; keeping the last targets", self.targets_file, exc)
            return
        self._targets_mtime = mtime
        log.info("targets file %s: %d targets", self.targets_file, len(loaded))
        self.targets = self._static + loaded

    # -- one scrape -------------------------------------------------------------------------------------

    def _get(self, target: Target) -> tuple[Target, list | None, str | None]:
        try:
            return target, parse(self.fetch(target.url, self.timeout_s)), None
        except ExpositionError as exc:
            return target, None, f"{target.url} did not serve a Prometheus exposition: {exc}"
        except urllib.error.HTTPError as exc:
            return target, None, f"{target.url} answered HTTP {exc.code} {exc.reason}"
        except Exception as exc:  # noqa: BLE001 - a target failing is data, not a crash
            reason = getattr(exc, "reason", None) or exc
            return target, None, f"cannot scrape {target.url}: {type(exc).__name__}: {reason}"

    def scrape_once(self, now: datetime | None = None, publish: bool = True) -> ScrapeReport:
        """Scrape every target once; publish (or, with ``publish=False``, only return) the events."""
        self._reload_targets()
        now = now or self.clock()
        report = ScrapeReport()
        if len(self.targets) > 1:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.workers, len(self.targets))) as pool:
                results = list(pool.map(self._get, self.targets))
        else:
            results = [self._get(t) for t in self.targets]
        per_node: dict[str, list[Envelope]] = {}
        xids: dict[str, list[Envelope]] = {}
        health: list[Envelope] = []
        answered: set[str] = set()
        for target, samples, problem in results:
            collector = f"scrape.{target.kind}"
            if problem is not None:
                report.failed_targets[target.url] = problem
                health += self._problem(target, collector, problem, now)
                continue
            health += self._recovered(target, collector, now)
            assert samples is not None
            if target.kind == "dcgm":
                reading = read_dcgm(samples, target.node, target.host)
                for ev in gpu_events(reading, now, self.cluster, self.violations):
                    per_node.setdefault(ev.source.node or target.host, []).append(ev)
                    report.gpu_samples += 1
                for (node, gpu), (value, labels) in sorted(reading.xids.items()):
                    xid = self.xids.observe(node, gpu, value, labels, now, self.cluster)
                    if xid is not None:
                        xids.setdefault(node, []).append(xid)
                        report.xids += 1
                nodes = reading.nodes or {target.node or target.host}
            else:
                nic = read_node_exporter(samples, target.node, target.host)
                for ev in nic_events(nic, now, self.cluster):
                    per_node.setdefault(ev.source.node or target.host, []).append(ev)
                    report.nic_samples += 1
                nodes = nic.nodes or {target.node or nic.nodename or target.host}
            answered |= nodes
        for node in sorted(answered):
            seq = self._seq.get(node, 0)
            self._seq[node] = seq + 1
            beat = Heartbeat(event_time=now, source=Source(cluster=self.cluster, node=node), seq=seq,
                             interval_s=self.interval_s)
            per_node.setdefault(node, []).insert(0, beat)
        report.nodes = answered
        self.scrapes += 1
        for node in sorted(per_node):
            group = per_node[node]
            report.events += group
            if publish:
                self._publish(group, NODE_SAMPLES if node in answered else None)
        for node in sorted(xids):
            report.events += xids[node]
            if publish:
                self._publish(xids[node])
        for h in health:
            report.events.append(h)
            if publish:
                self._publish([h])
        self.xids.save()
        return report

    def _publish(self, group: list[Envelope], topic_type: str | None = None) -> None:
        try:
            if topic_type is not None:
                self.publisher.publish(group, topic_type=topic_type)
            else:
                # Groups of one type and key: split a mixed group (samples of a node with no heartbeat).
                by: dict[tuple[str, bytes], list[Envelope]] = {}
                for ev in group:
                    by.setdefault((ev.event_type, message_key(ev)), []).append(ev)  # type: ignore[attr-defined]
                for events in by.values():
                    self.publisher.publish(events)
        except Exception:  # noqa: BLE001 - one bad group must not stop the scraper
            log.exception("publishing %d events failed", len(group))

    def _problem(self, target: Target, collector: str, detail: str, now: datetime) -> list[Envelope]:
        node = target.node or target.host
        if target.url in self._open:
            c, n, d, count = self._open[target.url]
            self._open[target.url] = (c, n, d, count + 1)
            return []
        self._open[target.url] = (collector, node, detail, 1)
        log.warning("%s", detail)
        return [AgentHealth(event_time=now, source=Source(cluster=self.cluster, node=node), collector=collector,
                            status="failed", problem=target.url, detail=detail[:2000])]

    def _recovered(self, target: Target, collector: str, now: datetime) -> list[Envelope]:
        if target.url not in self._open:
            return []
        c, node, detail, count = self._open.pop(target.url)
        log.info("%s answers again", target.url)
        return [AgentHealth(event_time=now, source=Source(cluster=self.cluster, node=node), collector=c,
                            status="recovered", problem=target.url,
                            detail=f"recovered after {count} failed scrape(s): {detail}"[:2000], occurrences=count)]

    # -- running ----------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, on_scrape: Callable[[ScrapeReport], None] | None = None) -> None:
        """Scrape every ``interval_s`` until ``stop`` is set, serving the publisher in between."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                report = self.scrape_once()
            except ScrapeError as exc:
                log.error("%s", exc)
                report = None
            if on_scrape is not None and report is not None:
                on_scrape(report)
            next_at += self.interval_s
            while not stop.is_set():
                left = next_at - time.monotonic()
                if left <= 0:
                    break
                self.publisher.poll(min(0.1, left))
            if time.monotonic() - next_at > self.interval_s:  # fell behind (slow targets): skip, do not burst
                next_at = time.monotonic()


def targets_from(dcgm: Iterable[str], node: Iterable[str]) -> list[Target]:
    """Targets from ``--dcgm`` and ``--node-exporter`` values."""
    return [parse_target("dcgm", s) for s in dcgm] + [parse_target("node", s) for s in node]
