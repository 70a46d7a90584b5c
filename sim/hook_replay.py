"""Replay generated rank timelines through the real training hooks, to score the localizer on what they record.

:func:`vigil.sim.rank_traces.make_localization_case` with ``parts=True``
gives, per rank and iteration, the pieces of the rank's iteration. Here
each rank gets a real :class:`~vigil.producers.training.TrainingMonitor` on
a simulated clock, and each iteration is run through the hooks' API in the
order a training loop would: the host's data loading, the warm-up bubble
(``pipeline_wait``), compute in two halves each followed by a synchronous
tensor-parallel all-reduce (through ``instrument_collectives`` on a fake
``torch.distributed`` whose calls take the generated time), the
point-to-point receive of the pipeline (timed as wait by the wrappers),
the cool-down bubble, and the data-parallel all-reduce. The monitor's own
split (:func:`vigil.producers.training.timing.split_step`) makes the
records: compute from the marked ``mon.compute()`` blocks (``marked=True``,
the documented deployment) or the step's remainder (``marked=False``:
then the data loading counts as compute too).

The replay runs the host-clock path: the CUDA path's arithmetic is the
same split on event times (tested against a fake device in
``tests/unit/test_gpu_timing_fake_cuda.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

from vigil.producers.training.monitor import TrainingMonitor
from vigil.producers.training.wire import Sink

__all__ = ["replay_through_hooks"]


class _Clock:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


class _Group:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Dist:
    """The parts of ``torch.distributed`` the hooks wrap; each call lasts the next scripted duration."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.next_s = 0.0

    def _take(self) -> None:
        self.clock.t += self.next_s
        self.next_s = 0.0

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        self._take()

    def recv(self, tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> None:
        self._take()

    def get_world_size(self) -> int:
        return 1 << 20

    def get_process_group_ranks(self, group: Any) -> list[int]:
        return [0, 1]


class _Keep(Sink):
    def __init__(self) -> None:
        self.records: list[list[Any]] = []

    def send(self, source: dict[str, Any], records: list[list[Any]], urgent: bool = False) -> None:
        self.records.extend(records)


class _Tensor:
    nbytes = 4096


def replay_through_hooks(iterations: Sequence[Sequence[dict[str, Any]]], *, marked: bool = True) -> list[list[dict[str, Any]]]:
    """The localizer's records as the hooks would have made them from these timelines.

    ``iterations``: records with ``parts`` (see the module docstring). Returns
    the same shape: per iteration, per rank ``{rank, dp, pp, tp, compute,
    comm, wait, ops}`` (``ops``: the monitor's seconds per group kind, of
    the kinds the input's ``ops`` had), plus ``tp_size`` where the input had it.
    """
    state: dict[int, tuple[TrainingMonitor, _Clock, _Dist, _Keep, _Group, _Group]] = {}
    tensor = _Tensor()
    out: list[list[dict[str, Any]]] = []
    for i, records in enumerate(iterations):
        rows = []
        for rec in records:
            r = int(rec["rank"])
            if r not in state:
                clock = _Clock()
                dist = _Dist(clock)
                keep = _Keep()
                mon = TrainingMonitor(keep, job="replay", rank=r, node="sim", dp=rec["dp"], pp=rec["pp"], tp=rec["tp"],
                                      clock=clock, timing="cpu", flush_interval_s=1e9, max_buffer=1 << 30)
                mon.instrument_collectives(dist)
                tp_g, dp_g = _Group("tp"), _Group("dp")
                mon.name_group(tp_g, f"tp:{rec['dp']},{rec['pp']}")
                mon.name_group(dp_g, f"dp:{rec['pp']},{rec['tp']}")
                state[r] = (mon, clock, dist, keep, tp_g, dp_g)
            mon, clock, dist, keep, tp_g, dp_g = state[r]
            p = rec["parts"]
            with mon.step(i):
                clock.t += p["idle"]
                if p["bubble_warm"] > 0:
                    with mon.pipeline_wait():
                        clock.t += p["bubble_warm"]
                for _ in range(2):
                    if marked:
                        with mon.compute():
                            clock.t += p["compute"] / 2
                    else:
                        clock.t += p["compute"] / 2
                    if p["tp"] > 0:
                        dist.next_s = p["tp"] / 2
                        dist.all_reduce(tensor, group=tp_g)
                if p["pp"] > 0:
                    dist.next_s = p["pp"]
                    dist.recv(tensor, 0)
                if p["bubble_cool"] > 0:
                    with mon.pipeline_wait():
                        clock.t += p["bubble_cool"]
                if p["dp"] > 0:
                    dist.next_s = p["dp"]
                    dist.all_reduce(tensor, group=dp_g)
            it = keep.records[-1] if keep.records and keep.records[-1][0] == "it" else mon._buf[-1]
            _, _step, _start, _end, compute, comm, _dp, _pp, _tp, wait, by_kind, _measured = it
            row: dict[str, Any] = {"rank": r, "dp": rec["dp"], "pp": rec["pp"], "tp": rec["tp"], "compute": compute,
                                   "comm": comm, "wait": wait}
            if "ops" in rec:
                row["ops"] = {k: float(by_kind.get(k, 0.0)) for k in rec["ops"]}
            if "tp_size" in rec:
                row["tp_size"] = rec["tp_size"]
            rows.append(row)
        out.append(rows)
    return out
