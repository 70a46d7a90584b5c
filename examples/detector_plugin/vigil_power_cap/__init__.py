"""Example detector plugin: a GPU that keeps drawing more than its power cap.

Installed next to vigil (``pip install ./examples/detector_plugin``), it is
found through the ``vigil.detectors`` entry point and fed every GPU
telemetry sample of its node.
"""

from __future__ import annotations

from typing import Any

from vigil.detectors import Detector, Finding
from vigil.schemas import GpuTelemetry


class PowerCap(Detector):
    """Fires when one GPU of the node draws more than ``cap_w`` for ``samples`` samples in a row.

    Examples
    --------
    >>> from vigil.schemas import GpuTelemetry, Source, from_seconds
    >>> det = PowerCap(cap_w=700, samples=2)
    >>> for t, w in enumerate([650, 720, 730]):
    ...     det.update(GpuTelemetry(event_time=from_seconds(t), source=Source(node="n1", gpu=3), power_w=w), t=t)
    >>> det.finding.kind, det.finding.evidence["gpu"], det.finding.onset
    ('power_over_cap', 3, 1.0)
    """

    name = "power_cap"
    version = "1"
    consumes = ("gpu_telemetry",)
    per = "node"

    def __init__(self, cap_w: float = 700.0, samples: int = 3) -> None:
        if not cap_w > 0 or samples < 1:
            raise ValueError("cap_w must be > 0 and samples >= 1")
        self.cap_w = float(cap_w)
        self.samples = samples
        self._reset()

    def _reset(self) -> None:
        self._over: dict[int, list[float]] = {}

    def update(self, event: GpuTelemetry, *, t: float) -> None:
        if event.power_w is None or event.source.gpu is None:
            return
        over = self._over.setdefault(event.source.gpu, [])
        if event.power_w > self.cap_w:
            over.append(float(t))
        else:
            over.clear()

    @property
    def finding(self) -> Finding | None:
        for gpu, times in sorted(self._over.items()):
            if len(times) >= self.samples:
                return Finding("power_over_cap", 3, times[0], times[-1],
                               {"gpu": gpu, "cap_w": self.cap_w, "samples_over": len(times)})
        return None

    @classmethod
    def _conformance_feed(cls, seed: int) -> list[tuple[str, tuple, dict[str, Any]]]:
        from vigil.schemas import Source, from_seconds

        return [("update", (GpuTelemetry(event_time=from_seconds(t), source=Source(node="n", gpu=0),
                                         power_w=500.0),), {"t": float(t)}) for t in range(20)]
