"""The layer contracts hold (bare ``lint-imports``), and a forbidden import breaks them (the check is not a no-op)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = [str(Path(sys.executable).with_name("lint-imports")), str(ROOT / "pyproject.toml"), "--no-cache"]


def _lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run(LINT, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def _tree_with(dest: Path, module: str, source: str) -> Path:
    """``dest/vigil`` as the repository's, plus one module: a folder of links for each package on the
    way to the new file, so that the file lands in the copy and never in the repository."""
    folder, real = dest, ROOT
    for part in module.split(".")[:-1]:
        folder, real = folder / part, (real / part).resolve()
        if folder.is_symlink():
            folder.unlink()
        folder.mkdir()
        for entry in real.iterdir():
            if entry.name != "__pycache__":
                (folder / entry.name).symlink_to(entry.resolve())
    (folder / (module.rsplit(".", 1)[1] + ".py")).write_text(source)
    return dest


def test_the_layers_hold() -> None:
    done = _lint(ROOT)
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
    tree = _tree_with(tmp_path, module, source)
    done = _lint(tree, pythonpath=tree)
    assert done.returncode != 0, done.stdout
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout
