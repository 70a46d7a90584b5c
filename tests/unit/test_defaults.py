"""Each default has one home: settings, CLI options and the other users read it from its owner.

Where a user cannot import the owner cheaply (a CLI option of ``vigil notify`` or ``vigil scrape``,
whose owners would slow every ``vigil`` command down), the number is restated and held equal here.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from vigil.actuators.backends import KubernetesBackend, SlurmBackend
from vigil.actuators.backends.base import COMMAND_TIMEOUT_S, CommandBackend
from vigil.actuators.executor import MAX_DECISION_AGE_S, Executor
from vigil.actuators.inventory import Inventory
from vigil.actuators.safety import SafetyLimits
from vigil.detectors import HangDetector
from vigil.detectors.hang import DEFAULT_K
from vigil.settings import Settings, default_of
from vigil.streams.config import HEARTBEAT_INTERVAL_S, SESSION_TIMEOUT_S, StreamConfig

ROOT = Path(__file__).resolve().parents[2]


def _option(command, name: str):
    """The default of a typer option of ``command``."""
    return inspect.signature(command).parameters[name].default.default


def test_settings_stream_defaults_are_stream_configs():
    s = Settings()
    for name in ("group_id", "session_timeout_s", "heartbeat_interval_s", "fetch_max_wait_ms", "tick_interval_s",
                 "recovery_window_s", "decide", "replan"):
        assert getattr(s, name) == default_of(StreamConfig, name), name


def test_unset_detector_and_ladder_settings_leave_the_components_defaults():
    s = Settings()
    assert s.detector_params() == {} and s.escalation_params() == {}
    assert s.stream_config("localhost:9092").escalation == {}
    assert Settings(hang_k=4.0).detector_params() == {"hang": {"k": 4.0}}
    assert HangDetector().k == DEFAULT_K == default_of(HangDetector, "k")


def test_every_consumer_group_has_the_stream_configs_timings():
    from vigil.services.actuator import ActuatorService, AgentActuator
    from vigil.services.agent import NodeAgent
    from vigil.streams.notify.service import NotifyService

    assert (default_of(StreamConfig, "session_timeout_s"), default_of(StreamConfig, "heartbeat_interval_s")) == \
        (SESSION_TIMEOUT_S, HEARTBEAT_INTERVAL_S)
    for owner in (ActuatorService, AgentActuator, NodeAgent, NotifyService):
        assert default_of(owner, "session_timeout_s") == SESSION_TIMEOUT_S, owner
        assert default_of(owner, "heartbeat_interval_s") == HEARTBEAT_INTERVAL_S, owner


def test_the_decision_age_limit_has_one_home():
    from vigil.cli.actuate import actuate
    from vigil.services.actuator import AgentActuator

    assert default_of(Executor, "max_age_s") == MAX_DECISION_AGE_S
    assert default_of(AgentActuator, "max_age_s") == MAX_DECISION_AGE_S
    assert _option(actuate, "max_decision_age") == MAX_DECISION_AGE_S


@pytest.mark.parametrize("option,owner,name", [
    ("max_drained_nodes", SafetyLimits, "max_drained_nodes"),
    ("max_drained_fraction", SafetyLimits, "max_drained_fraction"),
    ("drain_window", SafetyLimits, "drain_window_s"),
    ("max_restarts_without_progress", SafetyLimits, "max_restarts_without_progress"),
    ("rate_limit", SafetyLimits, "rate_limit"),
    ("rate_window", SafetyLimits, "rate_window_s"),
    ("inventory_refresh", Inventory, "refresh_s"),
    ("command_timeout", CommandBackend, "timeout_s"),
])
def test_vigil_actuate_options_default_to_their_owners(option, owner, name):
    from vigil.cli.actuate import actuate

    assert _option(actuate, option) == default_of(owner, name)


def test_the_scheduler_backends_share_one_command_timeout():
    for backend in (CommandBackend, SlurmBackend, KubernetesBackend):
        assert default_of(backend, "timeout_s") == COMMAND_TIMEOUT_S, backend


def test_notify_and_scrape_options_equal_their_owners():
    from vigil.cli.notify import notify
    from vigil.cli.scrape import scrape
    from vigil.producers.exporters.scraper import Scraper
    from vigil.streams.notify import AlertmanagerReceiver, Notifier

    assert _option(notify, "retry_for") == default_of(Notifier, "retry_for_s")
    assert _option(notify, "am_refresh") == default_of(AlertmanagerReceiver, "refresh_s")
    assert _option(scrape, "interval") == default_of(Scraper, "interval_s")


def test_the_benchmarks_hang_k_is_the_detectors():
    from vigil.bench import pipeline, scenarios

    assert scenarios.K == pipeline.HANG_K == DEFAULT_K


def test_gpus_per_node_is_defined_once():
    defined = []
    for folder in ("vigil", "schemas", "detectors", "producers", "streams", "actuators", "sim"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                if any(isinstance(t, ast.Name) and t.id == "GPUS_PER_NODE" for t in targets):
                    defined.append(str(path.relative_to(ROOT)))
    assert defined == ["schemas/events/lifecycle.py"]


def test_default_of_reads_dataclass_fields_and_signatures():
    assert default_of(SafetyLimits, "rate_limit") == 6
    assert default_of(Executor, "dry_run") is False
    with pytest.raises(KeyError):
        default_of(Executor, "backend")
