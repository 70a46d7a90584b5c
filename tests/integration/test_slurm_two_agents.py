"""examples/slurm/train.sbatch's per-node line, run twice on one machine as srun would on two nodes.

Each `vigil agent` gets only the SLURM_* variables srun sets on its node; from
them it must derive the job, its node name, the node count and rank, and the
rendezvous address and port, and launch its rank so that the two ranks find
each other (a real gloo all-reduce across the two agents). The job ends
`completed` on both nodes, with no page and no decision.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from vigil.bench.scenario_harness import TRAIN, Recorder, Scene, WorkerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _srun_line() -> list[str]:
    """The agent's argv from train.sbatch (what follows `srun ... vigil`), up to the training command."""
    text = (ROOT / "examples" / "slurm" / "train.sbatch").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    argv = line.split()
    start = argv.index("agent")
    return argv[start:argv.index("--")]


def test_two_agents_find_each_other_from_the_slurm_environment(config, tmp_path):
    import random

    from vigil.broker import port_is_free

    # the agents derive the rendezvous port from the job id (20000 + id mod 20000): pick an id whose port is free
    job = next(str(j) for j in random.sample(range(100_000, 200_000), 500) if port_is_free(20000 + j % 20000))
    scene = Scene(tmp_path, config.bootstrap, prefix=config.topic_prefix)
    worker = WorkerProcess(scene)
    rec = None
    try:
        worker.wait_ready()
        rec = Recorder(scene)
        train = tmp_path / "train.py"
        train.write_text(TRAIN.read_text())
        spec = json.dumps({"steps": 15, "step_s": 0.1})
        procs = []
        for nodeid, name in enumerate(("gpu-a", "gpu-b")):
            env = scene.env(VIGIL_STATE_DIR=str(tmp_path / name), SLURM_JOB_ID=job, SLURM_NNODES="2",
                            SLURM_NODEID=str(nodeid), SLURM_JOB_NODELIST="localhost", SLURMD_NODENAME=name,
                            SLURM_GPUS_ON_NODE="1")
            argv = [sys.executable, "-m", "vigil.cli", *_srun_line(), "--no-gpu", "--kmsg", os.devnull,
                    "--nic-root", str(tmp_path / "nic"), "--hooks-socket", str(tmp_path / f"{name}.sock"),
                    "--control-dir", str(tmp_path / f"ctl-{name}"), "--", sys.executable, str(train), spec]
            log = open(tmp_path / f"{name}.log", "wb")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            scene.processes.append(procs[-1])
        assert wait_until(lambda: all(p.poll() is not None for p in procs), 180, rec.poll), \
            (tmp_path / "gpu-a.log").read_text()[-2000:]
        wait_until(lambda: len([s for _, s in rec.job_states(job) if s.state == "completed"]) == 2, 20, rec.poll)
        assert [p.returncode for p in procs] == [0, 0], (tmp_path / "gpu-b.log").read_text()[-2000:]
        completed = {s.source.node for _, s in rec.job_states(job) if s.state == "completed"}
        assert completed == {"gpu-a", "gpu-b"}
        banner = (tmp_path / "gpu-b.log").read_text()
        assert re.search(rf"job {job} \(1 rank\(s\), node 1 of 2\)", banner), banner[:500]
        wait_until(lambda: False, 3, rec.poll)
        assert rec.pages() == [] and rec.decisions == []
    finally:
        if rec is not None:
            rec.close()
        scene.close()
