"""Check the layer contracts of pyproject.toml with import-linter.

The design's folders (schemas/, detectors/, ...) sit at the top of the
repository and install as ``vigil.schemas``, ``vigil.detectors``, ... through
setuptools' package-dir mapping. import-linter (grimp) finds a package's
modules by walking its folder, so it would see only ``vigil/``. This script
lays out the installed shape in a temporary folder (``vigil/`` with a link per
mapped folder), puts it first on the path and runs ``lint-imports``; its exit
code is import-linter's.

    python tools/lint_layers.py [--extra MODULE=PATH ...]

``--extra`` adds a module file to the shadow tree (the tests use it to prove
that a forbidden import fails).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shadow_tree(dest: Path, extra: dict[str, Path]) -> Path:
    """``dest/vigil`` laid out as installed; returns ``dest``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    top = dest / "vigil"
    top.mkdir()
    for entry in (ROOT / "vigil").iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package == "vigil":
            continue
        (dest / package.replace(".", "/")).symlink_to(ROOT / folder)
    for module, path in extra.items():
        target = dest / (module.replace(".", "/") + ".py")
        # Replace each linked folder on the way by a folder of links, so that the file lands in the
        # shadow tree and never in the repository.
        folder = dest
        for part in module.split(".")[:-1]:
            folder = folder / part
            if folder.is_symlink():
                real = folder.resolve()
                folder.unlink()
                folder.mkdir()
                for entry in real.iterdir():
                    if entry.name != "__pycache__":
                        (folder / entry.name).symlink_to(entry)
        target.write_text(path.read_text())
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", action="append", default=[], metavar="MODULE=PATH")
    args = parser.parse_args(argv)
    extra = {m: Path(p) for m, p in (e.split("=", 1) for e in args.extra)}
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="vigil-layers-") as tmp:
        shadow = shadow_tree(Path(tmp), extra)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        return subprocess.run([str(lint), str(ROOT / "pyproject.toml"), "--no-cache"],
                              cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
