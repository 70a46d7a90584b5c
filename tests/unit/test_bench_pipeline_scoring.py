"""The pipeline benchmark's scoring: which alert answers which fault, percentiles, targets (hand-made cases)."""

from __future__ import annotations

import math
import uuid

import pytest

from vigil.bench.pipeline import MIN_P99_SAMPLES, match, merge, percentile, quantile_ci, summarize, targets_met
from vigil.schemas import Alert, Source, Subject, from_seconds
from vigil.sim.load import Injection
from vigil.sim.simulator import Fault


def alert(kind, subject, incident=None, status="open", evidence=()):
    return Alert(event_time=from_seconds(0.0), source=Source(), incident_id=incident or uuid.uuid4(), incident_version=1,
                 status=status, severity=2, kind=kind, subject=Subject(**subject), onset_time=from_seconds(0.0),
                 detection_time=from_seconds(0.0), detector="x", detector_version="1", evidence=list(evidence))


def exc(job, at, ended=None):
    return Injection("exception", Fault("exception", job, at, injected_at=at), job=job, iteration_s=1.0,
                     ended_at=ended if ended is not None else at + 8.0)


def test_the_first_alert_naming_the_cause_after_injection_counts():
    inj = exc("j1", 100.0)
    alerts = [(alert("cuda_error", {"job": "j1"}), 99.0),            # before the fault: not it
              (alert("cuda_error", {"job": "j2"}), 100.1),           # another job
              (alert("task_hang", {"job": "j1"}), 100.2),            # not its cause
              (alert("cuda_error", {"job": "j1"}, status="resolved"), 100.3),
              (alert("cuda_error", {"job": "j1", "rank": 3}), 100.4)]  # it (a narrower subject is fine)
    [row] = match([inj], alerts)["faults"]
    assert math.isclose(row["delay_s"], 0.4) and row["incidents"] == 1


def test_a_fault_with_no_alert_is_missed_and_an_alert_with_no_fault_is_unexplained():
    out = match([exc("j1", 100.0)], [(alert("xid", {"node": "n1"}), 101.0)])
    assert out["faults"][0]["delay_s"] is None
    assert out["unexplained_incidents"] == {"xid": 1}
    [told] = out["unexplained"]
    assert (told["kind"], told["subject"], told["arrived_at"], told["severity"]) == ("xid", {"node": "n1"}, 101.0, 2)


def test_an_incident_answers_one_fault():
    """A later fault of the same job is not credited with the earlier fault's incident's update."""
    first, second = exc("j1", 100.0, ended=108.0), exc("j1", 120.0, ended=128.0)
    inc = uuid.uuid4()
    alerts = [(alert("cuda_error", {"job": "j1"}, inc), 100.2), (alert("cuda_error", {"job": "j1"}, inc), 121.0)]
    rows = match([first, second], alerts)["faults"]
    assert math.isclose(rows[0]["delay_s"], 0.2) and rows[1]["delay_s"] is None


def test_two_incidents_for_one_fault_are_counted():
    alerts = [(alert("cuda_error", {"job": "j1"}), 100.2), (alert("cuda_error", {"job": "j1"}), 100.9)]
    [row] = match([exc("j1", 100.0)], alerts)["faults"]
    assert row["incidents"] == 2


def test_a_fail_slow_is_answered_by_its_gpu_or_its_job_and_counted_in_iterations():
    f = Fault("gpu_slow", "n1", 10.0, gpu=2, injected_at=100.0, onset_at=100.5)
    inj = Injection("fail_slow", f, job="j1", iteration_s=1.0, slowed_iteration_s=2.0, ended_at=150.0)
    alerts = [(alert("throttle", {"node": "n1", "gpu": 3}), 101.0),  # another GPU
              (alert("throttle", {"node": "n1", "gpu": 2}), 104.5),
              (alert("throttle", {"node": "n1", "gpu": 2}, evidence=[{"kind": "fail_slow", "subject": {"job": "j1"}}]),
               110.5)]
    [row] = match([inj], alerts)["faults"]
    assert math.isclose(row["iterations"], 2.0) and math.isclose(row["job_iterations"], 5.0)


