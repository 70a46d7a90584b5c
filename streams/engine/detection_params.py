"""The detection engine's parameters (:class:`EngineParams`) and the built-in detectors it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from vigil.detectors import Detector

__all__ = ["BUILTIN", "EngineParams"]

#: The built-in detectors the engine runs, by registry name.
BUILTIN = ("heartbeat_loss", "xid", "nic_congestion", "gpu_degradation", "process_exit", "exception_classifier",
           "node_health", "iteration_period", "hang", "fail_slow", "straggler", "flight_recorder")


@dataclass(frozen=True)
class EngineParams:
    #: Constructor arguments per detector name (the operator's settings); defaults are the detectors' own.
    detectors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: How often the windows of the detectors that are not silence-driven (XID, NIC, GPU) are aged.
    window_tick_s: float = 1.0
    #: Hearing nothing at all (no data, no broker answer) for this long means the worker, not the
    #: cluster, went deaf: silences then count from when it hears again.
    deaf_after_s: float = 2.0
    #: Reading a partition's messages this long after they were written (the least late of those read
    #: from it between two ticks) the worker is behind on it: a subject's newest messages may be in the
    #: part of the log it has not read, so no silence is judged until it catches up (a late feed is
    #: not silence). The least late, so that a few producers with slow clocks do not count as a backlog.
    max_feed_lag_s: float = 1.0
    #: A subject silent past its timeout while its feed is still being read, but has not yet carried its
    #: timeout's worth of others' messages past the subject's last one, is late, not silent (its next
    #: message may be in the part of that partition not yet delivered); so are the nodes of a partition
    #: (three or more) that went quiet as a whole while the others are read (its delivery stalled). For
    #: at most this long past the timeout; then they are judged on arrival (a feed whose other writers only
    #: replay old data; a stall that long is a shared silence to report).
    late_feed_grace_s: float = 30.0
    #: Events older than this (against the worker's clock) do not start tracking a subject: a new
    #: consumer group reading an old log must not report every node that left long ago as lost.
    max_event_age_s: float = 300.0
    #: Events stamped further ahead of the worker's clock than this are refused (a node with a
    #: broken clock must not hold a subject "alive" for hours).
    max_future_s: float = 60.0
    #: Detector plugins (see :mod:`vigil.streams.plugins`), run beside the built-ins.
    plugins: tuple[type[Detector], ...] = ()
    #: The built-in detectors to run.
    builtins: tuple[str, ...] = BUILTIN
    #: Detectors of a job started afresh at a known change of its configuration (a new layout, a change
    #: its training process announced): they judge the job against its own past, and a shift the job
    #: made on purpose is no fail-slow.
    afresh_on_change: tuple[str, ...] = ("fail_slow",)
    #: Called on each detector class before the engine routes to it, returning the class to use
    #: (``Callable[[type[Detector]], type[Detector]]``): a metrics endpoint times a sample of the
    #: instances (:class:`vigil.streams.metrics.DetectorTimer`). None: the classes as they are.
    instrument: Any = None
