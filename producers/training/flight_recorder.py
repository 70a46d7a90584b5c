"""Torch's flight recorder: take a rank's dump, read torch's dump files, cut them to what a hang analysis needs.

The recorder is torch's ring buffer of the last collectives of every process
group of a rank (``torch/csrc/distributed/c10d/FlightRecorder*``), sized by
``TORCH_FR_BUFFER_SIZE=N`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` before torch
2.7) set before the process group starts (0: off; unset: torch's default,
2000 entries in 2.13, off in older releases). It is dumped

* on request, from any thread (the training thread may be stuck inside the
  collective): ``torch._C._distributed_c10d._dump_fr_trace_json`` (torch >=
  2.7; ``_dump_nccl_trace_json``/``_dump_nccl_trace`` before, NCCL builds
  only) — :func:`raw_dump`;
* by torch itself when a NCCL collective times out, with
  ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``: a pickle per rank at
  ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
  before 2.7; default ``/tmp/nccl_trace_rank_<rank>``) — :func:`read_dump_file`,
  which reads it without executing anything (a pickle that names any Python
  global is refused).

A dump holds ``version``, ``pg_config`` (group name -> ``desc``, ``ranks``),
``pg_status`` (per local group id: ``last_enqueued_collective``,
``last_started_collective``, ``last_completed_collective``) and ``entries``
(one per operation: ``process_group`` = [name, desc], ``collective_seq_id``,
``p2p_seq_id``, ``is_p2p``, ``profiling_name`` e.g. ``nccl:all_reduce``,
``state`` scheduled|started|completed, ``retired``, ``time_created_ns``,
``time_discovered_started_ns``, ``time_discovered_completed_ns``, ...).
Measured with torch 2.13 on CPU: the Gloo backend records too (dump format
2.10), with every entry's ``state`` left at ``scheduled`` (only ``retired``
and ``pg_status.last_completed_collective`` tell completion), no
point-to-point entries, and an empty ``pg_config``; so :func:`collect_dump`
adds each group's ranks from ``torch.distributed`` itself.

:func:`normalize` turns a raw dump into the payload of a
:class:`~vigil.schemas.events.FlightRecorderDump` event (the last entries of
each group, no stack traces); :func:`vigil.detectors.flight_recorder.analyze_dumps`
compares the ranks' payloads.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable

__all__ = ["BUFFER_ENV", "DUMP_FILE_ENV", "raw_dump", "read_dump_file", "dump_file_prefix", "normalize",
           "unavailable", "collect_dump", "fit_payload", "process_groups", "payload_from_file", "dump_event"]

#: Environment variables that size the recorder's buffer (newest name first).
BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
#: Environment variables that name the prefix of the on-timeout dump files (newest name first).
DUMP_FILE_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"


def _buffer_size() -> int | None:
    for name in BUFFER_ENV:
        v = os.environ.get(name)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                return None
    return None


def raw_dump() -> tuple[dict[str, Any] | None, str | None]:
    """This process's dump as torch gives it, or ``(None, why not)``."""
    try:
        import torch._C._distributed_c10d as c10d  # noqa: PLC0415
    except Exception as exc:  # no torch, or torch without distributed
        return None, f"torch.distributed is not available here ({type(exc).__name__}: {exc})"
    for name, kind in (("_dump_fr_trace_json", "json"), ("_dump_nccl_trace_json", "json"),
                       ("_dump_fr_trace", "pickle"), ("_dump_nccl_trace", "pickle")):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            data = fn(True, False) if kind == "json" else fn(True, False, False)
        except Exception as exc:
            return None, f"torch's {name} failed: {type(exc).__name__}: {exc}"
        try:
            return (json.loads(data) if kind == "json" else _safe_loads(data)), None
        except Exception as exc:
            return None, f"torch's {name} returned an unreadable dump: {type(exc).__name__}: {exc}"
    import torch  # noqa: PLC0415

    return None, (f"torch {torch.__version__} has no flight-recorder dump API "
                  "(_dump_fr_trace_json from torch 2.7, _dump_nccl_trace in NCCL builds before)")