def test_hang_excess_is_over_k_times_its_jobs_step():
    inj = Injection("hang", Fault("hang", "j1", 0.0, injected_at=100.0), job="j1", iteration_s=2.0, ended_at=120.0)
    [row] = match([inj], [(alert("task_hang", {"job": "j1"}), 106.5)])["faults"]
    assert math.isclose(row["excess_s"], 0.5)


def test_percentiles_are_nearest_rank_and_a_miss_is_infinite():
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0
    assert percentile(values[:99] + [math.inf], 0.99) == 99.0
    assert percentile(values[:98] + [math.inf, math.inf], 0.99) is None
    assert percentile([], 0.5) is None


def _rows(kind, n, delay, missed=0):
    rows = [{"kind": kind, "delay_s": delay, "incidents": 1} for _ in range(n - missed)]
    return rows + [{"kind": kind, "delay_s": None, "incidents": 0} for _ in range(missed)]


def test_no_p99_from_fewer_than_100_faults():
    lat = summarize({"faults": _rows("exception", 99, 0.1)})
    assert lat["exception"]["p99"] is None and lat["exception"]["max"] == 0.1 and lat["exception"]["n"] == 99
    lat = summarize({"faults": _rows("exception", MIN_P99_SAMPLES, 0.1)})
    assert lat["exception"]["p99"] == 0.1 and "max" not in lat["exception"]


def test_a_target_needs_100_faults_none_missed_and_the_p99_within_it():
    met = lambda rows: targets_met(summarize({"faults": rows}), 500.0)["exception"]  # noqa: E731
    assert met(_rows("exception", 100, 0.15))
    assert not met(_rows("exception", 100, 0.25))           # too slow
    assert not met(_rows("exception", 99, 0.15))            # too few for a p99
    assert not met(_rows("exception", 100, 0.15, missed=1))  # one fault never alerted
    assert not targets_met(summarize({"faults": _rows("exception", 100, 0.15)}), 2048.0)["rss"]


def test_quantile_intervals_are_the_order_statistics_of_the_binomial():
    # the textbook ranks: the median of 100 lies between the 40th and 61st values (95 %), of 10 the 2nd and 9th
    assert quantile_ci([float(x) for x in range(1, 101)], 0.5) == [40.0, 61.0]
    assert quantile_ci([float(x) for x in range(10, 0, -1)], 0.5) == [2.0, 9.0]
    # a p99 of 100 values: bounded below by the 97th, not above (no rank beyond the sample)
    assert quantile_ci([float(x) for x in range(1, 101)], 0.99) == [97.0, None]
    # a missed fault at an end leaves it unbounded
    assert quantile_ci([1.0, 2.0, math.inf, math.inf, math.inf], 0.5)[1] is None
    assert quantile_ci([], 0.5) is None


def test_merge_keeps_every_part_and_recomputes_the_verdict():
    def part(command, throughput, points, wall):
        return {"command": command, "throughput": throughput, "throughput_detail": {},
                "capacity": [{"gpus_per_worker": g, "workers": 1, "targets_met": ok, "rss_mb": 100.0 + g / 100,
                              "records_per_s": 2 * g, "worker_cpu_us_per_record": 5.0} for g, ok in points],
                "machine": {"load_before": [float(wall)], "load_after": [float(wall) + 1]}, "wall_s": wall}

    out = merge([part("a", {"1": 100}, [(2000, True), (25000, True)], 10),
                 part("b", {"2": 150}, [(25000, False), (5000, True)], 20)])
    assert out["throughput"] == {"1": 100, "2": 150}
    assert [p["gpus_per_worker"] for p in out["capacity"]] == [2000, 5000, 25000]
    assert out["max_gpus_per_worker_meeting_targets"] == 5000  # the later 25,000 point missed
    assert out["command"] == ["a", "b"] and out["wall_s"] == 30
    assert out["machine"]["load_before"] == [10.0] and out["machine"]["load_after"] == [21.0]
    assert out["projection"]["100000"]["workers"] == 20

    # a merged result merged again with a new part: flat commands and parts, its notes kept before the new ones
    again = merge([dict(out, notes=["first"]), part("c", {"1": 120}, [(10000, True)], 5)], notes=["second"])
    assert again["command"] == ["a", "b", "c"] and [q["command"] for q in again["parts"]] == ["a", "b", "c"]
    assert again["notes"] == ["first", "second"] and again["throughput"] == {"1": 120, "2": 150}
    assert again["max_gpus_per_worker_meeting_targets"] == 10000 and again["wall_s"] == 35


