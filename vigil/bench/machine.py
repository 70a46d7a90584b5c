"""What every benchmark records about the machine it ran on, and how busy it was.

A figure measured while the machine was busy is not the same figure: each
benchmark JSON carries the load average before and after its run
(:func:`measured`) next to the CPU count, the CPU's name and a speed mark
(:func:`speed_mark`) before and after: the same 2-core VM spec has landed on
hosts three times apart in speed, and one host's speed has drifted 1.8x within
an hour at a quiet load, so figures compare only through those marks.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from typing import Any, Iterator

__all__ = ["machine_info", "measured", "speed_mark"]


def _cpu_model() -> str | None:
    """The CPU's name and clock as the kernel reports them (None off Linux)."""
    try:
        lines = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    mhz = fields.get("cpu MHz")
    return f"{name} @ {float(mhz):.0f} MHz" if name and mhz else name


def speed_mark() -> float:
    """Seconds a fixed pure-Python loop takes on one core (best of 3, 0.1-0.2 s in all; lower is faster): the
    interpreter's speed on this machine now, to compare figures measured on different machines or hours."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        total, table = 0, {}
        for i in range(300_000):  # arithmetic, a dict and a call: what the detect stage does most
            table[i & 1023] = total
            total += len(str(i & 255)) * (i % 7)
        best = min(best, time.perf_counter() - began)
    return round(best, 4)


def machine_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "speed_mark_s": speed_mark(),
            "python": sys.version.split()[0], "platform": platform.platform()}


@contextlib.contextmanager
def measured(into: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Fill ``into`` with the machine and its load average before and after the ``with`` block."""
    into.update(machine_info())
    into["load_before"] = [round(x, 2) for x in os.getloadavg()]
    try:
        yield into
    finally:
        into["load_after"] = [round(x, 2) for x in os.getloadavg()]
        into["speed_mark_after_s"] = speed_mark()  # the host's speed can drift during a long run
