"""Unit tests run apart from the environment: a ``VIGIL_*`` variable set by the shell, CI or the
integration tier's conftest (which exports a decision key and turns /metrics off for its processes)
must not change what a unit test sees. A test that wants one sets it with ``monkeypatch``."""
import os

import pytest


@pytest.fixture(autouse=True)
def _no_vigil_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith("VIGIL_")]:
        monkeypatch.delenv(name)