def test_merge_refuses_points_measured_on_different_machines():
    """The same 2-core VM spec has landed on hosts three times apart in speed: a curve through points of two
    of them describes neither, so merge refuses it, and keeps the parts' machine (not the merger's)."""
    def part(gpus, machine):
        return {"command": f"p{gpus}", "throughput": {}, "capacity": [
            {"gpus_per_worker": gpus, "workers": 1, "targets_met": True, "rss_mb": 200.0, "records_per_s": 2 * gpus,
             "worker_cpu_us_per_record": 5.0}], "machine": {**machine, "load_before": [0.1], "load_after": [0.2]},
            "wall_s": 1}

    fast = {"cpu_model": "AMD EPYC @ 2596 MHz", "speed_mark_s": 0.031}
    out = merge([part(5000, fast), part(10000, {**fast, "speed_mark_s": 0.036})])  # within SAME_SPEED: one machine
    assert out["machine"]["cpu_model"] == "AMD EPYC @ 2596 MHz" and out["machine"]["speed_mark_s"] == 0.031
    with pytest.raises(ValueError, match="different machines"):
        merge([part(5000, fast), part(10000, {**fast, "speed_mark_s": 0.09})])  # 2.9x slower
    with pytest.raises(ValueError, match="CPU not recorded"):
        merge([part(5000, fast), part(10000, {})])  # an older part that did not say
    merged_before = merge([part(5000, {}), part(10000, {})])
    with pytest.raises(ValueError, match="different machines"):
        merge([merged_before, part(15000, fast)])  # a merge's own parts are looked into


def test_a_later_fault_of_the_same_job_owns_the_incidents_that_came_after_it():
    """Two crashes of one job 20 s apart, each alerted by an incident of its own: the second's incident is
    not credited to the first (whose margin still ran), and the first was alerted once."""
    first, second = exc("j1", 100.0, ended=108.0), exc("j1", 120.0, ended=128.0)
    alerts = [(alert("cuda_error", {"job": "j1"}), 100.2), (alert("cuda_error", {"job": "j1"}), 120.1)]
    rows = match([first, second], alerts)["faults"]
    assert rows[0]["incidents"] == 1 and math.isclose(rows[1]["delay_s"], 0.1) and rows[1]["incidents"] == 1
    # a node lost under the same job: the hang it causes, and the update naming the node, are the node's
    lost = Injection("node_lost", Fault("node_loss", "n1", 0.0, injected_at=125.0), job="j1", iteration_s=1.0,
                     ended_at=131.5)
    hang = Injection("hang", Fault("hang", "j1", 0.0, injected_at=100.0), job="j1", iteration_s=1.0, ended_at=111.0)
    inc = uuid.uuid4()
    alerts = [(alert("task_hang", {"job": "j1"}), 103.0), (alert("task_hang", {"job": "j1"}, inc), 126.5),
              (alert("node_lost", {"node": "n1"}, inc), 126.6)]
    rows = match([hang, lost], alerts)["faults"]
    assert rows[0]["incidents"] == 1 and math.isclose(rows[1]["delay_s"], 1.6)


