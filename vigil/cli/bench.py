"""``vigil bench ...``: benchmarks that write JSON."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from vigil.cli.common import bench_app, console, err_console, fail, print_table, require_server

@bench_app.command("detectors")
def bench_detectors(
    json_path: Path = typer.Option(Path("bench/results/detectors.json"), "--json", help="Where to write the results."),
    n_traces: int = typer.Option(500, "--traces", min=10, help="Labelled fail-slow traces per evaluation seed "
                                                              "(half clean)."),
    tuning_seeds: str = typer.Option("0", help="Seeds the tuned detectors were tuned on (comma-separated); "
                                               "the references of the general section are tuned on them."),
    evaluation_seeds: str = typer.Option("4,5", help="Seeds every figure is reported on (comma-separated), "
                                                     "disjoint from the tuning seeds."),
    n_out_of_family: int = typer.Option(50, "--out-of-family", min=1,
                                        help="Out-of-family fail-slow cases per family and seed."),
    general: bool = typer.Option(True, help="Run the general change-point section (needs ruptures)."),
    n_general_per_family: int = typer.Option(70, "--per-family", min=5,
                                             help="General series per family and evaluation seed."),
    sections: str = typer.Option("failslow,out_of_family,localizer,general", "--sections",
                                 help="Sections to run, comma-separated (failslow, out_of_family, localizer, general); "
                                      "run into an existing --json file, they replace only their own part of it."),
) -> None:
    """Score the change-point detectors on labelled series, on evaluation seeds apart from the tuning seeds.

    Fail-slow: accuracy (with its never-alarming floor), false-positive and
    false-negative rates with Wilson intervals, detection delay and onset
    error in iterations, updates per second, on generated iteration-time
    traces and on out-of-family cases (ramps, flapping, benign shifts after a
    known event, restarts, checkpoint/eval blocks, warm-ups). General: F1
    (margin 5) and covering of the streaming detector against ruptures'
    Binseg and PELT, "zero" and BOCPD on ten families of series with
    simulated annotators. Also the straggler localizer's accuracy and the
    ACF iteration-period error. Writes JSON (with the machine's load before
    and after, and the command that reproduces it, every option spelled out)
    and prints tables. ``--sections localizer`` refreshes the localizer's part
    of an existing result alone.
    """
    require_server("bench detectors")
    from vigil.bench.detectors import SECTIONS, run

    chosen = [x.strip() for x in sections.split(",") if x.strip()]
    if not chosen or any(x not in SECTIONS for x in chosen):
        fail(f"--sections must be some of {', '.join(SECTIONS)}, got {sections!r}")

    def seeds(text: str) -> list[int]:
        try:
            return [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            fail(f"seeds must be comma-separated integers, got {text!r}")

    with console.status("generating traces...") as status:
        try:
            result = run(str(json_path), n_traces=n_traces, tuning_seeds=seeds(tuning_seeds),
                         evaluation_seeds=seeds(evaluation_seeds), n_out_of_family=n_out_of_family, general=general,
                         n_general_per_family=n_general_per_family,
                         sections=chosen,
                         progress=lambda what: status.update(f"scoring {what}..."))
        except ValueError as exc:
            fail(str(exc))
    from rich import box

    fmt = lambda v, p=3: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))
    ci = lambda r, k: "" if not r.get(k + "_ci") else f" [{r[k + '_ci'][0]:.3f}, {r[k + '_ci'][1]:.3f}]"
    table = Table("detector", "accuracy [95% CI]", "fpr", "fnr≥10", "delay50", "max", "upd/s",
                  box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False,
                  title=f"fail-slow, evaluation seeds {result['evaluation_seeds']} "
                        f"(tuned on {result['tuning_seeds']}), {result['traces']['n']} traces")
    rows = list(result["detectors"].items()) + ([("floor (never alarms)", result["floor"])] if result["floor"] else [])
    for name, r in rows:
        table.add_row(name, fmt(r.get("accuracy")) + ci(r, "accuracy"), fmt(r.get("fpr")), fmt(r.get("fnr_ge10")),
                      fmt(r.get("delay_median"), 0), fmt(r.get("delay_max"), 0),
                      f"{(r.get('updates_per_s') or 0) / 1000:,.0f}k")
    if rows:
        console.print(table)
    names = list(result["detectors"])
    oof = Table("case", "n", *names, "floor", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                title="out of family: accuracy")
    for fam, row in result["out_of_family"].items():
        oof.add_row(fam, str(row["n"]), *(fmt((row.get(nm) or {}).get("accuracy")) for nm in names),
                    fmt(row["floor"]["accuracy"]))
    if result["out_of_family"]:
        console.print(oof)
    g = result.get("general")
    if g:
        refs = g["references"]
        gt = Table("family", "n", "f1", "cover", "zero f1", "zero cover", "binseg f1", "pelt f1", "bocpd f1",
                   "deployed f1",
                   box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                   title=f"general: residual_cusum, {g['points_per_s']:,.0f} points/s")
        for fam, r in g["families"].items():
            gt.add_row(fam, str(r["n"]), fmt(r["f1"]), fmt(r["cover"]), fmt(refs["zero"]["families"][fam]["f1"]),
                       fmt(refs["zero"]["families"][fam]["cover"]), fmt(refs["binseg"]["families"][fam]["f1"]),
                       fmt(refs["pelt"]["families"][fam]["f1"]), fmt(refs["bocpd"]["families"][fam]["f1"]),
                       fmt(refs["residual_cusum_deployed"]["families"][fam]["f1"]))
        gt.add_row("all", str(g["n"]), fmt(g["f1"]) + ci(g, "f1"), fmt(g["cover"]) + ci(g, "cover"),
                   fmt(refs["zero"]["f1"]), fmt(refs["zero"]["cover"]), fmt(refs["binseg"]["f1"]),
                   fmt(refs["pelt"]["f1"]), fmt(refs["bocpd"]["f1"]), fmt(refs["residual_cusum_deployed"]["f1"]))
        console.print(gt)
    loc = result.get("localizer") or {}
    console.print(f"localizer accuracy {fmt(loc.get('accuracy'))} (through the hooks {fmt(loc.get('accuracy_hooks'))}; "
                  f"per class {loc.get('by_class')}), "
                  f"ACF median relative error {fmt((result.get('acf') or {}).get('rel_error_median'), 4)}")
    last = (result.get("refreshed") or [result])[-1]
    console.print(f"load average before {last['load_avg_before']}, after {last['load_avg_after']}")
    console.print(f"written to {json_path}")


@bench_app.command("pipeline")
def bench_pipeline(
    json_path: Path = typer.Option(Path("bench/results/pipeline.json"), "--json", help="Where to write the results."),
    load_gpus: str = typer.Option("2000,5000,10000,25000,50000", "--load-gpus",
                                  help="GPUs per worker to carry, comma-separated: the capacity curve, lowest first."),
    workers: int = typer.Option(1, "--workers", min=1, help="Detection workers sharing the load."),
    faults_per_kind: int = typer.Option(100, "--faults-per-kind", min=1,
                                        help="Faults of each kind per point (a p99 needs 100)."),
    throughput_workers: str = typer.Option("1,2", "--throughput-workers",
                                           help="Worker counts for the backlog throughput ('' skips it)."),
    throughput_gpus: int = typer.Option(25_000, "--throughput-gpus", help="Cluster whose telemetry makes the backlog."),
    throughput_seconds: float = typer.Option(300.0, "--throughput-seconds", min=10,  # throughput.BACKLOG_SECONDS
                                             help="Seconds of that cluster's telemetry in the backlog."),
    seed: int = typer.Option(0, help="Seed of the cluster and its faults."),
    stop_at_first_miss: bool = typer.Option(True, "--stop-at-first-miss/--keep-going",
                                            help="Stop after the first point that misses a target (--keep-going: "
                                                 "run every point)."),
    runs_per_point: int = typer.Option(1, "--runs-per-point", min=1,
                                       help="Measure each point as this many shorter runs, the faults split among "
                                            "them and the results combined: the embedded broker's in-memory log "
                                            "makes its fetch cost grow through a long run (a real Kafka's does not). "
                                            "Each run starts a fresh broker and worker, so worker state older than "
                                            "one run is not exercised."),
) -> None:
    """Alert latency while workers carry a large cluster's telemetry; capacity; throughput on a backlog.

    For each N in --load-gpus: a fresh embedded broker, the workers, and a
    generated N-GPU cluster (node samples at 1 Hz, every job step with every
    rank's timings, job states) with --faults-per-kind faults of each kind
    (exception, process exit, xid, node lost, hang, fail-slow) at random
    times; each fault's delay to the first alert naming its cause, the
    workers' consumer lag and RSS. The generator and the broker run on core
    0, the workers on the others. Then the largest N that held every target
    and a projection for 100k and 1M GPUs. A point takes about 12 minutes
    (node losses are spaced 6.5 s apart). Writes JSON and prints a table.
    """
    require_server("bench pipeline")
    from vigil.bench.pipeline import TARGETS, run, split_faults

    try:
        sizes = tuple(int(x) for x in load_gpus.split(",") if x.strip())
        tp = tuple(int(x) for x in throughput_workers.split(",") if x.strip())
    except ValueError:
        fail(f"--load-gpus and --throughput-workers are comma-separated integers, got {load_gpus!r}, "
             f"{throughput_workers!r}", 2)
    try:
        split_faults(faults_per_kind, runs_per_point)
    except ValueError as e:
        fail(f"--faults-per-kind {faults_per_kind} --runs-per-point {runs_per_point}: {e}", 2)
    with console.status("starting...") as status:
        result = run(str(json_path), load_gpus=sizes, workers=workers, faults_per_kind=faults_per_kind,
                     throughput_workers=tp, throughput_gpus=throughput_gpus, throughput_seconds=throughput_seconds,
                     seed=seed, stop_at_first_miss=stop_at_first_miss, runs_per_point=runs_per_point,
                     progress=lambda what: status.update(what + "..."))
    for n, rps in result["throughput"].items():
        d = result["throughput_detail"][n]
        console.print(f"backlog: {n} worker(s) {rps:,} records/s ({d['records']:,} records in {d['seconds']} s"
                      f"{'' if d['sustained_30s'] else ', under 30 s'})")
    kinds = list(TARGETS)
    table = Table("GPUs/worker", "records/s", *[f"{k} p99" for k in kinds], "lag p99 s", "RSS MB", "met")
    for p in result["capacity"]:
        cells = []
        for k in kinds:
            e = p["latency"].get(k) or {}
            if k == "hang":
                e = {**e, **(e.get("excess_over_k_d_iter") or {})}
            elif k == "fail_slow":
                e = {**e, **(e.get("iterations") or {})}
            value = e.get("p99") if e.get("p99") is not None else e.get("max")
            cells.append("-" if value is None else f"{value:.3g}{'' if e.get('p99') is not None else ' (max)'}"
                         + (f" {e['missed']} missed" if e.get("missed") else ""))
        table.add_row(f"{p['gpus_per_worker']:,}", f"{p['records_per_s']:,}", *cells, str(p["lag_p99_s"]),
                      str(p["rss_mb"]), "yes" if p["targets_met"] else "no")
    console.print(table)
    console.print(f"targets: {', '.join(f'{k} {v}' for k, v in TARGETS.items())} (hang: excess over 3 x D_iter s; "
                  f"fail-slow: iterations)")
    console.print(f"largest load meeting every target: {result['max_gpus_per_worker_meeting_targets']} GPUs per worker")
    console.print(f"written to {json_path}")


@bench_app.command("planners")
def bench_planners(
    json_path: Path = typer.Option(Path("bench/results/planners.json"), "--json", help="Where to write the results."),
    repeats: int = typer.Option(7, min=1, help="Timed calls per instance; the median is reported, with its 95 % "
                                               "interval from 6 calls on."),
    seed: int = typer.Option(0, help="Seed of the generated instances."),
    quality_seeds: int = typer.Option(10, min=1, help="Fragmented clusters on which placement is compared with the baselines."),
) -> None:
    """Time every planner against its target, and compare placement with topology-unaware baselines.

    Pure computation on one core, no broker; takes about a minute.
    Each timing is the median of REPEATS calls on a seeded instance, with its
    n and its distribution-free 95 % interval (order statistics):

    \b
      micro-batch rebalancing (Falcon S2), 512 DP groups ........ target <= 10 ms
      multi-job re-planning (Unicron), 100 jobs on 10,000 GPUs
        planned in nodes of 8 GPUs (1,250 workers) .............. target <= 100 ms
      placement (Arnold), a 512-node job (dp 64 x pp 8) in a
        fragmented 1,024-node cluster of 32-node minipods ....... target <= 1 s

    plus a size sweep of each (and re-planning in GPU units), and the
    placement objective (max DP-group spread + split PP groups) of best-fit,
    random-fit and packing divided by the exact placement's, over
    QUALITY_SEEDS clusters (Arnold reports up to 1.67x). Writes JSON with
    microbatch_512_ms, waf_100jobs_10k_ms, placement_512of1024_ms,
    placement_spread_vs_best_baseline, intervals (n and 95 % interval of each
    timing), targets_met and targets_met_over_interval, command (this command line, every
    option spelled out) and a detail section (sweeps, per-seed quality, the
    machine and its load average before and after), and prints a table.
    """
    require_server("bench planners")
    from vigil.bench.planners import format_table, run

    with console.status("benchmarking the planners...") as status:
        result = run(str(json_path), repeats=repeats, seed=seed, quality_seeds=quality_seeds,
                     progress=lambda what: status.update(f"timing {what}..."))
    print_table(("measure", "value", "target"), format_table(result))
    console.print(f"written to {json_path}")


@bench_app.command("history")
def bench_history(
    json_path: Path = typer.Option(Path("bench/results/history.json"), "--json", help="Where to write the results."),
    telemetry_rows: int = typer.Option(100_000_000, min=1000, help="Raw telemetry rows generated in ClickHouse."),
    incidents: int = typer.Option(1_000_000, min=100, help="Incidents generated (about 1.9 alert versions each)."),
    sink_seconds: float = typer.Option(30.0, min=1.0, help="How long the sink stores a backlog for its rate."),
    sink_events: Optional[int] = typer.Option(None, min=1000, help="Events in that backlog (default: SINK_SECONDS "
                                                                   "x 200,000, more than the sink stores in that time)."),
    repeats: int = typer.Option(10, min=1, help="Runs of each cookbook query; the median is reported, with its 95 % "
                                                "interval from 6 runs on."),
) -> None:
    """Sink insert rows/s sustained (target >= 100,000) and the cookbook queries' latency over a large history (target < 1 s).

    The sink stores a backlog published beforehand for SINK_SECONDS (or until
    it is stored), through a real broker; its rate comes with a 95 % interval
    over 2 s windows. The history (TELEMETRY_ROWS raw telemetry rows and
    INCIDENTS incidents with decisions and action results) is generated
    inside ClickHouse with INSERT ... SELECT FROM numbers(), in a temporary
    chDB directory; at the defaults it takes several minutes and a few GB of
    disk (and the broker holds the backlog in memory: about 60 MB per million
    events). Writes JSON {"insert_rows_per_s", "insert_rows_per_s_ci95",
    "queries": {NAME: seconds}, "queries_ci95", "command", ...} (command: this
    command line, every option spelled out; the machine's load average before
    and after in detail.machine) and prints a table.
    """
    require_server("bench history")
    from vigil.bench.history import format_table, run

    with console.status("starting...") as status:
        result = run(str(json_path), telemetry_rows=telemetry_rows, incidents=incidents, sink_events=sink_events,
                     repeats=repeats, sink_seconds=sink_seconds, progress=lambda what: status.update(what + "..."))
    print_table(("measure", "value", "target"), format_table(result))
    console.print(f"written to {json_path}")


@bench_app.command("policies")
def bench_policies(
    json_path: Path = typer.Option(Path("bench/results/policies.json"), "--json", help="Where to write the results."),
    trace: str = typer.Option("trace-a", help="Failure trace preset: trace-a (8 weeks) or trace-b (20x the rate, 7 days)."),
    gpus: int = typer.Option(128, min=16, help="Cluster size; 128 runs Unicron's case 5 (six jobs)."),
    seed: int = typer.Option(0, help="Seed of the trace, the job mix and the detectors' inputs."),
    days: Optional[float] = typer.Option(None, min=0.5, help="Span of the trace in days, its faults drawn at the "
                                         "preset's per-node rates: a quick look. Default: the preset's own span "
                                         "and counts, which the targets are stated for."),
    scale: bool = typer.Option(True, help="Also time a 10,000-GPU, 4-week run of every policy (a few minutes)."),
    sweep_seeds: int = typer.Option(10, min=0, help="On 128 GPUs, also run seeds 0..N-1 for the bounds each target "
                                                    "is held against (a few seconds a seed); 0 skips it."),
) -> None:
    """Simulate the cluster under each recovery policy and compare how much training each gets back.

    Policies: restart-only (30 min collective timeout, 9 min resubmit, 14 min
    set-up, recompute since the last 30 min checkpoint, fixed-size jobs),
    per-job reconfiguration (only the failed job re-plans), and vigil (the
    live detectors and decision engine on simulated time: escalation,
    ski-rental fail-slow mitigation, WAF-optimal multi-job re-planning with
    topology-aware placement).

    \b
    Targets (Unicron case 5 on 128 GPUs):
      accumulated WAF >= 1.2x restart-only on trace-a, >= 1.9x on trace-b
      fail-slow slowdown reduced by >= 60.1 % (Falcon)
      vigil's ETTR >= 0.97 on trace-a
      a 10,000-GPU, 4-week run in under 10 minutes

    Each target is shown against a yardstick, on this seed and over the
    seed sweep: the oracle (every healthy node at the best allocation,
    recovery free) bounds any policy's WAF; vigil's ski rental told each
    fail-slow's true remaining duration is a reference for the fail-slow
    figure (not a bound).

    Writes JSON (policies: accumulated_waf, ettr_mean, failslow_slowdown_pct;
    failslow_mitigated_pct; wall_s; targets; command: this command line, every
    option spelled out; detail, with the machine's load average before and
    after), a markdown summary that names the command and a PNG plot of WAF
    over time next to it, and prints a table. Deterministic for a seed (the
    wall times aside).
    """
    require_server("bench policies")
    from vigil.bench.policies import format_table, run

    if trace not in ("trace-a", "trace-b"):
        fail(f"--trace must be trace-a or trace-b, got {trace!r}", 2)
    if gpus % 8:
        fail(f"--gpus must be a multiple of 8, got {gpus}", 2)
    with console.status("simulating...") as status:
        def progress(what: str) -> None:
            status.update(what)
            err_console.log(what)
        result = run(str(json_path), trace=trace, gpus=gpus, seed=seed, days=days, scale=scale,
                     sweep_seeds=sweep_seeds, progress=progress)
    print_table(("policy", "accumulated WAF (weighted EFLOP)", "vs restart-only", "ETTR mean", "fail-slow slowdown"),
                 format_table(result))
    for name, t in result["targets"].items():
        held = ""
        for kind in ("bound", "reference"):
            if t.get(kind) is not None:
                held = f"; {t[f'{kind}_is'].split(':')[0]} {kind} {t[kind]} on this seed"
                if t.get(f"{kind}_max_over_seeds") is not None:
                    held += f", {t[f'{kind}_max_over_seeds']} on the best seed"
        console.print(f"{name}: measured {t['measured']} (target {t['target']}{held}): "
                      f"{'met' if t['met'] else 'NOT met'}")
    console.print(f"written to {json_path} (+ .md, .png)")


@bench_app.command("hooks")
def bench_hooks(
    json_path: Path = typer.Option(Path("bench/results/hooks.json"), "--json", help="Where to write the results."),
    steps: int = typer.Option(1600, min=100, help="Short-step training steps of the A/B (hooks alternate on/off)."),
    block: int = typer.Option(20, min=5, help="Steps per on/off block."),
    acf_steps: int = typer.Option(400, min=50, help="Further steps with hooks on, for the ACF iteration-time check."),
    world: Optional[int] = typer.Option(None, min=2, help="Ranks (processes), an even number (dp x tp=2 grid); "
                                                          "default one per usable core (2 to 4)."),
    pin: bool = typer.Option(True, help="Pin each rank to its own core (when there are enough cores)."),
    real_steps: int = typer.Option(300, min=20, help="Steps of the A/B on a realistic (~170 ms) step."),
    real_block: int = typer.Option(6, min=2, help="Steps per on/off block of the realistic step."),
    real_hidden: int = typer.Option(512, min=8, help="Hidden size of the realistic step's model."),
    real_batch: int = typer.Option(768, min=8, help="Batch size of the realistic step."),
    seed: int = typer.Option(0, help="Seed of the bootstrap confidence intervals."),
    agent_seconds: float = typer.Option(20.0, min=2.0, help="How long to run the agent for its CPU figure."),
) -> None:
    """Measure the training hooks' overhead on a real multi-process torch step, the ACF error, and the agent's CPU.

    Runs WORLD gloo ranks on CPU training a small MLP (two tensor-parallel and
    one data-parallel all-reduce per step) and alternates blocks of steps with
    and without the hooks in the same run (the end-to-end A/B), one rank per
    core, each pinned to its core. The hooks run as deployed on a CPU
    backend (marked compute, the compute/communication/wait split, control
    channel, hang watchdog). The reported overhead is the hooks' extra CPU
    time per step (the step's thread and the hooks' own) over the wall time
    of a hooks-off step of the realistic (~100+ ms) step, median over block
    pairs with a bootstrap 95% interval; the target (<= 1%) is met only if
    the interval's upper end is <= 1%. CPU time, unlike wall time, does not
    jitter with the other processes on the cores; the short step's A/B is in
    the detail. Then the iteration time found by ACF on the published
    collective calls is compared with the measured one (target <= 2%), and
    the node agent runs at its default intervals to measure its CPU share of
    one core. Starts its own embedded broker unless VIGIL_KAFKA_BOOTSTRAP is
    set. Writes JSON {overhead_pct, overhead_ci95, overhead_target_met,
    acf_rel_error, agent_cpu_pct, command, loadavg_before, loadavg_after,
    detail} and prints a table.
    """
    require_server("bench hooks")
    from rich.console import Console
    from rich.table import Table

    from vigil.bench.hooks import run

    if world is not None and world % 2:
        raise typer.BadParameter("--world must be even")
    console = Console()
    with console.status("benchmarking the hooks...") as status:
        result = run(str(json_path), steps=steps, block=block, acf_steps=acf_steps, world=world,
                     real_steps=real_steps, real_block=real_block, real_hidden=real_hidden, real_batch=real_batch,
                     seed=seed, agent_seconds=agent_seconds, pin=pin,
                     bootstrap=os.environ.get("VIGIL_KAFKA_BOOTSTRAP") or None,
                     progress=lambda what: status.update(what))
    d = result["detail"]
    head = d["overhead"]
    table = Table("measure", "value", "target")
    lo, hi = result["overhead_ci95"]
    table.add_row(f"hook overhead ({head['run']} step, CPU path; / {head['denominator_ms']:.1f} ms step of one rank)",
                  f"{result['overhead_pct']:.2f} % (95 % CI {lo:.2f}..{hi:.2f})",
                  "<= 1 %: " + ("met" if result["overhead_target_met"] else "NOT met"))
    table.add_row("  isolated hot-path cost per step", f"{d['hook_cost_us_per_step']:.1f} us of {d['step_ms_off_median']:.2f} ms", "")
    table.add_row("  A/B end to end (noise)", f"{d['ab_overhead_pct']:+.2f} % (pairs sd {d['ab_pair_spread_pct']:.1f} %)", "")
    acf = result["acf_rel_error"]
    table.add_row("ACF iteration-time error", "-" if acf is None else f"{100 * acf:.2f} %", "<= 2 %")
    cpu = result["agent_cpu_pct"]
    table.add_row("agent CPU (one core)", "-" if cpu is None else f"{cpu:.2f} %", "")
    console.print(table)
    console.print(f"written to {json_path}")


#: The committed results of the whole suite, and where a run of some scenarios (--only) goes unless told.
SCENARIOS_JSON = Path("bench/results/scenarios.json")
SCENARIOS_ONLY_JSON = Path("bench/results/scenarios-only.json")


@bench_app.command("scenarios")
def bench_scenarios(
    json_path: Optional[Path] = typer.Option(
        None, "--json", help=f"Where to write the results (default: {SCENARIOS_JSON}, or with --only "
        f"{SCENARIOS_ONLY_JSON}, which git ignores: a partial run never overwrites the full results)."),
    names: Optional[List[str]] = typer.Option(None, "--only", help="Run only this scenario (repeatable)."),
) -> None:
    """Real job lifecycles on the real agent: no false page, no missed fault, never stuck.

    Each scenario runs a real broker, a real `vigil worker` and real `vigil
    agent` processes launching real multi-process torch (gloo) training
    scripts, does something to them (the job finishes, is cancelled, hangs,
    crashes in a loop, has a slow first step or long checkpoints; a rank or an
    agent is killed; an agent stops cleanly; eight agents go silent at once; a
    repaired node fails its health check) and compares what vigil published
    (alerts, decisions, actions, job and node states, exit codes) with the
    ground truth. A false page is a sev1/sev2 incident or a decision the
    truth does not call for. Takes several minutes; writes JSON and prints a
    table. Targets: every scenario passes, 0 false pages, 0 missed, under 10
    minutes on 2 cores.
    """
    require_server("bench scenarios")
    from vigil.bench.scenarios import SCENARIOS, run

    unknown = sorted(set(names or []) - set(SCENARIOS))
    if unknown:
        fail(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", 2)
    if json_path is None:
        json_path = SCENARIOS_ONLY_JSON if names else SCENARIOS_JSON
    with console.status("running scenarios...") as status:
        result = run(str(json_path), tuple(names) if names else None,
                     progress=lambda n: status.update(f"scenario {n}..."))
    table = Table("scenario", "passed", "false pages", "missed", "wall s")
    for name, r in result["scenarios"].items():
        table.add_row(name, "yes" if r["passed"] else "[red]NO[/red]", str(r["false_pages"]), str(r["missed"]),
                      str(r["wall_s"]))
    console.print(table)
    console.print(f"{result['passed']}/{result['total']} passed, {result['false_pages']} false page(s), "
                  f"{result['missed']} missed, {result['wall_s']} s; written to {json_path}")


@bench_app.command("fuzz")
def bench_fuzz(
    json_path: Path = typer.Option(Path("bench/results/fuzz.json"), "--json", help="Where to write the results."),
    messages: int = typer.Option(20_000, min=100, help="Messages to produce."),
    malformed: float = typer.Option(0.35, min=0.0, max=1.0, help="Share of the messages that are malformed."),
    seed: int = typer.Option(0, help="Seed of the generator."),
) -> None:
    """Garbage and edge-case events through the real loop (broker, worker, history sink, chDB).

    Every message must end stored once or dead-lettered once; the sink must never stall and the
    worker never die. Writes {"messages", "stored", "dead_lettered", "lost", "duplicated",
    "sink_stalls", "worker_restarts", "wall_s"} (and a detail) as JSON; takes a few minutes.
    """
    require_server("bench fuzz")
    from vigil.bench.fuzz import run

    with console.status("starting...") as status:
        result = run(str(json_path), messages=messages, malformed=malformed, seed=seed,
                     progress=lambda what: status.update(what + "..."))
    print_table(("messages", "stored", "dead-lettered", "lost", "duplicated", "sink stalls", "worker restarts", "wall s"),
                [tuple(str(result[k]) for k in ("messages", "stored", "dead_lettered", "lost", "duplicated",
                                                "sink_stalls", "worker_restarts", "wall_s"))])
    console.print(f"malformed: {result['detail']['malformed_messages']:,} "
                  f"({result['detail']['malformed_share']:.0%}); written to {json_path}")
    if result["lost"] or result["duplicated"] or result["sink_stalls"]:
        fail("messages were lost, duplicated or stalled the sink (see the JSON's detail)")
