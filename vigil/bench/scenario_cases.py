"""The scenarios of ``vigil bench scenarios``: what each does to the job, agents or broker, and what it requires.

Each is a function ``(scene, rec, verdict)`` in :data:`SCENARIOS`; the
runner (:mod:`vigil.bench.scenarios`) gives it a fresh prefix and worker
and judges its :class:`~vigil.bench.scenario_verdict.Verdict`. A scenario
that stops the broker says so (``own_broker``), one that needs worker
settings names them (``worker_env``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable

from vigil.bench.scenario_harness import AgentProcess, Recorder, Scene, wait_until
from vigil.bench.scenario_verdict import Verdict
from vigil.detectors.hang import DEFAULT_K
from vigil.schemas import GPUS_PER_NODE, Decision, JobState, NodeState, Source, encode, message_key, topic_name
from vigil.schemas.envelope import utcnow

__all__ = ["SCENARIOS", "FAST"]

#: Step time of the scenarios' jobs (seconds), and the hang detector's k (the defaults).
STEP_S = 0.2
K = DEFAULT_K


def _spec(**kw: Any) -> dict[str, Any]:
    return {"steps": 1000, "step_s": STEP_S, **kw}


def _settle(rec: Recorder, seconds: float) -> None:
    """Keep reading for ``seconds``: what vigil says after the fact (a late false page) counts too."""
    wait_until(lambda: False, seconds, rec.poll)


def _states(rec: Recorder, job: str) -> list[str]:
    return [s.state for _, s in rec.job_states(job)]


# -- the scenarios ---------------------------------------------------------------------------------------------


def normal_completion(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "done", _spec(steps=30))
    v.expected.update(exit_code=0, job_state="completed")
    code = None
    wait_until(lambda: agent.proc.poll() is not None, 120, rec.poll)
    code = agent.proc.poll()
    _settle(rec, 6)
    v.require("exit_code", code == 0, code)
    v.require("job_completed", "completed" in _states(rec, "done"), _states(rec, "done"))


def job_cancelled(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "cancel", _spec())
    v.expected.update(exit_code=143, job_state="cancelled")
    wait_until(lambda: agent.step() >= 10, 90, rec.poll)
    agent.signal(signal.SIGTERM)  # what scancel and a Kubernetes eviction do
    wait_until(lambda: agent.proc.poll() is not None, 60, rec.poll)
    _settle(rec, 6)
    v.require("exit_code", agent.proc.poll() == 143, agent.proc.poll())
    v.require("job_cancelled", "cancelled" in _states(rec, "cancel"), _states(rec, "cancel"))


def hang_after_clean_run(scene: Scene, rec: Recorder, v: Verdict) -> None:
    first = AgentProcess(scene, "n1", "first", _spec(steps=20))
    wait_until(lambda: first.proc.poll() is not None, 120, rec.poll)
    hang_at = 25
    second = AgentProcess(scene, "n1", "second", _spec(hang_at=hang_at), actuate=True)
    budget = K * STEP_S + 1.0
    v.expected.update(first_exit=0, hang_incident="task_hang of job second", within_s=budget, decision="restart_process")
    v.pages_allowed, v.decisions_allowed = {"task_hang"}, {"restart_process"}
    onset: list[float] = []

    def watch() -> None:
        rec.poll()
        if not onset and second.step() >= hang_at - 1:
            f = second.dir / "progress" / "rank0"
            onset.append(f.stat().st_mtime)  # when the last step before the hang ended (its rank wrote it)
    opened = lambda: [t for t, a in rec.opened("task_hang") if a.subject.job == "second"]
    wait_until(lambda: bool(opened()), 90, watch)
    wait_until(lambda: any(d.action == "restart_process" for _, d in rec.decisions), 20, rec.poll)
    second.signal(signal.SIGTERM)
    wait_until(lambda: second.proc.poll() is not None, 60, rec.poll)
    _settle(rec, 4)
    delay = opened()[0] - onset[0] if opened() and onset else None
    hang = [a for _, a in rec.opened("task_hang") if a.subject.job == "second"][:1]
    v.observed["hang_evidence"] = hang[0].evidence[:3] if hang else None  # its timeout, and what set it
    v.require("first_exit", first.proc.poll() == 0, first.proc.poll())
    v.require("hang_alert_in_time", delay is not None and delay <= budget,
              None if delay is None else round(delay, 3))
    v.require("restart", any(d.action == "restart_process" and d.target.job == "second" for _, d in rec.decisions))
    v.require("new_incident", all(a.subject.job != "first" for a in rec.pages()))


def crash_loop(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "crashy", _spec(crash=3), actuate=True)
    v.expected.update(backoff="growing gaps between restarts", exit_code=75, alert="sev1 recovery_failed")
    v.pages_allowed = {"process_exit", "recovery_failed"}
    v.decisions_allowed = {"restart_process", "reconfigure", "notify_human"}
    wait_until(lambda: agent.proc.poll() is not None, 180, rec.poll)
    _settle(rec, 5)
    restarts = [t for t, s in rec.job_states("crashy") if s.state == "restarting"]
    gaps = [round(b - a, 2) for a, b in zip(restarts, restarts[1:])]
    v.require("backoff", len(gaps) >= 2 and all(b > a for a, b in zip(gaps, gaps[1:])), gaps)
    v.require("exit_code", agent.proc.poll() == 75, agent.proc.poll())
    v.require("recovery_failed", any(a.kind == "recovery_failed" and a.severity == 1 for _, a in rec.alerts))


def warmup(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "warm", _spec(steps=40, first_step_x=15.0), actuate=True)
    v.expected.update(exit_code=0)
    wait_until(lambda: agent.proc.poll() is not None, 150, rec.poll)
    _settle(rec, 5)
    v.require("exit_code", agent.proc.poll() == 0, agent.proc.poll())


def checkpoint_pause(scene: Scene, rec: Recorder, v: Verdict) -> None:
    """Every 8 steps an unmarked ``torch.save`` taking 10 steps' time, as most training loops save."""
    every, x, steps = 8, 10.0, 40
    agent = AgentProcess(scene, "n1", "ckpt", _spec(steps=steps, ckpt_every=every, ckpt_x=x, ckpt_torch_save=True),
                         actuate=True)
    want = [s for s in range(1, steps) if s % every == 0]
    v.expected.update(exit_code=0, saves=f"steps {want}, unmarked torch.save, each >= {x:g} x {STEP_S} s")
    wait_until(lambda: agent.proc.poll() is not None, 150, rec.poll)
    _settle(rec, 5)
    saves = {}
    for f in sorted((agent.dir / "progress").glob("saves*")):
        saves[f.name] = [(int(a), float(b)) for a, b in (line.split() for line in f.read_text().splitlines())]
    v.require("exit_code", agent.proc.poll() == 0, agent.proc.poll())
    v.require("saves_took_10_steps", len(saves) == 2 and all([s for s, _ in got] == want
                                                               and min(t for _, t in got) >= x * STEP_S
                                                               for got in saves.values()), saves)


