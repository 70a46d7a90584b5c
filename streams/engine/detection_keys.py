"""What the detection engine keeps of each job and node (:class:`_Key`), and the event ids it saw lately."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vigil.detectors import Detector
from vigil.streams.engine.steps import StepAssembler

if TYPE_CHECKING:
    from vigil.streams.engine.detection import DetectionEngine


class _Key:
    """One job or node: its detectors (made on first input), and what the engine knows of it."""

    __slots__ = ("per", "name", "owner", "cluster", "detectors", "last_arrival", "last_event", "feed", "mark",
                 "nodes", "steps", "engine", "changed_step")

    def __init__(self, per: str, name: str, cluster: str, engine: "DetectionEngine") -> None:
        self.per = per
        self.name = name
        self.owner = f"{per}:{name}"
        self.cluster = cluster
        self.detectors: dict[str, Detector] = {}
        self.last_arrival = float("-inf")
        self.last_event = float("-inf")  # the newest event time of its signs of life
        self.feed: Any = None  # where it was read from (a partition)
        self.mark = float("-inf")  # how far that feed had been read then, in the feed's own time
        self.nodes: set[str] = set()  # a job's nodes
        self.steps = StepAssembler() if per == "job" else None
        self.engine = engine
        self.changed_step: int | None = None  # the step of the last change announced (every rank may say it)

    @property
    def key(self) -> str:
        return self.name

    @property
    def arrived(self) -> float | None:
        """When the worker last heard a sign of life of this key, on its clock; None while replaying the log
        (arrivals then are not the cluster's)."""
        return None if self.engine._replaying or self.last_arrival == float("-inf") else self.last_arrival

    @property
    def raised(self) -> frozenset[str]:
        """Kinds currently raised for this key (the context a detector may consult)."""
        owner = self.owner
        reported = self.engine._reported
        return frozenset(f.kind for d in self.detectors for f in reported.get((owner, d), {}).values())


class _SeenIds:
    """Event ids seen lately: at least the last ``keep``, at most ``2 * keep`` (two generations of sets).

    Keyed by the id's 128-bit integer, which hashes in C (a ``uuid.UUID`` hashes in Python).
    """

    __slots__ = ("keep", "new", "old")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.new: set[int] = set()
        self.old: set[int] = set()

    def __contains__(self, value: int) -> bool:
        return value in self.new or value in self.old

    def add(self, value: int) -> None:
        self.new.add(value)
        if len(self.new) >= self.keep:
            self.old, self.new = self.new, set()
