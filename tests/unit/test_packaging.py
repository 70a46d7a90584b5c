"""What the distribution installs matches the tree, and each public name means one thing.

The design's folders sit at the top of the repository; ``vigil/`` holds a link to each, so they
install as ``vigil.schemas``, ... through an explicit ``packages`` list: a new sub-package missing
from the list would import in the repository and be absent from a wheel.
"""

from __future__ import annotations

import ast
import os
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
DESIGN_FOLDERS = ("schemas", "detectors", "producers", "streams", "actuators", "sim")

# Public classes that may share a name across modules, each with why. None today: two classes of one
# name with different meanings make a reader (and an import) pick the wrong one.
SHARED_NAMES_ALLOWED: dict[str, str] = {}


def _package_dirs() -> dict[str, Path]:
    """Every folder with an ``__init__.py`` under ``vigil/`` (through its links), by the name it installs as."""
    found = {}
    for path, _, files in os.walk(ROOT / "vigil", followlinks=True):
        folder = Path(path)
        rel = folder.relative_to(ROOT)
        if "__init__.py" in files and "__pycache__" not in rel.parts:
            found[".".join(rel.parts)] = folder
    return found


def test_the_packages_list_is_the_tree() -> None:
    listed = set(CONFIG["packages"])
    in_tree = set(_package_dirs())
    assert listed == in_tree, f"in the tree, not in pyproject's packages: {sorted(in_tree - listed)}; " \
                              f"listed, not in the tree: {sorted(listed - in_tree)}"


def test_every_top_folder_of_the_design_is_linked_under_vigil() -> None:
    for folder in DESIGN_FOLDERS:
        link = ROOT / "vigil" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder, link


def public_classes(dirs: dict[str, Path]) -> dict[str, list[str]]:
    """Module-level classes whose name does not start with ``_``, by name: the modules defining each."""
    where: dict[str, list[str]] = defaultdict(list)
    for package, folder in dirs.items():
        for path in sorted(folder.glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(module)
    return where


def test_no_two_public_classes_share_a_name() -> None:
    shared = {name: modules for name, modules in public_classes(_package_dirs()).items()
              if len(modules) > 1 and name not in SHARED_NAMES_ALLOWED}
    assert not shared, f"public classes defined in more than one module: {shared}"


def test_the_name_check_sees_a_duplicate(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text("")
        (tmp_path / sub / "m.py").write_text("class Record:\n    pass\n\nclass _Private:\n    pass\n")
    found = public_classes({"x.a": tmp_path / "a", "x.b": tmp_path / "b"})
    assert found == {"Record": ["x.a.m", "x.b.m"]}
