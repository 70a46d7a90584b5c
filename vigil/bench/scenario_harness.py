"""The parts a scenario runs: a broker, a worker, node agents launching real torch ranks, and a recorder.

Everything is the real thing a user runs: a tansu broker, ``vigil worker``
and ``vigil agent`` as subprocesses (``python -m vigil.cli``), the training
script of :mod:`vigil.bench.scenario_train` with gloo ranks. Each scenario
gets its own topic prefix and consumer group on the suite's broker (or a
broker of its own when it stops one), and every process it starts is
stopped by its PID when it ends.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vigil.schemas import ActionResult, Alert, Decision, Envelope, JobState, NodeState, decode

__all__ = ["AgentProcess", "Recorder", "Scene", "WorkerProcess", "wait_until"]

TRAIN = Path(__file__).with_name("scenario_train.py")


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll: Callable[[], Any] | None = None,
               every_s: float = 0.05) -> bool:
    """Poll ``predicate`` (calling ``poll()`` between tries) until it holds or ``timeout_s`` passes.

    ``poll`` is expected to wait for news itself (:meth:`Recorder.poll` waits up to 50 ms for a message), so
    there is no sleep after it: a sleep would add its length to every latency read off the recorder.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if predicate():
            return True
        if poll is None:
            time.sleep(every_s)
    return predicate()


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Scene:
    """One scenario's world: its folder, broker address, topic prefix and group; what it started."""

    root: Path
    bootstrap: str
    prefix: str = field(default_factory=lambda: f"scn-{uuid.uuid4().hex[:8]}")
    processes: list[subprocess.Popen] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # ranks left behind by a killed agent
    logs: list[Path] = field(default_factory=list)  # the logs of what it started, for a failed scenario's report
    #: Unix socket paths must stay under 108 bytes: a deep pytest folder does not, so sockets live here
    sockets: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vgs-", dir="/tmp")))
    #: the key the worker signs decisions with and the acting agents verify them by, as an operator configures
    decision_keys: str = field(default_factory=lambda: json.dumps({"scenes": base64.b64encode(os.urandom(32)).decode()}))

    def log_tails(self, chars: int = 2000) -> dict[str, str]:
        return {str(p.relative_to(self.root)): p.read_text(errors="replace")[-chars:] for p in self.logs if p.exists()}

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "VIGIL_KAFKA_BOOTSTRAP": self.bootstrap, "VIGIL_TOPIC_PREFIX": self.prefix,
                "VIGIL_DECISION_KEYS": self.decision_keys,
                "VIGIL_GROUP_ID": f"{self.prefix}-detect", "PYTHONUNBUFFERED": "1", **extra}

    def close(self) -> None:
        for proc in reversed(self.processes):
            _stop(proc)
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.sockets, ignore_errors=True)


class WorkerProcess:
    """``vigil worker`` for the scene."""

    def __init__(self, scene: Scene, env: dict[str, str] | None = None) -> None:
        self.dir = scene.root / "worker"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ready = self.dir / "ready"
        self.log = self.dir / "worker.log"
        scene.logs.append(self.log)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "vigil.cli", "worker", "--ready-file", str(self.ready),
                                          "--log-level", "INFO"], env=scene.env(VIGIL_STATE_DIR=str(self.dir), **(env or {})),
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        scene.processes.append(self.proc)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        if not wait_until(lambda: self.ready.exists() or self.proc.poll() is not None, timeout_s) \
                or self.proc.poll() is not None:
            raise RuntimeError(f"worker not ready; log:\n{self.log.read_text()[-3000:]}")


