"""vigil report: terminal tables and an HTML report whose plots a headless Chromium renders."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.integration import scripted_history as sh

PLOTS = ("iterations-ettr-small", "iterations-big-b", "timeline", "ettr", "lemons")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def report_run(tmp_path_factory):
    """`vigil report` on its own state directory, filled with the scripted history."""
    tmp = tmp_path_factory.mktemp("report")
    env = dict(os.environ, VIGIL_STATE_DIR=str(tmp / "state"), VIGIL_TELEMETRY_TTL_DAYS="0")
    env.pop("VIGIL_CLICKHOUSE_DSN", None)
    fill = textwrap.dedent(f"""
        from vigil.streams.history import HistoryStore
        from tests.integration import scripted_history as sh
        store = HistoryStore("chdb://{tmp / 'state' / 'history'}", "vigil")
        store.migrate()
        sh.populate(store)
    """)
    subprocess.run([sys.executable, "-c", fill], env=env, check=True, timeout=120)
    html = tmp / "report.html"
    out = subprocess.run([sys.executable, "-m", "vigil.cli", "report", "--since", "2026-03-02", "--until",
                          "2026-03-04", "--html", str(html)], env={**env, "COLUMNS": "160"},
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout, html


def test_the_terminal_report_has_every_table(report_run):
    stdout, _ = report_run
    for title in ("Incidents by domain", "ETTR per job", "MTTF by job size", "Expected MTTF at scale", "MTTR",
                  "Detection latency", "fail-slow", "Lemon-node ranking"):
        assert title in stdout, title
    lemon_table = stdout[stdout.index("Lemon-node ranking"):]
    first_row = next(line for line in lemon_table.splitlines() if re.match(r"│ n\d\d ", line))
    assert first_row.startswith(f"│ {sh.LEMON} ")
    assert "0.714" in stdout  # ettr-small's ETTR


def test_chromium_renders_every_plot(report_run, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no headless Chromium here (`make test` installs Debian's chromium when it runs as root)")
    _, html = report_run
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    for plot in PLOTS:
        m = re.search(rf"<figure class=\"plot\" id=\"{plot}\"[^>]*>(.*?)</figure>", dom, re.S)
        assert m, f"figure {plot} missing from the rendered DOM"
        svg = m.group(1)
        assert "<svg" in svg and svg.count("<path") >= 5, plot
    assert re.search(r"<td>n13</td>", dom)

    png = tmp_path / "report.png"
    subprocess.run([chromium, *flags, f"--screenshot={png}", "--window-size=1200,2400", html.as_uri()],
                   capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    pixels = mpimg.imread(png)
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    ink = (pixels[..., :3].mean(axis=2) < 0.9).mean()
    coloured = ((abs(pixels[..., 0] - pixels[..., 1]) > 0.2) | (abs(pixels[..., 1] - pixels[..., 2]) > 0.2)).mean()
    assert ink > 0.02, "the page rendered almost blank"
    assert coloured > 0.002, "no coloured plot marks in the screenshot"
