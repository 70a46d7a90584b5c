"""The nodes and jobs an actuator may act on: static ones plus those learned from state events.

A decision naming a node or job the inventory does not know is refused
before anything runs. Static entries come from the command line or a file
(:meth:`Inventory.load`); :meth:`Inventory.observe` learns from
``job_state`` (the job and its nodes) and ``node_state`` (the node) events.
A job learned from events is forgotten when it is ``completed`` or
``cancelled`` (acting on it would resurrect it); a ``failed`` job stays
known, since restarting it is the point. Static entries are never forgotten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from vigil.actuators.plans import check_name
from vigil.schemas import Envelope, JobState, NodeState

__all__ = ["Inventory"]

_FINISHED = ("completed", "cancelled")


class Inventory:
    def __init__(self, nodes: Iterable[str] = (), jobs: Iterable[str] = ()) -> None:
        self._static_nodes = {check_name(n, "node") for n in nodes}
        self._static_jobs = {check_name(j, "job") for j in jobs}
        self._learned_nodes: set[str] = set()
        self._learned_jobs: set[str] = set()
        self.job_nodes: dict[str, tuple[str, ...]] = {}

    @classmethod
    def load(cls, path: str | os.PathLike, nodes: Iterable[str] = (), jobs: Iterable[str] = ()) -> "Inventory":
        """A JSON file ``{"nodes": [...], "jobs": [...]}`` (``jobs`` may map job -> its nodes), plus extras."""
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
        inv = cls([*file_nodes, *nodes], [*file_jobs, *jobs])
        if isinstance(file_jobs, dict):
            for job, job_nodes in file_jobs.items():
                inv._static_nodes.update(check_name(n, f"jobs.{job}") for n in job_nodes)
                inv.job_nodes[job] = tuple(job_nodes)
        return inv

    def add_node(self, node: str) -> None:
        self._static_nodes.add(check_name(node, "node"))

    def add_job(self, job: str, nodes: Iterable[str] = ()) -> None:
        self._static_jobs.add(check_name(job, "job"))
        ns = tuple(check_name(n, "node") for n in nodes)
        self._static_nodes.update(ns)
        if ns:
            self.job_nodes[job] = ns

    def observe(self, event: Envelope) -> bool:
        """Learn from a ``job_state`` or ``node_state`` event; True if it was one. Invalid names are ignored."""
        if isinstance(event, JobState):
            job = event.source.job
            if job is None or not _valid(job):
                return True
            nodes = tuple(n for n in event.nodes if _valid(n))
            self._learned_nodes.update(nodes)
            if event.state in _FINISHED:
                self._learned_jobs.discard(job)
                self.job_nodes.pop(job, None)
            else:
                self._learned_jobs.add(job)
                if nodes:
                    self.job_nodes[job] = nodes
            return True
        if isinstance(event, NodeState):
            node = event.source.node
            if node is not None and _valid(node):
                self._learned_nodes.add(node)
            return True
        return False

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._static_nodes | self._learned_nodes)

    @property
    def jobs(self) -> frozenset[str]:
        return frozenset(self._static_jobs | self._learned_jobs)

    def knows_node(self, node: str) -> bool:
        return node in self._static_nodes or node in self._learned_nodes

    def knows_job(self, job: str) -> bool:
        return job in self._static_jobs or job in self._learned_jobs

    def __repr__(self) -> str:
        return f"Inventory({len(self.nodes)} nodes, {len(self.jobs)} jobs)"


def _valid(name: str) -> bool:
    try:
        check_name(name, "name")
    except ValueError:
        return False
    return True
