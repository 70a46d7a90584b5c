"""The contract every detector follows, and the registry that finds them by name.

A detector is a small stateful object (river's ``drift`` detectors are the
model): constructor arguments stored under the same names and validated with a
``ValueError``; changing state in private attributes rebuilt by ``_reset()``;
``update(...)`` takes an explicit timestamp ``t`` (seconds, float) and returns
nothing; timers are a separate ``tick(now)``; read-only properties say what
was found. Detectors never read the clock and never do I/O, so a replay or a
test runs them on simulated time.

Snapshots are plain picklable dicts so a stream app can keep detector state in
a table or a file and rebuild the detector after a restart.

How the stream engine drives a detector is declared on its class, the same
for built-ins and plugins: ``consumes`` (event types of :mod:`vigil.schemas`,
or derived inputs of :mod:`vigil.detectors.inputs`), ``per`` (one instance
per ``"job"`` or per ``"node"``), and ``observe`` (how an input becomes an
``update`` call). ``silence`` marks detectors that fire on a timer when
their subject goes quiet, ``transient`` those whose findings are single
events (raised once, never cleared).
"""

from __future__ import annotations

import copy
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Protocol

from vigil.schemas import Slowdown


class DetectorError(ValueError):
    """Root of the errors raised by detectors (bad parameters, bad input)."""


@dataclass(frozen=True)
class Finding:
    """What a detector reports when it fires.

    ``onset`` is when the condition began (for a change point, the first
    sample of the new regime; for a hang, the last sign of life), which is
    earlier than ``detected_at``, the time the detector could tell.
    """

    kind: str
    severity: int
    onset: float
    detected_at: float
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Narrows the subject beyond the detector's key (e.g. ``{"rank": 3, "node": "n1"}``); None: the key alone.
    subject: dict[str, Any] | None = None
    #: For a slowdown: its size, class and place (what the correlator and the decisions read).
    slowdown: Slowdown | None = None


class KeyContext(Protocol):
    """What the engine tells a detector about its key besides the detector's own input."""

    key: str
    per: str

    @property
    def raised(self) -> frozenset[str]:
        """Kinds of the findings currently raised for this key, by any of its detectors."""

    @property
    def arrived(self) -> float | None:
        """When the engine last heard a sign of life of this key, on its clock (None: not known)."""


class Detector:
    """Base class: snapshot/restore, reset, and the conformance hooks.

    Subclasses set ``name`` and ``version``, implement ``_reset()``,
    ``update(...)`` and, when they time out on silence, ``tick(now)``.
    They expose ``finding`` (a :class:`Finding` while the condition holds,
    else ``None``).
    """

    #: Name under which the class is registered.
    name: ClassVar[str] = ""
    #: Bumped when the algorithm's behaviour changes, carried on every alert.
    version: ClassVar[str] = "1"
    #: Inputs the engine feeds it: event types (``"heartbeat"``) or derived inputs (``"progress"``).
    consumes: ClassVar[tuple[str, ...]] = ()
    #: One instance per ``"job"`` or per ``"node"`` (the engine's keys).
    per: ClassVar[str | None] = None
    #: Fires from ``tick`` when its subject goes quiet: ticked every engine tick, but only once
    #: nothing has arrived from the subject for ``timeout_s`` (a late feed is not silence).
    silence: ClassVar[bool] = False
    #: Findings are single events (an exit, an exception): raised once, never cleared.
    transient: ClassVar[bool] = False
    #: ``observe_batch`` gets all of one message's inputs for a key at once (e.g. one node's GPU samples).
    batch: ClassVar[bool] = False

    @classmethod
    def for_key(cls, key: str, **params: Any) -> "Detector":
        """A new instance for one job or node; ``params`` are the operator's settings for this detector."""
        return cls(**params)

    def observe(self, item: Any, *, t: float, context: KeyContext | None = None) -> None:
        """Feed one consumed input stamped ``t``; the default hands it to ``update(item, t=t)``."""
        self.update(item, t=t)  # type: ignore[attr-defined]

    def observe_batch(self, items: list[Any], *, t: float, context: KeyContext | None = None) -> None:
        """Feed one message's inputs for this key (``batch`` detectors); ``t`` is the latest stamp."""
        for item in items:
            self.observe(item, t=t, context=context)

    def emitted(self) -> list[Any]:
        """Derived inputs produced since the last call, for the other detectors of the key."""
        return []

    def _reset(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """Advance the detector's clock; detectors that time out override it."""
        _check_time(now, "now")

    @property
    def finding(self) -> Finding | None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- persistence -------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Return a picklable copy of the whole state (parameters included)."""
        return {"name": self.name, "version": self.version, "state": copy.deepcopy(self.__dict__)}

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> "Detector":
        """Rebuild a detector from :meth:`snapshot`'s output.

        Raises :class:`DetectorError` when the snapshot was taken from another
        detector or another version of this one (its state layout may differ).
        """
        if snapshot.get("name") != cls.name or snapshot.get("version") != cls.version:
            raise DetectorError(
                f"snapshot of {snapshot.get('name')!r} v{snapshot.get('version')} "
                f"cannot restore {cls.name!r} v{cls.version}"
            )
        obj = cls.__new__(cls)
        obj.__dict__.update(copy.deepcopy(snapshot["state"]))
        return obj

    def to_bytes(self) -> bytes:
        return pickle.dumps(self.snapshot(), protocol=pickle.HIGHEST_PROTOCOL)

    # -- conformance hooks -------------------------------------------------
    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        """Constructor arguments the conformance suite uses."""
        return {}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        """A seeded sequence of calls ``(method, args, kwargs)`` on healthy input.

        The first ``_conformance_warmup()`` calls must leave the detector silent.
        """
        raise NotImplementedError

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 0


REGISTRY: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Class decorator: make ``cls`` findable by its ``name`` in :data:`REGISTRY`."""
    if not cls.name:
        raise DetectorError(f"{cls.__qualname__} has no name to register under")
    existing = REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise DetectorError(f"detector name {cls.name!r} is taken by {existing.__qualname__}")
    REGISTRY[cls.name] = cls
    return cls


def _check_time(value: float, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise DetectorError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def _check_positive_ints(**values: int) -> None:
    """Raise DetectorError unless every value is an int >= 1 (a bool is not a count)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DetectorError(f"{name} must be a positive int, got {value!r}")


def _check_positive(value: float, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise DetectorError(f"{what} must be a positive finite number, got {value!r}")
    return float(value)
