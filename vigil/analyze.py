"""Offline localization from PyTorch profiler (Kineto) traces: one Chrome-trace JSON per rank.

``vigil analyze rank0.json rank1.json ...`` (or a directory) reads the
traces torch.profiler wrote (``export_chrome_trace`` or
``tensorboard_trace_handler``, ``.json`` or ``.json.gz``), turns each rank's
profiled steps (the ``ProfilerStep#N`` annotations) into the localizer's
per-rank step records, and runs :func:`vigil.detectors.straggler.localize_window`
over the steps every rank has.

What a trace proves, per step window:

``comm``
    the union of the collectives' intervals: the backend's annotations
    (``gloo:all_reduce``, ``nccl:all_gather``..., on whatever thread ran
    them) and, in GPU traces, the NCCL kernels (``ncclDevKernel_AllReduce``...)
    on their streams;
``wait``
    the union of point-to-point operations (``gloo:send``/``recv``,
    ``nccl:send``/``recv``, NCCL ``SendRecv`` kernels) and of user annotations
    named in ``wait_markers`` (default ``vigil.wait`` and ``vigil.bubble``:
    ``with torch.profiler.record_function("vigil.bubble"):`` around a
    pipeline's bubbles), minus the collectives;
``compute``
    CPU traces: the union of the operators (``cpu_op``) on the threads that
    run them, minus ``comm`` and ``wait``; GPU traces (with ``kernel``
    events): the union of the other kernels, attributed to the step that
    launched them (by correlation id), minus ``comm`` and ``wait``. Time
    nothing covers (Python between operators, sleeps) is not compute.

Coordinates: the trace's ``distributedInfo.rank``; (dp, pp, tp) from the
grid given (``dp x pp x tp`` = world size, Megatron order: tp fastest, then
dp, then pp), by default pure data parallelism. The traces do not say which
process group a gloo collective ran in, so there are no per-kind timings
(``ops``) and a slow link cannot be located from CPU traces (the verdict
says so).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from vigil.detectors.localization import Localization, localize_window
from vigil.producers.training.timing import minus_length, union_length

__all__ = ["RankTrace", "load_trace", "step_records", "analyze", "Analysis", "DEFAULT_WAIT_MARKERS"]

DEFAULT_WAIT_MARKERS = ("vigil.wait", "vigil.bubble")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_BACKEND_OP = re.compile(r"^(gloo|nccl|ucc|mpi|xccl):(\w+)$")
_P2P_NAMES = {"send", "recv", "isend", "irecv", "send_recv", "sendrecv", "batch_isend_irecv", "coalesced_send_recv"}
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_(\w+?)(?:_|\(|$)", re.I)


@dataclass
class RankTrace:
    """One rank's trace, reduced to what the records need (times in seconds, trace clock)."""

    path: str
    rank: int
    world_size: int | None
    steps: dict[int, tuple[float, float]]  # step -> (start, end)
    compute: list[tuple[float, float]] = field(default_factory=list)  # CPU operators, or compute kernels
    comm: list[tuple[float, float]] = field(default_factory=list)
    wait: list[tuple[float, float]] = field(default_factory=list)
    kernel_step: dict[int, int] = field(default_factory=dict)  # GPU: index into compute/comm/wait lists -> step
    gpu: bool = False
    groups: list[dict[str, Any]] = field(default_factory=list)
    gpu_intervals: list[tuple[str, float, float, int | None]] = field(default_factory=list)  # (what, s, e, step)


