"""The control channel's commands applied at step boundaries: retry in place, checkpoint, save and exit.

``dump_flight_recorder`` is the exception: the channel's thread serves it at
once (the rank may be stuck inside a collective and never reach a step
boundary) by sending this rank's flight-recorder dump, or why there is none.

"Save and exit" reaches the ranks of a distributed job at slightly
different step boundaries; they agree first (one all-reduce of a flag) so
that every rank saves the same step and none is left waiting in a
collective. :class:`CommandHooks` is a part of
:class:`~vigil.producers.training.monitor.TrainingMonitor`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable

from vigil.producers.training.control import Command, ControlChannel, control_path
from vigil.schemas.control import IMMEDIATE

if TYPE_CHECKING:
    from vigil.producers.training.monitor import StepContext

__all__ = ["CommandHooks"]


class CommandHooks:
    """The monitor's control commands (see the module docstring)."""

    def start_control(self, path: str | os.PathLike | None = None, on_checkpoint: Callable[[int], None] | None = None,
                      agree_every: int = 1) -> ControlChannel:
        """Listen for commands on ``path`` (default :func:`~vigil.producers.training.control.control_path`).

        "Save and exit" reaches the ranks at slightly different step
        boundaries; a rank that left alone would leave its peers blocked in
        the next step's collective. So in a ``torch.distributed`` job the
        ranks agree first: every ``agree_every`` steps one tiny all-reduce
        (MAX of a flag; on NCCL it waits for the step's GPU work) tells every
        rank whether any of them was asked; they then save and exit after the
        same step. ``agree_every=0``: no agreement (each rank acts alone).
        ``dump_flight_recorder`` is answered at once, from the channel's
        thread (:meth:`dump_flight_recorder`).
        """
        if agree_every < 0:
            raise ValueError(f"agree_every must be >= 0, got {agree_every}")
        self._on_checkpoint = on_checkpoint
        self._agree_every = agree_every
        self.control = ControlChannel(path or control_path(self.job, self.rank),
                                      handlers={Command.dump_flight_recorder: self._dump_on_request})
        return self.control

    def _dump_on_request(self) -> str:
        p = self.dump_flight_recorder("on_demand")
        if not p.get("available"):
            return f"flight recorder unavailable: {p.get('unavailable_reason')}"
        return f"flight recorder dumped: {len(p.get('entries') or [])} entries of {len(p.get('groups') or [])} group(s)"

    def _apply_commands(self, ctx: StepContext) -> None:
        if self.control is None:
            return
        for cmd in self.control.poll():
            self._apply(cmd, ctx)
        if self._agree_every and self._world() > 1 and ctx.step % self._agree_every == 0 and self._agree(self._exit_asked):
            self._exit_asked = False
            self._save_and_exit(ctx)

    def _world(self) -> int:
        if self._dist is None and "torch.distributed" in sys.modules:  # not instrumented: still a distributed job
            self._dist = sys.modules["torch.distributed"]
        dist = self._dist
        try:
            return dist.get_world_size() if dist is not None and dist.is_initialized() else 1
        except Exception:
            return 1

    def _agree(self, mine: bool) -> bool:
        """Was any rank asked? One all-reduce (MAX) of a flag, outside the timed collectives."""
        import torch  # noqa: PLC0415 - only reached in a torch.distributed job

        dist = self._dist
        device = "cuda" if "nccl" in str(dist.get_backend()).lower() else "cpu"
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
        self._originals.get("all_reduce", dist.all_reduce)(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _save_and_exit(self, ctx: StepContext) -> None:
        ctx.checkpoint_requested = True
        ctx.exit_requested = True
        self.exit_requested = True
        if self._on_checkpoint is not None:
            with self.checkpoint(ctx.step):
                self._on_checkpoint(ctx.step)

    def _apply(self, cmd: Command, ctx: StepContext) -> None:
        if cmd in IMMEDIATE:  # served by the channel's thread; never queued by it
            return
        ctx.commands.append(cmd)
        if cmd is Command.retry_step:
            ctx.retry = True
        elif cmd is Command.checkpoint:
            ctx.checkpoint_requested = True
            if self._on_checkpoint is not None:
                with self.checkpoint(ctx.step):
                    self._on_checkpoint(ctx.step)
        elif cmd is Command.save_and_exit:
            if self._agree_every and self._world() > 1:
                self._exit_asked = True  # the ranks agree at the next agreement step (see start_control)
            else:
                self._save_and_exit(ctx)

    def _handle_failure(self, ctx: StepContext) -> bool:
        """After a failed step: apply queued commands, wait ``retry_wait_s`` for one; True = retry."""
        if self.control is None:
            return False
        self._apply_commands(ctx)
        if not ctx.commands and self.retry_wait_s > 0:
            cmd = self.control.wait(self.retry_wait_s)
            if cmd is not None:
                self._apply(cmd, ctx)
        return ctx.retry and not ctx.exit_requested
