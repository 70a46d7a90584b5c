"""The ``vigil`` command line: one Typer app, its commands in the modules of this package.

:mod:`~vigil.cli.common` holds the apps and what every command shares;
:mod:`~vigil.cli.stack` the stack's commands, :mod:`~vigil.cli.bench` the
benchmarks, :mod:`~vigil.cli.agent` the node agent and
:mod:`~vigil.cli.actuate` the actuator.
"""

from __future__ import annotations

import sys

from vigil.cli import stack, agent, actuate, bench  # noqa: F401,I001  (each registers its commands, in this order)
from vigil.cli import scrape  # noqa: F401,E402  (vigil scrape)
from vigil.cli import notify  # noqa: F401,E402  (vigil notify)
from vigil.cli import sim  # noqa: F401,E402  (vigil sim)
from vigil.cli import analyze  # noqa: F401,E402  (vigil analyze: profiler traces, offline)
from vigil.cli import node  # noqa: F401,E402  (vigil node: an operator's word on a node)
from vigil.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    _private_output()
    app()


def _private_output() -> None:
    """Files this process creates are its user's alone (0600/0700: the state directory holds keys,
    tokens and the history), and nothing it prints or logs shows a secret of the settings."""
    import os

    from vigil.secrets import Redactor, dsn_secrets, redact_process_output

    os.umask(0o077)
    redact = Redactor(dsn_secrets(os.environ.get("VIGIL_CLICKHOUSE_DSN")))
    redact.add([os.environ.get("VIGIL_KAFKA_SASL_PASSWORD")])
    raw_keys = os.environ.get("VIGIL_DECISION_KEYS")
    if raw_keys:  # (even when it does not parse: the settings' error would quote it)
        redact.add([raw_keys])
        try:
            import json

            redact.add(str(v) for v in json.loads(raw_keys).values())
        except (ValueError, AttributeError):
            pass
    try:
        from vigil.settings import Settings

        redact.add(Settings().secrets())
    except Exception:  # noqa: BLE001 - a bad setting is reported by the command itself; the env's values are masked
        pass
    redact_process_output(redact)


if __name__ == "__main__":
    sys.exit(main())
