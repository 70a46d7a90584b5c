"""Backends that carry out decisions: local process supervisor, Slurm, Kubernetes.

See :mod:`actuators.backends.base` for the contract (``name``, ``supports``,
``execute(decision, dry_run) -> Outcome``).
"""

from actuators.backends.base import Backend, CommandBackend, Outcome, run_command
from actuators.backends.kubernetes import KubernetesBackend
from actuators.backends.local import ControlDirProcesses, LocalBackend, ProcessControl
from actuators.backends.slurm import SlurmBackend

__all__ = [
    "Backend", "CommandBackend", "ControlDirProcesses", "KubernetesBackend", "LocalBackend", "Outcome",
    "ProcessControl", "SlurmBackend", "run_command",
]