def test_the_projection_gives_workers_and_memory_from_the_cpu_per_record_and_from_the_latency_capacity():
    """Hand-made points: 2 records a second per GPU; a worker's cores 0.1 + 20 us per record; its RSS
    100 MB + 30 MB per 1,000 GPUs. At 50 % busy a worker carries (0.5 - 0.1) / (20 us x 2) = 10,000 GPUs."""
    from vigil.bench.pipeline import project

    def point(gpus):
        records = 2.0 * gpus
        return {"gpus_per_worker": gpus, "workers": 1, "records_per_s": records,
                "cpu_cores": {"worker-0": 0.1 + 20e-6 * records, "broker": 0.4}, "rss_mb": 100.0 + 0.03 * gpus}

    points = [point(1000), point(4000), point(8000)]
    out = project(points, None, throughput={"1": 40_000})
    model = out["model"]
    assert model["records_per_gpu_s"] == 2.0 and model["cpu_gpus_per_worker"] == 10_000
    assert model["worker_cpu"]["us_per_record"] == 20.0 and math.isclose(model["worker_cpu"]["fixed_cores"], 0.1)
    assert (model["rss_mb"]["base"], model["rss_mb"]["per_1000_gpus"]) == (100.0, 30.0)
    assert model["backlog_us_per_record"] == 25.0 and set(model["scales_with"]) >= {"records", "worker_rss", "incidents"}
    big = out["100000"]
    assert big["records_per_s"] == 200_000 and big["worker_cores_at_full_use"] == 4.0
    assert big["from_cpu"] == {"workers": 10, "rss_gb_per_worker": round(400 / 1024, 3), "rss_gb": round(4000 / 1024, 2)}
    assert (big["workers"], big["rss_gb"]) == (10, round(4000 / 1024, 2)) and "from_latency" not in big
    assert out["1000000"]["from_cpu"]["workers"] == 100
    # a latency capacity, when a point met every target, is the projection's basis; the CPU one stays beside it
    held = project(points, 5000)["100000"]
    assert held["from_latency"] == {"workers": 20, "rss_gb_per_worker": round(250 / 1024, 3),
                                    "rss_gb": round(5000 / 1024, 2)}
    assert held["workers"] == 20 and held["basis"] == "latency capacity" and held["from_cpu"]["workers"] == 10
    # no live CPU figure: the backlog's cost of a record, a worker at full use
    bare = [{k: v for k, v in p.items() if k != "cpu_cores"} for p in points]
    assert project(bare, None, throughput={"1": 40_000}, max_busy=1.0)["100000"]["from_cpu"]["workers"] == 5


def test_a_live_fit_that_leaves_no_room_falls_back_to_the_backlog_cost_and_a_falling_rss_to_its_largest():
    """Hand-made: a worker's cores 0.6 + 10 us per record (its fixed cost alone is over 50 % busy) and an RSS
    that falls as GPUs grow; the backlog drained 40,000 records/s (25 us each). At 50 % busy a worker takes
    20,000 records/s, 10,000 GPUs at 2 records per GPU-s: 10 workers for 100,000 GPUs, each at the largest
    RSS measured (700 MB)."""
    from vigil.bench.pipeline import project

    points = [{"gpus_per_worker": g, "workers": 1, "records_per_s": 2.0 * g,
               "cpu_cores": {"worker-0": 0.6 + 10e-6 * 2.0 * g}, "rss_mb": rss}
              for g, rss in ((10_000, 700.0), (25_000, 600.0))]
    out = project(points, None, throughput={"1": 40_000})
    model = out["model"]
    assert math.isclose(model["worker_cpu_live_fit"]["fixed_cores"], 0.6)
    assert model["worker_cpu"]["us_per_record"] == 25.0 and model["cpu_gpus_per_worker"] == 10_000
    assert model["rss_mb"]["base"] == 700.0 and model["rss_mb"]["per_1000_gpus"] == 0.0
    assert out["100000"]["workers"] == 10 and out["100000"]["rss_gb"] == round(10 * 700 / 1024, 2)


