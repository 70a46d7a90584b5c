"""Fail-slow ski rental priced by the expected remaining duration, learned from the episodes seen."""

from __future__ import annotations

import uuid

import pytest

from vigil.schemas import Alert, Decision, JobState, NodeState, Source, Subject, from_seconds, Slowdown
from vigil.streams.engine.decisions import DecisionEngine
from vigil.streams.engine.skirental import EpisodeDurations, FailSlowMitigation

COSTS = {"rebalance_microbatches": 5.0, "adjust_topology": 60.0, "checkpoint_restart": 300.0}


def bought(m: FailSlowMitigation, start: int, until: int, step: int = 1) -> list[tuple[int, str]]:
    return [(t, s) for t in range(start, until, step) for _, s, _ in m.tick(float(t))]


# -- the duration model ----------------------------------------------------------------------


def test_kaplan_meier_mean_remaining_life_with_and_without_censoring():
    h = EpisodeDurations(min_at_risk=1)
    for d in (100.0, 300.0):
        h.observe("computation", d, ended=True)
    assert h.expected_remaining("computation", 0.0) == pytest.approx((200.0, True))
    assert h.expected_remaining("computation", 200.0) == pytest.approx((100.0, True))
    assert h.expected_remaining("computation", 300.0) is None  # older than every episode seen: no estimate
    # An episode cut short at 50 s leaves the risk set without ending: it does not make episodes look short.
    h.observe("computation", 50.0, ended=False)
    assert h.expected_remaining("computation", 0.0) == pytest.approx((200.0, True))
    # Classes are apart.
    assert h.expected_remaining("communication", 0.0) is None


def test_a_tail_of_censored_episodes_gives_only_a_lower_bound_within_the_support():
    h = EpisodeDurations(min_at_risk=2)
    for d in (100.0, 200.0):
        h.observe("communication", d, ended=True)
    for d in (400.0, 5000.0):  # cut short: at least that long
        h.observe("communication", d, ended=False)
    r, exact = h.expected_remaining("communication", 0.0)
    # S = 1 to 100 s, 3/4 to 200 s, 1/2 after; the integral stops at the 2nd longest (400 s): the lone
    # 5000 s record is too thin a support to count on.
    assert not exact and r == pytest.approx(100 + 0.75 * 100 + 0.5 * 200)
    assert h.expected_remaining("communication", 450.0) is None


def test_a_record_is_revised_when_the_end_of_an_episode_cut_short_is_seen_later():
    h = EpisodeDurations(min_at_risk=1)
    rid = h.observe("communication", 100.0, ended=False)
    assert h.count("communication") == (1, 0)
    assert h.revise("communication", rid, 3600.0, ended=True)
    assert h.count("communication") == (1, 1) and h.expected_remaining("communication", 0.0) == (3600.0, True)
    assert not h.revise("communication", rid + 1, 1.0, ended=True)


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match="min_at_risk"):
        EpisodeDurations(min_at_risk=0)
    with pytest.raises(ValueError, match="duration_s"):
        EpisodeDurations().observe("computation", -1.0, ended=True)
    with pytest.raises(ValueError, match="confirm_s"):
        FailSlowMitigation(confirm_s=-1.0)


# -- pricing --------------------------------------------------------------------------------------


def history(cls: str, durations: list[float], ended: bool = True) -> EpisodeDurations:
    h = EpisodeDurations(min_at_risk=3)
    for d in durations:
        h.observe(cls, d, ended=ended)
    return h


def test_without_history_the_classic_rule_buys_each_step_when_the_slowdown_has_paid_for_it():
    m = FailSlowMitigation(COSTS)
    m.start("j", 1.0, 2.0, "computation", now=0.0)  # half of every second lost
    assert bought(m, 0, 700) == [(10, "rebalance_microbatches"), (120, "adjust_topology"),
                                 (600, "checkpoint_restart")]


