"""Every analytics view against the scripted history's ground truth (tests/integration/scripted_history.py)."""

from __future__ import annotations

import math

import pytest

from vigil.schemas.tables import create_table_sql
from vigil.streams.analytics import PROJECTION_GPUS, window_args
from tests.integration import scripted_history as sh


@pytest.fixture
def populated(history):
    sh.populate(history)
    return history


def q(store, sql):
    return store.query(sql.replace("DB.", f"{store.database}."))


def view(store, name, since=None, until=None):
    r = q(store, f"SELECT * FROM DB.{name}({window_args(since, until)})")
    return [dict(zip(r.columns, row)) for row in r.rows]


def iso(seconds: float) -> str:
    return sh.at(seconds).strftime("%Y-%m-%d %H:%M:%S")


def test_incidents_by_kind_domain_and_xid_code_equal_the_injected_faults(populated):
    exp = sh.expected()
    assert dict(q(populated, "SELECT kind, count() FROM DB.incidents GROUP BY kind").rows) == exp.by_kind
    assert dict(q(populated, "SELECT domain, count() FROM DB.incidents GROUP BY domain").rows) == exp.by_domain
    assert dict(q(populated, "SELECT xid_code, count() FROM DB.incidents WHERE kind = 'xid' "
                             "GROUP BY xid_code").rows) == exp.by_xid
    taxonomy = view(populated, "incident_taxonomy")
    assert sum(r["incidents"] for r in taxonomy) == len(sh.INCIDENTS)
    by_key = {(r["domain"], r["kind"], r["severity"], r["xid_code"]): r["incidents"] for r in taxonomy}
    assert by_key[("hardware", "xid", 1, 48)] == 2 and by_key[("user_code", "xid", 2, 13)] == 1
    # One row per incident although some have three versions (open, update, resolved).
    rows = q(populated, "SELECT name, severity, failure_class, detection_latency_s, resolved_time IS NULL "
                        "FROM DB.incidents AS i INNER JOIN (SELECT incident_id, summary AS name FROM DB.alerts "
                        "WHERE incident_version = 1) AS a USING incident_id").rows
    truth = {i.name: (i.severity, i.failure_class, i.latency_s, i.resolved_after_s is None) for i in sh.INCIDENTS}
    assert {r[0]: (r[1], r[2], pytest.approx(r[3]), r[4]) for r in rows} == truth


def test_ettr_of_the_scripted_job_equals_the_hand_computation(populated):
    ettr = {r["job"]: r for r in view(populated, "ettr")}
    small = ettr["ettr-small"]
    assert small["available_s"] == pytest.approx(1400.0)
    assert small["productive_s"] == pytest.approx(1000.0)
    assert small["ettr"] == pytest.approx(sh.ETTR_SMALL)  # 1000 / 1400
    assert small["recomputed_steps"] == 10  # steps 50..59 ran twice
    start, end, expected = sh.ETTR_SMALL_WINDOW
    windowed = {r["job"]: r for r in view(populated, "ettr", iso(start), iso(end))}
    # Hindsight: the first runs of steps 50..59 (T0+560..660) were lost, so only
    # their reruns (T0+900..1000) are productive within [T0+600, T0+1000).
    assert windowed["ettr-small"]["available_s"] == pytest.approx(end - start)
    assert windowed["ettr-small"]["ettr"] == pytest.approx(expected)
    assert "big-b" not in windowed  # it starts on day 2


def test_ettr_of_a_job_that_died_counts_the_time_it_held_its_gpus(populated):
    """dies-c kept every step it ran, but hung at T0+3060 and held its GPUs until failed at T0+3660."""
    dies = {r["job"]: r for r in view(populated, "ettr")}["dies-c"]
    assert dies["state"] == "failed"
    assert dies["available_s"] == pytest.approx(1660.0)
    assert dies["productive_s"] == pytest.approx(1000.0)
    assert dies["ettr"] == pytest.approx(sh.ETTR_DIES)