def rank_killed(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "victim", _spec(), actuate=True)
    v.expected.update(alert="sev2 process_exit", within_s=0.5, decision="restart_process", restart_result="succeeded",
                      restarted="every rank a new process, past the step it was killed at")
    v.pages_allowed, v.decisions_allowed = {"process_exit"}, {"restart_process"}
    wait_until(lambda: agent.step() >= 15, 90, rec.poll)
    before = agent.progress()
    old_pids = {pid for _, pid in before.values()}
    killed_at = max(step for step, _ in before.values())
    killed = time.time()
    os.kill(before[1][1], signal.SIGKILL)
    # the first alert naming the exit (a peer's broken connection may have opened the incident first)
    opened = lambda: [t for t, a in rec.alerts if a.kind == "process_exit" and a.subject.job == "victim"][:1]
    wait_until(lambda: bool(opened()), 20, rec.poll)
    restarts = lambda: {d.decision_id for _, d in rec.decisions if d.action == "restart_process"
                        and d.target.job == "victim"}
    wait_until(lambda: bool(restarts()), 20, rec.poll)
    results = lambda: [r for _, r in rec.actions if r.decision_id in restarts()]
    succeeded = lambda: [r for r in results() if r.state == "succeeded"]
    wait_until(lambda: bool(succeeded()) or any(r.state in ("failed", "timed_out", "cancelled") for r in results()),
               60, rec.poll)

    def restarted() -> bool:  # the ranks' own files: new processes, and they got past where the job was killed
        now = agent.progress()
        return len(now) == 2 and all(pid not in old_pids and step > killed_at for step, pid in now.values())
    wait_until(restarted, 90, rec.poll)
    after = agent.progress()
    agent.signal(signal.SIGTERM)
    wait_until(lambda: agent.proc.poll() is not None, 60, rec.poll)
    _settle(rec, 4)
    delay = opened()[0] - killed if opened() else None
    v.require("exit_alert_in_time", delay is not None and delay <= 0.5, None if delay is None else round(delay, 3))
    v.require("restart", bool(restarts()))
    v.require("restart_succeeded", bool(succeeded()), [f"{r.state}: {r.detail[:120]}" for r in results()])
    v.require("restarted_ranks_progress", len(after) == 2 and all(pid not in old_pids and step > killed_at
                                                                 for step, pid in after.values()),
              {"killed_at_step": killed_at, "before": {r: list(x) for r, x in sorted(before.items())},
               "after": {r: list(x) for r, x in sorted(after.items())}})


