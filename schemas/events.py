"""Every event vigil reads or writes, as frozen pydantic v2 models.

Each model fixes ``event_type`` to a literal; :data:`EVENT_TYPES` maps that
name to the model. Telemetry comes from node agents, training hooks and the
simulator; alerts, decisions and action results are what vigil itself says.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, PrivateAttr, model_validator

from vigil.schemas.envelope import (
    INT32_MAX, INT64_MAX, INT64_MIN, Count, Envelope, Frozen, Label, Name, label_field,
    name_field, time_field,
)
from vigil.schemas.evidence import FindingEvidence, evidence_of

#: An unsigned 64-bit counter as the kernel reports it (stored as JSON text, not as an Int64 column).
U64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
#: A GPU index on a node.
GpuIndex = Annotated[int, Field(ge=0, le=1023)]

# --- telemetry --------------------------------------------------------------

#: A timing figure of an iteration record, and the ways one can be measured (see ``IterationTiming.measured``).
TimingFigure = Literal["compute_s", "communication_s", "wait_s"]
TimingMethod = Literal["cuda_events", "cuda_events_remainder", "cpu_wall", "cpu_wall_remainder", "external"]


class IterationTiming(Envelope):
    """One training iteration of one rank, with its compute/communication split."""

    event_type: Literal["iteration"] = Field("iteration", description="Event type tag.")
    step: int = Field(ge=0, le=INT64_MAX, description="Training step (iteration) number.")
    start: AwareDatetime = time_field(description="When the iteration began.")
    end: AwareDatetime = time_field(description="When the iteration completed.")
    duration_s: float = Field(ge=0, description="Iteration wall time in seconds (end - start).")
    compute_s: float | None = Field(None, ge=0, description="Seconds spent computing (forward/backward/optimizer).")
    communication_s: float | None = Field(None, ge=0, description="Seconds spent in (or waiting on) collectives.")
    dp: int | None = Field(None, ge=0, le=INT64_MAX, description="Data-parallel coordinate of the rank.")
    pp: int | None = Field(None, ge=0, le=INT64_MAX, description="Pipeline-parallel coordinate (stage) of the rank.")
    tp: int | None = Field(None, ge=0, le=INT64_MAX, description="Tensor-parallel coordinate of the rank.")
    wait_s: float | None = Field(None, ge=0, description=(
        "Seconds blocked waiting for peers outside collectives (pipeline bubbles, point-to-point send/recv "
        "waits); counted in neither compute_s nor communication_s."))
    communication_by_kind: dict[str, float] = Field(default_factory=dict, description=(
        "Seconds in collectives per kind of process group (the group name's part before a colon: tp, dp, "
        "world...), and in point-to-point operations under pp; empty when not measured."))
    measured: dict[TimingFigure, TimingMethod] = Field(default_factory=dict, description=(
        "How each figure was measured: figure -> method. cuda_events: CUDA events recorded on the stream the "
        "work ran on (device time); cuda_events_remainder: the device span of the step minus the measured "
        "blocked time; cpu_wall: the host clock around the calls (true where the work runs on the calling "
        "thread, as with gloo; only the launch cost of a CUDA collective); cpu_wall_remainder: the host step "
        "time minus the measured blocked time; external: supplied by the caller. Empty: not stated "
        "(producers before this field)."))
    config_change: str | None = Field(None, min_length=1, max_length=2000, description=(
        "A change of the job's configuration that takes effect at this step, announced by the training process "
        "(TrainingMonitor.note_change: a new batch size or sequence length, a resize...): why, for a human. The "
        "step time may shift from here on purpose, so the job's fail-slow detection starts afresh. None: no "
        "change announced."))

    @model_validator(mode="after")
    def _end_after_start(self) -> "IterationTiming":
        if self.end < self.start:
            raise ValueError(f"end ({self.end.isoformat()}) is before start ({self.start.isoformat()})")
        return self


class IterationStep(Envelope):
    """One step of a job with every rank's timings in columns: one message per job per step.

    At thousands of ranks per job, per-rank events cost more to move and parse
    than the detection on them; columns make a step one record to handle.
    Element ``i`` of every list belongs to rank ``ranks[i]``.
    """

    event_type: Literal["iteration_step"] = Field("iteration_step", description="Event type tag.")
    step: int = Field(ge=0, le=INT64_MAX, description="Training step (iteration) number.")
    start: AwareDatetime = time_field(description="When the step began.")
    end: AwareDatetime = time_field(description="When the step completed (on every rank: it is synchronous).")
    duration_s: float = Field(ge=0, description="Step wall time in seconds.")
    ranks: list[Count] = Field(min_length=1, description="Global ranks, one per column element.")
    nodes: list[Name] = Field(description="Node of each rank.")
    gpus: list[GpuIndex] = Field(description="GPU index of each rank on its node.")
    compute_s: list[float] = Field(description="Seconds each rank spent computing.")
    communication_s: list[float] = Field(description="Seconds each rank spent in (or waiting on) collectives.")
    dp: list[Count] = Field(description="Data-parallel coordinate of each rank.")
    pp: list[Count] = Field(description="Pipeline-parallel coordinate (stage) of each rank.")
    tp: list[Count] = Field(description="Tensor-parallel coordinate of each rank.")
    wait_s: list[float] = Field(default_factory=list, description=(
        "Seconds each rank was blocked waiting for peers outside collectives (pipeline bubbles, P2P waits); "
        "empty when not measured (a ClickHouse array cannot be null)."))
    measured: dict[TimingFigure, TimingMethod] = Field(default_factory=dict, description=(
        "How the figures were measured (as IterationTiming.measured), when every rank measured them alike."))
    config_change: str | None = Field(None, min_length=1, max_length=2000, description=(
        "A change of the job's configuration that takes effect at this step (as IterationTiming.config_change): "
        "the job's fail-slow detection starts afresh. None: no change announced."))

    @model_validator(mode="after")
    def _columns_align(self) -> "IterationStep":
        n = len(self.ranks)
        for name in ("nodes", "gpus", "compute_s", "communication_s", "dp", "pp", "tp"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} elements, ranks has {n}")
        if self.wait_s and len(self.wait_s) != n:
            raise ValueError(f"wait_s has {len(self.wait_s)} elements, ranks has {n} (or none: not measured)")
        if self.end < self.start:
            raise ValueError(f"end ({self.end.isoformat()}) is before start ({self.start.isoformat()})")
        return self


class CollectiveOp(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    broadcast = "broadcast"
    all_to_all = "all_to_all"
    send = "send"
    recv = "recv"
    barrier = "barrier"
    other = "other"


class CollectiveCall(Envelope):
    """One collective (or point-to-point) call made by a rank."""

    event_type: Literal["collective"] = Field("collective", description="Event type tag.")
    op: CollectiveOp = Field(description="Collective operation.")
    group: str = label_field(description="Process group the call ran in.")
    nbytes: int = Field(0, ge=0, le=INT64_MAX, description="Payload size in bytes.")
    start: AwareDatetime = time_field(description="When the call was issued.")
    end: AwareDatetime = time_field(description="When the call completed.")


class XidError(Envelope):
    """An NVIDIA XID error reported by the driver (kernel log or NVML event)."""

    event_type: Literal["xid"] = Field("xid", description="Event type tag.")
    code: int = Field(ge=0, le=INT64_MAX, description="XID number (79 for a bare 'fallen off the bus' line).")
    pci_bus_id: str | None = label_field(None, "PCI bus id of the GPU, e.g. 0000:3b:00.")
    pid: int | None = Field(None, ge=0, le=INT64_MAX, description="Process id named by the driver, when known.")
    process_name: str | None = label_field(None, "Process name named by the driver, when known.")
    message: str = Field("", description="The driver's text after the code.")
    raw_line: str | None = Field(None, description="The kernel log line as read, kept verbatim.")


class NicCounters(Envelope):
    """Cumulative counters of one NIC port (RoCE hw_counters and IB counters)."""

    event_type: Literal["nic_counters"] = Field("nic_counters", description="Event type tag.")
    device: str = label_field(description="RDMA device name, e.g. mlx5_0.")
    port: int = Field(ge=1, le=INT64_MAX, description="Port number on the device.")
    counters: dict[Label, U64] = Field(description="Counter name to cumulative value as read from sysfs.")
    port_state: str | None = label_field(None, "Port state, e.g. ACTIVE or DOWN.")


class GpuTelemetry(Envelope):
    """One sample of one GPU's health (NVML)."""

    event_type: Literal["gpu_telemetry"] = Field("gpu_telemetry", description="Event type tag.")
    utilization_pct: float | None = Field(None, ge=0, le=100, description="GPU utilization in percent.")
    memory_used_bytes: int | None = Field(None, ge=0, le=INT64_MAX, description="Device memory in use.")
    memory_total_bytes: int | None = Field(None, ge=0, le=INT64_MAX, description="Device memory in total.")
    temperature_c: float | None = Field(None, description="GPU core temperature in degrees Celsius.")
    sm_clock_mhz: float | None = Field(None, ge=0, description="SM clock in MHz.")
    mem_clock_mhz: float | None = Field(None, ge=0, description="Memory clock in MHz.")
    power_w: float | None = Field(None, ge=0, description="Power draw in watts.")
    throttle_reasons: int | None = Field(None, ge=0, le=INT64_MAX, description="NVML clocks-event (throttle) reason bitmask.")
    ecc_sbe: int | None = Field(None, ge=0, le=INT64_MAX, description="Corrected (single-bit) ECC errors, volatile count.")
    ecc_dbe: int | None = Field(None, ge=0, le=INT64_MAX, description="Uncorrected (double-bit) ECC errors, volatile count.")
    retired_pages: int | None = Field(None, ge=0, le=INT64_MAX, description="Retired pages (pre-Ampere) in total.")
    remapped_rows: int | None = Field(None, ge=0, le=INT64_MAX, description="Remapped rows (Ampere and later) in total.")
    pcie_replays: int | None = Field(None, ge=0, le=INT64_MAX, description="PCIe replay counter.")
    nvlink_errors: dict[Label, U64] = Field(default_factory=dict, description="NVLink error counters by name.")