class _NoGlobals(pickle.Unpickler):
    """A dump is dicts, lists, strings and numbers: any Python global in it is refused, never imported."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump may not name {module}.{name}")


def _safe_loads(data: bytes) -> Any:
    return _NoGlobals(io.BytesIO(data)).load()


def read_dump_file(path: str | os.PathLike) -> dict[str, Any]:
    """A dump file torch wrote (pickle, or JSON), read without executing anything.

    Raises ``ValueError`` when the file is neither, or names a Python global.
    """
    data = Path(path).read_bytes()
    try:
        obj = json.loads(data) if data[:1] in (b"{", b" ", b"\n") else _safe_loads(data)
    except (pickle.UnpicklingError, EOFError, json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a flight-recorder dump (pickle or JSON): {exc}") from exc
    if not isinstance(obj, dict) or "entries" not in obj:
        raise ValueError(f"{path}: a flight-recorder dump is a mapping with 'entries', got {type(obj).__name__}")
    return obj


def dump_file_prefix() -> str:
    """The prefix torch writes its on-timeout dumps to (``<prefix><rank>``)."""
    for name in DUMP_FILE_ENV:
        v = os.environ.get(name)
        if v:
            return v
    return _DEFAULT_PREFIX


def _int_or_none(v: Any) -> int | None:
    try:
        i = int(v)
    except (TypeError, ValueError):
        return None
    return i if i >= 0 else None


def _ranks(v: Any) -> list[int]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return []
    if isinstance(v, (list, tuple)):
        return sorted(int(r) for r in v)
    return []


def unavailable(reason: str, trigger: str, backend: str | None = None) -> dict[str, Any]:
    """The payload of a rank whose recorder gave nothing (the event says why)."""
    return {"trigger": trigger, "available": False, "unavailable_reason": reason, "backend": backend,
            "format_version": None, "torch_version": _torch_version(), "groups": [], "entries": [], "entries_total": 0}


def _torch_version() -> str | None:
    try:
        import torch  # noqa: PLC0415

        return str(torch.__version__)
    except Exception:
        return None


def normalize(raw: dict[str, Any], *, trigger: str, backend: str | None = None,
              groups: dict[str, dict[str, Any]] | None = None, max_entries_per_group: int = 16) -> dict[str, Any]:
    """The payload of a :class:`~vigil.schemas.events.FlightRecorderDump` from a raw dump.

    ``groups`` (name -> ``{"desc", "ranks"}``) completes the dump's own
    ``pg_config`` (empty with Gloo). Keeps the last ``max_entries_per_group``
    entries of each group.

    Examples
    --------
    >>> raw = {"version": "2.10", "pg_config": {}, "pg_status": {"0": {"last_enqueued_collective": 2,
    ...        "last_started_collective": -1, "last_completed_collective": 1}},
    ...        "entries": [{"process_group": ["0", "default_pg"], "pg_id": 0, "collective_seq_id": s, "p2p_seq_id": 0,
    ...                     "is_p2p": False, "profiling_name": "gloo:all_reduce", "state": "scheduled",
    ...                     "retired": s == 1, "time_created_ns": 10 * s} for s in (1, 2)]}
    >>> p = normalize(raw, trigger="hang", groups={"0": {"desc": "default_pg", "ranks": [0, 1]}})
    >>> p["groups"]
    [{'name': '0', 'desc': 'default_pg', 'ranks': [0, 1], 'last_enqueued': 2, 'last_started': None, 'last_completed': 1}]
    >>> [(e["seq"], e["op"], e["retired"]) for e in p["entries"]]
    [(1, 'gloo:all_reduce', True), (2, 'gloo:all_reduce', False)]
    """
    entries_raw = raw.get("entries") or []
    out_groups: dict[str, dict[str, Any]] = {}
    for name, cfg in (raw.get("pg_config") or {}).items():
        ranks = _ranks((cfg or {}).get("ranks"))
        if name and ranks:
            out_groups[str(name)] = {"name": str(name), "desc": (cfg or {}).get("desc") or None, "ranks": ranks}
    for name, cfg in (groups or {}).items():
        g = out_groups.setdefault(str(name), {"name": str(name), "desc": cfg.get("desc") or None, "ranks": []})
        if not g["ranks"]:
            g["ranks"] = _ranks(cfg.get("ranks"))
    pgid_name: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    for e in entries_raw:
        pg = e.get("process_group") or ("", "")
        name, desc = str(pg[0]), (pg[1] if len(pg) > 1 else None)
        if e.get("pg_id") is not None:
            pgid_name[str(e.get("pg_id"))] = name
        g = out_groups.setdefault(name, {"name": name, "desc": None, "ranks": []})
        if not g["desc"] and desc not in (None, "", "undefined"):
            g["desc"] = desc
        entries.append({
            "group": name, "seq": _int_or_none(e.get("collective_seq_id")), "p2p_seq": _int_or_none(e.get("p2p_seq_id")),
            "is_p2p": bool(e.get("is_p2p")), "op": str(e.get("profiling_name") or ""), "state": e.get("state"),
            "retired": e.get("retired"), "created_ns": _int_or_none(e.get("time_created_ns")),
            "started_ns": _int_or_none(e.get("time_discovered_started_ns")) or None,
            "completed_ns": _int_or_none(e.get("time_discovered_completed_ns")) or None,
        })
    for g in out_groups.values():
        g.update(last_enqueued=None, last_started=None, last_completed=None)
    for pgid, st in (raw.get("pg_status") or {}).items():
        name = pgid_name.get(str(pgid))
        if name is None and str(pgid) in out_groups:
            name = str(pgid)
        if name is None or not isinstance(st, dict):
            continue
        out_groups[name].update(last_enqueued=_int_or_none(st.get("last_enqueued_collective")),
                                last_started=_int_or_none(st.get("last_started_collective")),
                                last_completed=_int_or_none(st.get("last_completed_collective")))
    kept = _last_per_group(entries, max_entries_per_group)
    payload = {"trigger": trigger, "available": True, "unavailable_reason": None, "backend": backend,
               "format_version": str(raw.get("version")) if raw.get("version") is not None else None,
               "torch_version": _torch_version(), "groups": sorted(out_groups.values(), key=lambda g: g["name"]),
               "entries": kept, "entries_total": len(entries_raw)}
    if not entries_raw:
        size = _buffer_size()
        # The buffer's default differs by version (0 in older torch, 2000 in 2.13): say what is known.
        payload.update(available=False, unavailable_reason=(
            "the flight recorder holds no entries: its buffer is off (TORCH_FR_BUFFER_SIZE=0)" if size == 0 else
            "the flight recorder holds no entries (no collective recorded yet)" if size else
            "the flight recorder holds no entries: nothing recorded yet, or its buffer is off by default in this "
            "torch (set TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE before torch 2.7, > 0 before the "
            "process group starts)"))
    return payload


def _last_per_group(entries: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    keep = []
    for e in reversed(entries):
        c = counts.get(e["group"], 0)
        if c < n:
            keep.append(e)
            counts[e["group"]] = c + 1
    return keep[::-1]


def fit_payload(payload: dict[str, Any], fits: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Halve the entries kept per group until ``fits(payload)`` (a datagram's size limit); at least one each."""
    n = max([sum(1 for e in payload["entries"] if e["group"] == g["name"]) for g in payload["groups"]] or [0])
    while not fits(payload) and n > 1:
        n //= 2
        payload = dict(payload, entries=_last_per_group(payload["entries"], n))
    return payload


