"""What the distribution installs matches the tree, and each public name means one thing.

The design's folders install under ``vigil.`` through pyproject's ``package-dir`` mapping and an
explicit ``packages`` list (setuptools' discovery cannot follow the mapping): a new sub-package
missing from the list would import in the repository and be absent from a wheel.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
MAPPING: dict[str, str] = CONFIG["package-dir"]

# Public classes that may share a name across modules, each with why. None today: two classes of one
# name with different meanings make a reader (and an import) pick the wrong one.
SHARED_NAMES_ALLOWED: dict[str, str] = {}


def _package_dirs() -> dict[str, Path]:
    """Every folder with an ``__init__.py`` under a mapped folder, by the name it installs as."""
    found = {}
    for package, folder in MAPPING.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            found[".".join((package, *rel.parts))] = init.parent
    return found


def test_the_packages_list_is_the_tree() -> None:
    listed = set(CONFIG["packages"])
    in_tree = set(_package_dirs())
    assert listed == in_tree, f"in the tree, not in pyproject's packages: {sorted(in_tree - listed)}; " \
                              f"listed, not in the tree: {sorted(listed - in_tree)}"


def test_every_top_folder_of_the_design_is_mapped() -> None:
    for folder in ("schemas", "detectors", "producers", "streams", "actuators", "sim"):
        assert MAPPING[f"vigil.{folder}"] == folder


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
