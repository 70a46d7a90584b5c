"""The nodes and jobs an actuator may act on: from the operator, never from a topic.

A decision naming a node or job the inventory does not know is refused
before anything runs. Every entry comes from the operator:

* the command line (``--node``, ``--job``) and an inventory file
  (:meth:`Inventory.load`: ``{"nodes": [...], "jobs": [...] or {job: [nodes]}}``),
  where Slurm host ranges are expanded node by node (``gpu-[01-04,07]``);
* the scheduler itself, asked again every ``refresh_s`` seconds
  (:meth:`Inventory.refresh`): Slurm's ``scontrol show nodes`` and ``squeue``
  (:class:`SlurmSource`), or the Kubernetes API through ``kubectl``
  (:class:`KubernetesSource`).

The ``state.nodes`` and ``state.jobs`` topics are not a source: anyone who
can write a topic could otherwise add ``ALL`` or a thousand fake nodes (and
so raise the blast-radius limit, a fraction of the known cluster).
:meth:`Inventory.observe` takes those events and learns nothing from them.

Names are checked with :func:`~vigil.actuators.plans.check_name`: a name
that stands for a set of nodes (``ALL``, ``node[1-64]``) is never an entry.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Protocol

from vigil.actuators.errors import PlanError
from vigil.actuators.plans import check_name
from vigil.schemas import Envelope, JobState, NodeState

__all__ = ["Inventory", "InventorySource", "KubernetesSource", "SlurmSource", "expand_hostlist"]

log = logging.getLogger(__name__)

#: Most names one host-range expression may expand to (a typo must not make a million nodes).
MAX_EXPANSION = 100_000


def expand_hostlist(expr: str) -> list[str]:
    """Slurm host-list syntax to the names it stands for, in order.

    >>> expand_hostlist("gpu-[01-03,07],login1")
    ['gpu-01', 'gpu-02', 'gpu-03', 'gpu-07', 'login1']
    >>> expand_hostlist("rack[1-2]-n[1-2]")
    ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    out: list[str] = []
    for part in _split_top(expr):
        names = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            names = [n + literal for n in names]
            if ranges:
                values: list[str] = []
                for piece in ranges.split(","):
                    lo, sep, hi = piece.partition("-")
                    if not lo.isdigit() or (sep and not hi.isdigit()):
                        raise ValueError(f"host list {expr[:80]!r}: {piece!r} is not a number or a range a-b")
                    if not sep:
                        values.append(lo)
                        continue
                    if int(hi) < int(lo) or int(hi) - int(lo) >= MAX_EXPANSION:
                        raise ValueError(f"host list {expr[:80]!r}: bad range {piece!r}")
                    width = len(lo) if lo.startswith("0") else 0
                    values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
                names = [n + v for n in names for v in values]
            if len(names) > MAX_EXPANSION:
                raise ValueError(f"host list {expr[:80]!r} expands to more than {MAX_EXPANSION} names")
        out += names
    return out


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        raise ValueError(f"host list {expr[:80]!r}: unbalanced brackets")
    return [p for p in parts + [current] if p]


def _names(entries: Iterable[object], where: str) -> set[str]:
    """Validated names, host ranges expanded (a bad name is an error: the operator's file must be right)."""
    out: set[str] = set()
    for entry in entries:
        if not isinstance(entry, str):
            raise ValueError(f"{where}: expected a name, got {entry!r:.80}")
        for name in expand_hostlist(entry) if "[" in entry or "," in entry else [entry]:
            try:
                out.add(check_name(name, where))
            except PlanError as exc:
                raise ValueError(str(exc)) from None
    return out


class InventorySource(Protocol):
    """Where an inventory is refreshed from: ``(nodes, jobs)`` as the scheduler knows them now."""

    name: str

    def __call__(self) -> tuple[set[str], set[str]]: ...


def _run(argv: list[str], timeout_s: float) -> str:
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise RuntimeError(f"{argv[0]} not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv)} did not answer within {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()[-300:]}")
    return proc.stdout.decode(errors="replace")


def _valid(names: Iterable[str], what: str) -> set[str]:
    out = set()
    for name in names:
        try:
            out.add(check_name(name, what))
        except PlanError as exc:
            log.warning("inventory: skipping %s", exc)
    return out


