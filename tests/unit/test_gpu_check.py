"""``tools/gpu_check.py`` where there is no GPU (here): a clear message and exit status 2, nothing attempted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "tools" / "gpu_check.py"


def test_without_a_gpu_the_check_says_so_and_exits_2_no_gpu_here():
    pytest.importorskip("torch")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no device visible, whatever the machine has
    res = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["gpu"] is False
    assert "no NVIDIA GPU is visible here" in out["error"] and "torch.cuda.is_available() is False" in out["error"]
    assert res.stderr.startswith("gpu_check: no NVIDIA GPU is visible here")
    assert "Traceback" not in res.stderr
