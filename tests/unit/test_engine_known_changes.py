"""A job's known changes of configuration through the engine, on simulated time.

The rule the fail-slow benchmark scores (vigil.bench.detectors): a step-time
shift after a known change of configuration is benign, the same shift with
no such event is a fail-slow. Known answers from the generator: a seeded 2 %
jittered 1 s step that becomes 30 % slower at step 250, with or without an
event there: a new layout in a job state (moved, resized, re-partitioned),
or a change the training process announced on that step.
"""

from __future__ import annotations

import numpy as np
import pytest

from vigil.schemas import IterationStep, IterationTiming, JobState, Source, from_seconds
from vigil.streams.engine.detection import DetectionEngine, EngineParams

T0 = 1_700_000_000.0
SHIFT_AT = 250
LAYOUT = {"nodes": ["n1", "n2"], "gpus": 16, "dp": 2, "pp": 1, "tp": 8}


def _durations(n: int = 400, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [(1.3 if k >= SHIFT_AT else 1.0) * (1 + 0.02 * rng.standard_normal()) for k in range(n)]


def _timing(step: int, end: float, duration: float, rank: int = 0, change: str | None = None) -> IterationTiming:
    return IterationTiming(event_time=from_seconds(end), source=Source(job="j", node=f"n{1 + rank % 2}", rank=rank),
                           step=step, start=from_seconds(end - duration), end=from_seconds(end), duration_s=duration,
                           config_change=change)


def _state(t: float, state: str = "running", **layout) -> JobState:
    return JobState(event_time=from_seconds(t), source=Source(job="j"), state=state,  # type: ignore[arg-type]
                    **{**LAYOUT, **layout})


def _play(engine: DetectionEngine, at_shift=None, ranks: int = 1) -> list:
    """Feed the job's steps (and the job's first state before them); ``at_shift(engine, step, t)`` runs on the
    first slower step, before it is fed, and returns the findings it made with the events it wants fed instead."""
    findings = list(engine.on_lifecycle(_state(T0), T0))
    t = T0
    for k, d in enumerate(_durations()):
        t += d
        events = [_timing(k, t, d, rank=r) for r in range(ranks)]
        if k == SHIFT_AT and at_shift is not None:
            made, events = at_shift(engine, k, t, events)
            findings += made
        findings += engine.on_events(events, t)
    return findings


def _raised(findings) -> list:
    return [f for f in findings if f.kind == "fail_slow" and f.status == "raised"]


def test_a_shift_with_no_event_is_a_fail_slow():
    [found] = _raised(_play(DetectionEngine()))
    ends = T0 + np.cumsum(_durations())
    onset = int(np.searchsorted(ends, found.onset_time.timestamp()))
    assert abs(onset - SHIFT_AT) <= 20  # the benchmark's onset tolerance


def _state_at(**layout):
    def at_shift(engine, step, t, events):
        return engine.on_lifecycle(_state(t - 1.3, **layout), t - 1.0), events
    return at_shift


@pytest.mark.parametrize("layout", [
    {"nodes": ["n3", "n4"]},                      # moved to other nodes (a re-plan)
    {"nodes": ["n1", "n2", "n3", "n4"], "gpus": 32, "dp": 4},  # resized
    {"dp": 1, "pp": 2},                           # re-partitioned on the same nodes
], ids=["moved", "resized", "repartitioned"])
def test_a_shift_after_a_new_layout_is_no_fail_slow(layout):
    assert _raised(_play(DetectionEngine(), _state_at(**layout))) == []


@pytest.mark.parametrize("layout", [{}, {"nodes": ["n2"]}], ids=["same", "one agent's own node"])
def test_a_state_that_changes_no_layout_is_no_known_change(layout):
    """The same layout said again, or a node agent naming its own node of the job: the shift still alarms."""
    assert len(_raised(_play(DetectionEngine(), _state_at(**layout)))) == 1


def test_a_queued_state_with_no_layout_says_nothing_of_it():
    def queued(engine, step, t, events):
        made = engine.on_lifecycle(JobState(event_time=from_seconds(t - 1.3), source=Source(job="j"),
                                            state="pending"), t - 1.0)
        return made, events
    assert len(_raised(_play(DetectionEngine(), queued))) == 1


def test_a_shift_the_training_process_announced_is_no_fail_slow():
    def announced(engine, step, t, events):
        return [], [e.model_copy(update={"config_change": "sequence length 4k -> 8k"}) for e in events]
    assert _raised(_play(DetectionEngine(), announced)) == []


def test_an_announcement_in_columns_counts_too():
    """The same job sending its steps in columns (iteration_step), the change on the first slower one."""
    engine = DetectionEngine()
    t, found = T0, []
    for k, d in enumerate(_durations()):
        t += d
        step = IterationStep(event_time=from_seconds(t), source=Source(job="j"), step=k, start=from_seconds(t - d),
                             end=from_seconds(t), duration_s=d, ranks=[0], nodes=["n1"], gpus=[0],
                             compute_s=[0.8 * d], communication_s=[0.2 * d], dp=[0], pp=[0], tp=[0],
                             config_change="global batch 1M -> 2M tokens" if k == SHIFT_AT else None)
        found += engine.on_events([step], t)
    assert _raised(found) == []


def test_every_rank_announcing_the_same_step_starts_it_afresh_once():
    made = []

    def counted(cls):
        if cls.name != "fail_slow":
            return cls
        return type(cls.__name__, (cls,), {"__init__": lambda self, **kw: (made.append(1), cls.__init__(self, **kw))[1]})

    def announced(engine, step, t, events):
        return [], [e.model_copy(update={"config_change": "resized"}) for e in events]

    engine = DetectionEngine(EngineParams(instrument=counted))
    assert _raised(_play(engine, announced, ranks=4)) == []
    assert len(made) == 2  # the job's first, and one at the change (not one per rank)


def test_a_fail_slow_raised_before_a_new_layout_clears_with_it():
    engine = DetectionEngine()
    found = _play(engine)
    [raised] = _raised(found)
    t = T0 + 600.0
    cleared = [f for f in engine.on_lifecycle(_state(t, nodes=["n5", "n6"]), t)
               if f.kind == "fail_slow" and f.status == "cleared"]
    assert [f.onset_time for f in cleared] == [raised.onset_time]


def test_which_detectors_start_afresh_is_the_operators_setting():
    """With no detector named, a new layout changes nothing: the shift alarms as if unannounced."""
    engine = DetectionEngine(EngineParams(afresh_on_change=()))
    assert len(_raised(_play(engine, _state_at(nodes=["n3", "n4"])))) == 1


def test_an_ended_job_forgets_its_layout():
    engine = DetectionEngine()
    engine.on_lifecycle(_state(T0), T0)
    engine.on_lifecycle(_state(T0 + 1, "completed"), T0 + 1)
    assert engine._layouts.get("j") is None
    # the next job of that name starts from its own layout: its first state is no change
    assert engine._layouts.learn("j", _state(T0 + 2, nodes=["n9"])) is False