def _run(rows, seed, records_per_s=1000, measured_s=100.0, rss_mb=300.0, **extra):
    """A hand-made run of one point: live()'s keys that combine_runs reads."""
    return {"gpus_per_worker": 5000, "gpus": 5000, "workers": 1, "seed": seed, "faults_per_kind": 50,
            "faults": rows, "measured_s": measured_s, "records_per_s": records_per_s, "rss_mb": rss_mb, **extra}


def _delays(kind, delays, **row):
    return [{"kind": kind, "delay_s": d, "incidents": 0 if d is None else 1, **row} for d in delays]


def test_the_faults_of_a_point_are_split_ceil_each_and_the_remainder_last():
    from vigil.bench.pipeline import split_faults

    assert split_faults(100, 3) == [34, 34, 32] and split_faults(100, 4) == [25] * 4 and split_faults(7, 1) == [7]
    with pytest.raises(ValueError):
        split_faults(5, 4)  # 2, 2, 2 leave the last run nothing


def test_runs_of_a_point_pool_their_faults_for_one_p99():
    """Two runs of 50 exception faults, delays 1..50 ms and 51..100 ms: no run alone has a p99 (50 < 100),
    the point has the 99th of the 100 pooled, 0.099 s (not the largest, 0.100)."""
    from vigil.bench.pipeline import combine_runs

    point = combine_runs([_run(_delays("exception", [i / 1000 for i in range(1, 51)]), 0),
                          _run(_delays("exception", [i / 1000 for i in range(51, 101)]), 1000)])
    lat = point["latency"]["exception"]
    assert (lat["p99"], lat["p50"], lat["n"], lat["missed"]) == (0.099, 0.05, 100, 0)
    assert point["targets"]["exception"] and point["runs_per_point"] == 2
    assert [f["run"] for f in point["faults"]] == [0] * 50 + [1] * 50
    assert [(r["seed"], r["latency"]["exception"]["max"]) for r in point["runs"]] == [(0, 0.05), (1000, 0.1)]
    assert all("faults" not in r for r in point["runs"])


def test_a_miss_in_one_run_is_a_miss_of_the_point():
    from vigil.bench.pipeline import combine_runs

    point = combine_runs([_run(_delays("exception", [0.01] * 50), 0),
                          _run(_delays("exception", [0.01] * 49 + [None]), 1000)])
    lat = point["latency"]["exception"]
    assert (lat["n"], lat["missed"], lat["p99"]) == (100, 1, 0.01)  # the miss is the 100th value, past the p99
    assert not point["targets"]["exception"] and not point["targets_met"]
    assert [r["latency"]["exception"]["missed"] for r in point["runs"]] == [0, 1]


def test_runs_combine_rates_over_total_time_the_largest_rss_and_time_weighted_cores():
    """1,000 records/s for 100 s and 3,000 for 300 s: 1,000,000 records in 400 s, 2,500/s (the mean of the
    rates would be 2,000); a worker at 0.2 core then 0.6: 0.5 over the 400 s."""
    from vigil.bench.pipeline import combine_runs, merge

    rows = _delays("exception", [0.01] * 50)
    point = combine_runs([
        _run(rows, 0, 1000, 100.0, 300.0, cpu_cores={"worker-0": 0.2, "broker": 0.1}, worker_busy_share=[0.1],
             worker_cpu_us_per_record=200.0, broker_rss_mb=500.0, generator_late_s={"p99": 0.01, "max": 0.2},
             unexplained_incidents={"xid": 1}, faults_injected={"exception": 50}, lag_p99_s=0.5, lag_max_s=1.0),
        _run(rows, 1000, 3000, 300.0, 700.0, cpu_cores={"worker-0": 0.6, "broker": 0.3}, worker_busy_share=[0.5],
             worker_cpu_us_per_record=200.0, broker_rss_mb=900.0, generator_late_s={"p99": 0.03, "max": 0.1},
             unexplained_incidents={"xid": 2, "task_hang": 1}, faults_injected={"exception": 50},
             lag_p99_s=2.0, lag_max_s=3.0, unexplained=[{"kind": "task_hang"}])])
    assert point["records_per_s"] == 2500 and point["measured_s"] == 400.0
    assert point["rss_mb"] == 700.0 and point["broker_rss_mb"] == 900.0
    assert point["cpu_cores"] == {"worker-0": 0.5, "broker": 0.25} and point["worker_busy_share"] == [0.4]
    assert point["worker_cpu_us_per_record"] == 200.0
    assert point["generator_late_s"]["max"] == 0.2
    assert point["unexplained_incidents"] == {"xid": 3, "task_hang": 1}
    assert point["unexplained"] == [{"kind": "task_hang", "run": 1}]  # told in full, with the run they came in
    assert point["faults_injected"]["exception"] == 100
    # no histograms: the largest of the runs' lag figures, and said so
    assert (point["lag_p99_s"], point["lag_max_s"], point["lag_pooled"]) == (2.0, 3.0, False)
    # merge takes a combined point as it takes one run's
    merged = merge([{"command": "x", "throughput": {}, "capacity": [point], "machine": {}, "wall_s": 1.0}])
    assert merged["capacity"] == [point] and merged["max_gpus_per_worker_meeting_targets"] is None