def _read_json(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    obj = json.loads(data)
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (a JSON object with 'traceEvents')")
    return obj


def load_trace(path: str | Path, wait_markers: Iterable[str] = DEFAULT_WAIT_MARKERS, rank: int | None = None) -> RankTrace:
    """Read one rank's Kineto trace. ``rank`` overrides ``distributedInfo.rank`` (or the file name's number)."""
    path = Path(path)
    obj = _read_json(path)
    info = obj.get("distributedInfo") or {}
    if rank is None:
        rank = info.get("rank")
    if rank is None:
        m = re.search(r"(\d+)(?:\D*)$", path.name.split(".")[0])
        if m is None:
            raise ValueError(f"{path}: no distributedInfo.rank in the trace and no rank number in the file name")
        rank = int(m.group(1))
    markers = set(wait_markers)
    steps: dict[int, tuple[float, float]] = {}
    step_tid = None
    cpu_ops: list[tuple[Any, float, float]] = []
    comm: list[tuple[float, float]] = []
    wait: list[tuple[float, float]] = []
    launches: dict[int, float] = {}  # correlation id -> launch time (CPU)
    kernels: list[tuple[str, float, float, int | None]] = []
    backend_tids: set[Any] = set()
    for e in obj["traceEvents"]:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        name = str(e.get("name", ""))
        cat = str(e.get("cat", "")).lower()
        s = float(e["ts"]) * 1e-6
        t = s + float(e.get("dur", 0.0)) * 1e-6
        m = _STEP.match(name)
        if m:
            steps[int(m.group(1))] = (s, t)
            step_tid = e.get("tid")
            continue
        if cat == "kernel" or cat == "gpu_memcpy":
            km = _NCCL_KERNEL.match(name)
            what = "compute"
            if km:
                op = km.group(1).lower()
                what = "wait" if any(p in op for p in ("sendrecv", "send", "recv")) else "comm"
            corr = (e.get("args") or {}).get("correlation")
            kernels.append((what, s, t, corr))
            continue
        if cat == "cuda_runtime" and "launch" in name.lower():
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[int(corr)] = s
            continue
        bm = _BACKEND_OP.match(name)
        if bm:
            backend_tids.add(e.get("tid"))
            (wait if bm.group(2).lower() in _P2P_NAMES else comm).append((s, t))
            continue
        if name == "record_param_comms":
            coll = str((e.get("args") or {}).get("Collective name", "")).lower()
            if coll:
                (wait if coll in _P2P_NAMES else comm).append((s, t))
            continue
        if name in markers:
            wait.append((s, t))
            continue
        if cat == "cpu_op" and not name.startswith(("c10d::", "record_param_comms")):
            cpu_ops.append((e.get("tid"), s, t))
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep#N annotations: profile with a schedule and prof.step() per step")
    tr = RankTrace(str(path), int(rank), info.get("world_size"), dict(sorted(steps.items())),
                   comm=comm, wait=wait, groups=list(info.get("pg_config") or []))
    if kernels:
        tr.gpu = True
        ordered = sorted(steps.items())
        for what, s, t, corr in kernels:
            at = launches.get(int(corr)) if corr is not None else None
            ref = at if at is not None else s
            step = next((k for k, (a, b) in ordered if a <= ref < b), None)
            tr.gpu_intervals.append((what, s, t, step))
    else:
        tr.compute = [(s, t) for tid, s, t in cpu_ops if tid not in backend_tids or tid == step_tid]
    return tr


def step_records(trace: RankTrace, grid: tuple[int, int, int] | None = None) -> dict[int, dict[str, Any]]:
    """Per profiled step, the localizer's record of this rank: ``rank, dp, pp, tp, compute, comm, wait``."""
    world = trace.world_size or 1
    dp_n, pp_n, tp_n = grid if grid is not None else (world, 1, 1)
    r = trace.rank
    tp = r % tp_n
    dp = (r // tp_n) % dp_n
    pp = r // (tp_n * dp_n)
    out: dict[int, dict[str, Any]] = {}
    for step, (a, b) in trace.steps.items():
        if trace.gpu:
            ivs = [(w, s, t) for w, s, t, st in trace.gpu_intervals if st == step]
            comm = [(s, t) for w, s, t in ivs if w == "comm"]
            wait = [(s, t) for w, s, t in ivs if w == "wait"]
            comp = [(s, t) for w, s, t in ivs if w == "compute"]
        else:
            comm = [(max(s, a), min(t, b)) for s, t in trace.comm if s < b and t > a]
            wait = [(max(s, a), min(t, b)) for s, t in trace.wait if s < b and t > a]
            comp = [(max(s, a), min(t, b)) for s, t in trace.compute if s < b and t > a]
        out[step] = {"rank": r, "dp": dp, "pp": pp, "tp": tp,
                     "compute": minus_length(comp, comm + wait),
                     "comm": union_length(comm),
                     "wait": minus_length(wait, comm),
                     "step_s": b - a}
    return out


@dataclass
class Analysis:
    """What :func:`analyze` found: the verdict, the steps used, and every rank's records."""

    localization: Localization
    steps: list[int]
    records: list[list[dict[str, Any]]]
    grid: tuple[int, int, int]
    gpu: bool
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        loc = self.localization
        return {"culprit": loc.culprit, "location": loc.location, "evidence": loc.evidence,
                "suspects": [{"culprit": s.culprit, "location": s.location, "excess_s": s.excess_s, "score": s.score,
                              "evidence": s.evidence} for s in loc.suspects],
                "steps": self.steps, "grid": list(self.grid), "gpu_trace": self.gpu, "notes": self.notes,
                "per_rank_median": _per_rank_median(self.records)}


def _per_rank_median(records: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    import numpy as np

    by: dict[int, list[dict[str, Any]]] = {}
    for it in records:
        for r in it:
            by.setdefault(r["rank"], []).append(r)
    return [{"rank": k, "dp": v[0]["dp"], "pp": v[0]["pp"], "tp": v[0]["tp"],
             **{f: float(np.median([x[f] for x in v])) for f in ("compute", "comm", "wait", "step_s")}}
            for k, v in sorted(by.items())]


def analyze(paths: Sequence[str | Path], grid: tuple[int, int, int] | None = None,
            wait_markers: Iterable[str] = DEFAULT_WAIT_MARKERS, skip_first: int = 0, **localize_params: Any) -> Analysis:
    """Load every rank's trace, build the records of the steps all ranks have, localize.

    ``paths``: files or directories (``*.json``, ``*.json.gz`` inside).
    ``skip_first``: steps left out at the start (warm-up).
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(q for q in p.iterdir() if q.name.endswith((".json", ".json.gz"))
                                and not q.name.endswith("groups.json")))
        else:
            files.append(p)
    if not files:
        raise ValueError("no trace files")
    traces = [load_trace(f, wait_markers) for f in files]
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"two traces claim the same rank: {sorted(ranks)}")
    world = max(t.world_size or 0 for t in traces) or len(traces)
    g = grid or (world, 1, 1)
    if g[0] * g[1] * g[2] != world:
        raise ValueError(f"grid dp x pp x tp = {g[0]} x {g[1]} x {g[2]} = {g[0] * g[1] * g[2]}, "
                         f"but the traces are of a world of {world}")
    notes = []
    if len(traces) < world:
        notes.append(f"{len(traces)} of {world} ranks' traces given: the others are not compared")
    per = [step_records(t, g) for t in traces]
    common = sorted(set.intersection(*(set(p) for p in per)))[skip_first:]
    if not common:
        raise ValueError("no profiled step is in every rank's trace (ProfilerStep numbers differ)")
    records = [[p[s] for p in per] for s in common]
    notes.append("no per-group timings in these traces: a slow link cannot be located (only worker, stage, "
                 "spread or none)")
    loc = localize_window(records, **localize_params)
    return Analysis(loc, common, records, g, any(t.gpu for t in traces), notes)
