"""The history of a simulated run, with faults injected at known times, counts
each injected fault once, under its kind, severity and XID code."""

from __future__ import annotations

from collections import Counter

from vigil.sim.clustersim import simulate
from vigil.sim.clustersim.model import MODELS, JobConfig, Topology
from vigil.sim.clustersim.traces import DAY, FailStop, FailureTrace

#: The incident kind the detectors name each injected fault kind with.
INCIDENT_KIND = {"process_exit": "process_exit", "node_loss": "node_lost", "xid": "xid"}


def test_incidents_from_a_simulated_run_equal_the_injected_faults(history):
    topo = Topology.build(3, 3)
    jobs = [JobConfig("sim-job", MODELS["1.3B"], 1.0, size=3)]
    injected = (FailStop(600.0, "node-000", 2, "process_exit", "", "restart"),
                FailStop(3000.0, "node-002", 1, "node_loss", "", "exclude", repair_s=DAY),
                FailStop(5000.0, "node-001", 1, "xid", "48", "exclude", repair_s=DAY))
    events: list = []
    simulate("vigil", jobs, topo, FailureTrace("history", tuple(topo.nodes), 8000.0, 0, injected, ()),
             tap=lambda _t, batch: events.extend(batch))
    assert history.insert_events(events) == len({e.event_id for e in events})

    rows = history.query(f"SELECT kind, severity, xid_code, count() FROM {history.database}.incidents "
                         "GROUP BY kind, severity, xid_code").rows
    want = Counter((INCIDENT_KIND[f.kind], f.severity, int(f.detail) if f.kind == "xid" else None) for f in injected)
    assert {(kind, sev, code): n for kind, sev, code, n in rows} == dict(want)