class Heartbeat(Envelope):
    """A sign of life from a node agent, sent every ``interval_s`` seconds."""

    event_type: Literal["heartbeat"] = Field("heartbeat", description="Event type tag.")
    seq: int = Field(ge=0, le=INT64_MAX, description="Sequence number, +1 per heartbeat since the agent started.")
    interval_s: float = Field(gt=0, description="The agent's heartbeat interval in seconds.")


class ProcessExit(Envelope):
    """A training process ended."""

    event_type: Literal["process_exit"] = Field("process_exit", description="Event type tag.")
    pid: int = Field(ge=0, le=INT64_MAX, description="Process id.")
    exit_code: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="Exit code, when the process exited.")
    signal: int | None = Field(None, ge=1, le=INT64_MAX, description="Signal number, when the process was killed by one.")
    local_rank: int | None = Field(None, ge=0, le=INT64_MAX, description="Local rank on the node.")
    command: str | None = Field(None, description="Command line of the process.")


class ExceptionCategory(str, Enum):
    cuda_error = "cuda_error"
    illegal_memory_access = "illegal_memory_access"
    nccl_error = "nccl_error"
    nccl_timeout = "nccl_timeout"
    out_of_memory = "out_of_memory"
    connection_reset = "connection_reset"
    connection_refused = "connection_refused"
    other = "other"