def test_runs_pool_their_lag_histograms():
    """Run 0: 50 messages 100 ms late; run 1: 49 at 200 ms, 1 at 9 s. Pooled, the 50th of 100 is 0.1 s and the 99th 0.2 s;
    run 1 alone has 9 s as its p99 (the 50th of 50), which the largest of the runs' p99s would report."""
    from vigil.bench.pipeline import combine_runs

    rows = _delays("exception", [0.01] * 50)
    point = combine_runs([_run(rows, 0, lag_ms=[{100: 50}], lag_p99_s=0.1),
                          _run(rows, 1000, lag_ms=[{"200": 49, "9000": 1}], lag_p99_s=9.0)])  # JSON's string keys
    assert point["lag"] == [{"p50_s": 0.1, "p99_s": 0.2, "max_s": 9.0, "messages": 100}]
    assert (point["lag_p99_s"], point["lag_max_s"], point["lag_pooled"]) == (0.2, 9.0, True)
    assert [r["lag_p99_s"] for r in point["runs"]] == [0.1, 9.0]


def _all_kinds_on_target(n):
    rows = []
    for kind in ("exception", "process_exit", "xid"):
        rows += _delays(kind, [0.1] * n)
    rows += _delays("node_lost", [1.0] * n)
    rows += _delays("hang", [3.5] * n, excess_s=0.5, d_iter=1.0)
    rows += _delays("fail_slow", [4.0] * n, iterations=2.0, job_iterations=3.0)
    return rows


def test_a_run_stopped_early_fails_the_point_whose_pooled_faults_meet_every_target():
    from vigil.bench.pipeline import combine_runs

    whole = combine_runs([_run(_all_kinds_on_target(50), 0), _run(_all_kinds_on_target(50), 1000)])
    assert all(whole["targets"].values()) and whole["targets_met"]  # 100 of each kind: every p99 within target
    stopped = combine_runs([_run(_all_kinds_on_target(50), 0),
                            _run(_all_kinds_on_target(50), 1000, stopped_early="a worker read 61 s behind")])
    assert all(stopped["targets"].values()) and not stopped["targets_met"]
    assert stopped["stopped_early"] == "run 1: a worker read 61 s behind"
    assert [r["stopped_early"] for r in stopped["runs"]] == [None, "a worker read 61 s behind"]


def test_the_pipeline_command_names_its_runs_per_point():
    from vigil.bench.command import reproducing_command
    from vigil.bench.pipeline import CLI_OPTIONS, run

    line = reproducing_command(run, {"json_path": "p.json", "runs_per_point": 4}, "vigil bench pipeline", CLI_OPTIONS)
    assert line.startswith("vigil bench pipeline --json p.json") and " --runs-per-point 4 " in line