def test_a_restart_that_leaves_the_job_short_is_worth_only_the_slowdown_beyond_it():
    # 0.5 s lost per s; a restart with no spare node leaves the job 0.25 short: it saves 0.25 s per s, so the
    # classic rule buys it once the slowdown it would have saved (half of what was lost) reaches its 300 s
    m = FailSlowMitigation(COSTS)
    m.start("j", 1.0, 2.0, "communication", now=0.0, strategies=("checkpoint_restart",), restart_shrink=0.25)
    assert bought(m, 0, 1300) == [(1200, "checkpoint_restart")]
    # short by as much as the slowdown costs: never, however long episodes last
    m = FailSlowMitigation(COSTS, durations=history("communication", [30000.0, 40000.0, 60000.0, 90000.0]))
    m.start("j", 1.0, 2.0, "communication", now=0.0, strategies=("checkpoint_restart",), restart_shrink=0.5)
    assert bought(m, 0, 20000, 10) == []
    assert "no spare node" in m._worth("j", m._episodes["j"], "checkpoint_restart", 20000.0)[1]
    with pytest.raises(ValueError, match="restart_shrink"):
        FailSlowMitigation(COSTS).start("k", 1.0, 2.0, "communication", now=0.0, restart_shrink=1.5)


def test_long_episodes_in_history_buy_the_restart_at_once():
    m = FailSlowMitigation(COSTS, durations=history("communication", [3000.0, 4000.0, 6000.0, 9000.0]))
    m.start("j", 1.0, 1.25, "communication", now=20.0, onset=0.0, strategies=("checkpoint_restart",))
    assert bought(m, 20, 100) == [(20, "checkpoint_restart")]
    assert "expected to last another" in m.explain("j")


def test_short_episodes_in_history_hold_the_restart_back_while_they_cover_the_age():
    m = FailSlowMitigation(COSTS, durations=history("communication", [600.0, 700.0, 900.0, 1200.0, 1300.0, 1400.0]))
    m.start("j", 1.0, 1.25, "communication", now=0.0, strategies=("checkpoint_restart",))
    # 0.2 s lost per s: a restart pays back only past 1500 s more, and no episode this old lasted that long.
    # Past 1200 s fewer than 3 episodes are older: history no longer covers the age and the classic rule
    # takes over, at 300 s lost.
    ((t, step),) = bought(m, 0, 2000, 10)
    assert step == "checkpoint_restart" and 1500 <= t <= 1510
    # The same history with a long tail: the expectation pays for a restart at once.
    m = FailSlowMitigation(COSTS, durations=history("communication", [600.0, 700.0, 900.0, 1200.0, 30_000.0]))
    m.start("j", 1.0, 1.25, "communication", now=0.0, strategies=("checkpoint_restart",))
    assert bought(m, 0, 20) == [(0, "checkpoint_restart")]


def test_after_a_step_the_next_one_waits_to_see_whether_it_worked():
    m = FailSlowMitigation(COSTS, durations=history("communication", [5000.0, 6000.0, 8000.0]))
    m.start("j", 1.0, 2.0, "communication", now=30.0, onset=0.0)  # detected 30 s after its onset
    # S3 at once; S4 only once S3's 60 s, twice the detection delay and 60 s have passed without the end
    assert bought(m, 30, 400) == [(30, "adjust_topology"), (210, "checkpoint_restart")]


def test_an_end_seen_just_after_a_step_is_the_steps_doing_a_later_one_the_episodes_own():
    h = EpisodeDurations(min_at_risk=1)
    m = FailSlowMitigation(COSTS, durations=h)
    m.start("a", 1.0, 2.0, "computation", now=0.0, strategies=("rebalance_microbatches",))
    m.start("b", 1.0, 2.0, "computation", now=0.0, strategies=("rebalance_microbatches",))
    assert bought(m, 0, 20) == [(10, "rebalance_microbatches"), (10, "rebalance_microbatches")]
    m.stop("a", now=50.0)  # within 10 + 5 + 60 s of S2: S2 may have cured it
    m.stop("b", now=500.0)  # long after: S2 did not cure it, it ended by itself
    assert sorted(d for d, _, _ in h._episodes["computation"]) == [50.0, 500.0]
    assert h.count("computation") == (2, 1)
    # anything else acting on the job (a restart, a move) counts the same way
    m.start("c", 1.0, 2.0, "computation", now=1000.0, strategies=())
    m.touched("c", 1100.0)
    m.stop("c", now=1120.0)
    assert h.count("computation") == (3, 1)