class TrainingException(Envelope):
    """An uncaught exception in a training process, published before it exits."""

    event_type: Literal["training_exception"] = Field("training_exception", description="Event type tag.")
    category: ExceptionCategory = Field(description="Classified kind of failure.")
    exc_type: str = label_field(description="Exception class name.")
    message: str = Field("", description="Exception message.")
    traceback: str | None = Field(None, description="Formatted traceback.")
    thread: str | None = label_field(None, "Name of the thread that raised it.", min_length=0)


class FlightRecorderDump(Envelope):
    """One rank's flight-recorder dump (torch's NCCL/Gloo collective trace), taken on a hang or on demand.

    The recorder (``TORCH_FR_BUFFER_SIZE``, or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` on older torch) keeps the
    last collectives of every process group of the rank with their sequence numbers and states;
    comparing the ranks' dumps names the rank missing from, or stuck in, collective N of group G. The
    entries are the last ones per group, in torch's field names cut to what that comparison needs.
    """

    event_type: Literal["flight_recorder_dump"] = Field("flight_recorder_dump", description="Event type tag.")
    trigger: Literal["hang", "on_demand", "timeout_file"] = Field(description=(
        "What took the dump: the hooks' hang watchdog, a request, or torch's own dump file on a timeout."))
    available: bool = Field(description="Whether the rank's recorder produced a dump.")
    unavailable_reason: str | None = Field(None, description="Why there is no dump (no API in this torch, buffer size 0...).")
    backend: str | None = Field(None, description="Backend of the default process group (nccl, gloo).")
    format_version: str | None = Field(None, description="The dump's own format version (torch's 'version' key).")
    torch_version: str | None = Field(None, description="torch.__version__ of the rank.")
    groups: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Process groups of the rank: {name, desc, ranks (global ranks), last_enqueued, last_started, "
        "last_completed} (the last three from the dump's pg_status, null when absent)."))
    entries: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Recorded operations, oldest first: {group, seq (collective_seq_id), p2p_seq, is_p2p, op "
        "(profiling_name), state (scheduled|started|completed), retired, created_ns, started_ns, completed_ns}."))
    entries_total: int = Field(0, ge=0, description="Entries in the dump before it was cut to the last ones per group.")


# --- state ------------------------------------------------------------------

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


# --- what vigil says --------------------------------------------------------


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