def test_job_sizes_and_spans_come_from_the_published_job_states(populated):
    runs = {r[0]: r[1:] for r in q(populated, "SELECT job, gpus, nodes, node_count, state, "
                                               "toUnixTimestamp64Micro(start) / 1e6, toUnixTimestamp64Micro(end) / 1e6 "
                                               "FROM DB.job_runs").rows}
    assert set(runs) == set(sh.JOBS)
    for job, (gpus, nodes, start, end, final) in sh.JOBS.items():
        assert runs[job][:4] == (gpus, nodes, len(nodes), final), job
        assert runs[job][4:] == (pytest.approx(sh.at(start).timestamp()), pytest.approx(sh.at(end).timestamp()))
    # ETTR needs steps: big-a published none, so it has a size and a span but no ETTR.
    assert {r["job"]: r["gpus"] for r in view(populated, "ettr")} == {j: v[0] for j, v in sh.JOBS.items()
                                                                     if j != "big-a"}


def test_a_job_still_running_holds_its_gpus_to_now_and_one_without_state_spans_its_steps(history):
    """No terminal state: a job whose scheduler still says running holds its GPUs (its span runs to now,
    so the view clips it to the window); a job that never published a state is known by its steps only."""
    events = [sh.JobState(event_time=sh.at(5000), source=sh.Source(cluster=sh.CLUSTER, job="held"), state="running",
                          nodes=["n01"], gpus=8)]
    events += [sh._step_event("held", i, 5000 + 10 * i, 10.0, ["n01"]) for i in range(10)]  # to T0+5100
    events += [sh._step_event("stateless", i, 5000 + 10 * i, 10.0, ["n02"]) for i in range(10)]
    history.insert_events(events)
    rows = {r["job"]: r for r in view(history, "ettr", iso(4000), iso(6000))}
    assert rows["held"]["state"] == "running"
    assert rows["held"]["available_s"] == pytest.approx(1000.0)  # T0+5000 to the window's end
    assert rows["held"]["ettr"] == pytest.approx(0.1)
    assert rows["stateless"]["available_s"] == pytest.approx(100.0) and rows["stateless"]["ettr"] == pytest.approx(1.0)
    assert rows["stateless"]["gpus"] == 0


def test_mttf_by_job_size_and_the_fleet_rate(populated):
    exp = sh.expected()
    failures = {r["job"]: r["failures"] for r in view(populated, "job_failures")}
    assert failures == exp.job_failures
    # By hand: failures over node-days of job runtime.
    node_days = sum(len(nodes) * (end - start) / sh.DAY for _, nodes, start, end, _ in sh.JOBS.values())
    rate = sum(exp.job_failures.values()) / node_days
    rows = {r["bucket_gpus"]: r for r in view(populated, "mttf_by_size")}
    assert set(rows) == {gpus for gpus, *_ in sh.JOBS.values()}  # 8, 16, 64, 128: sizes from the job states
    assert rows[64]["observed_mttf_h"] == pytest.approx(24.0 / exp.job_failures["big-a"])
    assert rows[128]["observed_mttf_h"] == pytest.approx(24.0 / exp.job_failures["big-b"])
    for gpus, r in rows.items():
        assert r["fleet_rate_per_node_day"] == pytest.approx(rate)
        assert r["expected_mttf_h"] == pytest.approx(24.0 / (rate * gpus / 8))
    projection = {r["gpus"]: r["expected_mttf_h"] for r in view(populated, "mttf_projection")}
    assert set(projection) == set(PROJECTION_GPUS)
    assert projection[100000] == pytest.approx(24.0 / (rate * 100000 / 8))


def test_mttr_by_action_and_detection_latency_by_detector(populated):
    exp = sh.expected()
    mttr = {r["action"]: r for r in view(populated, "mttr_by_action")}
    assert set(mttr) == set(exp.mttr_by_action)
    for action, times in exp.mttr_by_action.items():
        assert mttr[action]["incidents"] == len(times), action
        assert mttr[action]["mean_s"] == pytest.approx(sum(times) / len(times)), action
        assert mttr[action]["max_s"] == pytest.approx(max(times)), action
    latency = {r["detector"]: r for r in view(populated, "detection_latency")}
    assert set(latency) == set(exp.latency_by_detector)
    for detector, values in exp.latency_by_detector.items():
        assert latency[detector]["incidents"] == len(values)
        assert latency[detector]["mean_s"] == pytest.approx(sum(values) / len(values))