def test_a_straggler_left_by_a_checkpoint_restart_completes_its_episode_when_it_comes_back():
    h = EpisodeDurations(min_at_risk=1)
    m = FailSlowMitigation(COSTS, durations=h)
    m.start("j", 1.0, 2.0, "communication", now=0.0, strategies=("checkpoint_restart",))
    assert bought(m, 0, 700, 10) == [(600, "checkpoint_restart")]
    m.straggler_left("j", "n3")
    m.straggler_left("other-job", "n4")  # no episode there: ignored
    m.stop("j", now=600.0)  # the restart moved the job: the incident closes, "at least 600 s"
    assert h.count("communication") == (1, 0)
    m.node_back("n4", 700.0)
    m.node_back("n3", 4000.0)  # the slow link's node is healthy again: the episode lasted 4000 s
    assert h.count("communication") == (1, 1) and h.expected_remaining("communication", 0.0) == (4000.0, True)
    m.node_back("n3", 9000.0)  # once only
    assert h.expected_remaining("communication", 0.0) == (4000.0, True)


# -- in the decision engine ----------------------------------------------------------------------


T = 1_700_000_000.0


def failslow(job: str, cls: str, onset: float, now: float, incident: uuid.UUID, status: str = "open") -> Alert:
    return Alert(event_time=from_seconds(now), source=Source(), incident_id=incident, incident_version=1,
                 status=status, severity=3, kind="fail_slow", subject=Subject(job=job), onset_time=from_seconds(onset),
                 detection_time=from_seconds(now), detector="bocd_verify", detector_version="1",
                 evidence=[{"kind": "fail_slow", "subject": {"job": job}}], jobs={job: []},
                 slowdowns=[Slowdown(job=job, before_s=1.0, after_s=2.0, slowdown_class=cls)])


def job_state(name: str, nodes: list[str], dp: int, pp: int) -> JobState:
    return JobState(event_time=from_seconds(T), source=Source(job=name), state="running", nodes=nodes,
                    gpus=8 * len(nodes), dp=dp, pp=pp, tp=8)


def actions(out) -> list[str]:
    return [e.action for e in out if isinstance(e, Decision)]


def test_the_engine_offers_only_the_steps_a_layout_allows():
    eng = DecisionEngine(mitigation=FailSlowMitigation(COSTS))
    eng.on_state(job_state("dp-only", ["n1", "n2"], dp=2, pp=1), T)
    eng.on_state(job_state("one-node", ["n3"], dp=1, pp=1), T)
    eng.on_alert(failslow("dp-only", "computation", T, T, uuid.uuid4()), T)
    eng.on_alert(failslow("one-node", "computation", T, T, uuid.uuid4()), T)
    seen = {}
    for t in range(0, 700, 10):
        for e in eng.tick(T + t):
            if isinstance(e, Decision):
                seen.setdefault(e.target.job, []).append(e.action)
    # a single stage has no topology to adjust; a single replica no micro-batches to move
    assert seen == {"dp-only": ["rebalance_microbatches", "checkpoint_restart"], "one-node": ["checkpoint_restart"]}


