"""The discrete-event cluster simulator: physics with known answers, traces, policies, the benchmark."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vigil.sim.clustersim import Costs, scenario, simulate
from vigil.sim.clustersim.model import (
    MODELS, HardwareSpec, JobConfig, StepFactors, Topology, iteration_time, link_role, throughput_table,
)
from vigil.sim.clustersim.publish import AcceleratedPublisher
from vigil.sim.clustersim.traces import DAY, FailSlowFault, FailStop, FailureTrace, preset

#: No communication and no per-step overhead: an iteration is pure compute.
COMPUTE_ONLY = HardwareSpec(allreduce_overlap=1.0, ring_latency_s=0.0, overhead_s=0.0)


def run_small(policy, stops=(), slows=(), days=1.0, size=2, hw=HardwareSpec(), costs=Costs(), seed=0, model="1.3B"):
    topo = Topology.build(size, size)
    jobs = [JobConfig("j", MODELS[model], 1.0, size=size)]
    trace = FailureTrace("t", tuple(topo.nodes), days * DAY, seed, tuple(stops), tuple(slows))
    return simulate(policy, jobs, topo, trace, costs=costs, hw=hw, seed=seed)


def events(result, event, /, **match):
    return [e for e in result["log"] if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


# -- physics ---------------------------------------------------------------------


def test_a_single_slow_gpu_slows_a_compute_bound_job_by_its_own_slowdown():
    m = MODELS["1.3B"]
    healthy = iteration_time(m, 4, hw=COMPUTE_ONLY)
    slow = StepFactors.healthy(4, 1)
    slow.compute[2, 0] = 1.5
    assert iteration_time(m, 4, slow, COMPUTE_ONLY) / healthy == pytest.approx(1.5, rel=1e-12)


def test_a_slow_gpu_stretches_only_the_compute_part_when_the_job_communicates():
    m, hw = MODELS["7B"], HardwareSpec()
    healthy = iteration_time(m, 4, hw=hw)
    compute = math.ceil(m.global_batch / 4) * m.t_mb(hw)  # one replica's micro-batches, pp = 1
    slow = StepFactors.healthy(4, 1)
    slow.compute[0, 0] = 1.5
    assert iteration_time(m, 4, slow, hw) - healthy == pytest.approx(0.5 * compute, rel=1e-9)
    assert 1.0 < iteration_time(m, 4, slow, hw) / healthy < 1.5


def test_a_congested_link_slows_only_the_traffic_that_crosses_it():
    grid = [["a0", "a1"], ["b0", "b1"]]
    assert link_role(grid, "a0", "b0") == "dp" and link_role(grid, "a0", "a1") == "pp"
    assert link_role(grid, "a0", "b1") is None and link_role(grid, "a0", "zz") is None
    m = MODELS["13B"]
    f = StepFactors.healthy(2, 2)
    f.dp_comm = 4.0
    assert iteration_time(m, 2, f) > iteration_time(m, 2)


def test_throughput_is_non_linear_and_only_multiples_of_the_pipeline_depth_count():
    t = throughput_table(MODELS["13B"], 16)
    assert all(t[x] == 0.0 for x in range(17) if x % 2)
    per_node = [t[x] / x for x in range(2, 17, 2)]
    assert all(a > b for a, b in zip(per_node, per_node[1:]))  # diminishing returns
    assert t[16] > t[2] * 7


def test_simulated_progress_loses_exactly_what_a_slow_gpu_costs():
    slow = FailSlowFault(t=10_000.0, node="node-000", cause="computation", factor=1.5, duration_s=3600.0, gpu=3)
    clean = run_small("restart-only", hw=COMPUTE_ONLY)
    r = run_small("restart-only", slows=[slow], hw=COMPUTE_ONLY)
    job = r["jobs"]["j"]
    assert job["failslow_lost_s"] == pytest.approx(3600.0 * (1 - 1 / 1.5), rel=1e-9)
    assert job["failslow_unmitigated_lost_s"] == pytest.approx(job["failslow_lost_s"], rel=1e-9)
    assert job["useful_pflops"] == pytest.approx(clean["jobs"]["j"]["useful_pflops"] * (DAY - 1200.0) / DAY, rel=1e-9)


class _LeaveTheStraggler:
    """A test policy: as soon as a fail-slow hits the job, move it off the slow node onto the other one (or onto
    none: the job stops), free."""

    name = "leave-the-straggler"

    def __init__(self, onto):
        self.onto = onto

    def setup(self, sim):
        self.moved = False

    def on_failstop(self, sim, fault, job):
        pass

    def on_node_up(self, sim, node):
        pass

    def on_level(self, sim, job):
        if job.episodes and not self.moved:
            self.moved = True
            sim.at(sim.now, self._move, sim, job)

    def _move(self, sim, job):
        sim.leave_stragglers(job)
        sim.release(job)
        if self.onto is None:
            sim.set_off(job, "no nodes")
            return
        sim.assign(job, [[self.onto]])
        sim.resume(job, 0.0, rollback=False)

    def finish(self, sim):
        return {}


@pytest.mark.parametrize("onto", ["node-001", None])
def test_leaving_a_straggler_costs_the_share_of_speed_the_job_gives_up_while_the_episode_lasts(onto):
    from vigil.sim.clustersim.engine import Simulation

    topo = Topology.build(2, 2)
    jobs = [JobConfig("j", MODELS["1.3B"], 1.0, size=2)]
    slow = FailSlowFault(t=10_000.0, node="node-000", cause="computation", factor=2.0, duration_s=3600.0, gpu=1)
    trace = FailureTrace("t", tuple(topo.nodes), DAY, 0, (), (slow,))
    sim = Simulation(jobs, topo, trace, _LeaveTheStraggler(onto), hw=COMPUTE_ONLY,
                     initial={"j": [["node-000"], ["node-001"]]})
    r = sim.run()
    job = r["jobs"]["j"]
    table = throughput_table(MODELS["1.3B"], 2, COMPUTE_ONLY)
    # healthy on one node instead of two (or stopped) for the hour the GPU stays slow: that share of the hour is lost
    share = 1.0 if onto is None else 1 - table[1] / table[2]
    assert job["failslow_lost_s"] == pytest.approx(3600.0 * share, rel=1e-6)
    assert job["failslow_unmitigated_lost_s"] == pytest.approx(3600.0 * (1 - 1 / 2.0), rel=1e-6)
    # the slowdown is how much longer the work took: none of it got done while the job was stopped
    assert r["failslow_slowdown_pct"] == (None if onto is None else pytest.approx(100.0 * share / (1 - share), rel=1e-6))


# -- failures, restarts, repairs -----------------------------------------------------------


def test_node_repair_returns_capacity_to_a_restart_only_job():
    c = Costs()
    loss = FailStop(t=4500.0, node="node-001", severity=1, kind="node_loss", detail="", cure="exclude", repair_s=6 * 3600.0)
    r = run_small("restart-only", stops=[loss])
    repaired = 4500.0 + 6 * 3600.0
    # the job waited for the node, set up, redid the 900 s since its checkpoint at 3600 s, then ran to the end
    running_again = repaired + c.setup_s + (4500.0 - 2 * c.checkpoint_interval_s)
    assert r["jobs"]["j"]["ettr"] == pytest.approx((4500.0 + DAY - running_again) / DAY, rel=1e-9)
    assert events(r, "node_repaired", node="node-001") and r["still_waiting"] == []


def test_node_repair_returns_capacity_to_a_job_vigil_shrank():
    loss = FailStop(t=4500.0, node="node-001", severity=1, kind="node_loss", detail="", cure="exclude", repair_s=6 * 3600.0)
    r = run_small("vigil", stops=[loss])
    replans = events(r, "replan")
    assert replans[0]["jobs"] == {"j": 1} and replans[0]["failed"] == "j"  # shrank onto the surviving node
    assert any(e["jobs"] == {"j": 2} and e["t"] >= 4500.0 + 6 * 3600.0 for e in replans)  # grew back after repair
    assert r["jobs"]["j"]["ettr"] > 0.97


def test_a_failure_during_a_restart_fails_the_restart_and_escalates():
    crash = FailStop(t=1000.0, node="node-000", severity=2, kind="process_exit", detail="", cure="restart")
    loss = FailStop(t=1100.0, node="node-001", severity=1, kind="node_loss", detail="", cure="exclude", repair_s=3 * DAY)
    r = run_small("vigil", stops=[crash, loss], days=0.5)
    assert events(r, "decision", action="restart_process", job="j")
    assert events(r, "action_result", action="restart_process", state="failed")
    assert events(r, "decision", action="reconfigure", job="j")
    assert events(r, "replan")[0]["jobs"] == {"j": 1}  # off the lost node
    # The escalated reconfigure also excludes the crashed rank's node (the engine's culprit); it comes
    # back after its health check and the job runs there again, never on the lost node.
    assert events(r, "replan")[-1]["jobs"] == {"j": 1} and r["jobs"]["j"]["ettr"] > 0.7


def test_restart_only_starts_over_when_a_failure_hits_the_set_up():
    c = Costs()
    first = FailStop(t=1000.0, node="node-000", severity=2, kind="process_exit", detail="", cure="restart")
    during_setup = 1000.0 + c.collective_timeout_s + c.resubmit_s + 100.0
    second = FailStop(t=during_setup, node="node-001", severity=2, kind="hang", detail="", cure="restart")
    r = run_small("restart-only", stops=[first, second])
    assert r["restarts"] == 2
    cycle = c.collective_timeout_s + c.resubmit_s + c.setup_s
    back = during_setup + cycle + (1000.0 - 0.0)  # recompute 1000 s since the start (no checkpoint yet)
    assert r["jobs"]["j"]["ettr"] == pytest.approx((1000.0 + DAY - back) / DAY, rel=1e-9)


# -- vigil drives the live code --------------------------------------------------------------------


def test_vigil_answers_a_crash_with_the_live_decision_engine():
    crash = FailStop(t=2000.0, node="node-001", severity=2, kind="process_exit", detail="", cure="restart")
    r = run_small("vigil", stops=[crash], days=0.25)
    opened = events(r, "alert", status="open", kind="process_exit")
    decided = events(r, "decision", action="restart_process", job="j")
    assert opened and decided and "sev2 process_exit" in decided[0]["reason"]
    assert decided[0]["t"] - 2000.0 < 1.0  # in-band: within a second
    assert [e["state"] for e in events(r, "action_result", action="restart_process")] == ["running", "succeeded"]
    assert events(r, "alert", status="resolved", kind="process_exit")
    assert r["detection"]["process_exit"]["p50_s"] < 1.0


def test_vigil_retries_in_place_then_escalates_when_the_failure_comes_back():
    flap = FailStop(t=2000.0, node="node-000", severity=3, kind="exception", detail="nccl_timeout", cure="restart")
    r = run_small("vigil", stops=[flap], days=0.25)
    actions = [e["action"] for e in events(r, "decision", job="j")]
    assert actions[:2] == ["retry_in_place", "restart_process"]


def test_vigil_detects_and_mitigates_a_slow_gpu():
    slow = FailSlowFault(t=20_000.0, node="node-001", cause="computation", factor=2.0, duration_s=4 * 3600.0, gpu=5)
    r = run_small("vigil", slows=[slow], days=0.5)
    assert events(r, "alert", status="open", kind="fail_slow")
    assert events(r, "decision", action="rebalance_microbatches", job="j")
    assert r["detection"]["fail_slow:computation"]["p50_s"] < 60.0
    assert r["failslow_mitigated_pct"] > 30.0
    rest = run_small("restart-only", slows=[slow], days=0.5)
    assert r["failslow_lost_s"] < rest["failslow_lost_s"]


# -- traces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,days,sev1,others,comp,comm", [("trace-a", 56, 10, 33, 4, 12),
                                                              ("trace-b", 7, 26, 80, 10, 30)])
def test_trace_presets_have_the_documented_counts(name, days, sev1, others, comp, comm):
    nodes = [f"n{i:02d}" for i in range(16)]
    t = preset(name, nodes, seed=3)
    c = t.counts()
    assert (c["sev1"], c["others"], c["fail_slow_computation"], c["fail_slow_communication"]) == (sev1, others, comp, comm)
    assert t.duration_s == days * DAY
    down = {}
    for f in sorted(t.fail_stops, key=lambda f: f.t):
        if f.node in down and down[f.node] > f.t:
            assert not any(n not in down or down[n] <= f.t for n in nodes), "an event on a node under repair"
        if f.severity == 1:
            assert DAY <= f.repair_s <= 7 * DAY
            down[f.node] = f.t + f.repair_s
    assert {f.cure for f in t.fail_stops if f.severity == 1} == {"exclude"}
    # scaled presets keep the per-node rates
    big = preset(name, [f"n{i:03d}" for i in range(160)], seed=3).counts()
    assert (big["sev1"], big["others"]) == (10 * sev1, 10 * others)


@pytest.mark.parametrize("seed", [0, 3, 29])  # seeds whose trace-b takes the whole cluster down
def test_a_preset_puts_faults_on_nodes_under_repair_only_when_every_node_is_down(seed):
    nodes = [f"n{i:02d}" for i in range(16)]
    t = preset("trace-b", nodes, seed=seed)
    repairs = t.outages()

    def down(node, when):  # as the simulator plays it: a fault at the instant of a repair still finds it down
        return any(n == node and a < when <= b for n, a, b in repairs)

    starts = {(n, a) for n, a, _ in repairs}
    on_down = [(f.node, f.t) for f in t.fail_stops if (f.node, f.t) not in starts and down(f.node, f.t)]
    on_down += [(s.node, s.t) for s in t.fail_slows if down(s.node, s.t)]
    assert on_down and len(on_down) == t.on_down_nodes()
    for node, when in on_down:
        assert all(down(n, when) for n in nodes), f"a fault on {node} under repair while another node was up"


def test_the_oracle_counts_a_node_down_once_when_it_fails_again_under_repair():
    from vigil.bench.policies import oracle_waf

    jobs = [JobConfig("j", MODELS["1.3B"], 1.0, size=2)]
    table = throughput_table(MODELS["1.3B"], 2)
    stops = (FailStop(1 * DAY, "n0", 1, "node_loss", "", "exclude", 2 * DAY),
             FailStop(2 * DAY, "n0", 1, "xid", "79", "exclude", 5 * DAY))  # n0 is under repair: nothing changes
    trace = FailureTrace("t", ("n0", "n1"), 10 * DAY, 0, stops, ())
    assert trace.outages() == [("n0", 1 * DAY, 3 * DAY)] and trace.on_down_nodes() == 1
    assert oracle_waf(jobs, trace) == pytest.approx((table[2] * 8 * DAY + table[1] * 2 * DAY) / 1e18)


def test_no_policy_beats_the_oracle_when_the_whole_cluster_goes_down():
    from vigil.bench.policies import oracle_waf

    jobs, topo, trace = scenario("trace-b", 128, seed=3)  # every node is down at some point of this trace
    assert trace.on_down_nodes() > 0
    bound = oracle_waf(jobs, trace)
    for policy in ("restart-only", "per-job", "vigil"):
        assert simulate(policy, jobs, topo, trace, seed=3)["accumulated_waf"] <= bound


def test_a_run_is_deterministic_for_a_seed():
    jobs, topo, trace = scenario("trace-b", 128, seed=5, days=2)
    a = simulate("vigil", jobs, topo, trace, seed=5)
    b = simulate("vigil", jobs, topo, trace, seed=5)
    assert a["accumulated_waf"] == b["accumulated_waf"] and a["log"] == b["log"]
    assert a["decisions"] == b["decisions"] and sum(a["decisions"].values()) > 50
    _, _, other = scenario("trace-b", 128, seed=6, days=2)
    assert other.fail_stops != trace.fail_stops


# -- publishing ------------------------------------------------------------------------------------


def test_accelerated_publisher_paces_simulated_time():
    clock = [100.0]
    slept = []
    published = []

    class Pub:
        def publish(self, events):
            published.extend(events)

    def sleep(s):
        slept.append(s)
        clock[0] += s

    crash = FailStop(t=600.0, node="node-000", severity=2, kind="process_exit", detail="", cure="restart")
    tap = AcceleratedPublisher(Pub(), speedup=3600.0, clock=lambda: clock[0], sleep=sleep)
    r = run_small("vigil", stops=[crash], days=0.1)
    topo = Topology.build(2, 2)
    jobs = [JobConfig("j", MODELS["1.3B"], 1.0, size=2)]
    trace = FailureTrace("t", tuple(topo.nodes), 0.1 * DAY, 0, (crash,), ())
    simulate("vigil", jobs, topo, trace, tap=tap)
    kinds = {e.event_type for e in published}
    assert {"alert", "decision", "action_result", "node_state", "job_state", "heartbeat", "process_exit"} <= kinds
    assert sum(1 for e in published if e.event_type == "decision") == sum(r["decisions"].values())
    last = max(e["t"] for e in r["log"] if e["event"] == "action_result")
    assert sum(slept) == pytest.approx(last / 3600.0, rel=0.05)  # the run's span at 3600x


# -- the benchmark -----------------------------------------------------------------------------------


def test_bench_policies_writes_json_markdown_and_plot(tmp_path):
    from vigil.bench.policies import run

    path = tmp_path / "policies.json"
    result = run(str(path), trace="trace-b", gpus=128, seed=1, days=1, scale=False, sweep_seeds=2)  # 1 day: quick
    on_disk = json.loads(path.read_text())
    assert on_disk["trace"] == "trace-b" and on_disk["gpus"] == 128 and on_disk["detail"]["trace_days"] == 1
    assert set(on_disk["policies"]) == {"restart-only", "per-job", "vigil"}
    for p in on_disk["policies"].values():
        assert {"accumulated_waf", "ettr_mean", "failslow_slowdown_pct"} <= set(p)
    assert "failslow_mitigated_pct" in on_disk and on_disk["wall_s"] > 0
    assert result["policies"]["vigil"]["accumulated_waf"] > result["policies"]["restart-only"]["accumulated_waf"]
    assert result["detail"]["oracle_accumulated_waf"] >= max(p["accumulated_waf"] for p in result["policies"].values())
    assert path.with_suffix(".md").read_text().startswith("# Policy benchmark")
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.isfinite(result["detail"]["restart_only_manual_shrink_4h"]["accumulated_waf"])
    bound = result["detail"]["failslow_clairvoyant"]
    assert bound["failslow_mitigated_pct"] is not None and "failslow_steps" in bound
    assert set(result["detail"]["per_policy"]["vigil"]["failslow_history"]) == {"computation", "communication"}
    sweep = result["detail"]["seed_sweep"]
    assert [r["seed"] for r in sweep["per_seed"]] == [0, 1]
    assert all(r["vigil_ratio"] <= r["oracle_ratio"] for r in sweep["per_seed"])
    assert result["targets"]["waf_ratio_trace-b"]["bound"] == result["detail"]["oracle_ratio_vs_restart_only"]
    assert "reference" in result["targets"]["failslow_mitigated_pct"]  # the clairvoyant run is no bound
    assert "bound" not in result["targets"]["failslow_mitigated_pct"]
    assert "### Seeds 0-1" in path.with_suffix(".md").read_text()
    command = f"vigil bench policies --json {path} --trace trace-b --gpus 128 --seed 1 --days 1 --no-scale --sweep-seeds 2"
    assert on_disk["command"] == command
    assert f"Reproduce: `{command}`" in path.with_suffix(".md").read_text().splitlines()
    machine = on_disk["detail"]["machine"]
    assert machine["cpus"] and all(len(machine[k]) == 3 for k in ("load_before", "load_after"))