def test_fail_slow_time_lost(populated):
    rows = view(populated, "failslow_lost")
    # big-b's own fail-slow, and dies-c's under an incident rooted at n05's GPU; the straggler has no size.
    assert [(r["job"], r["incidents"]) for r in rows] == [("big-b", 1), ("dies-c", 1)]
    assert rows[0]["slowed_s"] == pytest.approx(1800.0)
    assert rows[0]["lost_s"] == pytest.approx(sh.FAILSLOW_LOST_S)
    assert rows[1]["slowed_s"] == pytest.approx(300.0)
    assert rows[1]["lost_s"] == pytest.approx(sh.FAILSLOW_LOST_DIES_S)
    assert rows[1]["worst_rel_change"] == pytest.approx(0.25)
    assert sum(d - 10.0 for _, _, d in sh.dies_c_steps()) == pytest.approx(sh.FAILSLOW_LOST_DIES_S)
    # The raw steps agree: 30 min of 15 s steps instead of 10 s ones.
    steps = sh.big_b_steps()
    lost_in_steps = sum(d - 10.0 for _, _, d in steps)
    assert lost_in_steps == pytest.approx(sh.FAILSLOW_LOST_S, abs=10.0)


def test_the_planted_lemon_node_ranks_first_and_alone(populated):
    exp = sh.expected()
    rows = view(populated, "lemon_nodes")
    assert rows[0]["node"] == sh.LEMON and rows[0]["lemon"] == 1
    assert [r["node"] for r in rows if r["lemon"]] == [sh.LEMON]
    assert {r["node"]: r["failures"] for r in rows if r["failures"]} == exp.node_failures
    # Poisson tail by hand, with the exposure rule (per day: last - first heartbeat).
    days = 2 * (sh.DAY - sh.HEARTBEAT_S) / sh.DAY
    lam = sum(exp.node_failures.values()) / (days * len(sh.NODES)) * days
    k = exp.node_failures[sh.LEMON]
    tail = 1 - sum(math.exp(-lam) * lam ** i / math.factorial(i) for i in range(k))
    assert rows[0]["node_days"] == pytest.approx(days)
    assert rows[0]["p_value"] == pytest.approx(tail, rel=1e-6)


def test_a_row_stored_twice_is_not_counted_twice(populated):
    """The rollups use only idempotent aggregates: a duplicate that reaches a table
    (a replay, an overlapping backfill) changes no answer."""
    before = q(populated, "SELECT kind, count() FROM DB.incidents GROUP BY kind ORDER BY kind").rows
    ettr_before = view(populated, "ettr")
    db = populated.database
    populated._client.command(f"INSERT INTO {db}.alerts SELECT * FROM {db}.alerts")
    populated._client.command(f"INSERT INTO {db}.iteration_steps SELECT * FROM {db}.iteration_steps")
    assert q(populated, "SELECT kind, count() FROM DB.incidents GROUP BY kind ORDER BY kind").rows == before
    assert view(populated, "ettr") == ettr_before