#: A dead letter keeps at most this many raw bytes (with the size and SHA-256 of the whole),
#: and at most DETAIL_MAX characters of detail: it is always small enough to produce.
RAW_KEEP = 64 * 1024
RAW_B64_MAX = 4 * ((RAW_KEEP + 2) // 3)
DETAIL_MAX = 4000


class DeadLetter(Envelope):
    """A message that could not be processed, kept whole with the reason."""

    event_type: Literal["dead_letter"] = Field("dead_letter", description="Event type tag.")
    reason: str = label_field(description="Failure class: not_json, unknown_event_type, unsupported_version, invalid, "
                              "wrong_topic, store_refused, refused...")
    detail: str = Field(max_length=DETAIL_MAX, description="What failed, where, and what was expected.")
    field: str | None = label_field(None, "Offending field, when known.")
    source_topic: str = Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._?-]+$",
                              description="Topic the message was read from ('?' when not known).")
    source_partition: int = Field(ge=0, le=INT32_MAX, description="Partition it was read from.")
    source_offset: int = Field(ge=0, le=INT64_MAX, description="Offset it was read at.")
    raw_b64: str = Field(max_length=RAW_B64_MAX, description="The raw message bytes, base64-encoded; only the first "
                         "RAW_KEEP bytes when the message was larger (raw_truncated).")
    raw_size: int | None = Field(None, ge=0, le=INT64_MAX, description="Size of the whole raw message in bytes.")
    raw_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                   description="SHA-256 of the whole raw message, hex (identifies a truncated one).")
    raw_truncated: bool = Field(False, description="Whether raw_b64 holds only the first RAW_KEEP bytes.")


# --- what the producers say about themselves (issue 8) -------------------------


class AgentHealth(Envelope):
    """A node-agent collector failed, or recovered after failing.

    A collector reports each distinct problem once (``failed``), keeps running,
    and reports ``recovered`` once the problem is gone; repeats in between are
    only counted.
    """

    event_type: Literal["agent_health"] = Field("agent_health", description="Event type tag.")
    collector: str = label_field(description="Collector name, e.g. nvml, kmsg, nic, watchdog.disk.")
    status: Literal["failed", "recovered"] = Field(description="failed: a new problem; recovered: it is gone.")
    problem: str = label_field(max_length=4096, description="Stable key of the problem, e.g. the unreadable path or the error class.")
    detail: str = Field("", description="What failed, where, and what was expected.")
    occurrences: int = Field(1, ge=1, le=INT64_MAX, description="How many times the problem was seen (on recovery: in total).")


class EventsDropped(Envelope):
    """Events a producer had to discard (its local spool was full): never silent."""

    event_type: Literal["events_dropped"] = Field("events_dropped", description="Event type tag.")
    count: int = Field(ge=0, le=INT64_MAX, description="Number of events discarded.")
    messages: int = Field(ge=0, le=INT64_MAX, description="Number of Kafka messages (single events or batches) discarded.")
    by_type: dict[Label, Count] = Field(default_factory=dict, description="Discarded events per event type.")
    reason: str = label_field(description="Why: spool_full, record_too_large, hook_buffer_full...")
    component: str = label_field(description="What dropped them: publisher spool, training hook buffer...")


class WatchdogReport(Envelope):
    """One check of a long-run watchdog: a level, its trend and the time left.

    ``rate_per_s`` is the trend of ``used`` (bytes written per second, inodes
    used per second, memory growth per second) and ``time_to_limit_s`` the
    estimated seconds until ``used`` reaches ``limit`` at that rate (unset
    when it is not growing).
    """

    event_type: Literal["watchdog"] = Field("watchdog", description="Event type tag.")
    check: Literal["disk_space", "disk_inodes", "host_memory", "gpu_memory", "job_liveness", "log_staleness"] = Field(
        description="What was checked."
    )
    target: str = label_field(max_length=4096, description="What it was checked on: a path, a job id, a log file, a GPU.")
    status: Literal["ok", "warning", "critical"] = Field(description="Verdict of the check.")
    summary: str = Field("", description="One line for a human.")
    used: float | None = Field(None, ge=0, description="Amount in use (bytes, inodes, seconds since the log was written).")
    limit: float | None = Field(None, ge=0, description="Capacity or allowed value (total bytes or inodes, expected interval).")
    used_fraction: float | None = Field(None, ge=0, description="used / limit, when both are known.")
    rate_per_s: float | None = Field(None, description="Trend of ``used`` per second over the watchdog's window.")
    time_to_limit_s: float | None = Field(None, ge=0, description="Estimated seconds until ``used`` reaches ``limit`` at that rate.")


EVENT_MODELS: tuple[type[Envelope], ...] = (
    IterationTiming, IterationStep, CollectiveCall, XidError, NicCounters, GpuTelemetry, Heartbeat,
    ProcessExit, TrainingException, JobState, NodeState, Checkpoint, DetectorFinding, Alert, Decision, ActionResult,
    DeadLetter, AgentHealth, EventsDropped, WatchdogReport, FlightRecorderDump,
)

#: event_type -> model
EVENT_TYPES: dict[str, type[Envelope]] = {
    m.model_fields["event_type"].default: m for m in EVENT_MODELS
}
