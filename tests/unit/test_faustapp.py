"""The faust app vigil builds: settings that matter to operators."""

from __future__ import annotations

import os
from pathlib import Path

from vigil.streams.config import StreamConfig
from vigil.streams.faustapp import create_app


def test_worker_leaves_no_data_directory_in_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = create_app(StreamConfig(bootstrap="localhost:1", group_id="litter-check"))
    datadir = Path(app.conf.datadir)
    assert tmp_path not in datadir.parents and datadir != tmp_path
    assert os.listdir(tmp_path) == []


def test_worker_keeps_faust_files_where_configured(tmp_path: Path) -> None:
    app = create_app(StreamConfig(bootstrap="localhost:1", data_dir=str(tmp_path / "faust")))
    assert Path(app.conf.datadir) == tmp_path / "faust"
