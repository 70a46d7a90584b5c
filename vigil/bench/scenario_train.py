"""The training job of the scenario suite: real data-parallel torch (gloo on CPU) with vigil's hooks.

``vigil bench scenarios`` writes this file into each scenario's folder and
launches it with ``vigil agent ... -- python train.py SPEC`` (one process per
rank, torchrun's environment). SPEC is a JSON object:

``steps``          steps to run, then exit 0
``step_s``         seconds of one step (a sleep around a real all-reduce)
``first_step_x``   the first step takes this many times longer (warm-up)
``ckpt_every``     every N steps save a checkpoint, marked with ``mon.checkpoint()``
``ckpt_x``         ... taking this many step times
``ckpt_torch_save`` ... unmarked instead: ``torch.save`` of a tensor to storage slow enough that
                   it takes that long (what most training loops do); the ranks write
                   ``saves<r>``: one line per save, its step and the seconds it took
``hang_at``        at this step, rank ``hang_rank`` sleeps forever inside the step
``crash``          exit with this code right after start, every launch (a crash loop)
``start_step``     resume from this step (the next job of a chain)
``progress``       a folder: each rank writes ``rank<r>`` = its last step and pid, and
                   ``saved<r>`` = the step and time of a save vigil asked for

It is a user's script: the scenario knows its ground truth from SPEC and
from what it does to the processes, never from vigil's output.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


class SlowStorage:
    """A file written at a fixed rate (checkpoint storage slower than a step: a network filesystem), so a
    save of ``nbytes`` takes ``seconds`` whatever this machine's disk."""

    def __init__(self, path: Path, nbytes: int, seconds: float) -> None:
        self._f = open(path, "wb")
        self._rate = nbytes / seconds

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        time.sleep(len(data) / self._rate)
        return n

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("crash") is not None:
        sys.exit(int(spec["crash"]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    from vigil.producers.training import TrainingMonitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    mon = TrainingMonitor.from_env(dp=rank, pp=0, tp=0)
    mon.instrument_collectives()
    mon.install_exception_hooks()
    progress = Path(spec["progress"]) / f"rank{rank}" if spec.get("progress") else None

    def save(step: int) -> None:  # asked by vigil ("save and exit"): the ground truth of what was saved, and when
        time.sleep(spec.get("ckpt_x", 5) * spec["step_s"])
        if progress is not None:
            progress.with_name(f"saved{rank}").write_text(f"{step} {time.time()}")

    mon.start_control(on_checkpoint=save)
    grad = torch.ones(1024)
    step = spec.get("start_step", 0)  # resuming a run from its checkpoint
    while step < spec["steps"]:
        with mon.step(step) as s:
            pause = spec["step_s"] * (spec.get("first_step_x", 1.0) if step == 0 else 1.0)
            time.sleep(pause * 0.8)
            if step == spec.get("hang_at") and rank == spec.get("hang_rank", world - 1):
                while True:  # a hung collective: this rank never returns, its peers wait in theirs
                    time.sleep(3600)
            dist.all_reduce(grad)
            time.sleep(pause * 0.2)
        if s.exit_requested:
            break
        if spec.get("ckpt_every") and step and step % spec["ckpt_every"] == 0:
            seconds = spec.get("ckpt_x", 10) * spec["step_s"]
            if spec.get("ckpt_torch_save"):  # unmarked, as most loops save: the hooks must see it themselves
                weights = torch.ones(1 << 18)  # 1 MiB
                storage = SlowStorage(Path(spec["progress"]) / f"ckpt{rank}.pt", weights.numel() * 4, seconds)
                t0 = time.time()
                torch.save({"step": step, "weights": weights}, storage)
                storage.close()
                if progress is not None:
                    with open(progress.with_name(f"saves{rank}"), "a") as f:
                        f.write(f"{step} {time.time() - t0:.3f}\n")
            else:
                with mon.checkpoint(step):
                    time.sleep(seconds)
        if progress is not None:
            progress.write_text(f"{step} {os.getpid()}")
        if not s.retry:
            step += 1
    mon.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