class SlurmSource:
    """Nodes from ``scontrol show nodes --oneliner`` (``NodeName=``), jobs from ``squeue --noheader --format=%i``."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", squeue: str = "squeue", timeout_s: float = 30.0) -> None:
        self.scontrol, self.squeue, self.timeout_s = scontrol, squeue, timeout_s

    def __call__(self) -> tuple[set[str], set[str]]:
        shown = _run([self.scontrol, "show", "nodes", "--oneliner"], self.timeout_s)
        nodes = _valid(re.findall(r"(?:^|\s)NodeName=(\S+)", shown), "scontrol NodeName")
        jobs = _valid((line.strip() for line in _run([self.squeue, "--noheader", "--format=%i"],
                                                      self.timeout_s).splitlines() if line.strip()), "squeue job id")
        return nodes, jobs


class KubernetesSource:
    """Nodes and jobs from the Kubernetes API (through ``kubectl``): every node, and the values of the
    job label on the pods of ``namespace``."""

    name = "kubernetes"

    def __init__(self, namespace: str = "default", job_label: str = "job-name", kubectl: str = "kubectl",
                 timeout_s: float = 30.0) -> None:
        self.namespace, self.job_label, self.kubectl, self.timeout_s = namespace, job_label, kubectl, timeout_s

    def __call__(self) -> tuple[set[str], set[str]]:
        nodes_doc = json.loads(_run([self.kubectl, "get", "nodes", "-o", "json"], self.timeout_s))
        pods_doc = json.loads(_run([self.kubectl, "get", "pods", "-n", self.namespace, "-l", self.job_label,
                                    "-o", "json"], self.timeout_s))
        nodes = _valid((i.get("metadata", {}).get("name", "") for i in nodes_doc.get("items", [])), "kubernetes node")
        jobs = _valid((i.get("metadata", {}).get("labels", {}).get(self.job_label, "")
                       for i in pods_doc.get("items", [])), "kubernetes job label")
        return nodes, jobs


class Inventory:
    """Static nodes and jobs, plus those of ``source`` (refreshed every ``refresh_s`` seconds)."""

    def __init__(self, nodes: Iterable[str] = (), jobs: Iterable[str] = (), *,
                 source: Callable[[], tuple[set[str], set[str]]] | None = None, refresh_s: float = 60.0) -> None:
        self._static_nodes = {check_name(n, "node") for n in nodes}
        self._static_jobs = {check_name(j, "job") for j in jobs}
        self._source_nodes: set[str] = set()
        self._source_jobs: set[str] = set()
        self.job_nodes: dict[str, tuple[str, ...]] = {}
        self.source = source
        self.refresh_s = refresh_s
        self._refreshed_at: float | None = None
        self.last_error: str | None = None

    @classmethod
    def load(cls, path: str | os.PathLike, nodes: Iterable[str] = (), jobs: Iterable[str] = (), **kw: object) -> "Inventory":
        """A JSON file ``{"nodes": [...], "jobs": [...]}`` (``jobs`` may map job -> its nodes), plus extras.

        Node entries may be Slurm host ranges (``gpu-[01-16]``): each name they stand for is an entry.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"inventory {p}: cannot read JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"inventory {p}: expected an object {{\"nodes\": [...], \"jobs\": [...]}}")
        file_nodes = data.get("nodes", [])
        file_jobs = data.get("jobs", [])
        if not isinstance(file_nodes, list) or not isinstance(file_jobs, (list, dict)):
            raise ValueError(f"inventory {p}: \"nodes\" must be a list and \"jobs\" a list or an object")
        inv = cls(_names([*file_nodes, *nodes], f"inventory {p} nodes"), [*file_jobs, *jobs], **kw)  # type: ignore[arg-type]
        if isinstance(file_jobs, dict):
            for job, job_nodes in file_jobs.items():
                if not isinstance(job_nodes, list):
                    raise ValueError(f"inventory {p}: jobs.{job} must be a list of nodes")
                expanded = _names(job_nodes, f"inventory {p} jobs.{job}")
                inv._static_nodes.update(expanded)
                inv.job_nodes[job] = tuple(sorted(expanded))
        return inv

    def add_node(self, node: str) -> None:
        self._static_nodes.add(check_name(node, "node"))

    def add_job(self, job: str, nodes: Iterable[str] = ()) -> None:
        self._static_jobs.add(check_name(job, "job"))
        ns = tuple(check_name(n, "node") for n in nodes)
        self._static_nodes.update(ns)
        if ns:
            self.job_nodes[job] = ns

    def refresh(self, now: float, force: bool = False) -> None:
        """Ask the source again if ``refresh_s`` has passed (or ``force``); a source that fails keeps what it
        said last (logged, and in :attr:`last_error`)."""
        if self.source is None:
            return
        if not force and self._refreshed_at is not None and now - self._refreshed_at < self.refresh_s:
            return
        self._refreshed_at = now
        try:
            nodes, jobs = self.source()
        except Exception as exc:  # noqa: BLE001 - a scheduler that does not answer: keep the last answer
            self.last_error = f"{getattr(self.source, 'name', 'source')}: {exc}"
            log.warning("inventory refresh failed (%s); keeping %d nodes, %d jobs", self.last_error,
                        len(self._source_nodes), len(self._source_jobs))
            return
        self.last_error = None
        self._source_nodes, self._source_jobs = set(nodes), set(jobs)

    def observe(self, event: Envelope) -> bool:
        """A ``job_state`` / ``node_state`` event: True if it was one. Nothing is learned from it: targets come
        from the operator (a topic is writable by whoever reaches the broker)."""
        return isinstance(event, (JobState, NodeState))

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._static_nodes | self._source_nodes)

    @property
    def jobs(self) -> frozenset[str]:
        return frozenset(self._static_jobs | self._source_jobs)

    def knows_node(self, node: str) -> bool:
        return node in self._static_nodes or node in self._source_nodes

    def knows_job(self, job: str) -> bool:
        return job in self._static_jobs or job in self._source_jobs

    def __repr__(self) -> str:
        via = f", from {getattr(self.source, 'name', 'a source')} every {self.refresh_s:g} s" if self.source else ""
        return f"Inventory({len(self.nodes)} nodes, {len(self.jobs)} jobs{via})"
