"""The Slurm backend: ``scontrol`` (and ``sbatch``/``scancel`` to resubmit), argv lists only.

==================  =====================================================================
action              commands
==================  =====================================================================
restart_process     ``scontrol requeue <job>`` (the whole job: Slurm has no per-node restart)
checkpoint_restart  ``scontrol requeue <job>`` (the job checkpoints on the SIGTERM Slurm sends)
isolate_node        ``scontrol update nodename=<n> state=drain reason=<reason>``
reconfigure         drain each excluded node, then ``scontrol requeue <job>``; or, with a
                    ``resubmit_script``: drain, ``sbatch --dependency=afterany:<job>
                    --exclude=<nodes> [--nodes=<workers>] <script>``, ``scancel <job>``
others              failed: not supported by the slurm backend
==================  =====================================================================

Requeue or resubmit: ``scontrol requeue`` keeps the job id and its size, and
Slurm places it again avoiding drained nodes; it cannot change the number of
nodes (a ``workers`` in the plan is then reported as not applied). When the
operator configures a ``resubmit_script`` (``vigil actuate
--slurm-resubmit-script``), ``reconfigure`` submits a replacement job that
starts only once the old one has ended (``afterany``: its last checkpoint is
complete), on ``workers`` nodes, away from the excluded ones, then cancels
the old job; the new job gets a new id, which vigil learns from ``job_state``
events. ``placement`` is not applied by Slurm (noted in the detail).

The drain reason is one argv element ``reason=vigil <decision>: <text>``,
control characters removed and length-capped; names are validated against
:data:`~vigil.actuators.plans.NAME_RE` before any command is built.
"""

from __future__ import annotations

import os
from pathlib import Path

from vigil.actuators.backends.base import COMMAND_TIMEOUT_S, CommandBackend
from vigil.actuators.plans import Action, clean_reason

__all__ = ["SlurmBackend"]


class SlurmBackend(CommandBackend):
    name = "slurm"
    supports = frozenset({"restart_process", "checkpoint_restart", "isolate_node", "reconfigure"})

    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S, *, resubmit_script: str | os.PathLike | None = None,
                 scontrol: str = "scontrol", sbatch: str = "sbatch", scancel: str = "scancel") -> None:
        super().__init__(timeout_s)
        self.resubmit_script = str(Path(resubmit_script).resolve()) if resubmit_script is not None else None
        self.scontrol, self.sbatch, self.scancel = scontrol, sbatch, scancel

    def _drain(self, node: str, action: Action) -> list[str]:
        reason = clean_reason(f"vigil {action.decision_id[:8]}: {action.reason or action.action}", 128)
        return [self.scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]

    def drained_by(self, argv: list[str]) -> str | None:
        if argv[:2] == [self.scontrol, "update"] and "state=drain" in argv:
            return next((a.split("=", 1)[1] for a in argv if a.startswith("nodename=")), None)
        return None

    def commands(self, action: Action) -> tuple[list[list[str]], list[str]]:
        notes: list[str] = []
        job = action.job
        if action.action in ("restart_process", "checkpoint_restart"):
            assert job is not None
            if action.nodes:
                notes.append(f"requeue restarts every node of job {job}, not only {list(action.nodes)}")
            return [[self.scontrol, "requeue", job]], notes
        if action.action == "isolate_node":
            assert action.node is not None
            return [self._drain(action.node, action)], notes
        # reconfigure
        assert job is not None
        argvs = [self._drain(n, action) for n in action.exclude_nodes]
        if action.placement is not None:
            notes.append("placement not applied by slurm")
        if self.resubmit_script is not None:
            sbatch = [self.sbatch, f"--dependency=afterany:{job}"]
            if action.exclude_nodes:
                sbatch.append(f"--exclude={','.join(action.exclude_nodes)}")
            if action.workers is not None:
                sbatch.append(f"--nodes={action.workers}")
            sbatch.append(self.resubmit_script)
            argvs += [sbatch, [self.scancel, job]]
        else:
            if action.workers is not None:
                notes.append(f"workers={action.workers} not applied: requeue keeps the job's size "
                             "(configure --slurm-resubmit-script to resubmit on fewer nodes)")
            argvs.append([self.scontrol, "requeue", job])
        return argvs, notes
