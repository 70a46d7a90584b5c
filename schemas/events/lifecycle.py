"""Lifecycle events: a job's spec and state, a node's availability, a checkpoint; what ends a job, what
takes a node away on purpose."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from vigil.schemas.envelope import INT64_MAX, Envelope, Name, name_field

#: GPUs per node in the plans vigil makes (HGX/DGX nodes): the one home of this figure.
GPUS_PER_NODE = 8


#: Job states that end a job (its detection stops; its incidents of the past resolve).
JOB_ENDED = frozenset({"completed", "failed", "cancelled", "preempted", "time_limit"})
#: Node states in which a node is out of service on purpose: its silence is no loss.
NODE_AWAY = frozenset({"leaving", "drained", "maintenance"})


class JobState(Envelope):
    """A job's spec and lifecycle state (published on submit and on every change).

    A job ends ``completed`` (every rank exited 0), ``failed`` (its launcher
    gave up), ``cancelled`` (the scheduler or a user stopped it),
    ``preempted`` or ``time_limit`` (it saved and left before the scheduler
    killed it). None of these is a failure to page about.
    """

    event_type: Literal["job_state"] = Field("job_state", description="Event type tag.")
    state: Literal["pending", "running", "restarting", "completed", "failed", "cancelled", "preempted",
                   "time_limit"] = Field(description="Lifecycle state of the job.")
    reason: str = Field("", max_length=2000, description="Why the state changed, for a human.")
    exit_codes: dict[str, Annotated[int, Field(ge=-255, le=255)]] = Field(default_factory=dict, description="Global rank -> exit code (negative: "
                                       "killed by that signal), when the job's processes ended.")
    restart_count: int = Field(0, ge=0, le=INT64_MAX, description="Restarts of the job's processes so far.")
    run: str | None = name_field(None, "The training run this job belongs to: one run across a chain of jobs that "
                                 "resume each other.")
    checkpoint_step: int | None = Field(None, ge=0, le=INT64_MAX, description="Step of the checkpoint the job saved on leaving.")
    checkpoint_s: float | None = Field(None, ge=0, description="Seconds that checkpoint took.")
    nodes: list[Name] = Field(default_factory=list, description="Nodes the job runs on.")
    gpus: int = Field(0, ge=0, le=INT64_MAX, description="GPUs the job holds.")
    dp: int = Field(1, ge=1, le=INT64_MAX, description="Data-parallel size.")
    pp: int = Field(1, ge=1, le=INT64_MAX, description="Pipeline-parallel size.")
    tp: int = Field(1, ge=1, le=INT64_MAX, description="Tensor-parallel size.")
    weight: float = Field(1.0, gt=0, description="Priority weight of the job.")
    min_gpus: int = Field(0, ge=0, le=INT64_MAX, description="Fewest GPUs the job can run on.")


class NodeState(Envelope):
    """A node's availability as vigil or the scheduler sees it.

    ``joined``: an agent started on it and it passed its health check;
    ``unhealthy``: it failed that check and stays out of capacity;
    ``leaving``: its agent stopped cleanly (its silence is no loss);
    ``drained`` / ``maintenance``: taken out of service on purpose;
    ``repaired``: back from repair (it still has to pass its check).
    """

    event_type: Literal["node_state"] = Field("node_state", description="Event type tag.")
    state: Literal["healthy", "degraded", "drained", "lost", "repaired", "joined", "leaving", "maintenance",
                   "unhealthy"] = Field(description="Availability of the node.")
    reason: str = Field("", max_length=2000, description="Why the state changed.")
    checks: dict[str, str] = Field(default_factory=dict, description="Health checks run before joining: "
                                   "name -> 'ok' or what failed.")


class Checkpoint(Envelope):
    """A training process saving a checkpoint: its start and its end (the hooks' ``mon.checkpoint()``).

    While a checkpoint is under way the job makes no progress on purpose:
    hang detection waits for it, and its duration is what a graceful exit
    before a time limit must leave room for.
    """

    event_type: Literal["checkpoint"] = Field("checkpoint", description="Event type tag.")
    step: int = Field(ge=0, description="Training step the checkpoint saves.")
    phase: Literal["started", "completed", "failed"] = Field(description="Which end of the checkpoint this is.")
    duration_s: float | None = Field(None, ge=0, description="Seconds it took (on completed or failed).")
