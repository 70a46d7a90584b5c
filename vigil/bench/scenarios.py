"""``vigil bench scenarios``: real job lifecycles on the real agent, judged against ground truth.

Each scenario runs on a real broker with a real ``vigil worker`` and real
``vigil agent`` processes launching real gloo torch ranks
(:mod:`vigil.bench.scenario_harness`), does something to them (lets the job
finish, cancels it, hangs or kills a rank, kills or stops an agent, freezes
eight agents, stops the broker), and compares what vigil published (alerts,
decisions, actions, job and node states, the agents' exit codes) with what
the scenario knows happened. A *false page* is a sev1/sev2 incident or a
decision the ground truth does not call for; a *miss* is a required
observation that did not come (or came too late).

JSON: ``{"scenarios": {NAME: {"passed", "expected", "observed", "false_pages",
"missed", "wall_s"}}, "passed", "total", "false_pages", "missed", "wall_s",
"machine", "command"}``: ``machine`` with the load average before and after,
``command`` what reproduces the run.

The scenarios themselves are in :mod:`vigil.bench.scenario_cases`, their
judgement in :mod:`vigil.bench.scenario_verdict`; this module runs them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from vigil.bench.scenario_cases import FAST, K, SCENARIOS, STEP_S  # noqa: F401 - (K, STEP_S: the old names)
from vigil.bench.scenario_harness import Recorder, Scene, WorkerProcess
from vigil.bench.scenario_verdict import Verdict

__all__ = ["SCENARIOS", "FAST", "run", "run_scenario", "Verdict"]


def run_scenario(name: str, bootstrap: str, root: Path) -> dict[str, Any]:
    """One scenario on the broker at ``bootstrap``: its own prefix, worker and processes."""
    from vigil.streams.kafka import ensure_topics

    from vigil.broker import TansuBroker, find_tansu

    (root / name).mkdir(parents=True, exist_ok=True)
    own = None
    if getattr(SCENARIOS[name], "own_broker", False):  # it stops its broker: one of its own
        own = TansuBroker(find_tansu(None), log_path=root / name / "tansu.log").start()
        bootstrap = own.bootstrap
    scene = Scene(root / name, bootstrap)
    scene.broker = own  # type: ignore[attr-defined]
    started = time.monotonic()
    verdict = Verdict()
    rec = None
    try:
        ensure_topics({"bootstrap.servers": bootstrap}, scene.prefix)
        worker = WorkerProcess(scene, env=getattr(SCENARIOS[name], "worker_env", None))
        worker.wait_ready()
        rec = Recorder(scene)
        t0 = time.time()
        SCENARIOS[name](scene, rec, verdict)
        out = verdict.judge(rec, t0)
    except Exception as exc:  # a scenario that cannot run fails, with the reason
        out = {"passed": False, "expected": verdict.expected, "observed": {"error": f"{type(exc).__name__}: {exc}",
                                                                          "trace": traceback.format_exc()[-2000:]},
               "false_pages": 0, "missed": 1}
    finally:
        if rec is not None:
            rec.close()
        scene.close()
        if own is not None:
            own.stop()
    if not out["passed"]:  # what the processes said, for whoever reads the failure
        out["observed"]["logs"] = scene.log_tails()
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


#: ``run`` arguments that ``vigil bench scenarios`` takes, and its options (``--only`` once per scenario).
CLI_OPTIONS = {"names": "--only..."}


def run(json_path: str | None, names: tuple[str, ...] | None = None, bootstrap: str | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the scenarios (all by default) on a broker of their own (or ``bootstrap``); write JSON.

    The JSON's ``command`` reproduces the run: ``vigil bench scenarios`` with
    each scenario named (``--only``), or the Python call when ``bootstrap``
    was given.
    """
    arguments = dict(locals())  # (first: the names imported below are not arguments)
    from vigil.bench.command import reproducing_command
    from vigil.bench.machine import machine_info
    from vigil.broker import TansuBroker, find_tansu

    command = reproducing_command(run, arguments, "vigil bench scenarios", CLI_OPTIONS)
    started = time.monotonic()
    load_before = os.getloadavg()
    names = names or tuple(SCENARIOS)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vigil-scenarios-") as tmp:
        broker = None
        if bootstrap is None:
            broker = TansuBroker(find_tansu(None), log_path=Path(tmp) / "tansu.log").start()
            bootstrap = broker.bootstrap
        try:
            for name in names:
                if progress is not None:
                    progress(name)
                results[name] = run_scenario(name, bootstrap, Path(tmp))
        finally:
            if broker is not None:
                broker.stop()
    out = {"scenarios": results, "passed": sum(r["passed"] for r in results.values()), "total": len(results),
           "false_pages": sum(r["false_pages"] for r in results.values()),
           "missed": sum(r["missed"] for r in results.values()), "wall_s": round(time.monotonic() - started, 1),
           "machine": {**machine_info(), "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]},
           "command": command}
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return out
