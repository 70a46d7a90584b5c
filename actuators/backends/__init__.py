"""Backends that carry out decisions: local process supervisor, Slurm, Kubernetes.

See :mod:`vigil.actuators.backends.base` for the contract (``name``, ``supports``,
``execute(decision, dry_run) -> Outcome``).
"""

from vigil.actuators.backends.base import Backend, CommandBackend, Outcome, run_command
from vigil.actuators.backends.kubernetes import KubernetesBackend
from vigil.actuators.backends.local import ControlDirProcesses, LocalBackend, ProcessControl
from vigil.actuators.backends.slurm import SlurmBackend

__all__ = [
    "Backend", "CommandBackend", "ControlDirProcesses", "KubernetesBackend", "LocalBackend", "Outcome",
    "ProcessControl", "SlurmBackend", "run_command",
]
