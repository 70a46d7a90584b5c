"""The installed package: every layer under ``vigil.*``, nothing at the top level, and light hooks.

Built as a wheel and installed (not editable) into a fresh virtual
environment whose dependencies come from the development one, then used from
a user's folder that has its own ``schemas/`` and ``streams/``.
"""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"numpy", "scipy", "river", "clickhouse_connect", "chdb", "matplotlib", "torch"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pkg")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    str(ROOT), "-w", str(tmp / "dist")], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("vigil-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("vigil-")}
    assert tops == {"vigil"}, tops
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    py = tmp / "venv" / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    # The dependencies: the development environment's site-packages (its editable vigil is not activated
    # from there: a path added by a .pth file is not scanned for .pth files of its own).
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "vigil-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return py


def _run(py: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_no_top_level_names_and_every_layer_under_vigil(installed, tmp_path):
    done = _run(installed, "import schemas", tmp_path)
    assert done.returncode != 0 and "No module named 'schemas'" in done.stderr
    done = _run(installed, "import vigil.schemas, vigil.detectors, vigil.streams.engine, vigil.actuators.executor, "
                           "vigil.producers.agent, vigil.sim, vigil.cli; print(vigil.schemas.__file__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "site-packages" in done.stdout and str(ROOT) not in done.stdout


def test_a_training_script_next_to_its_own_schemas_and_streams_folders(installed, tmp_path):
    for folder in ("schemas", "streams"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "train.py").write_text(
        "import schemas, streams\n"
        "assert schemas.MINE and streams.MINE  # the user's own folders\n"
        "from vigil.producers.training import CallbackSink, TrainingMonitor\n"
        "from vigil.schemas import IterationTiming\n"
        "got = []\n"
        "mon = TrainingMonitor(CallbackSink(got.extend), job='j', rank=0, node='n')\n"
        "with mon.step(0):\n    pass\n"
        "mon.flush()\n"
        "assert isinstance(got[0], IterationTiming), got\n"
        "print('ok')\n")
    done = subprocess.run([str(installed), "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_hooks_and_the_agent_import_nothing_of_the_server_side(installed, tmp_path):
    code = ("import sys, vigil.producers.training, vigil.producers.publisher, vigil.services.agent, vigil.cli\n"
            f"print(sorted(set({sorted(HEAVY)!r}) & set(m.split('.')[0] for m in sys.modules)))")
    done = _run(installed, code, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)
