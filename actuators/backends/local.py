"""The local backend: acts on training processes of this node through their supervisor and control sockets.

==================  =====================================================================
action              what it does
==================  =====================================================================
retry_in_place      ``retry_step`` on the control socket of each rank of ``plan.ranks``
                    that runs here (all of the job's ranks here when the plan names none)
restart_process     ``ProcessControl.restart(job, reason)``: stop every rank, relaunch
checkpoint_restart  ``save_and_exit`` to each rank here (once the supervisor treats their
                    exits as deliberate), give them ``checkpoint_wait_s`` to save at their
                    next step boundary and exit, then restart (ranks that
                    are already dead, the usual reason for the decision, cannot save; the
                    detail names them). Why not ``checkpoint`` then restart at once: the
                    command is applied at a step boundary, and a restart right after it is
                    queued would kill the ranks before they save.
others              failed: not supported by the local backend
==================  =====================================================================

A restart whose plan asks for ``collect_diagnostics: ["flight_recorder"]``
(the decision engine does for a hang) first sends ``dump_flight_recorder`` to
every rank here, all at once, and waits at most ``dump_wait_s`` for their
answers: each rank's hooks publish its flight-recorder dump (or why there is
none) before it is stopped, so the hang's culprit can be named. A rank that
does not answer in time (no control channel, a dump that hangs) is named in
the result's detail, and the restart goes on.

``plan.nodes`` names the nodes whose processes restart; an actuator on a
node not named does nothing and says so (``succeeded``, "nothing to do on
node ..."). A rank's control socket is :func:`~vigil.schemas.control.control_path`
of the job and rank under ``control_dir``.

:class:`ProcessControl` is what the backend needs from a supervisor
(``vigil agent --actuate`` implements it on its
:class:`~vigil.producers.agent.process.ProcessSupervisor`);
:class:`ControlDirProcesses` is the stand-in for ``vigil actuate --backend
local`` with no supervisor: it finds ranks by their control sockets and
cannot restart anything.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from vigil.actuators.backends.base import Outcome, as_action, unsupported
from vigil.actuators.errors import ActuatorError, ActionCancelled
from vigil.actuators.plans import Action
from vigil.actuators.state import ActionState
from vigil.schemas.control import ControlError, control_path, send_command
from vigil.schemas import Decision

__all__ = ["ControlDirProcesses", "LocalBackend", "ProcessControl"]


@runtime_checkable
class ProcessControl(Protocol):
    """The training processes an actuator may act on, on this node."""

    def jobs(self) -> set[str]:
        """Jobs whose processes this supervisor runs."""
        ...

    def ranks(self, job: str) -> list[int]:
        """Global ranks of ``job`` that run under this supervisor (empty: none here)."""
        ...

    def restart(self, job: str, reason: str, wait_s: float = 0.0,
                prepare: Callable[[], bool] | None = None) -> None:
        """Stop every rank of ``job`` here and launch them again; raise on failure.

        ``prepare``, when given, is called once the supervisor regards the live
        ranks as stopped on purpose (their exits are not failures) and before
        it stops them; it returns True when it asked them to save and exit,
        and then they get up to ``wait_s`` to do so before being terminated.
        """
        ...


class LocalBackend:
    name = "local"
    supports = frozenset({"retry_in_place", "restart_process", "checkpoint_restart"})
    #: It touches only the processes it supervises: node names in a plan only say whether it acts,
    #: so the executor does not require them to be in its inventory (the job must be).
    acts_on_nodes = False

    def __init__(self, control: ProcessControl, control_dir: str | os.PathLike | None = None, *,
                 node: str | None = None, command_timeout_s: float = 5.0, checkpoint_wait_s: float = 120.0,
                 dump_wait_s: float = 5.0) -> None:
        if not command_timeout_s > 0:
            raise ValueError(f"command_timeout_s must be > 0, got {command_timeout_s}")
        if checkpoint_wait_s < 0:
            raise ValueError(f"checkpoint_wait_s must be >= 0, got {checkpoint_wait_s}")
        if not dump_wait_s > 0:
            raise ValueError(f"dump_wait_s must be > 0, got {dump_wait_s}")
        self.control = control
        self.control_dir = control_dir
        self.node = node
        self.command_timeout_s = command_timeout_s
        self.checkpoint_wait_s = checkpoint_wait_s
        self.dump_wait_s = dump_wait_s

    def _path(self, job: str, rank: int) -> Path:
        return control_path(job, rank, self.control_dir)

    def _send(self, job: str, ranks: list[int], command: str) -> tuple[list[int], list[str]]:
        ok, errors = [], []
        for r in ranks:
            try:
                send_command(self._path(job, r), command, timeout_s=self.command_timeout_s)
                ok.append(r)
            except (ControlError, OSError, ValueError) as exc:
                errors.append(f"rank {r}: {exc}")
        return ok, errors

    def _dump_first(self, job: str, ranks: list[int]) -> str:
        """Ask every rank for its flight-recorder dump at once; wait at most ``dump_wait_s`` in all.

        Returns what happened, for the result's detail. Never raises: the restart goes on regardless.
        """
        pool = ThreadPoolExecutor(max_workers=max(1, len(ranks)), thread_name_prefix="vigil-dump")
        try:
            futures = {pool.submit(send_command, self._path(job, r), "dump_flight_recorder",
                                   timeout_s=self.dump_wait_s): r for r in ranks}
            done, _ = wait(futures, timeout=self.dump_wait_s + 0.5)  # each send gives up by itself at dump_wait_s
        finally:
            pool.shutdown(wait=False)
        dumped, failed = [], []
        for fut, r in sorted(futures.items(), key=lambda kv: kv[1]):
            if fut not in done:
                failed.append(f"rank {r}: no answer within {self.dump_wait_s:g} s")
                continue
            try:
                fut.result()
                dumped.append(r)
            except (ControlError, OSError, ValueError) as exc:
                failed.append(f"rank {r}: {exc}")
        out = f"flight recorder dump asked of ranks {ranks}: answered by {dumped}"
        return out + (f"; not by {len(failed)}: {'; '.join(failed)[:800]}" if failed else "")

    def execute(self, decision: Decision | Action, dry_run: bool = False) -> Outcome:
        action = as_action(decision)
        if action.action not in self.supports:
            return unsupported(self.name, action.action, self.supports)
        job = action.job
        assert job is not None  # parse_action requires it for these actions
        here = sorted(self.control.ranks(job))
        if not here:
            running = sorted(self.control.jobs())
            return Outcome(ActionState.failed, f"job {job} has no ranks under this supervisor"
                           f"{' on node ' + self.node if self.node else ''} (it runs: {running or 'nothing'})")
        if action.nodes and self.node is not None and self.node not in action.nodes:
            return Outcome(ActionState.succeeded,
                           f"nothing to do on node {self.node}: not among the plan's nodes {list(action.nodes)}")
        if action.action == "retry_in_place":
            ranks = [r for r in action.ranks if r in here] if action.ranks else here
            if not ranks:
                return Outcome(ActionState.succeeded, f"nothing to do here: ranks {list(action.ranks)} of job {job} "
                               f"do not run under this supervisor (it runs ranks {here})")
            argv = [["send_command", str(self._path(job, r)), "retry_step"] for r in ranks]
            if dry_run:
                return Outcome(ActionState.succeeded, f"dry run: would send retry_step to ranks {ranks} of job {job}", argv)
            ok, errors = self._send(job, ranks, "retry_step")
            if errors:
                return Outcome(ActionState.failed, f"retry_step queued on ranks {ok} of job {job}; not delivered to "
                               f"{len(errors)}: {'; '.join(errors)[:1500]}", argv)
            return Outcome(ActionState.succeeded, f"retry_step queued on ranks {ok} of job {job}", argv)
        can_restart = getattr(self.control, "can_restart", True)
        if not can_restart:
            return Outcome(ActionState.failed, f"{action.action} needs the process supervisor that launched job {job}: "
                           "run `vigil agent --actuate -- <training command>` on the node; this actuator only "
                           "reaches the control sockets")
        reason = f"decision {action.decision_id}: {action.reason}"[:300]
        dump = "flight_recorder" in action.diagnostics
        first = [["send_command", str(self._path(job, r)), "dump_flight_recorder"] for r in here] if dump else []
        first_said = f"ask ranks {here} of job {job} for their flight-recorder dumps, then " if dump else ""
        dumped = "" if dry_run or not dump else self._dump_first(job, here) + "; "
        if action.action == "restart_process":
            argv = first + [["restart", job]]
            if dry_run:
                return Outcome(ActionState.succeeded, f"dry run: would {first_said}restart ranks {here} of job {job}",
                               argv)
            try:
                self.control.restart(job, reason)
            except ActionCancelled:
                raise
            except Exception as exc:
                return Outcome(ActionState.failed, f"{dumped}restart of job {job} failed: {type(exc).__name__}: {exc}",
                               argv)
            return Outcome(ActionState.succeeded, f"{dumped}restarted ranks {here} of job {job}", argv)
        # checkpoint_restart
        argv = first + [["send_command", str(self._path(job, r)), "save_and_exit"] for r in here]
        argv.append(["restart", job, f"--wait={self.checkpoint_wait_s:g}"])
        if dry_run:
            return Outcome(ActionState.succeeded, f"dry run: would {first_said}ask ranks {here} of job {job} to save "
                           f"and exit, then restart them", argv)
        asked: dict[str, list] = {"ok": [], "errors": []}

        def ask_to_save() -> bool:
            asked["ok"], asked["errors"] = self._send(job, here, "save_and_exit")
            return bool(asked["ok"])

        try:
            self.control.restart(job, reason, wait_s=self.checkpoint_wait_s, prepare=ask_to_save)
        except ActionCancelled:
            raise
        except Exception as exc:
            ok = asked["ok"]
            return Outcome(ActionState.failed, f"{dumped}ranks {ok} asked to save and exit, then the restart of job "
                           f"{job} failed: {type(exc).__name__}: {exc}", argv)
        ok, errors = asked["ok"], asked["errors"]
        saved = f"ranks {ok} asked to save and exit" if ok else "no rank could be asked to save"
        missed = f"; not reached (restarted from their last checkpoint): {'; '.join(errors)[:1000]}" if errors else ""
        return Outcome(ActionState.succeeded, f"{dumped}{saved}; restarted ranks {here} of job {job}{missed}", argv)


_SOCK = re.compile(r"^(?P<job>.+)\.rank(?P<rank>\d+)\.sock$")


class ControlDirProcesses:
    """Ranks found by their control sockets in ``control_dir``; restarting is not possible from here."""

    can_restart = False

    def __init__(self, control_dir: str | os.PathLike | None = None) -> None:
        self.control_dir = control_dir

    def _dir(self) -> Path:
        return control_path("x", 0, self.control_dir).parent

    def jobs(self) -> set[str]:
        try:
            names = os.listdir(self._dir())
        except OSError:
            return set()
        return {m["job"] for m in map(_SOCK.match, names) if m}

    def ranks(self, job: str) -> list[int]:
        prefix = control_path(job, 0, self.control_dir).name[: -len("0.sock")]
        try:
            names = os.listdir(self._dir())
        except OSError:
            return []
        out = []
        for name in names:
            if name.startswith(prefix) and name.endswith(".sock") and name[len(prefix):-5].isdigit():
                out.append(int(name[len(prefix):-5]))
        return sorted(out)

    def restart(self, job: str, reason: str, wait_s: float = 0.0,
                prepare: Callable[[], bool] | None = None) -> None:
        raise ActuatorError(f"cannot restart job {job}: no process supervisor here (run `vigil agent --actuate`)")
