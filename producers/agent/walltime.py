"""Leaving before the scheduler kills the job: its end time, the grace a save needs, and when to ask.

Shared clusters give every job a time limit and may preempt it. The
practice of large open training runs is to exit on purpose before the hard
limit: know how long a step and a checkpoint take, ask the training to save
and exit when the time left falls below a safety factor (2) times that plus
the ranks' exit (:func:`grace_s`), and let the next job of the chain resume
from the checkpoint. The agent learns the end time from
``SLURM_JOB_END_TIME``, from ``squeue -h -j $SLURM_JOB_ID -o %e``, or from
``--deadline``; it also leaves at once on the scheduler's early warning
(``sbatch --signal=USR1@600``) and, within a grace period, on SIGTERM.

Pure rules here (time is an argument); the agent reads the clock and acts.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timezone
from typing import Callable, Mapping

__all__ = ["EXIT_S", "grace_s", "parse_deadline", "slurm_end_time", "due", "queued_successors"]


#: What a rank needs after its checkpoint to be gone: destroying its process group, flushing, the
#: interpreter's exit (0.6-1 s measured for a 2-rank gloo job on a loaded 2-core machine). Not scaled
#: by ``safety``: it does not grow with the model.
EXIT_S = 3.0


def grace_s(longest_step_s: float | None, checkpoint_s: float | None, *, safety: float = 2.0,
            default_step_s: float = 60.0, default_checkpoint_s: float = 300.0, exit_s: float = EXIT_S) -> float:
    """How long before the end the job must be asked to save and leave.

    ``safety`` x (the longest recent step + the measured checkpoint), plus
    ``exit_s``: the step under way must finish, the checkpoint must be
    written, and the ranks must exit before the limit or they are killed
    mid-teardown. Until the hooks measured them, generous defaults stand in.

    >>> grace_s(1.5, 20.0)
    46.0
    >>> grace_s(None, None)
    723.0
    """
    if not safety >= 1:
        raise ValueError(f"safety must be >= 1, got {safety}")
    step = longest_step_s if longest_step_s is not None else default_step_s
    ckpt = checkpoint_s if checkpoint_s is not None else default_checkpoint_s
    return safety * (max(0.0, step) + max(0.0, ckpt)) + max(0.0, exit_s)


def due(deadline: float | None, now: float, grace: float) -> bool:
    """Is it time to save and leave? (``deadline`` and ``now`` in seconds since the epoch)

    >>> due(1000.0, 950.0, 43.0), due(1000.0, 960.0, 43.0), due(None, 1e9, 43.0)
    (False, True, False)
    """
    return deadline is not None and deadline - now <= grace


def parse_deadline(text: str, now: float) -> float:
    """``+20s``, ``+3h``, ``+90m`` from ``now``; seconds since the epoch; or an ISO 8601 time (UTC if no zone).

    >>> parse_deadline("+20s", 100.0), parse_deadline("+2h", 0.0), parse_deadline("1700000000", 0.0)
    (120.0, 7200.0, 1700000000.0)
    >>> parse_deadline("2026-01-01T00:00:00", 0.0)
    1767225600.0
    """
    text = text.strip()
    m = re.fullmatch(r"\+(\d+(?:\.\d+)?)([smhd]?)", text)
    if m:
        return now + float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a deadline: {text!r} (expected +20s, +3h, epoch seconds or an ISO 8601 time)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def slurm_end_time(env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                   timeout_s: float = 10.0) -> float | None:
    """The job's end time from Slurm: ``SLURM_JOB_END_TIME`` (epoch seconds), else ``squeue -o %e``; None if unknown.

    >>> slurm_end_time({"SLURM_JOB_END_TIME": "1767225600"})
    1767225600.0
    >>> slurm_end_time({})
    """
    if env.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(env["SLURM_JOB_END_TIME"])
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        done = run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or "").strip()
    if done.returncode != 0 or not text or text in ("N/A", "Unknown", "NONE"):
        return None
    try:
        # squeue prints the controller's local time without a zone
        return datetime.fromisoformat(text).astimezone().timestamp()
    except ValueError:
        return None


def queued_successors(env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                      timeout_s: float = 10.0) -> list[str]:
    """Jobs queued to continue this one: the pending elements of its job array, else pending jobs of its name.

    >>> def squeue(argv, **kw):
    ...     return subprocess.CompletedProcess(argv, 0, stdout="4711_3\\n4711_4\\n" if "-r" in argv else "")
    >>> queued_successors({"SLURM_JOB_ID": "4712", "SLURM_ARRAY_JOB_ID": "4711"}, run=squeue)
    ['4711_3', '4711_4']
    >>> queued_successors({}, run=squeue)
    []
    """
    me = env.get("SLURM_JOB_ID")
    if not me:
        return []
    if env.get("SLURM_ARRAY_JOB_ID"):
        argv = ["squeue", "-h", "-r", "-t", "PENDING", "-j", env["SLURM_ARRAY_JOB_ID"], "-o", "%i"]
    elif env.get("SLURM_JOB_NAME") and env.get("USER"):
        argv = ["squeue", "-h", "-t", "PENDING", "-u", env["USER"], "-n", env["SLURM_JOB_NAME"], "-o", "%i"]
    else:
        return []
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [j for j in (line.strip() for line in (done.stdout or "").splitlines()) if j and j != me]
