"""What a backend is, and how the scheduler backends run their commands.

A backend has a ``name``, the set of actions it ``supports``, and
``execute(decision, dry_run) -> Outcome``. ``decision`` is a
:class:`~vigil.schemas.Decision` or an already validated
:class:`~vigil.actuators.plans.Action`; a backend validates what it is given
(names included) before it runs anything, so it is safe to call on its own.

Scheduler backends (:class:`CommandBackend`) turn an action into a list of
argv lists built only from validated fields, and run them one after the
other with :func:`run_command`: no shell, ever; a command that does not
finish within ``timeout_s`` is killed with its whole process group and the
outcome is ``timed_out``; a nonzero exit is ``failed`` with the tail of its
stderr; a missing executable is ``failed`` ("scontrol not found on PATH").
The first command that does not succeed stops the sequence, and the detail
says which commands had run before it (their effect stays: the outcome
says exactly what was done).

With ``dry_run`` nothing runs: the outcome is ``succeeded`` with "dry run:
would run ..." and the argv lists.

A drain or cordon that ran and succeeded is reported in the outcome's
``drained`` (:meth:`CommandBackend.drained_by` says which command takes which
node out), and the executor announces the node ``drained`` on the node
states topic: the operator's scheduler took it out, so its silence is no
loss and it is no capacity until it passes its check again.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from vigil.actuators.plans import Action, parse_action
from vigil.actuators.state import ActionState
from vigil.schemas import Decision

__all__ = ["Backend", "COMMAND_TIMEOUT_S", "CommandBackend", "CommandResult", "Outcome", "as_action", "run_command", "unsupported"]

STDERR_TAIL = 500


@dataclass(frozen=True)
class Outcome:
    """What a backend did: a final state, a detail for a human, and the commands (argv lists) it ran or would run."""

    state: ActionState
    detail: str
    argv: list[list[str]] = field(default_factory=list)
    #: Nodes this action took out of service (a drain or cordon that ran and succeeded, whatever came after it):
    #: the executor announces each as ``drained``.
    drained: tuple[str, ...] = ()


@runtime_checkable
class Backend(Protocol):
    name: str
    supports: frozenset[str]

    def execute(self, decision: Decision | Action, dry_run: bool = False) -> Outcome: ...


def as_action(decision: Decision | Action) -> Action:
    return decision if isinstance(decision, Action) else parse_action(decision)


def unsupported(backend: str, action: str, supported: frozenset[str]) -> Outcome:
    return Outcome(ActionState.failed,
                   f"{action} is not supported by the {backend} backend (it supports: {', '.join(sorted(supported))})")


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    state: ActionState
    detail: str


def run_command(argv: list[str], timeout_s: float) -> CommandResult:
    """Run one argv list (no shell); a hang is killed with its process group after ``timeout_s``."""
    shown = shlex.join(argv)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except FileNotFoundError:
        return CommandResult(argv, ActionState.failed, f"{argv[0]} not found on PATH")
    except PermissionError as exc:
        return CommandResult(argv, ActionState.failed, f"{argv[0]} cannot be executed: {exc.strerror}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it started
        except ProcessLookupError:
            pass
        proc.communicate()
        return CommandResult(argv, ActionState.timed_out, f"{shown} did not finish within {timeout_s:g} s; killed")
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-STDERR_TAIL:] or out.decode(errors="replace").strip()[-STDERR_TAIL:]
        how = f"exit code {proc.returncode}" if proc.returncode > 0 else f"killed by signal {-proc.returncode}"
        return CommandResult(argv, ActionState.failed, f"{shown} failed ({how}): {tail or '(no output)'}")
    return CommandResult(argv, ActionState.succeeded, shown)


#: How long a scheduler command (scontrol, sbatch, kubectl) may run before it is killed: ``timed_out``.
COMMAND_TIMEOUT_S = 60.0


class CommandBackend:
    """A backend that acts through scheduler commands; subclasses implement :meth:`commands`."""

    name = "command"
    supports: frozenset[str] = frozenset()

    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s

    def commands(self, action: Action) -> tuple[list[list[str]], list[str]]:
        """The argv lists for ``action`` and notes for the detail (what the backend does not apply)."""
        raise NotImplementedError

    def drained_by(self, argv: list[str]) -> str | None:
        """The node that ``argv`` (one of :meth:`commands`' lists) takes out of service, if it does."""
        return None

    def drained(self, argvs: list[list[str]], succeeded: bool) -> tuple[str, ...]:
        """The nodes that ``argvs`` as run took out of service: all of them when the sequence succeeded, else
        all but the last (the command that failed)."""
        ran = argvs if succeeded else argvs[:-1]
        return tuple(dict.fromkeys(n for a in ran if (n := self.drained_by(a)) is not None))

    def execute(self, decision: Decision | Action, dry_run: bool = False) -> Outcome:
        action = as_action(decision)
        if action.action not in self.supports:
            return unsupported(self.name, action.action, self.supports)
        argvs, notes = self.commands(action)
        note = f" ({'; '.join(notes)})" if notes else ""
        if dry_run:
            return Outcome(ActionState.succeeded,
                           f"dry run: would run {' && '.join(shlex.join(a) for a in argvs)}{note}", argvs)
        done: list[str] = []
        for argv in argvs:
            result = run_command(argv, self.timeout_s)
            if result.state is not ActionState.succeeded:
                before = f"; ran before it: {' && '.join(done)}" if done else "; nothing ran before it"
                ran = argvs[:len(done) + 1]
                return Outcome(result.state, result.detail + before + note, ran, self.drained(ran, False))
            done.append(result.detail)
        return Outcome(ActionState.succeeded, f"ran {' && '.join(done)}{note}", argvs, self.drained(argvs, True))
