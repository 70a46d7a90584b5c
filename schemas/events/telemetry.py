"""Telemetry events: what node agents, training hooks and the simulator measure and report."""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, model_validator

from vigil.schemas.envelope import INT64_MAX, INT64_MIN, Count, Envelope, Label, Name, label_field, time_field

#: An unsigned 64-bit counter as the kernel reports it (stored as JSON text, not as an Int64 column).
U64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
#: A GPU index on a node.
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
#: The figures of a GPU sample, bounded once for the per-GPU and the columnar events.
Percent = Annotated[float, Field(ge=0, le=100)]
NonNegative = Annotated[float, Field(ge=0)]

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
    """One sample of one GPU's health (NVML). A node agent sends its GPUs' samples as one :class:`GpuSamples`."""

    event_type: Literal["gpu_telemetry"] = Field("gpu_telemetry", description="Event type tag.")
    utilization_pct: Percent | None = Field(None, description="GPU utilization in percent.")
    memory_used_bytes: Count | None = Field(None, description="Device memory in use.")
    memory_total_bytes: Count | None = Field(None, description="Device memory in total.")
    temperature_c: float | None = Field(None, description="GPU core temperature in degrees Celsius.")
    sm_clock_mhz: NonNegative | None = Field(None, description="SM clock in MHz.")
    mem_clock_mhz: NonNegative | None = Field(None, description="Memory clock in MHz.")
    power_w: NonNegative | None = Field(None, description="Power draw in watts.")
    throttle_reasons: Count | None = Field(None, description="NVML clocks-event (throttle) reason bitmask.")
    ecc_sbe: Count | None = Field(None, description="Corrected (single-bit) ECC errors, volatile count.")
    ecc_dbe: Count | None = Field(None, description="Uncorrected (double-bit) ECC errors, volatile count.")
    retired_pages: Count | None = Field(None, description="Retired pages (pre-Ampere) in total.")
    remapped_rows: Count | None = Field(None, description="Remapped rows (Ampere and later) in total.")
    pcie_replays: Count | None = Field(None, description="PCIe replay counter.")
    nvlink_errors: dict[Label, U64] = Field(default_factory=dict, description="NVLink error counters by name.")


#: The figures of a GPU sample, in :class:`GpuTelemetry`'s order (a column each in :class:`GpuSamples`).
GPU_FIGURES = ("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "sm_clock_mhz",
               "mem_clock_mhz", "power_w", "throttle_reasons", "ecc_sbe", "ecc_dbe", "retired_pages",
               "remapped_rows", "pcie_replays", "nvlink_errors")


def _column(description: str) -> Any:
    return Field(default_factory=list, description=description + (
        " One element per GPU of ``gpus`` (null: that GPU did not report it), or empty: none did."))


