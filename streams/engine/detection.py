"""The detection engine: telemetry in, findings out, no Kafka.

Every detector, built-in or plugin, is driven the same way, from what its
class declares (:class:`vigil.detectors.Detector`): the inputs it
``consumes``, ``per`` what key (a job or a node: one instance each), and how
it ``observe``\\ s them. Events are routed by type to the detectors of their
key (a node's GPU samples in columns as they are to the detectors that read
columns, and as the per-GPU samples they hold, light views and not models, to
those that read only those); a job's timing events also pass its :class:`~vigil.streams.engine.steps.StepAssembler`,
which derives the ``progress`` and ``rank_timings`` inputs (and takes the
progress the collective-period detector infers, for jobs with no steps).

Each detector's current findings are diffed against what was last reported,
so the engine emits a ``raised`` finding when a condition begins and a
``cleared`` one when it ends; ``transient`` detectors' findings (an exit, an
exception) are raised once and never cleared (the correlator expires them).
Lifecycle is not failure (:meth:`DetectionEngine.on_lifecycle`): a job that
ends (completed, cancelled, failed, preempted, time limit) and a node that
leaves cleanly (its agent stopped, drained, in maintenance) take their
findings with them (all clear) and their state is dropped; what their
sources still had in flight (a last step, a last heartbeat, stamped before
the end) is ignored, and only a newer event starts them again.

Known changes are not failures either: a job's fail-slow detection judges
its step times against their own past, so at a change of configuration the
job made on purpose it starts afresh (the detectors named in
:attr:`EngineParams.afresh_on_change`, re-made, their findings cleared): a
restart (the fail-slow detector's own ``restarting`` rule), a running job
whose layout changed (:meth:`DetectionEngine.on_lifecycle`: another size,
dp/pp/tp, or a node it did not run on; re-planned or resized), and a change
its training process announced on a step (``config_change``, see
:meth:`vigil.producers.training.TrainingMonitor.note_change`). A shift with
no such event is still judged.

Timers: ``silence`` detectors (heartbeat loss, hang) are ticked every tick
but only once their subject has been quiet past their timeout *as far as
the worker can tell* (a worker that hears nothing at all is deaf, not the
cluster silent); the others age their windows once a second. A worker
reading some feed far behind judges silence in the log's own time instead:
a subject is silent when its feed carried others' messages past its last one
by more than its timeout (late, but not missed; the gaps in the worker's own
reading are not silence).

Parts: :mod:`~vigil.streams.engine.detection_params` (:class:`EngineParams`,
:data:`BUILTIN`), :mod:`~vigil.streams.engine.detection_keys` (what is kept per
job and node), :mod:`~vigil.streams.engine.detection_timers` (silence and
windows), :mod:`~vigil.streams.engine.detection_findings` (the diffing into
finding events); this module routes events and lifecycle to the detectors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from vigil.detectors import REGISTRY, Detector
from vigil.detectors.inputs import PROGRESS, RANK_TIMINGS, Progress
from vigil.schemas import (
    JOB_ENDED, NODE_AWAY, DetectorFinding, Envelope, IterationStep, IterationTiming, JobState, NodeState, to_seconds,
)
from vigil.streams.engine.detection_findings import _FindingDiff, detector_finding
from vigil.streams.engine.detection_keys import _Key, _SeenIds
from vigil.streams.engine.detection_params import BUILTIN, EngineParams
from vigil.streams.engine.detection_timers import _Timers
from vigil.streams.engine.layouts import JobLayouts

__all__ = ["BUILTIN", "DetectionEngine", "EngineParams", "detector_finding"]

#: Events that drive a job's steps (and say the job's stream is alive).
_STEP_EVENTS = ("iteration", "iteration_step", "collective")
#: Events that say a job's stream is alive.
_JOB_LIVENESS = (*_STEP_EVENTS, "checkpoint")
#: A node's GPU samples in columns go to the detectors that read them so (``consumes`` names both
#: types), and as the per-GPU samples they hold (:meth:`GpuSamples.rows`, routed as ``_GPU_ROWS``) to those
#: that read only ``gpu_telemetry`` (a plugin written before the columns).
_GPU_SAMPLES, _GPU_TELEMETRY, _GPU_ROWS = "gpu_samples", "gpu_telemetry", "gpu_samples:rows"
#: A detector class that does not override it derives nothing (not asked after every event it observes).
_NOTHING_EMITTED = Detector.emitted


class DetectionEngine(_Timers, _FindingDiff):
    """All detectors of the jobs and nodes this worker owns."""

    def __init__(self, params: EngineParams = EngineParams()) -> None:
        self.params = params
        classes = [REGISTRY[name] for name in params.builtins] + list(params.plugins)
        if params.instrument is not None:
            classes = [params.instrument(cls) for cls in classes]
        #: (per, input) -> detector classes consuming it
        self._routes: dict[tuple[str, str], list[type[Detector]]] = {}
        for cls in classes:
            for item in cls.consumes:
                self._routes.setdefault((cls.per, item), []).append(cls)  # type: ignore[arg-type]
            if _GPU_TELEMETRY in cls.consumes and _GPU_SAMPLES not in cls.consumes:
                # a node's GPU samples in columns reach it as the per-GPU samples they hold (GpuRow views)
                self._routes.setdefault((cls.per, _GPU_ROWS), []).append(cls)  # type: ignore[arg-type]
        #: event type -> the keys it is routed by ("job", "node")
        self._pers: dict[str, tuple[str, ...]] = {}
        for (per, item) in self._routes:
            self._pers[item] = tuple(sorted({*self._pers.get(item, ()), per}))
        for item in _JOB_LIVENESS:
            self._pers[item] = tuple(sorted({*self._pers.get(item, ()), "job"}))
        #: event types whose arrival says a node's stream is alive (those its silence detectors consume)
        self._node_liveness = {i for (per, i), cs in self._routes.items() if per == "node" and any(c.silence for c in cs)}
        #: (per, event type) -> how an event is routed (:meth:`_plan`), made on first use
        self._plans: dict[tuple[str, str], tuple[bool, int, tuple[type[Detector], ...]]] = {}
        #: (per, event type) -> whether routing such an event only appends it to its detectors' batches
        self._batch_only: dict[tuple[str, str], bool] = {}
        self.jobs: dict[str, _Key] = {}
        self.nodes: dict[str, _Key] = {}
        #: (per, name) -> when it ended or left: what its source stamped before is past
        self._ended: dict[tuple[str, str], float] = {}
        #: each job's layout as its states told it (a new one starts ``afresh_on_change`` detectors afresh)
        self._layouts = JobLayouts()
        self._replaying = False
        # (owner, detector name) -> {finding key: DetectorFinding} currently raised
        self._reported: dict[tuple[str, str], dict[str, DetectorFinding]] = {}
        self._seen_ids = _SeenIds(200_000)
        #: the detectors a tick drives, registered when made: silence detectors of nodes and of jobs
        #: (checked every tick, in that order), and those that age windows (each once per window_tick_s)
        self._silence: tuple[dict[tuple[str, str], tuple[_Key, Detector]], ...] = ({}, {})
        self._windows: dict[tuple[str, str, str], tuple[_Key, Detector]] = {}
        self._window_cycle: list[tuple[str, str, str]] = []
        self._window_credit = 0.0
        self._windows_ticked_at: float | None = None
        #: the events the last on_events call skipped for being stamped in the future (the caller dead-letters them)
        self.refused_future: list[Envelope] = []
        # The feed's own pulse: when the worker last heard anything, and when it heard again after
        # hearing nothing for deaf_after_s (its broker or link was down, or it was rebalancing).
        self._last_heard = float("-inf")
        self._feed_back_at = float("-inf")
        #: feed (a partition) -> the least delay from write to read of its messages since the last tick
        self._feed_window: dict[Any, float] = {}
        #: feed -> (the tick that saw it last, that least delay)
        self._feeds: dict[Any, tuple[float, float]] = {}
        #: feed -> the newest event time read from it (how far the log has been read, in its own time)
        self._marks: dict[Any, float] = {}
        #: feed -> when the worker last read a message from it
        self._feed_heard: dict[Any, float] = {}
        self._feed: Any = None  # the feed of the message being routed

    # -- inputs ------------------------------------------------------------
    def future(self, event: Envelope, now: float) -> bool:
        """Is the event stamped implausibly far ahead of ``now``? (The caller dead-letters it.)"""
        return to_seconds(event.event_time) > now + self.params.max_future_s

    def on_events(self, events: Iterable[Envelope], now: float, replay: bool = False, written: float | None = None,
                  feed: Any = None) -> list[DetectorFinding]:
        """Feed one message's events; return the findings they raise or clear.

        Duplicated event ids and events from the future are skipped here (the
        latter are listed in :attr:`refused_future` until the next call).
        ``replay``: read again from the log to rebuild state (a takeover): how
        late they arrive now says nothing about the delivery delay.
        ``written`` and ``feed``: when the message was written to the log and
        where it was read from (a partition); a worker that reads a feed far
        behind judges no silence until it caught up (``max_feed_lag_s``).
        """
        self._replaying = replay
        events = events if isinstance(events, list) else list(events)
        self.refused_future = []
        if feed is not None and not replay:
            self._feed_heard[feed] = now
        if written is not None and not replay:
            lag = now - written
            least = self._feed_window.get(feed)
            if least is None or lag < least:
                self._feed_window[feed] = lag
        if not events:
            return []
        self.heard(now)
        out: list[DetectorFinding] = []
        batches: dict[tuple[str, str, str], list[Any]] = {}
        seen = self._seen_ids
        keep = seen.keep
        pers_of = self._pers
        limit = now + self.params.max_future_s
        self._feed = feed
        mark = self._marks.get(feed, float("-inf")) if feed is not None else None
        stamp, at = None, 0.0
        route = self._route
        batch_only = self._batch_only
        # (event type, per, name, its batches) of the last event routed only to batches: the next one of the
        # same type and subject (a node's GPU samples) joins them without being routed again, as routing it
        # would do (its key and detectors exist now, and neither its time nor its staleness changes that)
        joins: tuple[str, str, str, list[list[Any]]] | None = None
        for event in events:
            ident = event.event_id.int
            if ident in seen.new or ident in seen.old:  # _SeenIds inlined: every record passes here
                continue
            if event.event_time != stamp:  # a node's samples share one time: converted once
                stamp = event.event_time
                at = stamp.timestamp()
            if at > limit:
                self.refused_future.append(event)
                continue
            fresh = seen.new
            fresh.add(ident)
            if len(fresh) >= keep:
                seen.old, seen.new = fresh, set()
            if mark is not None and at > mark:
                mark = self._marks[feed] = at
            etype: str = event.event_type  # type: ignore[attr-defined]
            if etype == _GPU_SAMPLES and _GPU_ROWS in pers_of:  # and each GPU's values to who reads only those
                todo: Any = ((etype, event), *((_GPU_ROWS, row) for row in event.rows()))  # type: ignore[attr-defined]
            else:
                todo = ((etype, event),)
            for etype, item in todo:
                pers = pers_of.get(etype)
                if not pers:
                    continue
                source = item.source
                if joins is not None and etype == joins[0] and \
                        (source.job if joins[1] == "job" else source.node) == joins[2]:
                    for batch in joins[3]:
                        batch[0].append(item)
                        if at > batch[1]:
                            batch[1] = at
                    continue
                joins = None
                for per in pers:
                    name = source.job if per == "job" else source.node
                    if name is None:
                        continue
                    found = route(per, name, etype, item, at, now, batches)
                    if found:
                        out += found
                    if len(pers) == 1 and batch_only.get((per, etype)):
                        joined = [batches.get((per, name, cls.name)) for cls in self._plans[(per, etype)][2]]
                        if None not in joined:  # each class took it (none skipped it as stale)
                            joins = (etype, per, name, joined)  # type: ignore[assignment]
        for (per, name, det_name), (items, t) in batches.items():
            key = self._keys(per)[name]
            det = key.detectors[det_name]
            det.observe_batch(items, t=t, context=key)
            out += self._diff(key, det, now)
        return out

    def _keys(self, per: str) -> dict[str, _Key]:
        return self.jobs if per == "job" else self.nodes

    def _plan(self, per: str, etype: str) -> tuple[bool, int, tuple[type[Detector], ...]]:
        """How an event type is routed for a job or node key: whether it is a sign of life (an ended
        subject's in-flight past is then ignored), which liveness it keeps (1: a job's, 2: a node's, 0:
        none) and the detector classes consuming it."""
        plan = self._plans[(per, etype)] = (
            etype in _JOB_LIVENESS or etype in self._node_liveness,
            1 if per == "job" and etype in _JOB_LIVENESS else 2 if per == "node" and etype in self._node_liveness else 0,
            tuple(self._routes.get((per, etype), ())))
        # no sign of life, no liveness, every class batched: routing it only appends it to its batches
        self._batch_only[(per, etype)] = not plan[0] and plan[1] == 0 and bool(plan[2]) and all(c.batch for c in plan[2])
        return plan

    def _route(self, per: str, name: str, etype: str, event: Envelope, at: float, now: float,
               batches: dict[tuple[str, str, str], list[Any]]) -> list[DetectorFinding]:
        keys = self.jobs if per == "job" else self.nodes
        key = keys.get(name)
        sign_of_life, liveness, classes = self._plans.get((per, etype)) or self._plan(per, etype)
        if sign_of_life and self._ended:
            ended = self._ended.get((per, name))
            if ended is not None:
                if at <= ended:
                    return []  # a sign of life in flight when it ended: the past, not a new start
                del self._ended[(per, name)]  # a new start (a requeued job, a restarted agent)
        stale = now - at > self.params.max_event_age_s
        out: list[DetectorFinding] = []
        if liveness == 1:
            if key is None and stale and etype != "collective":
                return out  # an old log's job: not tracked
            key = key or self._new_key(per, name, event.source.cluster)
            key.last_arrival = now
            if at > key.last_event:
                key.last_event, key.feed = at, self._feed
                key.mark = self._marks.get(self._feed, at)
            if isinstance(event, IterationStep):
                key.nodes.update(event.nodes)
            elif event.source.node:
                key.nodes.add(event.source.node)
            if isinstance(event, IterationTiming):
                if event.config_change is not None:
                    out += self._announced(key, event.step, now)
                out += self._derived(key, key.steps.on_iteration(event), now)  # type: ignore[union-attr]
            elif isinstance(event, IterationStep):
                if event.config_change is not None:
                    out += self._announced(key, event.step, now)
                out += self._derived(key, key.steps.on_step(event), now)  # type: ignore[union-attr]
        elif liveness == 2:
            if key is None and stale:
                return out  # an old log's node: not tracked
            key = key or self._new_key(per, name, event.source.cluster)
            key.last_arrival = now
            if at > key.last_event:
                key.last_event, key.feed = at, self._feed
                key.mark = self._marks.get(self._feed, at)
        for cls in classes:
            key = key or self._new_key(per, name, event.source.cluster)
            det = key.detectors.get(cls.name)
            if det is None:
                if cls.silence and stale:
                    continue
                det = self._make(key, cls)
            if cls.batch:
                slot = (per, name, cls.name)
                batch = batches.get(slot)
                if batch is None:
                    batches[slot] = [[event], at]
                else:
                    batch[0].append(event)
                    if at > batch[1]:
                        batch[1] = at
                continue
            det.observe(event, t=at, context=key)
            out += self._diff(key, det, now)
            if cls.emitted is _NOTHING_EMITTED:
                continue
            emitted = det.emitted()
            if emitted and key.steps is not None:  # progress inferred from the collective period
                for item in emitted:
                    out += self._derived(key, key.steps.on_inferred(item), now)
        return out

    def _derived(self, key: _Key, items: list[Any], now: float) -> list[DetectorFinding]:
        """Feed derived inputs (progress, rank timings) to the key's consumers of them, in order."""
        out: list[DetectorFinding] = []
        for item in items:
            if isinstance(item, Progress) and not self._replaying:
                item = dataclasses.replace(item, arrived=now)
            kind = PROGRESS if isinstance(item, Progress) else RANK_TIMINGS
            for cls in self._routes.get((key.per, kind), ()):
                det = key.detectors.get(cls.name)
                if det is None:
                    det = self._make(key, cls)
                det.observe(item, t=item.end, context=key)
                out += self._diff(key, det, now)
        return out

    def _announced(self, key: _Key, step: int, now: float) -> list[DetectorFinding]:
        """The job's training process announced a change of configuration at ``step``: once per step."""
        if key.changed_step == step:
            return []
        key.changed_step = step
        return self._afresh(key, now)

    def _afresh(self, key: _Key, now: float) -> list[DetectorFinding]:
        """Re-make the key's detectors named in ``afresh_on_change``; what they had raised clears."""
        out: list[DetectorFinding] = []
        for name in self.params.afresh_on_change:
            old = key.detectors.get(name)
            if old is not None:
                out += self._diff(key, self._make(key, type(old)), now)
        return out

    def _new_key(self, per: str, name: str, cluster: str) -> _Key:
        key = self._keys(per)[name] = _Key(per, name, cluster, self)
        return key

    def _make(self, key: _Key, cls: type[Detector]) -> Detector:
        """The key's instance of ``cls``, registered with the timers that drive it."""
        det = key.detectors[cls.name] = cls.for_key(key.name, **self.params.detectors.get(cls.name, {}))
        if cls.silence:
            self._silence[0 if key.per == "node" else 1][(key.name, cls.name)] = (key, det)
        elif cls.tick is not Detector.tick:
            self._windows[(key.per, key.name, cls.name)] = (key, det)
        return det

    def _drop_key(self, per: str, name: str) -> _Key | None:
        """Forget a job or node and unregister its detectors from the timers."""
        key = self._keys(per).pop(name, None)
        if key is not None:
            silence = self._silence[0 if per == "node" else 1]
            for det_name in key.detectors:
                silence.pop((name, det_name), None)
                self._windows.pop((per, name, det_name), None)
        return key

    def detector(self, per: str, name: str, detector: str) -> Detector | None:
        """The instance of ``detector`` for job or node ``name``, if it exists."""
        key = self._keys(per).get(name)
        return key.detectors.get(detector) if key is not None else None

    # -- lifecycle ---------------------------------------------------------
    def on_lifecycle(self, event: JobState | NodeState, now: float) -> list[DetectorFinding]:
        """A job's or a node's state: an end or a clean leave clears and drops it; a restart warms up again;
        a new layout of a job starts its ``afresh_on_change`` detectors afresh."""
        at = to_seconds(event.event_time)
        if isinstance(event, JobState) and event.source.job:
            job = event.source.job
            if event.state in JOB_ENDED:
                self._layouts.forget(job)
                return self._end("job", job, now, at)
            changed = self._layouts.learn(job, event)
            if job in self.jobs:  # its detectors that follow its lifecycle (the hang detector's warm-up)
                out = self._route("job", job, "job_state", event, at, now, {})
                if changed and job in self.jobs:
                    out += self._afresh(self.jobs[job], now)
                return out
            return []
        if isinstance(event, NodeState) and event.source.node:
            if event.state in NODE_AWAY:
                return self._end("node", event.source.node, now, at)
            return self._route("node", event.source.node, "node_state", event, at, now, {})
        return []

    def forget(self, nodes: Iterable[str] = (), jobs: Iterable[str] = ()) -> None:
        """Drop the state of subjects whose partitions moved to another worker."""
        for per, names in (("node", nodes), ("job", jobs)):
            for name in names:
                self._drop_key(per, name)
                for k in [k for k in self._reported if k[0] == f"{per}:{name}"]:
                    del self._reported[k]

    def _end(self, per: str, name: str, now: float, at: float) -> list[DetectorFinding]:
        """``name`` ended or left at ``at``: its findings clear, its state goes, its in-flight past is ignored."""
        self._ended[(per, name)] = max(at, self._ended.get((per, name), at))
        if len(self._ended) > 100_000:  # bounded: the oldest ends are long past
            for k in sorted(self._ended, key=self._ended.__getitem__)[:10_000]:
                del self._ended[k]
        key = self._drop_key(per, name)
        out: list[DetectorFinding] = []
        owner = f"{per}:{name}"
        for k in [k for k in self._reported if k[0] == owner]:
            for raised in self._reported.pop(k).values():
                out.append(self._cleared(raised, key.cluster if key else raised.source.cluster, now))
        return out
