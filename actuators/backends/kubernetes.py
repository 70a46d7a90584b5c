"""The Kubernetes backend: ``kubectl`` argv lists only.

==================  =====================================================================
action              commands
==================  =====================================================================
isolate_node        ``kubectl cordon <node>``
restart_process     ``kubectl delete pod -n <ns> -l <label>=<job> --wait=false``; with
                    ``plan.nodes``, one per node with ``--field-selector spec.nodeName=<n>``
checkpoint_restart  as restart_process: the pods get SIGTERM and their termination grace
                    period, which is when the training checkpoints
reconfigure         ``kubectl cordon`` each excluded node, delete the job's pods on those
                    nodes (a cordon does not move running pods), then ``kubectl scale
                    <kind>/<job> -n <ns> --replicas=<workers>`` when ``workers`` is given
others              failed: not supported by the kubernetes backend
==================  =====================================================================

The label key (default ``job-name``, what a batch/v1 Job puts on its pods),
the namespace and the kind to scale (default ``statefulset``) are the
operator's configuration, not the decision's. ``placement`` is not applied
(noted in the detail).
"""

from __future__ import annotations

from vigil.actuators.backends.base import COMMAND_TIMEOUT_S, CommandBackend
from vigil.actuators.plans import Action, check_name

__all__ = ["KubernetesBackend"]


class KubernetesBackend(CommandBackend):
    name = "kubernetes"
    supports = frozenset({"isolate_node", "restart_process", "checkpoint_restart", "reconfigure"})

    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S, *, namespace: str = "default", job_label: str = "job-name",
                 kind: str = "statefulset", kubectl: str = "kubectl") -> None:
        super().__init__(timeout_s)
        self.namespace = check_name(namespace, "namespace")
        if not job_label or any(c in job_label for c in "=,! \t\n") or job_label.startswith("-"):
            raise ValueError(f"job label key {job_label!r} is not a plain label key")
        self.job_label = job_label
        self.kind = check_name(kind, "kind")
        self.kubectl = kubectl

    def _delete_pods(self, job: str, node: str | None = None) -> list[str]:
        argv = [self.kubectl, "delete", "pod", "-n", self.namespace, "-l", f"{self.job_label}={job}", "--wait=false"]
        if node is not None:
            argv.append(f"--field-selector=spec.nodeName={node}")
        return argv

    def drained_by(self, argv: list[str]) -> str | None:
        return argv[2] if argv[:2] == [self.kubectl, "cordon"] and len(argv) == 3 else None

    def commands(self, action: Action) -> tuple[list[list[str]], list[str]]:
        notes: list[str] = []
        job = action.job
        if action.action == "isolate_node":
            assert action.node is not None
            return [[self.kubectl, "cordon", action.node]], notes
        assert job is not None
        if action.action in ("restart_process", "checkpoint_restart"):
            if action.nodes:
                return [self._delete_pods(job, n) for n in action.nodes], notes
            return [self._delete_pods(job)], notes
        # reconfigure
        argvs = [[self.kubectl, "cordon", n] for n in action.exclude_nodes]
        argvs += [self._delete_pods(job, n) for n in action.exclude_nodes]
        if action.workers is not None:
            argvs.append([self.kubectl, "scale", f"{self.kind}/{job}", "-n", self.namespace,
                          f"--replicas={action.workers}"])
        if action.placement is not None:
            notes.append("placement not applied by kubernetes")
        return argvs, notes
