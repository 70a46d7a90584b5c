"""vigil report: terminal tables and an HTML report whose plots a headless Chromium renders."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.integration import scripted_history as sh

PLOTS = ("iterations-ettr-small", "iterations-big-b", "iterations-dies-c", "timeline", "ettr", "lemons")
TIME_PLOTS = ("iterations-ettr-small", "iterations-big-b", "iterations-dies-c", "timeline")


def _figure(dom: str, plot: str) -> str:
    m = re.search(rf"<figure class=[\"']plot[\"'] id=[\"']{plot}[\"'][^>]*>(.*?)</figure>", dom, re.S)
    assert m, f"figure {plot} missing"
    return m.group(1)


def _tick_labels(svg: str, axis: str) -> list[str]:
    """The text of each x (or y) tick of a matplotlib SVG (text kept as <text> elements)."""
    return [html.unescape(m) for m in re.findall(rf'<g id="{axis}tick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, re.S)]


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
    ettr_table = stdout[stdout.index("ETTR per job"):stdout.index("MTTF by job size")]
    dies = next(line for line in ettr_table.splitlines() if "dies-c" in line)
    assert f"{sh.ETTR_DIES:.3f}" in dies and "failed" in dies and "│ 16 " in dies  # died: not 1.0; its size
    failslow = stdout[stdout.index("Time lost to fail-slow"):]
    assert re.search(r"│ dies-c +│ 1 +│ 300.0 +│ 60 ", failslow), failslow[:1200]  # rooted at the GPU, still counted
    mttf = stdout[stdout.index("MTTF by job size"):stdout.index("Expected MTTF at scale")]
    assert {int(m) for m in re.findall(r"^│ (\d+) ", mttf, re.M)} == {g for g, *_ in sh.JOBS.values()}


def test_time_axes_have_distinct_ticks_and_the_timeline_one_labelled_row_per_subject(report_run):
    _, path = report_run
    page = path.read_text()
    for plot in TIME_PLOTS:
        labels = _tick_labels(_figure(page, plot), "x")
        assert len(labels) >= 3 and len(set(labels)) == len(labels), (plot, labels)
    # ettr-small runs 23 minutes: its ticks are minutes of that hour, not one minute repeated
    assert _tick_labels(_figure(page, "iterations-ettr-small"), "x")[:2] in (["00:00", "00:05"], ["00:05", "00:10"])
    rows = _tick_labels(_figure(page, "timeline"), "y")
    subjects = {i.job or i.node for i in sh.INCIDENTS}
    assert {re.sub(r" \(\d+\)$", "", r) for r in rows} == subjects
    # one row per subject, plus one for each incident of it that overlaps another: the most open at once
    def most_at_once(incs):
        ends = [(i.onset, 1) for i in incs] + [(i.detection + i.resolved_after_s, -1) for i in incs
                                               if i.resolved_after_s is not None]
        level = peak = 0
        for _, d in sorted(ends, key=lambda e: (e[0], e[1])):
            level += d
            peak = max(peak, level)
        return peak
    assert len(rows) == sum(most_at_once([i for i in sh.INCIDENTS if (i.job or i.node) == s]) for s in subjects)


def test_chromium_renders_every_plot(report_run, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no headless Chromium here (`make test` installs Debian's chromium when it runs as root)")
    _, html = report_run
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    for plot in PLOTS:
        svg = _figure(dom, plot)
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
