"""The layer contracts hold, and a forbidden import breaks them (the check is not a no-op)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = [sys.executable, str(ROOT / "tools" / "lint_layers.py")]


def _lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LINT, *args], capture_output=True, text=True, timeout=300)


def test_the_layers_hold() -> None:
    done = _lint()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module,source,contract", [
    ("vigil.schemas._bad", "import vigil.streams.kafka\n", "schemas"),
    ("vigil.detectors._bad", "from vigil.producers.publisher import Publisher\n", "producers and actuators"),
    ("vigil.streams.engine._bad", "import confluent_kafka\n", "The engine is pure"),
    ("vigil.detectors._bad", "import prometheus_client\n", "detectors: pure"),
    ("vigil.streams.engine._bad", "from vigil.streams.metrics import DetectorTimer\n", "The engine is pure"),
    ("vigil.producers._bad", "from vigil.settings import Settings\n", "Nothing below the top"),
    # adapters the old hand-written list of the engine's contract left out
    ("vigil.streams.engine._bad", "from vigil.streams.stages import DetectStage\n", "The engine is pure"),
    ("vigil.streams.engine._bad", "from vigil.streams.notify import Notifier\n", "The engine is pure"),
    # a new module of streams/ placed in no layer (exhaustive), whatever it imports
    ("vigil.streams._new_adapter", "import json\n", "The engine is pure: below every adapter"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, source: str, contract: str) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    done = _lint("--extra", f"{module}={bad}")
    assert done.returncode != 0, done.stdout
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout
