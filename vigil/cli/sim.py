"""``vigil sim``: play a simulated cluster with faults into a running stack."""

from __future__ import annotations

import random
import threading
import time

import typer

from vigil.cli.common import app, console, fail, load_settings, terminate_on_sigterm, require_server


@app.command()
def sim(
    nodes: int = typer.Option(8, min=1, max=4096, help="Nodes of 8 GPUs (node-00, node-01, ...)."),
    jobs: int = typer.Option(2, min=1, help="Jobs sharing the nodes evenly (job-0, job-1, ...)."),
    fault: list[str] = typer.Option([], "--fault", "-f", help="KIND@TIME[:TARGET][,key=value...], repeatable: "
                                     "node_loss@30s:node-03, xid@20s:node-02,code=79,gpu=3, "
                                     "gpu_slow@40s:node-04,gpu=2,slowdown=0.4, congestion@40s:node-05, "
                                     "hang@25s:job-1,for=10s, process_exit@25s:job-0,rank=3, "
                                     "exception@25s:job-0,category=cuda_error."),
    duration: str = typer.Option("60s", help="Cluster time to play (30s, 5m, 1h); then the jobs end."),
    speed: float = typer.Option(1.0, help="Cluster seconds per wall second (durations are compressed)."),
    seed: int = typer.Option(0, help="Seed of the jitter and of faults given without a target."),
    cluster: str = typer.Option("sim", help="Cluster name in every event."),
) -> None:
    """Play a simulated cluster with faults into a running stack, and say what is injected when.

    Publishes what node agents and training hooks would (heartbeats with GPU
    and NIC samples, every job step, XIDs, process exits, exceptions) and
    each job's state, to the stack `vigil up` runs from VIGIL_STATE_DIR or
    to VIGIL_KAFKA_BOOTSTRAP. Watch what vigil makes of it with
    `vigil tail all` in another terminal. Times (fault times, --duration)
    are cluster time; at --speed 10 a 60 s run plays in 6 s, every
    duration in the cluster 10 times shorter.
    """
    require_server("sim")
    from vigil.broker import StackError
    from vigil.producers.publisher import Publisher
    from vigil.sim.feed import Feed, FeedError, build_cluster, parse_duration, parse_fault
    from vigil.stack import resolve_bootstrap, stream_config

    settings = load_settings()
    try:
        node_names, sim_jobs = build_cluster(nodes, jobs, seed)
        rng = random.Random(seed)
        faults = [parse_fault(text, node_names, sim_jobs, rng) for text in fault]
        feed = Feed(node_names, sim_jobs, faults, parse_duration(duration, "--duration"), speed=speed, seed=seed,
                    cluster=cluster)
    except FeedError as exc:
        fail(str(exc), 2)
    try:
        config = stream_config(settings, resolve_bootstrap(settings))
    except StackError as exc:
        fail(str(exc))
    publisher = Publisher(config.kafka_conf(), config.topic_prefix)
    console.print(f"vigil sim: {len(node_names)} nodes x 8 GPUs, {len(sim_jobs)} job(s), {feed.duration_s:g} s of "
                  f"cluster time at {speed:g}x ({feed.duration_s / speed:.1f} s) into {config.bootstrap} "
                  f"(topics {config.topic_prefix}.*)")
    for job in sim_jobs:
        console.print(f"  job {job.name}: {job.world_size} GPUs on {job.nodes[0]}..{job.nodes[-1]}, "
                      f"dp={job.dp} pp={job.pp} tp={job.tp}, steps of {job.iteration_s:g} s")
    for f in feed.faults:
        console.print(f"  fault at {f.at:g} s: {f.kind} {f.target}")
    if not faults:
        console.print("  no faults: a healthy cluster (vigil should raise nothing)")
    for warning in feed.warnings():
        console.print(f"[yellow]warning:[/yellow] {warning}")
    terminate_on_sigterm()
    stop = threading.Event()
    code = 0
    try:
        feed.begin(time.time())
        while True:
            now = time.time()
            for inj in feed.step(now, publisher.publish):
                console.print(f"{time.strftime('%H:%M:%S', time.localtime(inj.wall))}  t={inj.cluster_s:7.2f} s  "
                              f"[magenta]injected[/magenta] {inj.describe()}", highlight=False)
            if feed.finished:
                break
            stop.wait(0.02)  # pacing a real-time playback: every due event is published within 20 ms
    except KeyboardInterrupt:
        console.print("interrupted: ending the jobs")
        feed.step(time.time(), publisher.publish, stop=True)
        code = 130
    finally:
        left = publisher.flush(30)
    console.print(f"done: {feed.published:,} events published, {len(feed.injections)} fault(s) injected"
                  + (f"; {left} message(s) not delivered" if left else ""))
    raise typer.Exit(code or (1 if left else 0))
