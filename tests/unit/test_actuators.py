"""Actuators without a broker: the state machine, the ledger, the executor and its safety checks.

The backend here is a real :class:`~vigil.actuators.backends.base.CommandBackend`
whose one command (an argv list, no shell) appends a line to a file, so
"executed once" and "executed nothing" are counted on disk.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vigil.actuators.backends.base import CommandBackend
from vigil.actuators.errors import InvalidTransition, LedgerError, PlanError
from vigil.actuators.executor import CIRCUIT_ALERT_KIND, Executor
from vigil.actuators.inventory import Inventory
from vigil.actuators.ledger import STOPPED_MID_ACTION, Ledger
from vigil.actuators.plans import Action, parse_action
from vigil.actuators.safety import Safety, SafetyLimits
from vigil.actuators.state import TRANSITIONS, ActionState, check_transition
from vigil.schemas import ActionResult, Alert, Decision, JobState, NodeState, Source, Subject, to_seconds
from vigil.schemas.signing import Keyring

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
NODES = [f"n{i}" for i in range(10)]
#: The decision engine's key in these tests: every decision below is signed with it.
KEYRING = Keyring({"test": b"unit-test-decision-key-0123456789"}, signing_key="test")


def decision(action: str, *, job: str | None = "job-1", node: str | None = None, plan: dict | None = None,
             key: str | None = None, at: datetime = T0, reason: str = "test") -> Decision:
    did = uuid.uuid4()
    # (model_construct: the executor must refuse a bad name even in a model built without validation)
    return KEYRING.sign(Decision(event_time=at, decision_id=did, idempotency_key=key or f"key-{did}", action=action,
                                 target=Subject.model_construct(job=job, node=node), reason=reason, plan=plan or {}))


class RecordingBackend(CommandBackend):
    """Each action runs one real command that appends ``<action> <job or node>`` to ``log``."""

    name = "recording"
    supports = frozenset({"retry_in_place", "restart_process", "checkpoint_restart", "isolate_node", "reconfigure"})

    def __init__(self, log: Path) -> None:
        super().__init__(timeout_s=30)
        self.log = log

    def commands(self, action: Action) -> tuple[list[list[str]], list[str]]:
        line = f"{action.action} {action.job or action.node}"
        return [[sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')",
                 str(self.log), line]], []

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


class RaisingBackend:
    name = "raising"
    supports = frozenset({"restart_process"})

    def execute(self, decision, dry_run=False):
        raise RuntimeError("backend exploded")


@pytest.fixture
def env(tmp_path):
    class Env:
        def __init__(self) -> None:
            self.path = tmp_path / "ledger.sqlite"
            self.backend = RecordingBackend(tmp_path / "ran.log")
            self.ledgers: list[Ledger] = []

        def executor(self, *, limits: SafetyLimits | None = None, progress=None, dry_run=False, backend=None,
                     nodes=NODES, jobs=("job-1", "job-2"), **kw) -> Executor:
            ledger = Ledger(self.path, now=to_seconds(T0))
            self.ledgers.append(ledger)
            return Executor(backend or self.backend, ledger, Inventory(nodes, jobs),
                            Safety(limits or SafetyLimits(), progress=progress), dry_run=dry_run,
                            source=Source(cluster="c1", node="actuator-host"), keyring=KEYRING, **kw)

        def reopen(self, **kw) -> Executor:
            for ledger in self.ledgers:
                ledger.close()
            self.ledgers.clear()
            return self.executor(**kw)

    e = Env()
    yield e
    for ledger in e.ledgers:
        ledger.close()


def states(events) -> list[str]:
    return [e.state for e in events if isinstance(e, ActionResult)]


# -- the state machine ----------------------------------------------------------------------------------


ALLOWED = {("pending", "running"), ("pending", "failed"), ("running", "succeeded"), ("running", "failed"),
           ("running", "timed_out"), ("running", "cancelled")}


@pytest.mark.parametrize("src, dst", list(itertools.product([s.value for s in ActionState], repeat=2)))
def test_state_machine_allows_exactly_the_table(src, dst):
    did = uuid.uuid4()
    if (src, dst) in ALLOWED:
        assert check_transition(src, dst, did) is ActionState(dst)
    else:
        with pytest.raises(InvalidTransition) as info:
            check_transition(src, dst, did)
        err = info.value
        assert (err.from_state, err.to_state, err.decision_id) == (ActionState(src), ActionState(dst), did)
        assert f"{src} -> {dst}" in str(err) and str(did) in str(err)


def test_transition_table_and_terminal_states():
    assert {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets} == ALLOWED
    assert {s.value for s in ActionState if s.terminal} == {"succeeded", "failed", "timed_out", "cancelled"}
    with pytest.raises(InvalidTransition, match="unknown|bogus"):
        check_transition("pending", "bogus", "d1")


# -- the ledger -----------------------------------------------------------------------------------------


def test_ledger_is_idempotent_by_decision_id_and_by_key(tmp_path):
    with Ledger(tmp_path / "l.sqlite", now=0.0) as ledger:
        d = decision("restart_process", key="k1")
        rec, created = ledger.begin(d, "slurm", 10.0)
        assert created and rec.state is ActionState.pending
        again, created = ledger.begin(d, "slurm", 11.0)  # redelivery
        assert not created and again.decision_id == str(d.decision_id)
        other = decision("restart_process", key="k1")  # a second decision, same key
        again, created = ledger.begin(other, "slurm", 12.0)
        assert not created and again.decision_id == str(d.decision_id)
        assert ledger.lookup(other).decision_id == str(d.decision_id) and ledger.count() == 1
        ledger.transition(d.decision_id, ActionState.running, 13.0, executed=True, drained=["n1"], progress=7)
        done = ledger.transition(d.decision_id, ActionState.succeeded, 14.0, detail="ok", commands=[["a", "b"]])
        assert (done.state, done.detail, done.commands, done.drained, done.progress, done.updated_at) == (
            ActionState.succeeded, "ok", [["a", "b"]], ["n1"], 7, 14.0)
        with pytest.raises(InvalidTransition):
            ledger.transition(d.decision_id, ActionState.running, 15.0)
        with pytest.raises(LedgerError, match="in use by another actuator"):
            Ledger(tmp_path / "l.sqlite", now=0.0)


def test_ledger_reopened_after_a_crash_fails_running_rows_and_drops_pending_ones(tmp_path):
    path = tmp_path / "l.sqlite"
    running, pending, done = decision("restart_process"), decision("isolate_node", node="n1"), decision("none")
    script = textwrap.dedent(f"""
        import os, sys
        from vigil.actuators.ledger import Ledger
        from vigil.actuators.state import ActionState
        from vigil.schemas import Decision
        ds = [Decision.model_validate_json(a) for a in sys.argv[1:]]
        ledger = Ledger({str(path)!r}, now=100.0)
        for d in ds:
            ledger.begin(d, "slurm", 100.0)
        ledger.transition(ds[0].decision_id, ActionState.running, 101.0, executed=True, detail="scontrol requeue job-1")
        ledger.transition(ds[2].decision_id, ActionState.running, 101.0)
        ledger.transition(ds[2].decision_id, ActionState.succeeded, 101.0, detail="nothing to do")
        os._exit(9)  # the actuator dies mid-action: no close, no cleanup
    """)
    p = subprocess.run([sys.executable, "-c", script, running.model_dump_json(), pending.model_dump_json(),
                        done.model_dump_json()], capture_output=True, text=True, timeout=60)
    assert p.returncode == 9, p.stderr
    with Ledger(path, now=200.0) as ledger:
        assert [r.decision_id for r in ledger.recovered] == [str(running.decision_id)]
        rec = ledger.get(running.decision_id)
        assert rec.state is ActionState.failed and rec.detail.startswith(STOPPED_MID_ACTION)
        assert "scontrol requeue job-1" in rec.detail and rec.updated_at == 200.0
        assert ledger.get(pending.decision_id) is None  # nothing ran: it will be handled when redelivered
        assert ledger.get(done.decision_id).state is ActionState.succeeded
    with Ledger(path, now=300.0) as ledger:
        assert ledger.recovered == []  # nothing left to recover


def test_executor_reports_a_decision_cut_short_by_a_crash_as_failed_and_never_reruns_it(env):
    ex = env.executor()
    d = decision("restart_process")
    ex.ledger.begin(d, "recording", to_seconds(T0))
    ex.ledger.transition(d.decision_id, ActionState.running, to_seconds(T0), executed=True)
    ex = env.reopen()  # as after a crash
    (rec,) = ex.recovered_results(T0)
    assert (rec.decision_id, rec.state) == (d.decision_id, "failed") and STOPPED_MID_ACTION in rec.detail
    again = ex.handle(d, T0 + timedelta(seconds=5))  # the redelivered decision
    assert states(again) == ["failed"] and again[0].event_id == rec.event_id
    assert env.backend.lines() == []


# -- plans ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action, job, node, plan, field", [
    ("retry_in_place", "job-1", None, {"ranks": "all"}, "plan.ranks"),
    ("retry_in_place", "job-1", None, {"ranks": [0, -1]}, "plan.ranks[1]"),
    ("retry_in_place", "job-1", None, {"ranks": [True]}, "plan.ranks[0]"),
    ("restart_process", None, None, {}, "target.job"),
    ("restart_process", "job-1", None, {"nodes": ["n1", "n1"]}, "plan.nodes"),
    ("isolate_node", None, None, {}, "target.node"),
    ("isolate_node", None, "n1; rm -rf /", {}, "target.node"),
    ("isolate_node", None, "-rf", {}, "target.node"),
    ("reconfigure", "job-1", None, {"exclude_nodes": ["n1"], "workers": 0}, "plan.workers"),
    ("reconfigure", "job-1", None, {"exclude_nodes": "n1"}, "plan.exclude_nodes"),
    ("reconfigure", "job-1", None, {"exclude_nodes": ["$(reboot)"]}, "plan.exclude_nodes[0]"),
    ("rebalance_microbatches", "job-1", None, {"microbatches": [2, 0]}, "plan.microbatches[1]"),
    ("rebalance_microbatches", "job-1", None, {}, "plan.microbatches"),
    ("adjust_topology", "job-1", None, {"swaps": [["n1"]]}, "plan.swaps[0]"),
    ("adjust_topology", "job-1", None, {"swaps": [["n1", "n1"]]}, "plan.swaps[0]"),
    ("checkpoint_restart", "job 1", None, {}, "target.job"),
    ("restart_process", "job-1", None, {"progress_step": -3}, "plan.progress_step"),
])
def test_malformed_plans_are_refused_with_the_field(action, job, node, plan, field):
    with pytest.raises(PlanError) as info:
        parse_action(decision(action, job=job, node=node, plan=plan))
    assert info.value.field == field


def test_plans_parse_to_actions():
    a = parse_action(decision("reconfigure", plan={"exclude_nodes": ["n1", "n2"], "workers": 6, "placement": {"x": 1},
                                                   "strategy": "s3"}))
    assert (a.exclude_nodes, a.workers, a.drains, a.ignored_keys) == (("n1", "n2"), 6, ("n1", "n2"), ("strategy",))
    a = parse_action(decision("isolate_node", job=None, node="n3", plan={"reason": "xid 79\n\x1b[31mgone"}))
    assert a.drains == ("n3",) and a.reason == "xid 79 [31mgone"
    a = parse_action(decision("adjust_topology", plan={"swaps": [["n1", "n2"]], "progress_step": 40}))
    assert a.swaps == (("n1", "n2"),) and a.progress_step == 40 and a.named_nodes == ("n1", "n2")


# -- the executor ---------------------------------------------------------------------------------------


def test_a_decision_runs_once_running_then_succeeded(env):
    ex = env.executor()
    d = decision("restart_process")
    out = ex.handle(d, T0)
    assert states(out) == ["running", "succeeded"]
    assert all(r.decision_id == d.decision_id and r.backend == "recording" for r in out)
    assert env.backend.lines() == ["restart_process job-1"]
    again = ex.handle(d, T0 + timedelta(seconds=1))  # redelivered
    assert states(again) == ["succeeded"] and again[0].event_id == out[1].event_id
    twin = decision("restart_process", key=d.idempotency_key)  # same key, another id
    (dup,) = ex.handle(twin, T0 + timedelta(seconds=2))
    assert dup.decision_id == twin.decision_id and dup.state == "succeeded"
    assert f"duplicate of decision {d.decision_id}" in dup.detail
    ex = env.reopen()  # a restarted actuator remembers too
    assert states(ex.handle(d, T0 + timedelta(seconds=3))) == ["succeeded"]
    assert env.backend.lines() == ["restart_process job-1"]


def test_emit_sees_running_before_the_backend_runs(env):
    ex = env.executor()
    seen: list[tuple[str, list[str]]] = []
    out = ex.handle(decision("restart_process"), T0, emit=lambda e: seen.append((e.state, env.backend.lines())))
    assert seen == [("running", []), ("succeeded", ["restart_process job-1"])] and states(out) == ["running", "succeeded"]


@pytest.mark.parametrize("d, why", [
    (decision("isolate_node", job=None, node="ghost"), "unknown node 'ghost'"),
    (decision("restart_process", job="job-9"), "unknown job 'job-9'"),
    (decision("reconfigure", plan={"exclude_nodes": ["n1", "ghost"]}), "unknown node 'ghost'"),
    (decision("adjust_topology", plan={"swaps": [["n1", "n2"]]}), "not supported by the recording backend"),
    (decision("retry_in_place", plan={"ranks": "all"}), "malformed plan: plan.ranks: expected a list"),
    (decision("isolate_node", job=None, node="n1;reboot"), "malformed plan: target.node"),
    (decision("restart_process", at=T0 - timedelta(hours=1)), "stale decision"),
])
def test_refusals_fail_with_the_reason_and_execute_nothing(env, d, why):
    ex = env.executor()
    out = ex.handle(d, T0)
    (result,) = [e for e in out if isinstance(e, ActionResult)]
    assert result.state == "failed" and why in result.detail, result.detail
    # A refusal that says the input was wrong also raises an alert (not a backend's limits).
    alerts = [e for e in out if isinstance(e, Alert)]
    assert [a.kind for a in alerts] == ([] if "not supported" in why else ["actuator_refused_decision"])
    assert env.backend.lines() == []
    assert ex.ledger.get(d.decision_id).state is ActionState.failed


def test_no_machine_actions_succeed_and_run_nothing(env):
    ex = env.executor()
    (told,) = ex.handle(decision("notify_human", reason="fabric looks wrong"), T0)
    assert told.state == "succeeded" and "human" in told.detail and "fabric looks wrong" in told.detail
    (nothing,) = ex.handle(decision("none", job=None), T0)
    assert nothing.state == "succeeded" and "nothing to do" in nothing.detail
    assert env.backend.lines() == []


def test_dry_run_records_what_would_run_and_runs_nothing(env):
    ex = env.executor(dry_run=True)
    d = decision("isolate_node", job=None, node="n4")
    out = ex.handle(d, T0)
    assert states(out) == ["running", "succeeded"] and {r.backend for r in out} == {"dry-run:recording"}
    assert out[1].detail.startswith("dry run: would run ") and "isolate_node n4" in out[1].detail
    assert env.backend.lines() == []
    assert ex.ledger.get(d.decision_id).commands[0][-1] == "isolate_node n4"


def test_a_backend_that_raises_is_a_failed_action(env):
    ex = env.executor(backend=RaisingBackend())
    out = ex.handle(decision("restart_process"), T0)
    assert states(out) == ["running", "failed"] and "RuntimeError: backend exploded" in out[1].detail


def test_circuit_breaker_opens_at_the_limit_raises_sev1_and_stays_open_until_reset(env):
    ex = env.executor(limits=SafetyLimits(max_drained_nodes=2, max_drained_fraction=1.0, drain_window_s=600))
    for i, node in enumerate(["n0", "n1"]):
        assert states(ex.handle(decision("isolate_node", job=None, node=node), T0 + timedelta(seconds=i))) == [
            "running", "succeeded"]
    assert states(ex.handle(decision("isolate_node", job=None, node="n1"), T0 + timedelta(seconds=2))) == [
        "running", "succeeded"]  # the same node again is not a new one
    out = ex.handle(decision("reconfigure", plan={"exclude_nodes": ["n2"]}), T0 + timedelta(seconds=3))
    result, alert = out
    assert result.state == "failed" and "blast radius" in result.detail and "limit is 2" in result.detail
    assert isinstance(alert, Alert) and (alert.severity, alert.kind, alert.status) == (1, CIRCUIT_ALERT_KIND, "open")
    assert alert.subject.job == "job-1" and "--reset-circuit" in alert.summary
    # Open: every machine action is refused, with no second alert; a restarted actuator is still open.
    ex = env.reopen(limits=SafetyLimits(max_drained_nodes=2, max_drained_fraction=1.0, drain_window_s=600))
    (refused,) = ex.handle(decision("restart_process"), T0 + timedelta(seconds=4))
    assert refused.state == "failed" and "circuit breaker open" in refused.detail
    assert env.backend.lines() == ["isolate_node n0", "isolate_node n1", "isolate_node n1"]
    # A human resets it (from another process, while this one runs): resolved, and acting again.
    Ledger.request_reset(env.path, at=to_seconds(T0) + 5, kind="circuit", who="ops")
    (resolved,) = ex.tick(T0 + timedelta(seconds=5))
    assert (resolved.incident_id, resolved.incident_version, resolved.status) == (alert.incident_id, 2, "resolved")
    assert states(ex.handle(decision("isolate_node", job=None, node="n3"), T0 + timedelta(seconds=6))) == [
        "running", "succeeded"]


def test_circuit_limit_is_the_tighter_of_count_and_fraction_over_a_sliding_window(env):
    nodes = [f"m{i}" for i in range(20)]  # 10 % of 20 = 2 < 4
    ex = env.executor(nodes=nodes, limits=SafetyLimits(max_drained_nodes=4, max_drained_fraction=0.10,
                                                       drain_window_s=3600))
    assert states(ex.handle(decision("reconfigure", plan={"exclude_nodes": ["m0", "m1"]}), T0)) == ["running", "succeeded"]
    # The window slides: an hour later m0 and m1 have left it, so two more may go...
    later = T0 + timedelta(seconds=3601)
    assert states(ex.handle(decision("isolate_node", job=None, node="m2", at=later), later))[-1] == "succeeded"
    assert states(ex.handle(decision("isolate_node", job=None, node="m3", at=later), later))[-1] == "succeeded"
    # ... but not a third in the same window.
    out = ex.handle(decision("isolate_node", job=None, node="m4", at=later), later)
    assert states(out) == ["failed"] and out[1].kind == CIRCUIT_ALERT_KIND and "the limit is 2" in out[0].detail
    assert Safety(SafetyLimits(max_drained_fraction=0.10)).drain_limit(4) == 1  # one node may always go
    assert Safety(SafetyLimits(max_drained_nodes=3, max_drained_fraction=0.5)).drain_limit(100) == 3


def test_no_progress_guard_stops_after_k_restarts_without_a_new_step(env):
    step = {"job-1": 100}
    ex = env.executor(limits=SafetyLimits(max_restarts_without_progress=2, rate_limit=100), progress=step.get)
    t = T0
    for _ in range(2):
        t += timedelta(seconds=10)
        assert states(ex.handle(decision("restart_process", at=t), t)) == ["running", "succeeded"]
    t += timedelta(seconds=10)
    (refused,) = ex.handle(decision("checkpoint_restart", at=t), t)
    assert refused.state == "failed" and "no progress after 2 restarts: last step 100" in refused.detail
    assert "job-1" in ex.safety.given_up
    # Retry in place is not a restart: still allowed.
    assert states(ex.handle(decision("retry_in_place", at=t), t)) == ["running", "succeeded"]
    # A restarted actuator rebuilds the count from its ledger.
    ex = env.reopen(limits=SafetyLimits(max_drained_nodes=4, max_restarts_without_progress=2, rate_limit=100),
                    progress=step.get)
    assert states(ex.handle(decision("restart_process", at=t), t)) == ["failed"]
    # Training moved on (the decision says so): restarts are allowed again.
    t += timedelta(seconds=10)
    assert states(ex.handle(decision("restart_process", plan={"progress_step": 130}, at=t), t)) == ["running", "succeeded"]
    assert "job-1" not in ex.safety.given_up
    assert env.backend.lines().count("restart_process job-1") == 3


def test_no_progress_guard_with_unknown_progress_and_a_human_reset(env):
    ex = env.executor(limits=SafetyLimits(max_restarts_without_progress=1, rate_limit=100))
    assert states(ex.handle(decision("restart_process"), T0)) == ["running", "succeeded"]
    (refused,) = ex.handle(decision("restart_process"), T0 + timedelta(seconds=1))
    assert "no progress after 1 restarts: last step unknown" in refused.detail
    assert states(ex.handle(decision("restart_process", job="job-2"), T0 + timedelta(seconds=1)))[-1] == "succeeded"
    Ledger.request_reset(env.path, at=to_seconds(T0) + 2, kind="job", job="job-1")
    assert states(ex.handle(decision("restart_process"), T0 + timedelta(seconds=3))) == ["running", "succeeded"]


def test_rate_limit_per_job_and_window(env):
    ex = env.executor(limits=SafetyLimits(rate_limit=2, rate_window_s=60, max_restarts_without_progress=100))
    for s in (0, 10):
        assert states(ex.handle(decision("retry_in_place", at=T0 + timedelta(seconds=s)), T0 + timedelta(seconds=s)))[-1] == "succeeded"
    at = T0 + timedelta(seconds=20)
    (refused,) = ex.handle(decision("retry_in_place", at=at), at)
    assert refused.state == "failed" and "rate limit: 2 actions on job job-1 in the last 60 s" in refused.detail
    assert states(ex.handle(decision("retry_in_place", job="job-2", at=at), at))[-1] == "succeeded"  # other job
    at = T0 + timedelta(seconds=61)  # the first one left the window
    assert states(ex.handle(decision("retry_in_place", at=at), at))[-1] == "succeeded"
    assert env.backend.lines() == ["retry_in_place job-1"] * 2 + ["retry_in_place job-2", "retry_in_place job-1"]


def test_actions_not_for_this_executor_are_ignored(env):
    ex = env.executor(actions={"restart_process"})
    assert ex.handle(decision("isolate_node", job=None, node="n1"), T0) == []
    assert ex.ledger.count() == 0


def test_inventory_learns_nothing_from_state_events(env):
    """Targets come from the operator: a job or node announced on a state topic stays unknown."""
    ex = env.executor(nodes=[], jobs=[])
    assert ex.observe(JobState(event_time=T0, source=Source(job="job-7"), state="running", nodes=["g1", "g2"]))
    assert ex.observe(NodeState(event_time=T0, source=Source(node="ALL"), state="joined"))
    assert ex.inventory.nodes == frozenset() and ex.inventory.jobs == frozenset()
    out = ex.handle(decision("restart_process", job="job-7"), T0)
    assert "unknown job 'job-7'" in out[0].detail and env.backend.lines() == []


def test_inventory_file(tmp_path):
    f = tmp_path / "inv.json"
    f.write_text('{"nodes": ["a1"], "jobs": {"j1": ["a2", "a3"]}}')
    inv = Inventory.load(f, nodes=["a4"])
    assert inv.nodes == {"a1", "a2", "a3", "a4"} and inv.jobs == {"j1"}
    f.write_text('{"nodes": ["bad name"]}')
    with pytest.raises(ValueError, match="not a valid name"):
        Inventory.load(f)