def process_groups(dist: Any = None) -> dict[str, dict[str, Any]]:
    """Name -> ``{"desc", "ranks"}`` of every process group this rank is in, from ``torch.distributed``."""
    if dist is None:
        try:
            import torch.distributed as dist  # noqa: PLC0415
        except Exception:
            return {}
    out: dict[str, dict[str, Any]] = {}
    try:
        world = dist.distributed_c10d._world
        for pg, name in list(world.pg_names.items()):
            try:
                ranks = list(dist.get_process_group_ranks(pg))
            except Exception:
                continue
            out[str(name)] = {"desc": getattr(pg, "group_desc", None), "ranks": sorted(int(r) for r in ranks)}
    except Exception:
        return out
    return out


def collect_dump(dist: Any = None, *, trigger: str = "on_demand", max_entries_per_group: int = 16) -> dict[str, Any]:
    """This rank's payload: its dump normalised, with its groups' ranks, or why there is none."""
    backend = None
    try:
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415
        if dist.is_initialized():
            backend = str(dist.get_backend())
    except Exception:
        pass
    raw, why = raw_dump()
    groups = process_groups(dist)
    if raw is None:
        # The groups still say who else should answer: the analysis runs once they all have,
        # not a settling time later (by then a restart may have resolved the hang it would annotate).
        return dict(unavailable(why or "no dump", trigger, backend),
                    groups=[{"name": n, "desc": g.get("desc"), "ranks": g["ranks"], "last_enqueued": None,
                             "last_started": None, "last_completed": None} for n, g in sorted(groups.items())])
    return normalize(raw, trigger=trigger, backend=backend, groups=groups, max_entries_per_group=max_entries_per_group)


def payload_from_file(path: str | os.PathLike, *, groups: dict[str, dict[str, Any]] | None = None,
                      max_entries_per_group: int = 16) -> dict[str, Any]:
    """The payload of a dump file torch wrote on a timeout (``trigger="timeout_file"``)."""
    return normalize(read_dump_file(path), trigger="timeout_file", groups=groups,
                     max_entries_per_group=max_entries_per_group)


def dump_event(payload: dict[str, Any], *, t: float, source: dict[str, Any]) -> Any:
    """The :class:`~vigil.schemas.events.FlightRecorderDump` of a payload, for a publisher (e.g. the node
    agent that found torch's on-timeout files: ``dump_event(payload_from_file(path), t=mtime,
    source={"job": .., "rank": .., "node": ..})``).

    >>> ev = dump_event(unavailable("no recorder", "hang", "gloo"), t=1.7e9, source={"job": "j", "rank": 3})
    >>> ev.event_type, ev.source.rank, ev.available, ev.unavailable_reason
    ('flight_recorder_dump', 3, False, 'no recorder')
    """
    from vigil.schemas import Source, from_seconds
    from vigil.schemas.events import FlightRecorderDump

    src = Source(**{k: v for k, v in source.items() if v is not None})
    return FlightRecorderDump(event_time=from_seconds(t), source=src, **payload)
