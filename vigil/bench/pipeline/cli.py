"""``python -m vigil.bench.pipeline worker|inprocess|merge|replay``: the benchmark's helpers on the command line.

(Here rather than in ``__main__``: the package imports ``main``, and a ``__main__`` already imported when
``-m`` runs it makes Python warn.)"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from vigil.bench.pipeline.capacity import merge
from vigil.bench.pipeline.inprocess import inprocess
from vigil.bench.pipeline.procs import worker_main
from vigil.bench.pipeline.replay import main as replay_main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vigil.bench.pipeline")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="a detection worker that writes its stats every second")
    w.add_argument("--ready-file", type=Path, required=True)
    w.add_argument("--stats-file", type=Path, required=True)
    ip = sub.add_parser("inprocess", help="the detect stage's CPU per record in one process, and its profile")
    ip.add_argument("--gpus", type=int, default=25_000)
    ip.add_argument("--seconds", type=float, default=10.0)
    ip.add_argument("--warmup-seconds", type=float, default=5.0, help="cluster seconds building the state, untimed")
    ip.add_argument("--repeats", type=int, default=3)
    ip.add_argument("--profile-lines", type=int, default=0)
    ip.add_argument("--json", dest="json_path")
    rp = sub.add_parser("replay", help="the generator's faults through a worker's stages on a simulated clock: "
                                         "what is alerted, what is missed (deterministic)")
    rp.add_argument("--gpus", type=int, default=2000)
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--faults-per-kind", type=int, default=30)
    rp.add_argument("--json", dest="json_path")
    mg = sub.add_parser("merge", help="one pipeline.json from the JSON of several `vigil bench pipeline` runs")
    mg.add_argument("parts", nargs="+", type=Path)
    mg.add_argument("--json", dest="json_path", required=True)
    mg.add_argument("--note", action="append", default=[], help="a line of explanation kept in the JSON")
    args = parser.parse_args(argv)
    if args.cmd == "merge":
        line = shlex.join(["python", "-m", "vigil.bench.pipeline", "merge", *map(str, args.parts),
                           "--json", str(args.json_path), *(a for n in args.note for a in ("--note", n))])
        try:
            merged = merge([json.loads(p.read_text()) for p in args.parts], args.json_path, args.note,
                           merge_command=line)
        except ValueError as exc:
            parser.exit(2, f"merge: {exc}\n")
        print(json.dumps({k: merged[k] for k in ("throughput", "max_gpus_per_worker_meeting_targets", "wall_s")}))
    elif args.cmd == "worker":
        worker_main(args.ready_file, args.stats_file)
    elif args.cmd == "replay":
        replay_main(args.gpus, args.seed, args.faults_per_kind, args.json_path)
    elif args.cmd == "inprocess":
        out = inprocess(args.gpus, args.seconds, repeats=args.repeats, profile_lines=args.profile_lines,
                        json_path=args.json_path, warmup_s=args.warmup_seconds)
        print(json.dumps({k: v for k, v in out.items() if not k.startswith("profile")}))