class GpuSamples(Envelope):
    """One node's GPUs sampled at one time, in columns: one message per node per sample.

    The columnar form of :class:`GpuTelemetry` (what a node agent sends; the
    per-GPU event stays accepted): element ``i`` of every column belongs to
    GPU ``gpus[i]``, with the same bounds as the per-GPU event's field. A
    column left empty means no GPU reported that figure. Detectors read each
    GPU's values as they read a :class:`GpuTelemetry` (:meth:`rows`), and the
    history stores one row per GPU in the GPU telemetry table.
    """

    event_type: Literal["gpu_samples"] = Field("gpu_samples", description="Event type tag.")
    gpus: list[GpuIndex] = Field(min_length=1, max_length=1024, description="GPU index on the node, one per column element.")
    utilization_pct: list[Percent | None] = _column("GPU utilization in percent.")
    memory_used_bytes: list[Count | None] = _column("Device memory in use.")
    memory_total_bytes: list[Count | None] = _column("Device memory in total.")
    temperature_c: list[float | None] = _column("GPU core temperature in degrees Celsius.")
    sm_clock_mhz: list[NonNegative | None] = _column("SM clock in MHz.")
    mem_clock_mhz: list[NonNegative | None] = _column("Memory clock in MHz.")
    power_w: list[NonNegative | None] = _column("Power draw in watts.")
    throttle_reasons: list[Count | None] = _column("NVML clocks-event (throttle) reason bitmask.")
    ecc_sbe: list[Count | None] = _column("Corrected (single-bit) ECC errors, volatile count.")
    ecc_dbe: list[Count | None] = _column("Uncorrected (double-bit) ECC errors, volatile count.")
    retired_pages: list[Count | None] = _column("Retired pages (pre-Ampere) in total.")
    remapped_rows: list[Count | None] = _column("Remapped rows (Ampere and later) in total.")
    pcie_replays: list[Count | None] = _column("PCIe replay counter.")
    nvlink_errors: list[dict[Label, U64]] = Field(default_factory=list, description=(
        "NVLink error counters by name, one mapping per GPU of ``gpus`` (empty: none), or empty: none reported."))

    @model_validator(mode="after")
    def _columns_align(self) -> "GpuSamples":
        n = len(self.gpus)
        for name in GPU_FIGURES:
            got = len(getattr(self, name))
            if got and got != n:
                raise ValueError(f"{name} has {got} elements, gpus has {n} (or none: not reported)")
        if len(set(self.gpus)) != n:
            raise ValueError("gpus names a GPU twice (one sample per GPU)")
        if self.source.gpu is not None:
            raise ValueError("source.gpu must be unset: the GPUs are the gpus column")
        return self

    def rows(self) -> list["GpuRow"]:
        """Each GPU's sample as a :class:`GpuRow` (read like a :class:`GpuTelemetry`), without validating
        anything again: the columns were validated as a whole."""
        gpus = self.gpus
        n = len(gpus)
        d = self.__dict__
        names = [f for f in GPU_FIGURES if d[f]]
        src = self.source
        cluster, node, job, rank = src.cluster, src.node, src.job, src.rank
        head = {"version": self.version, "event_time": self.event_time, "event_type": "gpu_telemetry",
                "_of": self.event_id, **_ABSENT}
        new = object.__new__
        out: list[GpuRow] = []
        columns = [d[f] for f in names]
        for i, values in enumerate(zip(*columns) if columns else ((),) * n):
            row = new(GpuRow)
            rd = row.__dict__
            rd.update(head)
            source = new(RowSource)
            source.__dict__.update(cluster=cluster, node=node, job=job, rank=rank, gpu=gpus[i])
            rd["source"] = source
            rd.update(zip(names, values))
            if rd["nvlink_errors"] is None:
                rd["nvlink_errors"] = {}
            out.append(row)
        return out

    def telemetry(self) -> list[GpuTelemetry]:
        """Each GPU's sample as a :class:`GpuTelemetry`, with the id of :meth:`row_id` (built without
        validating again: for readers that need the model itself)."""
        stated = {"event_id", "version", "event_time", "source", "event_type", *(f for f in GPU_FIGURES if getattr(self, f))}
        return [GpuTelemetry.model_construct(
            stated, event_id=row.event_id, version=row.version, event_time=row.event_time,
            source=self.source.model_copy(update={"gpu": row.source.gpu}),
            **{f: getattr(row, f) for f in GPU_FIGURES}) for row in self.rows()]


#: A figure no GPU of the message reported.
_ABSENT: dict[str, Any] = {f: None for f in GPU_FIGURES}


def row_id(samples_id: uuid.UUID, gpu: int) -> uuid.UUID:
    """The event id of GPU ``gpu``'s row of the :class:`GpuSamples` ``samples_id``: the same for every
    delivery of the message (a UUIDv5 in the message's id as namespace), so the history stores it once."""
    return uuid.uuid5(samples_id, str(gpu))


class RowSource:
    """A :class:`GpuRow`'s source: the attributes of :class:`~vigil.schemas.envelope.Source`, plain."""

    cluster: str
    node: str | None
    job: str | None
    rank: int | None
    gpu: int | None


class GpuRow:
    """One GPU's values of a :class:`GpuSamples`, read like a :class:`GpuTelemetry`: the same attributes
    (``event_type`` is ``gpu_telemetry``; ``event_id`` is :func:`row_id`'s, made when first read), as
    plain Python objects. A view, not a model: it is not validated again and has no pydantic methods."""

    event_type: str
    source: RowSource

    def __getattr__(self, name: str) -> Any:
        if name == "event_id":  # only the history needs it: made on demand
            eid = self.__dict__["event_id"] = row_id(self.__dict__["_of"], self.source.gpu)  # type: ignore[arg-type]
            return eid
        raise AttributeError(name)


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
