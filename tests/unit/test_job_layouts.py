"""Where a job runs, as its states tell it: node agents name their own node, a move names a new set.

The known answers: a two-node job whose two agents each announce their own node is one layout of
two nodes (no move, in either engine); the simulator or a re-plan naming a new set is a move; a
resize is a change whatever nodes it names.
"""

from __future__ import annotations

from datetime import datetime, timezone

from vigil.schemas import JobState, Source
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.layouts import JobLayouts

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def state(nodes, *, agent=None, gpus=16, dp=16, pp=1, tp=1, state="running"):
    return JobState(event_time=T0, source=Source(job="j", node=agent), state=state, nodes=nodes, gpus=gpus, dp=dp,
                    pp=pp, tp=tp)


def test_each_agent_of_a_multi_node_job_naming_its_own_node_adds_up_to_one_layout():
    layouts = JobLayouts()
    assert layouts.learn("j", state(["n1"], agent="n1")) is False
    assert layouts.learn("j", state(["n2"], agent="n2")) is False
    assert layouts.get("j").nodes == {"n1", "n2"}
    assert layouts.learn("j", state(["n1"], agent="n1", state="restarting")) is False  # a restart on one node
    assert layouts.get("j").nodes == {"n1", "n2"}


def test_a_new_node_set_named_as_a_whole_is_a_move_and_a_resize_is_a_change():
    layouts = JobLayouts()
    layouts.learn("j", state(["n1", "n2"]))
    assert layouts.learn("j", state(["n1", "n2"])) is False  # said again
    assert layouts.learn("j", state(["n1"])) is False  # part of it
    assert layouts.learn("j", state(["n5", "n6"])) is True  # moved
    assert layouts.get("j").nodes == {"n5", "n6"}
    assert layouts.learn("j", state(["n5", "n6"], gpus=8, dp=8)) is True  # shrunk
    assert layouts.learn("j", state([], gpus=0)) is False  # a queued state says nothing of it
    assert layouts.get("j").nodes == {"n5", "n6"}


def test_the_decision_engine_keeps_every_node_of_a_job_its_agents_named():
    """Before, each agent's state replaced the job's nodes with its own: the job looked as if it moved
    between its nodes, and a loss of the node named first was not the job's."""
    engine = DecisionEngine()
    now = T0.timestamp()
    engine.on_state(state(["n1"], agent="n1"), now)
    engine.on_state(state(["n2"], agent="n2"), now + 1)
    info = engine.jobs["j"]
    assert info.nodes == {"n1", "n2"} and set(info.spec.nodes) == {"n1", "n2"}


def test_the_oldest_jobs_are_dropped_past_the_bound():
    layouts = JobLayouts(max_jobs=10)
    for i in range(12):
        layouts.learn(f"j{i}", state(["n1"]))
    assert layouts.get("j0") is None and layouts.get("j11") is not None
