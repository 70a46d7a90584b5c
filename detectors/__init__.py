"""Pure online detectors: no Kafka, no faust, time is always an argument.

Every public detector is registered by name in :data:`REGISTRY` so that a
stream app's configuration can name it. Outside plugins register through the
``vigil.detectors`` entry point (loaded by the stream apps, not here, so that
importing ``detectors`` stays free of side effects).
"""

from vigil.detectors.base import REGISTRY, Detector, DetectorError, Finding, register
from vigil.detectors import hang, heartbeat  # noqa: F401  (registration)
from vigil.detectors import bocd, verification, baselines, xid, nic, gpu, straggler, period  # noqa: F401
from vigil.detectors import flight_recorder  # noqa: F401  (registration)

from vigil.detectors.hang import HangDetector
from vigil.detectors.heartbeat import HeartbeatLoss

from vigil.detectors.verification import detect_changepoints

__all__ = ["REGISTRY", "Detector", "DetectorError", "Finding", "register", "HangDetector", "HeartbeatLoss",
           "detect_changepoints"]