def agent_killed(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n7", None)
    v.expected.update(alert="sev1 node_lost", within_s=3.0)
    v.pages_allowed, v.decisions_allowed = {"node_lost"}, {"isolate_node"}
    wait_until(lambda: bool(rec.node_states("n7")), 60, rec.poll)
    _settle(rec, 3)
    killed = time.time()
    agent.kill_hard()
    opened = lambda: [t for t, a in rec.opened("node_lost") if a.subject.node == "n7"]
    wait_until(lambda: bool(opened()), 20, rec.poll)
    _settle(rec, 4)
    delay = opened()[0] - killed if opened() else None
    v.require("node_lost_in_time", delay is not None and delay <= 3.0, None if delay is None else round(delay, 3))


def agent_stopped_cleanly(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n8", None)
    v.expected.update(node_state="leaving", node_lost=False)
    wait_until(lambda: bool(rec.node_states("n8")), 60, rec.poll)
    _settle(rec, 3)
    agent.signal(signal.SIGTERM)
    wait_until(lambda: agent.proc.poll() is not None, 30, rec.poll)
    _settle(rec, 10)  # well past 2.5 missed heartbeats
    v.require("leaving", "leaving" in [s.state for _, s in rec.node_states("n8")])
    v.require("no_node_lost", not rec.opened("node_lost"))


def eight_silent(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agents = [AgentProcess(scene, f"r{i}", None) for i in range(8)]
    v.expected.update(incidents=1, kind="nodes_silent", resolved=True)
    v.pages_allowed = {"nodes_silent"}
    wait_until(lambda: all(rec.node_states(a.node) for a in agents), 90, rec.poll)
    _settle(rec, 4)
    for a in agents:  # the feed stops: every agent frozen at once
        os.killpg(a.proc.pid, signal.SIGSTOP)
    wait_until(lambda: bool(rec.opened()), 20, rec.poll)
    _settle(rec, 8)
    opened = rec.opened()
    for a in agents:
        os.killpg(a.proc.pid, signal.SIGCONT)
    ids = {a.incident_id for _, a in opened}
    wait_until(lambda: ids and all(any(a.incident_id == i and a.status == "resolved" for _, a in rec.alerts)
                                   for i in ids), 30, rec.poll)
    _settle(rec, 3)
    v.require("one_incident", len(rec.opened()) == 1, [f"{a.kind} {a.subject.model_dump(exclude_none=True)}"
                                                       for _, a in rec.opened()])
    v.require("shared_cause", any(a.kind == "nodes_silent" for _, a in rec.alerts))
    v.require("resolved", bool(ids) and all(any(a.incident_id == i and a.status == "resolved"
                                                for _, a in rec.alerts) for i in ids))


def repair_fails_health_check(scene: Scene, rec: Recorder, v: Verdict) -> None:
    """n9 comes back from repair and fails its check; the re-planner (on in this scene's worker) is what
    shows the engine's healthy capacity: a job that wants two nodes gets the healthy n10 alone, and n9
    once a later start of its agent passes."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": scene.bootstrap})
    repaired = NodeState(event_time=utcnow(), source=Source(node="n9"), state="repaired", reason="RMA returned")
    wants_two = JobState(event_time=utcnow(), source=Source(job="probe"), state="pending", gpus=2 * GPUS_PER_NODE,
                         min_gpus=GPUS_PER_NODE, reason="queued: wants two nodes, runs on one")
    for event in (repaired, wants_two):
        p.produce(topic_name(event.event_type, scene.prefix), encode(event), key=message_key(event))
    p.flush(10)
    agent = AgentProcess(scene, "n9", None, extra=("--health-min-free-gb", "1000000"))  # a check it cannot pass
    v.expected.update(node_state="unhealthy", reported="sev3 health_check_failed",
                      capacity="out: the re-plan when healthy n10 joins gives job probe (two nodes wanted) n10 alone",
                      back="a later start of n9 that passes: the re-plan gives probe n9 too")
    v.decisions_allowed = {"replan"}
    wait_until(lambda: any(a.kind == "health_check_failed" for _, a in rec.alerts), 60, rec.poll)

    def replans(trigger: str | None = None) -> list[Decision]:
        return [d for _, d in rec.decisions if d.action == "replan" and trigger in (None, d.plan.get("trigger"))]
    healthy = AgentProcess(scene, "n10", None)
    wait_until(lambda: bool(replans("node n10 joined")), 60, rec.poll)
    agent.signal(signal.SIGTERM)
    wait_until(lambda: agent.proc.poll() is not None, 30, rec.poll)
    failed_states = [s.state for _, s in rec.node_states("n9")]
    before = replans()
    again = AgentProcess(scene, "n9", None)  # repaired for real this time: the check passes
    wait_until(lambda: bool(replans("node n9 joined")), 60, rec.poll)
    given = lambda ds: [d.plan.get("allocations", {}).get("probe") for d in ds]
    v.require("unhealthy", "unhealthy" in failed_states and "joined" not in failed_states, failed_states)
    v.require("reported", any(a.kind == "health_check_failed" and a.severity == 3 for _, a in rec.alerts))
    v.require("capacity_out", bool(replans("node n10 joined")) and all("n9" not in (a or []) for a in given(before))
              and given(replans("node n10 joined"))[-1] == ["n10"],
              {d.plan.get("trigger"): d.plan.get("allocations") for d in before})
    v.require("back_after_passing", any("n9" in (a or []) for a in given(replans("node n9 joined"))),
              [d.plan.get("allocations") for d in replans("node n9 joined")])
    again.signal(signal.SIGTERM)
    healthy.signal(signal.SIGTERM)
    wait_until(lambda: again.proc.poll() is not None and healthy.proc.poll() is not None, 30, rec.poll)


repair_fails_health_check.worker_env = {"VIGIL_REPLAN": "true"}  # type: ignore[attr-defined]


def broker_down_20s(scene: Scene, rec: Recorder, v: Verdict) -> None:
    from vigil.streams.kafka import ensure_topics

    job = AgentProcess(scene, "b0", "steady", _spec())
    daemons = [AgentProcess(scene, f"b{i}", None) for i in (1, 2)]
    v.expected.update(node_lost=False, steps_lost=0)
    before = _StepReader(scene, "steady")
    wait_until(lambda: job.step() >= 15 and all(rec.node_states(d.node) for d in daemons), 90,
               lambda: (rec.poll(), before.poll()))
    first_pages = list(rec.pages())
    rec.close()
    # A crash, not a shutdown: a broker given SIGTERM acks for seconds more and then, tansu's log being
    # in memory, forgets what it acked. What it acked after the reader's last fetch is unknowable here
    # (a real broker would keep it), so steps up to the kill are judged by what the reader saw, and every
    # step made after the kill must arrive through the spool.
    scene.broker.stop(timeout_s=0)  # type: ignore[attr-defined]
    at_kill = {rank: step for rank, (step, _) in job.progress().items()}
    seen_before = before.close()
    time.sleep(20.0)  # the outage itself: 20 s with no broker
    scene.broker.start()  # type: ignore[attr-defined]  # same address, an empty log (tansu keeps it in memory)
    ensure_topics({"bootstrap.servers": scene.bootstrap}, scene.prefix)
    back_at_step = job.step()
    after = Recorder(scene)
    wait_until(lambda: False, 20.0, after.poll)  # what the worker says once it hears again
    steps = _steps_seen(scene, "steady")
    missing = [(r, s) for r in (0, 1) for s in range(at_kill.get(r, 0) + 1, back_at_step + 1) if (r, s) not in steps]
    window = {r: [s for s in range(1, at_kill.get(r, 0) + 1) if (r, s) not in seen_before | steps] for r in (0, 1)}
    pages = first_pages + after.pages()
    v.observed["steps_after_kill"] = [min(at_kill.values(), default=0) + 1, back_at_step]
    v.observed["in_flight_at_kill_unseen"] = window  # acked by the killed broker or lost: not judged
    v.require("no_node_lost", not [a for a in pages if a.kind in ("node_lost", "nodes_silent", "task_hang")],
              [f"{a.kind} {a.subject.model_dump(exclude_none=True)}" for a in pages])
    v.require("nothing_lost", back_at_step > max(at_kill.values(), default=0) and not missing, missing[:20])
    job.signal(signal.SIGTERM)
    wait_until(lambda: job.proc.poll() is not None, 60, after.poll)
    rec.events, rec._consumer = after.events, after._consumer  # judged on what came after too


class _StepReader:
    """(rank, step) of ``job``'s iteration records, read from the log as they arrive."""

    def __init__(self, scene: Scene, job: str) -> None:
        from vigil.streams.kafka import reader

        self.job = job
        self.seen: set[tuple[int, int]] = set()
        self._consumer = reader({"bootstrap.servers": scene.bootstrap},
                                [topic_name("iteration", scene.prefix)])

    def poll(self) -> None:
        from vigil.schemas import IterationTiming, decode

        for m in self._consumer.consume(1000, timeout=0):
            if m.error() is None and m.value() is not None:
                self.seen |= {(e.source.rank, e.step) for e in decode(m.value()).events
                              if isinstance(e, IterationTiming) and e.source.job == self.job}

    def close(self) -> set[tuple[int, int]]:
        self._consumer.close()
        return self.seen


broker_down_20s.own_broker = True  # type: ignore[attr-defined]


def _left_saved(agent: AgentProcess, rec: Recorder, v: Verdict, how: str, code: int,
                before: float | None = None) -> None:
    """The job saved and left as ``how``: every rank saved the same step (before ``before``), the agent
    exited ``code``, the ranks 0, and its lifecycle event names the step the ranks saved."""
    saved = agent.saved()
    steps = {step for step, _ in saved.values()}
    ended = [s for _, s in rec.job_states(agent.job or "") if s.state == how]
    v.require("exit_code", agent.proc.poll() == code, agent.proc.poll())
    v.require("every_rank_saved_one_step", len(saved) == 2 and len(steps) == 1, saved)
    if before is not None:
        last = max((t for _, t in saved.values()), default=None)
        v.require("saved_before_deadline", last is not None and last <= before,
                  None if last is None else round(last - before, 2))
    v.require(f"job_{how}", bool(ended), _states(rec, agent.job or ""))
    v.require("ranks_exit_0", bool(ended) and set(ended[-1].exit_codes.values()) == {0},
              ended[-1].exit_codes if ended else None)
    v.require("checkpoint_step_reported", bool(ended) and len(steps) == 1 and ended[-1].checkpoint_step in steps,
              ended[-1].checkpoint_step if ended else None)


def time_limit(scene: Scene, rec: Recorder, v: Verdict) -> None:
    deadline = time.time() + 20.0
    agent = AgentProcess(scene, "n1", "limited", _spec(ckpt_every=10, ckpt_x=5.0), actuate=True,
                         extra=("--deadline", f"{deadline:.3f}", "--run", "run-limited", "--checkpoint-estimate", "5"))
    v.expected.update(exit_code=0, job_state="time_limit", saved_before=deadline, pages=0, decisions=0)
    wait_until(lambda: agent.proc.poll() is not None, 60, rec.poll)
    _settle(rec, 5)
    _left_saved(agent, rec, v, "time_limit", 0, before=deadline)


def warned_usr1(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "warned", _spec(ckpt_every=10, ckpt_x=5.0), actuate=True,
                         extra=("--run", "run-warned"))
    v.expected.update(exit_code=0, job_state="preempted", pages=0, decisions=0)
    wait_until(lambda: agent.step() >= 15, 90, rec.poll)
    agent.signal_all(signal.SIGUSR1)  # sbatch --signal=USR1@600: every process of the step gets it
    wait_until(lambda: agent.proc.poll() is not None, 60, rec.poll)
    _settle(rec, 5)
    _left_saved(agent, rec, v, "preempted", 0)


def sigterm_grace(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "evicted", _spec(ckpt_every=10, ckpt_x=5.0), actuate=True,
                         extra=("--term-grace", "15"))
    v.expected.update(exit_code=143, job_state="cancelled", pages=0, decisions=0)
    wait_until(lambda: agent.step() >= 15, 90, rec.poll)
    agent.signal(signal.SIGTERM)  # a Kubernetes eviction: the container's first process, then SIGKILL after its grace
    wait_until(lambda: agent.proc.poll() is not None, 30, rec.poll)
    _settle(rec, 5)
    _left_saved(agent, rec, v, "cancelled", 143)


def chain_continues(scene: Scene, rec: Recorder, v: Verdict) -> None:
    first = AgentProcess(scene, "n1", "chain-1", _spec(ckpt_every=10, ckpt_x=5.0), actuate=True,
                         extra=("--deadline", f"{time.time() + CHAIN_WALLTIME_S:.3f}", "--run", "run-chained", "--checkpoint-estimate", "3"))
    wait_until(lambda: first.proc.poll() is not None, 60, rec.poll)
    # the ranks saved step N (the one they finished) and the next job resumes with N + 1
    resume = min((step for step, _ in first.saved().values()), default=0) + 1
    steps = _StepReader(scene, "chain-2")
    second = AgentProcess(scene, "n1", "chain-2", _spec(steps=resume + 20, start_step=resume), actuate=True,
                          extra=("--run", "run-chained"))
    v.expected.update(first_exit=0, second_exit=0, chain_broken=False, resumed_from=resume,
                      checkpoint_step=resume - 1)
    poll = lambda: (rec.poll(), steps.poll())  # noqa: E731
    wait_until(lambda: second.proc.poll() is not None, 90, poll)
    wait_until(lambda: False, CHAIN_TIMEOUT_S + 4, poll)  # past the chain's timeout, counted from the first job's end
    first_step = min((step for _, step in steps.close()), default=None)
    left = [s for _, s in rec.job_states("chain-1") if s.state == "time_limit"]
    v.require("first_exit", first.proc.poll() == 0, first.proc.poll())
    v.require("second_exit", second.proc.poll() == 0, second.proc.poll())
    v.require("second_completed", "completed" in _states(rec, "chain-2"), _states(rec, "chain-2"))
    v.require("checkpoint_step", bool(left) and left[-1].checkpoint_step == resume - 1,
              left[-1].checkpoint_step if left else _states(rec, "chain-1"))
    v.require("resumed_from", first_step == resume, first_step)


def chain_broken(scene: Scene, rec: Recorder, v: Verdict) -> None:
    agent = AgentProcess(scene, "n1", "orphan", _spec(ckpt_every=10, ckpt_x=5.0), actuate=True,
                         extra=("--deadline", f"{time.time() + CHAIN_WALLTIME_S:.3f}", "--run", "run-orphaned", "--checkpoint-estimate", "3"))
    v.expected.update(exit_code=0, alert="sev2 chain_broken of run run-orphaned",
                      within_s=CHAIN_TIMEOUT_S + 3.0, decisions=0)
    v.pages_allowed = {"chain_broken"}
    wait_until(lambda: agent.proc.poll() is not None, 60, rec.poll)
    ended = time.time()
    opened = lambda: [t for t, a in rec.opened("chain_broken") if a.subject.run == "run-orphaned"]
    wait_until(lambda: bool(opened()), CHAIN_TIMEOUT_S + 20, rec.poll)
    _settle(rec, 3)
    delay = opened()[0] - ended if opened() else None
    v.require("exit_code", agent.proc.poll() == 0, agent.proc.poll())
    v.require("chain_broken_not_early", delay is not None and delay >= CHAIN_TIMEOUT_S - 1.0)
    v.require("chain_broken_in_time", delay is not None and delay <= CHAIN_TIMEOUT_S + 3.0,
              None if delay is None else round(delay, 2))


#: The run-chain watch's timeout in the chain scenarios (the worker's VIGIL_CHAIN_TIMEOUT_S).
CHAIN_TIMEOUT_S = 8.0
#: The chain scenarios' time limit, from the agent's start: the ranks must be in their loop before the save
#: is asked for (limit - checkpoint estimate); at 15 s, torch starting two ranks on a host at load 8 took
#: longer, the agent ended the ranks unsaved (exit 143) and chain_broken failed for want of a scenario.
CHAIN_WALLTIME_S = 20.0
chain_continues.worker_env = chain_broken.worker_env = {"VIGIL_CHAIN_TIMEOUT_S": str(CHAIN_TIMEOUT_S)}  # type: ignore[attr-defined]


def _steps_seen(scene: Scene, job: str) -> set[tuple[int, int]]:
    """(rank, step) of every iteration record of ``job`` on the broker's log, up to its end when asked.

    Up to the end offsets read first, not "until nothing comes": a job still running keeps the topic
    busy, and reading until it paused took until the job ended (minutes).
    """
    from vigil.schemas import IterationTiming, decode
    from vigil.streams.kafka import reader

    consumer = reader({"bootstrap.servers": scene.bootstrap}, [topic_name("iteration", scene.prefix)])
    seen: set[tuple[int, int]] = set()
    try:
        left = {}
        for tp in consumer.assignment():
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            if high > low:
                left[tp.partition] = high
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.2):
                if m.error() is not None:
                    continue
                if m.partition() in left and m.offset() >= left[m.partition()] - 1:
                    del left[m.partition()]
                if m.value() is None:
                    continue
                seen |= {(e.source.rank, e.step) for e in decode(m.value()).events
                         if isinstance(e, IterationTiming) and e.source.job == job}
    finally:
        consumer.close()
    return seen


SCENARIOS: dict[str, Callable[[Scene, Recorder, Verdict], None]] = {
    "normal_completion": normal_completion,
    "job_cancelled": job_cancelled,
    "hang_after_clean_run": hang_after_clean_run,
    "crash_loop": crash_loop,
    "warmup": warmup,
    "checkpoint_pause": checkpoint_pause,
    "rank_killed": rank_killed,
    "agent_killed": agent_killed,
    "agent_stopped_cleanly": agent_stopped_cleanly,
    "eight_silent": eight_silent,
    "broker_down_20s": broker_down_20s,
    "repair_fails_health_check": repair_fails_health_check,
    "time_limit": time_limit,
    "warned_usr1": warned_usr1,
    "sigterm_grace": sigterm_grace,
    "chain_continues": chain_continues,
    "chain_broken": chain_broken,
}
#: The subset the integration tests run on every `make test`.
FAST = ("normal_completion", "rank_killed", "agent_stopped_cleanly", "time_limit", "chain_broken")
