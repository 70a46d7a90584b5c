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
from vigil.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
