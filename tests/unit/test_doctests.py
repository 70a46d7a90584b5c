"""Every docstring example of every vigil module runs (the examples are part of the docs).

pytest's ``--doctest-modules`` imports files by their path, which would import
``detectors/bocd.py`` as a top-level ``detectors`` package beside the installed
``vigil.detectors``; walking the installed package runs each example in the
module users import.

The examples run as a user's would: with the repository's root off ``sys.path``.
pytest (``tests/`` is a package) and ``python -m pytest`` put the root there, where
a stale ``from schemas import ...`` finds the folder and passes here while it fails
for everyone else; with the root removed it fails here too.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import io
import pkgutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import vigil

ROOT = Path(__file__).resolve().parents[2]
# The design's folders: installed as vigil.<name> only, never importable under the bare name.
BARE = ("schemas", "detectors", "producers", "streams", "actuators", "sim")


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(vigil.__path__, "vigil."):
        names.append(info.name)
    for subpackage in ("schemas", "detectors", "producers", "streams", "actuators", "sim"):
        try:
            pkg = importlib.import_module(f"vigil.{subpackage}")
        except ModuleNotFoundError:
            continue
        names.append(pkg.__name__)
        names += [i.name for i in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}.")]
    return sorted(set(names))


MODULES = _modules()


@contextmanager
def _root_off_path() -> Iterator[None]:
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    try:
        yield
    finally:
        sys.path[:] = saved


def _run(module: object) -> tuple[int, int, str]:
    out = io.StringIO()
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with _root_off_path():
        for test in finder.find(module, getattr(module, "__name__", None)):
            runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    return result.failed, result.attempted, out.getvalue()


def test_the_walk_finds_every_layer() -> None:
    for prefix in ("vigil.schemas.", "vigil.detectors.", "vigil.producers.", "vigil.streams.", "vigil.actuators."):
        assert any(m.startswith(prefix) for m in MODULES), prefix


def test_a_bare_layer_import_fails_in_a_doctest() -> None:
    """The guard is not a no-op: an example importing ``schemas`` (not ``vigil.schemas``) fails."""
    import types
    module = types.ModuleType("vigil_bare_import_probe")
    module.__doc__ = ">>> from schemas import Source\n"
    failed, attempted, report = _run(module)
    assert (failed, attempted) == (1, 1), report
    assert "No module named 'schemas'" in report, report
    assert not any(name.split(".")[0] in BARE for name in sys.modules)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    failed, _attempted, report = _run(module)
    assert failed == 0, report


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.py")))
def test_example_doctests(path: str) -> None:
    spec = importlib.util.spec_from_file_location(f"vigil_example_{Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        failed, _attempted, report = _run(module)
    finally:
        sys.modules.pop(spec.name, None)
    assert failed == 0, report
