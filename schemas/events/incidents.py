"""What vigil says: detector findings, alerts (one incident per root cause), decisions and their results."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import AwareDatetime, Field, PrivateAttr, model_validator

from vigil.schemas.envelope import INT64_MAX, Envelope, Frozen, Name, label_field, name_field, time_field
from vigil.schemas.evidence import FindingEvidence, evidence_of


class Subject(Frozen):
    """What an alert or decision is about; fields that do not apply stay unset."""

    job: str | None = name_field(None, "Training job id.")
    node: str | None = name_field(None, "Node host name.")
    gpu: int | None = Field(None, ge=0, le=1023, description="GPU index on the node.")
    rank: int | None = Field(None, ge=0, le=INT64_MAX, description="Global rank.")
    link: str | None = label_field(None, "Network link, e.g. node/mlx5_0:1.", max_length=1024)
    run: str | None = name_field(None, "Training run: a chain of jobs that resume one another.")


class Slowdown(Frozen):
    """A job running slower than it did: how much, of what kind, and where when localized."""

    job: str | None = name_field(None, "The job that slowed down.")
    before_s: float | None = Field(None, ge=0, description="Iteration time before the slowdown, in seconds.")
    after_s: float | None = Field(None, ge=0, description="Iteration time since the slowdown, in seconds.")
    rel_change: float | None = Field(None, description="after / before - 1.")
    slowdown_class: Literal["computation", "communication"] | None = Field(
        None, description="Which part of the step grew: computation (a slow GPU) or communication (a slow link); "
        "unset when it could not be told.")
    node: str | None = name_field(None, "Node of the straggler, when localized.")
    gpu: int | None = Field(None, ge=0, le=1023, description="GPU of the straggler on that node, when localized.")


class Alert(Envelope):
    """One version of an incident: opened, updated, or resolved.

    An incident is one root cause; ``incident_id`` is stable across versions and
    ``incident_version`` rises by one with each update, so consumers can apply
    alerts idempotently and in order.
    """

    event_type: Literal["alert"] = Field("alert", description="Event type tag.")
    incident_id: uuid.UUID = Field(description="Stable id of the incident (one root cause).")
    incident_version: int = Field(ge=1, le=INT64_MAX, description="Version of the incident, +1 per update.")
    status: Literal["open", "update", "resolved"] = Field(description="What this version says.")
    severity: int = Field(ge=1, le=3, description="1 = node/hardware must leave the job, 2 = restart, 3 = retry.")
    kind: str = label_field(description="Failure kind, e.g. node_lost, task_hang.")
    subject: Subject = Field(description="What failed.")
    onset_time: AwareDatetime = time_field(description="When the failure began (last sign of health).")
    detection_time: AwareDatetime = time_field(description="When vigil detected it.")
    summary: str = Field("", description="One line for a human.")
    evidence: list[dict[str, Any]] = Field(default_factory=list, description="Observations behind the alert (bounded sample).")
    evidence_count: int = Field(0, ge=0, le=INT64_MAX, description="How many pieces of evidence were seen in total.")
    detector: str = label_field(description="Name of the detector that raised it.")
    detector_version: str = label_field(description="Version of that detector.")
    jobs: dict[Name, list[Name]] = Field(default_factory=dict, description="Jobs the incident touches, each with the "
                                       "nodes it was seen running on: what a remedy acts on.")
    slowdowns: list[Slowdown] = Field(default_factory=list, description="The fail-slows in the incident, one per job.")


class DetectorFinding(Envelope):
    """What one detector found (or saw clear), before correlation into incidents.

    Detection workers publish findings; the correlator joins findings across
    signals and subjects into one incident per root cause.
    """

    event_type: Literal["finding"] = Field("finding", description="Event type tag.")
    status: Literal["raised", "cleared"] = Field(description="The condition began, or ended.")
    kind: str = label_field(description="What was found, e.g. node_lost, fail_slow, xid, congestion.")
    severity: int = Field(ge=1, le=3, description="Severity the detector assigns on its own.")
    subject: Subject = Field(description="What the finding is about.")
    onset_time: AwareDatetime = time_field(description="When the condition began.")
    detector: str = label_field(description="Detector name.")
    detector_version: str = label_field(description="Detector version.")
    job_nodes: list[Name] = Field(default_factory=list, description="Nodes the subject job runs on, when known.")
    affected_jobs: list[Name] = Field(default_factory=list, description="Jobs running on the subject node when it "
                                     "was found (what a node's failure takes down).")
    slowdown: Slowdown | None = Field(None, description="For a fail-slow or straggler: its size, class and place.")
    evidence: dict[str, Any] = Field(default_factory=dict, description="The detector's evidence.")

    # The typed view of ``evidence`` (vigil.schemas.evidence), made once when the finding is made or decoded.
    _facts: FindingEvidence | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _typed_evidence(self) -> "DetectorFinding":
        self._facts = evidence_of(self.kind, self.evidence)
        return self

    @property
    def facts(self) -> FindingEvidence:
        """What correlation reads of the evidence, typed for its kind (:mod:`vigil.schemas.evidence`)."""
        return self._facts if self._facts is not None else evidence_of(self.kind, self.evidence)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "DetectorFinding":
        copy = super().model_copy(update=update, deep=deep)
        if update and ("kind" in update or "evidence" in update):
            copy._facts = evidence_of(copy.kind, copy.evidence)  # not the original's view
        return copy


class Decision(Envelope):
    """What vigil decided to do about one or more incidents."""

    event_type: Literal["decision"] = Field("decision", description="Event type tag.")
    decision_id: uuid.UUID = Field(description="Id of the decision; actuators are idempotent on it.")
    idempotency_key: str = label_field(max_length=1 << 20, description="Key that makes a repeated decision a no-op.")
    action: Literal[
        "retry_in_place", "restart_process", "reconfigure", "isolate_node",
        "rebalance_microbatches", "adjust_topology", "checkpoint_restart", "replan", "notify_human", "none",
    ] = Field(description="Action to take.")
    target: Subject = Field(description="What the action applies to.")
    reason: str = Field(description="Why this action was chosen.")
    answers: list[uuid.UUID] = Field(default_factory=list, description="Incident ids this decision answers.")
    plan: dict[str, Any] = Field(default_factory=dict, description="Action-specific plan (placement, micro-batches...).")
    signature: str | None = Field(
        None, max_length=256, pattern=r"^v1:[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_-]{43}$",
        description="v1:<key id>:<HMAC-SHA256, base64url> of the canonical decision (vigil.schemas.signing), set by "
        "the decision engine's publisher; actuators refuse a decision without a valid one.")


class ActionResult(Envelope):
    """An actuator's report on executing a decision."""

    event_type: Literal["action_result"] = Field("action_result", description="Event type tag.")
    decision_id: uuid.UUID = Field(description="Decision this result belongs to.")
    state: Literal["pending", "running", "succeeded", "failed", "timed_out", "cancelled"] = Field(
        description="State reached (cancelled: its actuator stopped first; no verdict on the remedy).")
    backend: str = label_field(description="Executor that ran it: local, slurm, kubernetes, dry-run.")
    detail: str = Field("", description="What happened, for a human.")
