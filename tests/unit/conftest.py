"""Unit tests run apart from the environment: a ``VIGIL_*`` variable set by the shell, CI or the
integration tier's conftest (which exports a decision key and turns /metrics off for its processes)
must not change what a unit test sees. A test that wants one sets it with ``monkeypatch``.

No test imports a layer under its bare folder name (``schemas``, ``streams``, ...): the root of
the repository is on ``sys.path`` here, so such an import works in the suite and fails for a user."""
import os
import sys

import pytest


@pytest.fixture(autouse=True)
def _no_vigil_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith("VIGIL_")]:
        monkeypatch.delenv(name)


_BARE = frozenset({"schemas", "detectors", "producers", "streams", "actuators", "sim"})


@pytest.fixture(autouse=True)
def _no_bare_layer_import():
    yield
    bare = sorted(n for n in sys.modules if n.partition(".")[0] in _BARE)
    assert not bare, f"imported under a bare top-level name (use vigil.<name>): {bare}"
