"""What every benchmark records about the machine it ran on, and how busy it was.

A figure measured while the machine was busy is not the same figure: each
benchmark JSON carries the load average before and after its run
(:func:`measured`) next to the CPU count and the Python version.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from typing import Any, Iterator

__all__ = ["machine_info", "measured"]


def machine_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}


@contextlib.contextmanager
def measured(into: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Fill ``into`` with the machine and its load average before and after the ``with`` block."""
    into.update(machine_info())
    into["load_before"] = [round(x, 2) for x in os.getloadavg()]
    try:
        yield into
    finally:
        into["load_after"] = [round(x, 2) for x in os.getloadavg()]
