"""A faust App tuned for sub-second alerts on Kafka and on the tansu test broker.

faust's aiokafka driver hard-codes ``fetch_max_wait_ms=1500``, so a quiet
partition holds every fetch for 1.5 s: an alert path needs far less. Rather
than patch faust, the app installs a transport whose consumer thread sets the
fetch wait from configuration.
"""

from __future__ import annotations

import logging
import ssl
import tempfile
from typing import Any

import faust
from faust.auth import SASLCredentials, SSLCredentials
from faust.transport.drivers import aiokafka as faust_aiokafka

from vigil.streams.config import StreamConfig

log = logging.getLogger(__name__)


class _LowLatencyConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when its fetcher starts, after construction.
        consumer._fetch_max_wait_ms = self.app.fetch_max_wait_ms  # type: ignore[attr-defined]
        return consumer


class _LowLatencyConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _LowLatencyConsumerThread:
        return _LowLatencyConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _LowLatencyTransport(faust_aiokafka.Transport):
    Consumer = _LowLatencyConsumer


class VigilApp(faust.App):
    """faust.App with a configurable fetch wait (``fetch_max_wait_ms``)."""

    fetch_max_wait_ms: int = 20

    def _new_transport(self) -> Any:
        return _LowLatencyTransport(self.conf.broker_consumer, self)


#: librdkafka keys this faust transport (aiokafka) understands; others cannot be honoured.
_UNDERSTOOD = {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location"}


def _credentials(config: StreamConfig) -> Any:
    sec = config.kafka_security
    ignored = sorted(set(sec) - _UNDERSTOOD)
    if ignored:
        log.warning("the faust workers' Kafka client (aiokafka) cannot use %s; the other vigil "
                    "clients (librdkafka) do", ", ".join(ignored))
    protocol = sec.get("security.protocol", "PLAINTEXT").upper()
    ctx = None
    if protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=sec.get("ssl.ca.location"))
    if protocol.startswith("SASL"):
        return SASLCredentials(username=sec.get("sasl.username"), password=sec.get("sasl.password"),
                               mechanism=sec.get("sasl.mechanism", "PLAIN"), ssl_context=ctx)
    if ctx is not None:
        return SSLCredentials(ctx)
    return None


def create_app(config: StreamConfig, app_id: str | None = None, **overrides: Any) -> VigilApp:
    # faust's default datadir is "<app id>-data" in the working directory: one
    # stray directory per group id wherever a worker runs, though no table is on disk.
    scratch = None
    if config.data_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="vigil-faust-")
    settings: dict[str, Any] = dict(
        datadir=config.data_dir or scratch.name,
        broker=[f"kafka://{host}" for host in config.bootstrap.split(",")],
        broker_credentials=_credentials(config),
        # tansu (like Kafka) joins a group in about half the session timeout.
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=config.heartbeat_interval_s,
        broker_request_timeout=max(40.0, config.session_timeout_s + 5),
        consumer_auto_offset_reset="earliest",
        # Commit often: a worker that takes over re-reads less.
        broker_commit_interval=1.0,
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        producer_linger_ms=0,
        stream_wait_empty=False,
    )
    settings.update(overrides)
    app = VigilApp(app_id or config.group_id, **settings)
    app.fetch_max_wait_ms = config.fetch_max_wait_ms
    app.scratch_dir = scratch  # type: ignore[attr-defined]  # removed with the app
    return app
