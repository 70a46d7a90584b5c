"""The load generator's message bytes, formatted from templates: what node agents and training hooks send.

:class:`Wire` writes the same JSON that :func:`vigil.schemas.encode` writes for
the same events (the load generator's tests hold them field for field equal to
the simulator's), as strings: building 30,000 pydantic models a second would
cost the generator more than the worker it loads. Values come in (the cluster
model, :mod:`vigil.sim.load`, draws them); bytes go out.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from vigil.schemas import GPUS_PER_NODE
from vigil.sim.simulator import SimJob

__all__ = ["NODE_RECORDS", "StepColumns", "Wire"]

#: Records in one node message: the heartbeat, one sample per GPU (all in one columnar event, counted
#: per GPU as the worker counts them), the NIC counters.
NODE_RECORDS = 1 + GPUS_PER_NODE + 1


#: Compact JSON of a list; one encoder for all (``json.dumps`` with separators builds one per call, which
#: was most of the generator's cost of a node's columns).
_json = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True)
class StepColumns:
    """A job's step columns that never change (JSON fragments): ranks, their nodes and GPUs, (dp, pp, tp)."""

    ranks: str
    nodes: str
    gpus: str
    dp: str
    pp: str
    tp: str

    @classmethod
    def of(cls, spec: SimJob) -> "StepColumns":
        world = range(spec.world_size)
        place = [spec.placement(r) for r in world]
        coords = [spec.coordinates(r) for r in world]
        return cls(ranks=_json(list(world)), nodes=_json([n for n, _ in place]), gpus=_json([g for _, g in place]),
                   dp=_json([c[0] for c in coords]), pp=_json([c[1] for c in coords]),
                   tp=_json([c[2] for c in coords]))


class Wire:
    """Formats one cluster's messages; event ids are unique per instance."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.ids = _Ids()
        self.iso = _Iso()
        self._fixed: dict[int, str] = {}  # GPUs on a node -> the columns of gpu_samples that never change

    def node(self, node: str, at: float, seq: int, gpus: list[tuple[bool, float, float, float, int]],
             nic: list[float]) -> bytes:
        """A node agent's message at ``at``: its heartbeat (``seq``), a sample of each GPU (busy, SM clock
        MHz, temperature C, power W, throttle reasons; one ``gpu_samples`` event) and its NIC's counters (CNP sent, CNP handled, ECN
        marked, port transmit wait)."""
        ids = self.ids
        head = f'"version":1,"event_time":"{self.iso(at)}","source":{{"cluster":"{self.cluster}","node":"{node}"'
        parts = [f'[{{"event_id":"{ids()}",{head}}},"event_type":"heartbeat","seq":{seq},"interval_s":1.0}}']
        n = len(gpus)
        fixed = self._fixed.get(n)
        if fixed is None:
            fixed = self._fixed[n] = (
                f'"memory_total_bytes":{_json([85899345920] * n)},"mem_clock_mhz":{_json([2619.0] * n)},'
                f'"ecc_sbe":{_json([0] * n)},"ecc_dbe":{_json([0] * n)},"retired_pages":[],"remapped_rows":[],'
                f'"pcie_replays":{_json([0] * n)},"nvlink_errors":[]}}')
        busy = [g[0] for g in gpus]
        parts.append(  # the node's GPUs in columns, as the agent sends them (GpuSamples)
            f'{{"event_id":"{ids()}",{head}}},"event_type":"gpu_samples","gpus":{_json(list(range(n)))},'
            f'"utilization_pct":{_json([97.0 if b else 0.0 for b in busy])},'
            f'"memory_used_bytes":{_json([64424509440 if b else 524288000 for b in busy])},'
            f'"temperature_c":{_json([round(g[2], 1) for g in gpus])},"sm_clock_mhz":{_json([round(g[1], 1) for g in gpus])},'
            f'"power_w":{_json([round(g[3], 1) for g in gpus])},"throttle_reasons":{_json([g[4] for g in gpus])},{fixed}')
        parts.append(
            f'{{"event_id":"{ids()}",{head}}},"event_type":"nic_counters","device":"mlx5_0","port":1,"counters":'
            f'{{"np_cnp_sent":{int(nic[0])},"rp_cnp_handled":{int(nic[1])},"np_ecn_marked_roce_packets":{int(nic[2])},'
            f'"port_xmit_wait":{int(nic[3])},"link_downed":0,"symbol_error":0}},"port_state":"ACTIVE"}}]')
        return ",".join(parts).encode()

    def step(self, job: str, step: int, begin: float, end: float, duration: float, columns: StepColumns,
             compute: list[float], communication: list[float]) -> bytes:
        """A job's ``iteration_step``: every rank's compute and communication time in columns."""
        iso = self.iso
        return (f'{{"event_id":"{self.ids()}","version":1,"event_time":"{iso(end)}","source":{{"cluster":'
                f'"{self.cluster}","job":"{job}"}},"event_type":"iteration_step","step":{step},'
                f'"start":"{iso(begin)}","end":"{iso(end)}","duration_s":{duration!r},'
                f'"ranks":{columns.ranks},"nodes":{columns.nodes},"gpus":{columns.gpus},"compute_s":{_json(compute)},'
                f'"communication_s":{_json(communication)},"dp":{columns.dp},"pp":{columns.pp},"tp":{columns.tp},'
                f'"wait_s":[],"measured":{{}}}}').encode()


class _Ids:
    """Unique event ids, cheaply: a random UUID's first 20 hex digits and a counter."""

    def __init__(self) -> None:
        head = uuid.uuid4().hex
        self.prefix = f"{head[:8]}-{head[8:12]}-4{head[13:16]}-8{head[17:20]}-"
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"{self.prefix}{self.n:012x}"


class _Iso:
    """Seconds since the epoch to the JSON time string, the date part cached per second."""

    def __init__(self) -> None:
        self._sec = -1
        self._prefix = ""

    def __call__(self, t: float) -> str:
        us = int(t * 1_000_000)
        sec, micro = divmod(us, 1_000_000)
        if sec != self._sec:
            self._sec = sec
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        return f"{self._prefix}.{micro:06d}Z"
