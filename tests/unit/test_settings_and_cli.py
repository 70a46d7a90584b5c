"""Settings from VIGIL_* variables, and `--help` on every command."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from vigil.broker import StackError, TansuBroker, find_tansu
from vigil.cli import app
from vigil.settings import Settings


def test_settings_read_the_vigil_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("VIGIL_KAFKA_BOOTSTRAP", "k1:9092,k2:9092")
    monkeypatch.setenv("VIGIL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("VIGIL_KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("VIGIL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("VIGIL_KAFKA_EXTRA", '{"client.rack": "r1"}')
    s = Settings()
    assert s.kafka_bootstrap == "k1:9092,k2:9092"
    assert s.resolved_clickhouse_dsn == f"chdb://{tmp_path}/history"
    assert "s3cret" not in repr(s)
    assert s.kafka_security() == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret", "client.rack": "r1"}
    with pytest.raises(ValidationError, match="frozen") as frozen:
        s.topic_prefix = "x"  # type: ignore[misc]
    assert [(e["type"], e["loc"]) for e in frozen.value.errors()] == [("frozen_instance", ("topic_prefix",))]
    assert s.topic_prefix == Settings().topic_prefix  # unchanged


def test_server_dsn_is_used_as_given(monkeypatch):
    monkeypatch.setenv("VIGIL_CLICKHOUSE_DSN", "http://default:@ch:8123")
    s = Settings()
    assert s.resolved_clickhouse_dsn == "http://default:@ch:8123" and s.chdb_path is None


COMMANDS = [[], ["up"], ["worker"], ["demo"], ["sql"], ["migrate"], ["schemas"], ["schemas", "export"],
            ["tail"], ["tail", "alerts"], ["bench"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "vigil")
def test_every_command_has_help(cmd):
    result = CliRunner().invoke(app, cmd + ["--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_missing_tansu_binary_says_what_to_do(tmp_path):
    with pytest.raises(StackError, match="VIGIL_TANSU_BIN"):
        find_tansu(tmp_path / "no-such-tansu")


def test_taken_port_says_what_to_do():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(StackError, match=f"port {port}.*taken"):
            TansuBroker(find_tansu(None), port=port).start()
