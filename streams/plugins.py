"""Detector plugins: classes registered under the ``vigil.detectors`` entry point.

A plugin is a :class:`vigil.detectors.Detector` subclass that also says what it
reads and how instances are keyed::

    class PowerCap(Detector):
        name = "power_cap"
        version = "1"
        consumes = ("gpu_telemetry",)   # event types it is fed
        per = "node"                    # one instance per node (or "job")

        def update(self, event, *, t): ...   # a schemas event, t = its time
        @property
        def finding(self): ...               # a vigil.detectors.Finding or None

and is published by its package's metadata::

    [project.entry-points."vigil.detectors"]
    power_cap = "my_package:PowerCap"

The detection worker loads every plugin at start, feeds it the events it
consumes, ticks it with the timers, and turns its findings into incidents
like any built-in detector's.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from vigil.detectors import REGISTRY, Detector, DetectorError
from vigil.schemas import EVENT_TYPES

log = logging.getLogger(__name__)

GROUP = "vigil.detectors"


class PluginError(DetectorError):
    """A plugin does not follow the contract; the message says which part."""


def check_plugin(cls: object, origin: str) -> type[Detector]:
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise PluginError(f"{origin}: {cls!r} is not a vigil.detectors.Detector subclass")
    if not cls.name:
        raise PluginError(f"{origin}: {cls.__qualname__} has no name")
    consumes = getattr(cls, "consumes", None)
    if not consumes or any(t not in EVENT_TYPES for t in consumes):
        raise PluginError(f"{origin}: {cls.__qualname__}.consumes must name event types among {sorted(EVENT_TYPES)}, "
                          f"got {consumes!r}")
    if getattr(cls, "per", None) not in ("job", "node"):
        raise PluginError(f"{origin}: {cls.__qualname__}.per must be 'job' or 'node'")
    return cls


def load_plugins() -> dict[str, type[Detector]]:
    """Every installed plugin, registered in :data:`vigil.detectors.REGISTRY` too.

    A plugin that fails to import or breaks the contract is reported and
    skipped: one bad package must not stop detection.
    """
    found: dict[str, type[Detector]] = {}
    for ep in entry_points(group=GROUP):
        origin = f"entry point {ep.name} = {ep.value}"
        try:
            cls = check_plugin(ep.load(), origin)
        except Exception as exc:  # import errors of a third-party package, or PluginError
            log.error("skipping detector plugin: %s", exc)
            continue
        existing = REGISTRY.get(cls.name)
        if existing is not None and existing is not cls:
            log.error("skipping detector plugin %s: the name %r is taken by %s", origin, cls.name,
                      existing.__qualname__)
            continue
        REGISTRY[cls.name] = cls
        found[cls.name] = cls
        log.info("loaded detector plugin %s (%s)", cls.name, origin)
    return found
