"""Pure online detectors: no Kafka, no clock, time is always an argument.

Every detector the engine runs is registered by name in :data:`REGISTRY` so
that a stream app's configuration can name it; the benchmark's baselines
(:mod:`~vigil.detectors.baselines`) register when imported. Outside plugins
register through the ``vigil.detectors`` entry point (loaded by the stream
apps, not here, so that importing ``detectors`` stays free of side effects).
"""

from vigil.detectors.base import REGISTRY, Detector, DetectorError, Finding, register
from vigil.detectors import hang, heartbeat  # noqa: F401  (registration)
from vigil.detectors import bocd, verification, xid, nic, gpu, straggler, period  # noqa: F401
from vigil.detectors import failslow, failures, health, flight_recorder  # noqa: F401

from vigil.detectors.hang import HangDetector
from vigil.detectors.heartbeat import HeartbeatLoss

from vigil.detectors.verification import detect_changepoints

__all__ = ["REGISTRY", "Detector", "DetectorError", "Finding", "register", "HangDetector", "HeartbeatLoss",
           "detect_changepoints"]