@pytest.mark.parametrize("nodes,restart_at", [(["n1", "n2", "n3"], 600), (["n1", "n2"], None)])
def test_the_engine_prices_a_restart_with_the_replica_the_job_loses_when_no_node_is_spare(nodes, restart_at):
    eng = DecisionEngine(mitigation=FailSlowMitigation(COSTS))
    for n in nodes:
        eng.on_state(NodeState(event_time=from_seconds(T), source=Source(node=n), state="healthy"), T)
    eng.on_state(job_state("dp-only", ["n1", "n2"], dp=2, pp=1), T)
    eng.on_alert(failslow("dp-only", "communication", T, T, uuid.uuid4()), T)  # 0.5 s lost per s
    seen = [(t, e.action) for t in range(0, 3000, 10) for e in eng.tick(T + t) if isinstance(e, Decision)]
    # n3 idle: the restart runs the job whole on it, bought when the slowdown has cost its 300 s; without a
    # spare the job would drop to one of its two nodes, worse than running at half speed: never
    assert seen == ([(restart_at, "checkpoint_restart")] if restart_at else [])


@pytest.mark.parametrize("min_gpus,restart_at", [(0, 1200), (32, None)])
def test_a_restart_that_would_take_the_job_below_its_minimum_is_never_worth_it(min_gpus, restart_at):
    eng = DecisionEngine(mitigation=FailSlowMitigation(COSTS))
    nodes = ["n1", "n2", "n3", "n4"]
    for n in nodes:
        eng.on_state(NodeState(event_time=from_seconds(T), source=Source(node=n), state="healthy"), T)
    eng.on_state(job_state("dp4", nodes, dp=4, pp=1).model_copy(update={"min_gpus": min_gpus}), T)
    eng.on_alert(failslow("dp4", "communication", T, T, uuid.uuid4()), T)  # 0.5 s lost per s
    seen = [(t, e.action) for t in range(0, 3000, 10) for e in eng.tick(T + t) if isinstance(e, Decision)]
    # no spare: on 3 of its 4 nodes it saves 0.5 - 0.25 s per s, so the 300 s restart pays once 600 s of
    # slowdown would have been saved (1200 s in); at a minimum of 4 nodes it cannot run on 3 at all
    assert seen == ([(restart_at, "checkpoint_restart")] if restart_at else [])


def test_the_engine_learns_durations_from_onset_to_resolution_and_from_the_straggler_coming_back():
    eng = DecisionEngine(mitigation=FailSlowMitigation(COSTS, durations=EpisodeDurations(min_at_risk=1)))
    eng.on_state(job_state("gpt", ["n1", "n2"], dp=2, pp=1), T)
    h = eng.mitigation.durations
    # 1. left alone (the rental waits), it ends by itself: onset to resolution
    inc = uuid.uuid4()
    eng.on_alert(failslow("gpt", "communication", T, T + 20, inc), T + 20)
    assert actions(eng.tick(T + 100)) == []
    eng.on_alert(failslow("gpt", "communication", T, T + 900, inc, status="resolved"), T + 900)
    assert h.count("communication") == (1, 1) and h.expected_remaining("communication", 0.0) == (900.0, True)
    # 2. the next one is expected to outlast what a restart costs (0.5 s lost per s x 900 s): restart at once;
    # the restart leaves n2 behind, which comes back when the slow link is fine again
    inc = uuid.uuid4()
    eng.on_alert(failslow("gpt", "communication", T + 5000, T + 5010, inc), T + 5010)
    assert actions(eng.tick(T + 5010)) == ["checkpoint_restart"]
    eng.on_state(NodeState(event_time=from_seconds(T + 5010), source=Source(node="n2"), state="drained",
                           reason="straggler"), T + 5010)
    eng.on_state(job_state("gpt", ["n1", "n3"], dp=2, pp=1), T + 5010)
    eng.on_alert(failslow("gpt", "communication", T + 5000, T + 5010, inc, status="resolved"), T + 5010)
    assert h.count("communication") == (2, 1)  # so far only "at least 10 s"
    eng.on_state(NodeState(event_time=from_seconds(T + 8000), source=Source(node="n2"), state="joined"), T + 8000)
    assert h.count("communication") == (2, 2)
    assert sorted(d for d, _, _ in h._episodes["communication"]) == [900.0, 3000.0]
