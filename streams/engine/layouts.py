"""Where each job runs and in what shape, as its states tell it; and whether a state is a move.

A job's layout is its size (GPUs, dp, pp, tp) and the nodes it runs on. Two
kinds of writer state it: a scheduler, the simulator or vigil's own re-plan
name the job's whole node set; a node agent of a multi-node job names only
its own node. So the nodes that agents name under one size add up, and a
change of layout (a move, a resize, a re-partition: what makes the job's
steps slower or faster on purpose) is another size, or a node set named as
a whole that holds a node the job was not known to run on.
"""

from __future__ import annotations

from dataclasses import dataclass

from vigil.schemas import JobState

__all__ = ["JobLayouts", "Layout"]

#: Jobs remembered at most (those that never said they ended are dropped oldest first beyond it).
MAX_JOBS = 100_000


@dataclass(frozen=True)
class Layout:
    sizes: tuple[int, int, int, int]  # GPUs, dp, pp, tp
    nodes: frozenset[str]


class JobLayouts:
    """The layout of every job heard of; :meth:`learn` says whether a state changed it."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self.max_jobs = max_jobs
        self._known: dict[str, Layout] = {}

    def get(self, job: str) -> Layout | None:
        return self._known.get(job)

    def forget(self, job: str) -> None:
        self._known.pop(job, None)

    def learn(self, job: str, event: JobState) -> bool:
        """Take ``event``'s layout of ``job``; True when it changes the one known.

        The first layout heard is no change; a state that names no size and no
        node (a queued job) says nothing of the layout.
        """
        nodes = frozenset(event.nodes)
        if event.gpus == 0 and not nodes:
            return False
        sizes = (event.gpus, event.dp, event.pp, event.tp)
        known = self._known.pop(job, None)  # re-inserted last: the least recently told are dropped first
        own_node = len(nodes) == 1 and event.source.node in nodes  # a node agent naming its own node
        if known is None:
            changed, layout = False, Layout(sizes, nodes)
        elif sizes != known.sizes:
            changed, layout = True, Layout(sizes, nodes or known.nodes)
        elif own_node or nodes <= known.nodes:
            changed, layout = False, Layout(sizes, known.nodes | nodes)
        else:  # a whole node set with a node the job was not on: it moved
            changed, layout = True, Layout(sizes, nodes)
        self._known[job] = layout
        if len(self._known) > self.max_jobs:
            for old in list(self._known)[: max(1, self.max_jobs // 10)]:
                del self._known[old]
        return changed