class AgentProcess:
    """``vigil agent`` on one (pretend) node: a node daemon, or the launcher of a job's ranks."""

    def __init__(self, scene: Scene, node: str, job: str | None = None, spec: dict[str, Any] | None = None,
                 nproc: int = 2, actuate: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.node, self.job = node, job
        self.dir = scene.root / f"agent-{node}-{job or 'daemon'}-{uuid.uuid4().hex[:4]}"
        self.dir.mkdir(parents=True)
        sockets = scene.sockets / self.dir.name
        sockets.mkdir()
        (self.dir / "progress").mkdir()
        (self.dir / "nic").mkdir()
        self.log = self.dir / "agent.log"
        scene.logs.append(self.log)
        kmsg = self.dir / "kmsg"
        kmsg.touch()
        argv = [sys.executable, "-m", "vigil.cli", "agent", "--node", node, "--no-gpu", "--kmsg", str(kmsg),
                "--nic-root", str(self.dir / "nic"), "--hooks-socket", str(sockets / "hooks.sock"),
                "--control-dir", str(sockets / "ctl"), "--log-level", "INFO", *extra]
        if job is not None:
            assert spec is not None
            spec = {**spec, "progress": str(self.dir / "progress")}
            argv += ["--job", job, "--nproc-per-node", str(nproc), "--master-port", str(_free_port())]
            if actuate:
                argv += ["--actuate"]
            train = self.dir / "train.py"
            train.write_text(TRAIN.read_text())
            argv += ["--", sys.executable, str(train), json.dumps(spec)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=scene.env(VIGIL_STATE_DIR=str(self.dir)), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.started = time.time()
        scene.processes.append(self.proc)
        self.scene = scene

    def progress(self) -> dict[int, tuple[int, int]]:
        """rank -> (last step, pid), from the ranks' own files."""
        out = {}
        for f in (self.dir / "progress").glob("rank*"):
            try:
                step, pid = f.read_text().split()
                out[int(f.name[4:])] = (int(step), int(pid))
            except (OSError, ValueError):
                continue
        return out

    def saved(self) -> dict[int, tuple[int, float]]:
        """rank -> (step, time) of the save vigil asked for, from the ranks' own files."""
        out = {}
        for f in (self.dir / "progress").glob("saved*"):
            try:
                step, at = f.read_text().split()
                out[int(f.name[5:])] = (int(step), float(at))
            except (OSError, ValueError):
                continue
        return out

    def signal_all(self, sig: int) -> None:
        """What a Slurm signal does: the agent and every process it started get it."""
        os.killpg(self.proc.pid, sig)

    def step(self) -> int:
        p = self.progress()
        return min((s for s, _ in p.values()), default=-1)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill_hard(self) -> None:
        """kill -9 the agent alone: its ranks live on (reaped at the scene's end)."""
        self.scene.pids += [pid for _, pid in self.progress().values()]
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


class Recorder:
    """Everything the scene's vigil published: alerts, decisions, actions, job and node states (no group)."""

    def __init__(self, scene: Scene) -> None:
        from vigil.streams.kafka import reader
        from vigil.schemas import topic_name

        topics = [topic_name(t, scene.prefix) for t in ("alert", "decision", "action_result", "job_state",
                                                         "node_state")]
        self._consumer = reader({"bootstrap.servers": scene.bootstrap}, topics)
        self.events: list[tuple[float, Envelope]] = []  # (arrival on this clock, event)

    def poll(self, wait_s: float = 0.05) -> None:
        """Read what has arrived, waiting up to ``wait_s`` for the first message."""
        from vigil.streams.kafka import take

        for msg in take(self._consumer, 500, wait_s):
            if msg.error() is None and msg.value() is not None:
                now = time.time()
                self.events += [(now, ev) for ev in decode(msg.value()).events]

    def close(self) -> None:
        self._consumer.close()

    def of(self, cls: type) -> list[tuple[float, Any]]:
        return [(t, e) for t, e in self.events if isinstance(e, cls)]

    @property
    def alerts(self) -> list[tuple[float, Alert]]:
        return self.of(Alert)

    @property
    def decisions(self) -> list[tuple[float, Decision]]:
        return self.of(Decision)

    @property
    def actions(self) -> list[tuple[float, ActionResult]]:
        return self.of(ActionResult)

    def job_states(self, job: str) -> list[tuple[float, JobState]]:
        return [(t, e) for t, e in self.of(JobState) if e.source.job == job]

    def node_states(self, node: str) -> list[tuple[float, NodeState]]:
        return [(t, e) for t, e in self.of(NodeState) if e.source.node == node]

    def opened(self, kind: str | None = None, max_severity: int = 3) -> list[tuple[float, Alert]]:
        """First version of each incident, by kind, at this severity or worse."""
        first: dict[Any, tuple[float, Alert]] = {}
        for t, a in self.alerts:
            first.setdefault(a.incident_id, (t, a))
        return [(t, a) for t, a in first.values() if (kind is None or a.kind == kind) and a.severity <= max_severity]

    def pages(self) -> list[Alert]:
        """Incidents that reached sev1 or sev2 at any version (what pages a human)."""
        worst: dict[Any, Alert] = {}
        for _, a in self.alerts:
            if a.status != "resolved" and (a.incident_id not in worst or a.severity < worst[a.incident_id].severity):
                worst[a.incident_id] = a
        return [a for a in worst.values() if a.severity <= 2]


def _free_port() -> int:
    from vigil.broker import free_port

    return free_port()
