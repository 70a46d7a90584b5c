"""``vigil analyze``: localize a straggler offline from PyTorch profiler traces (one per rank)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from vigil.cli.common import app, console, fail, print_table


@app.command()
def analyze(
    traces: List[Path] = typer.Argument(..., help="Kineto/Chrome-trace JSON files (.json or .json.gz), one per rank, "
                                                   "or directories of them."),
    dp: Optional[int] = typer.Option(None, min=1, help="Data-parallel size (default: world / (pp x tp))."),
    pp: int = typer.Option(1, min=1, help="Pipeline-parallel size."),
    tp: int = typer.Option(1, min=1, help="Tensor-parallel size (ranks in Megatron order: tp fastest, then dp, then pp)."),
    skip_first: int = typer.Option(0, min=0, help="Profiled steps to leave out at the start (warm-up)."),
    wait_marker: Optional[List[str]] = typer.Option(None, help="Annotation name that marks waiting for peers "
                                                               "(repeatable; default vigil.wait and vigil.bubble)."),
    z: float = typer.Option(5.0, min=0.1, help="Robust z-score a straggler must reach (fewer ranks need less)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the verdict and records as JSON here."),
) -> None:
    """Read one profiler trace per rank, turn each profiled step into compute / communication / wait, localize.

    The traces are what torch.profiler writes (export_chrome_trace or
    tensorboard_trace_handler) with a schedule and prof.step() per training
    step. Compute is what the trace proves busy (operators, or non-NCCL
    kernels in GPU traces); communication the collectives; wait the
    point-to-point operations and the annotations named by --wait-marker.
    Prints the verdict (worker, stage, spread, none...) with its evidence
    and every rank's medians.
    """
    from vigil.analyze import DEFAULT_WAIT_MARKERS
    from vigil.analyze import analyze as run

    grid = None
    try:
        if dp is not None or pp > 1 or tp > 1:
            if dp is None:
                from vigil.analyze import load_trace

                first = traces[0] if not traces[0].is_dir() else next(
                    q for q in sorted(traces[0].iterdir()) if q.name.endswith((".json", ".json.gz")))
                world = load_trace(first).world_size or 0
                if world % (pp * tp):
                    fail(f"world size {world} is not a multiple of pp x tp = {pp * tp}", 2)
                dp = world // (pp * tp)
            grid = (dp, pp, tp)
        result = run(traces, grid=grid, wait_markers=wait_marker or DEFAULT_WAIT_MARKERS, skip_first=skip_first, z=z)
    except (ValueError, OSError) as exc:
        fail(str(exc), 2)
    d = result.to_dict()
    loc = d["location"]
    console.print(f"[bold]verdict: {d['culprit']}[/bold]" + (f" at {loc}" if loc is not None else "")
                  + f"  ({len(d['steps'])} steps: {d['steps'][0]}..{d['steps'][-1]}, grid dp x pp x tp = "
                  + " x ".join(map(str, d["grid"])) + (", GPU trace" if d["gpu_trace"] else ", CPU trace") + ")")
    ev = d["evidence"]
    for key in ("replica_spread", "step_stretch", "compute_median", "comm_median", "wait_median", "ambiguous"):
        if key in ev:
            v = ev[key]
            console.print(f"  {key}: {v:.4f}" if isinstance(v, float) else f"  {key}: {v}")
    if d["suspects"]:
        print_table(("suspect", "location", "excess s", "evidence"),
                    [(s["culprit"], str(s["location"]), f"{s['excess_s']:.4f}",
                      ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in s["evidence"].items() if k in (
                                    "rank", "reporting_rank", "compute", "cell_time", "expected", "rel_excess", "z",
                                    "peers_comm_median", "wait", "peers_wait_median", "stage_compute", "reference")))
                     for s in d["suspects"]])
    print_table(("rank", "dp", "pp", "tp", "compute s", "comm s", "wait s", "step s"),
                [(str(r["rank"]), str(r["dp"]), str(r["pp"]), str(r["tp"]), f"{r['compute']:.4f}", f"{r['comm']:.4f}",
                  f"{r['wait']:.4f}", f"{r['step_s']:.4f}") for r in d["per_rank_median"]])
    for note in d["notes"]:
        console.print(f"note: {note}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(d, indent=2, default=str) + "\n")
        console.print(f"written to {json_path}")
