"""NIC port counters from sysfs: ``<root>/<dev>/ports/<port>/{hw_counters,counters}/*`` and ``state``.

The root is ``/sys/class/infiniband`` on a real node and configurable so
tests use a fixture tree with the same layout. Values are reported as read
(cumulative); wraps and resets are the detector's business
(:func:`vigil.detectors.nic.counter_delta`), since only it knows the previous
reading and the counter widths. A file that is missing or unreadable is
reported once as a health problem (keyed by its path) and the rest of the
port is still read; a root that does not exist makes the collector
unavailable (no RDMA devices), also reported once.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from vigil.producers.agent.base import Collector, CollectorUnavailable
from vigil.schemas import Envelope, NicCounters, Source

__all__ = ["NicCollector", "read_port", "parse_state"]

DEFAULT_ROOT = Path("/sys/class/infiniband")


def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``.

    >>> parse_state("4: ACTIVE\\n"), parse_state("1: DOWN")
    ('ACTIVE', 'DOWN')
    """
    text = text.strip()
    return text.split(":", 1)[1].strip() if ":" in text else text


def read_port(port_dir: Path, problem=lambda key, detail: None) -> tuple[dict[str, int], str | None]:
    """Counters (both directories) and the state of one port; bad files go to ``problem``."""
    counters: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        d = port_dir / sub
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            continue  # an IB port has no hw_counters, an old driver no counters: normal
        except OSError as exc:
            problem(str(d), f"cannot list {d}: {exc.strerror}")
            continue
        for name in names:
            path = d / name
            try:
                text = path.read_text().strip()
            except OSError as exc:
                problem(str(path), f"cannot read {path}: {exc.strerror}")
                continue
            try:
                value = int(text, 0)
            except ValueError:
                problem(str(path), f"{path} holds {text[:40]!r}, expected an integer counter")
                continue
            if value < 0 or value >= 2**63:
                problem(str(path), f"{path} holds {value}, outside a 64-bit signed counter")
                continue
            counters[name] = value
    state: str | None = None
    try:
        state = parse_state((port_dir / "state").read_text())
    except FileNotFoundError:
        problem(str(port_dir / "state"), f"{port_dir / 'state'} is missing")
    except OSError as exc:
        problem(str(port_dir / "state"), f"cannot read {port_dir / 'state'}: {exc.strerror}")
    return counters, state


class NicCollector(Collector):
    name = "nic"

    def __init__(self, interval_s: float, source: Source, root: str | os.PathLike = DEFAULT_ROOT) -> None:
        super().__init__(interval_s, source)
        self.root = Path(root)

    def collect(self, now: datetime) -> list[Envelope]:
        try:
            devices = sorted(os.listdir(self.root))
        except FileNotFoundError:
            raise CollectorUnavailable(f"no RDMA devices: {self.root} does not exist") from None
        except OSError as exc:
            raise CollectorUnavailable(f"cannot list {self.root}: {exc.strerror}") from None
        events: list[Envelope] = []
        for dev in devices:
            ports_dir = self.root / dev / "ports"
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
            except OSError as exc:
                self.problem(str(ports_dir), f"cannot list {ports_dir}: {exc.strerror}")
                continue
            for port in ports:
                if not port.isdigit() or int(port) < 1:
                    continue
                counters, state = read_port(ports_dir / port, self.problem)
                if not counters and state is None:
                    continue
                events.append(NicCounters(event_time=now, source=self.source, device=dev, port=int(port),
                                          counters=counters, port_state=state))
        return events