def test_migrate_keeps_existing_data_rebuilds_old_layouts_and_is_idempotent(history_session):
    import uuid

    store = history_session.with_database(f"test_{uuid.uuid4().hex[:10]}")
    db = store.database
    # The layout before this schema: every table by month, no rollups.
    store._client.command(f"CREATE DATABASE {db}")
    from vigil.schemas.tables import TABLE_SPECS
    for event_type, spec in TABLE_SPECS.items():
        ddl = create_table_sql(event_type, db).replace(f"PARTITION BY {spec.partition_by}",
                                                      f"PARTITION BY toYYYYMM({spec.time_column})")
        store._client.command(ddl)
    store._client.command(f"ALTER TABLE {db}.heartbeats DROP COLUMN interval_s")  # a field added since
    events = [e for e in sh.events() if e.event_type != "heartbeat"]
    store.insert_events(events)
    counts = {t: store.query(f"SELECT count() FROM {db}.{t}").rows[0][0] for t in ("alerts", "iteration_steps")}

    done = store.migrate(ttl_days=3650)
    assert "rebuilt heartbeats: PARTITION BY toYYYYMMDD(event_time) ORDER BY (node, event_time, event_id)" in done
    assert "added column heartbeats.interval_s" in done
    assert any(d.startswith("created incident_rollup_mv") for d in done)
    for table, n in counts.items():
        assert store.query(f"SELECT count() FROM {db}.{table}").rows[0][0] == n
    assert store.query(f"SELECT partition_key FROM system.tables WHERE database = '{db}' "
                       f"AND name = 'iteration_steps'").rows == [("toYYYYMMDD(event_time)",)]
    # The rollups were backfilled from the events stored before they existed.
    assert store.query(f"SELECT count() FROM {db}.incidents").rows[0][0] == len(sh.INCIDENTS)
    assert {r["job"]: r["ettr"] for r in view(store, "ettr")}["ettr-small"] == pytest.approx(sh.ETTR_SMALL)
    # The TTL is on the raw telemetry only.
    ttl = dict(store.query(f"SELECT name, engine_full LIKE '% TTL %' FROM system.tables WHERE database = '{db}' "
                           f"AND engine LIKE '%MergeTree'").rows)
    assert ttl["heartbeats"] == 1 and ttl["gpu_telemetry"] == 1 and ttl["alerts"] == 0 and ttl["job_steps"] == 0

    assert store.migrate(ttl_days=3650) == []  # nothing left to do
    assert store.migrate(ttl_days=3650, ttl_overrides={"gpu_telemetry": 7}) == [
        "gpu_telemetry: TTL toDateTime(event_time) + toIntervalDay(7)"]
    assert store.query(f"SELECT count() FROM {db}.incidents").rows[0][0] == len(sh.INCIDENTS)


def test_run_ettr_adds_a_chain_of_jobs_and_keeps_the_queue_gap_apart(history):
    """A run of two jobs under a time limit: job 1 runs 1000 s (90 steps of 10 s after a 100 s set-up), saves and
    leaves at its limit; the next job waits 500 s in the queue, then runs 600 s (50 steps after 100 s) and
    completes. Available 1600 s, productive 1400 s, gap 500 s: ETTR 1400/1600; the gap is not a failure."""
    from vigil.schemas import JobState, Source

    def state(job, s, t, **kw):
        return JobState(event_time=sh.at(t), source=Source(cluster="lab", job=job), state=s, run="chain", gpus=8, **kw)

    evs = [state("c1", "running", 0.0), state("c2", "pending", 900.0), state("c1", "time_limit", 1000.0,
                                                                              checkpoint_step=89),
           state("c2", "running", 1500.0), state("c2", "completed", 2100.0)]
    evs += [sh._step_event("c1", i, 100.0 + 10 * i, 10.0, ["n00"]) for i in range(90)]
    evs += [sh._step_event("c2", 90 + i, 1600.0 + 10 * i, 10.0, ["n00"]) for i in range(50)]
    history.insert_events(evs)
    r = q(history, "SELECT * FROM DB.job_runs")
    runs = {row["job"]: row for row in (dict(zip(r.columns, x)) for x in r.rows)}
    assert runs["c1"]["state"] == "time_limit" and runs["c1"]["run"] == "chain"
    (run,) = view(history, "run_ettr")
    assert (run["run"], run["jobs"], run["last_state"]) == ("chain", 2, "completed")
    assert run["available_s"] == pytest.approx(1600.0) and run["productive_s"] == pytest.approx(1400.0)
    assert run["gap_s"] == pytest.approx(500.0) and run["ettr"] == pytest.approx(1400 / 1600)
    assert q(history, "SELECT count() FROM DB.incidents").rows[0][0] == 0  # leaving at the limit is no incident
