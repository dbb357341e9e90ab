"""The HTML report in a real headless browser (Debian's chromium): it renders with no
console errors, every chart is in the rendered DOM, nothing is fetched from the
network, and a screenshot is saved for a human to look at.

Skipped only when chromium is not installed (.ci/run installs it)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from specprobe.judge.compare import compare_results, judge
from specprobe.judge.rules import load_table
from specprobe.report.html import render_compare_html, render_html
from tests.conftest import RealResults
from tests.helpers.noise import with_standard_errors

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); .ci/run installs it")

# Flags that keep chromium off the network and out of the user's profile.
BASE_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-default-browser-check",
    "--hide-scrollbars",
]
SHOTS = Path(os.environ.get("SPECPROBE_SCREENSHOT_DIR", "")) if os.environ.get("SPECPROBE_SCREENSHOT_DIR") else None


# A page that renders in about a second here gets two minutes before it counts as hung.
PAGE_TIMEOUT_S = 120
# Chromium's first start in a process maps a 300 MB binary. Late in a run its pages may have
# left the page cache (the vLLM servers beside it hold GBs): with them evicted, that start
# alone took 30 s here, and on CI, while the disk stalled, more than the page's two minutes
# (chromium had not printed its first log line). The start is not the page's fault, so it
# is bounded on its own, once per process, on a blank page.
START_TIMEOUT_S = 600


@functools.cache
def _start_failure() -> str | None:
    """Start chromium once on a blank page (its binary is then in memory); why it could not,
    or None. Cached, failure too: one slow machine costs one bound, not one per test."""
    try:
        with tempfile.TemporaryDirectory(prefix="specprobe-chromium-") as tmp:
            res = _launch(["--dump-dom", "about:blank"], Path(tmp), START_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return f"chromium did not start within {START_TIMEOUT_S} s on a blank page; it printed: {(exc.stderr or b'')[-1000:]!r}"
    if res.returncode != 0 or "<html>" not in res.stdout:
        return f"chromium exited {res.returncode} on a blank page: {res.stderr[-2000:]}"
    return None


def _launch(args: list[str], tmp: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp)}  # keep chromium's files in the test's temp dir
    return subprocess.run([CHROMIUM, *BASE_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args], capture_output=True, text=True, timeout=timeout, env=env)


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Chromium on one page, started once before in this process so that the page's own
    bound measures the page, not the disk."""
    assert CHROMIUM is not None
    if (why := _start_failure()) is not None:
        pytest.fail(why)
    return _launch(args, tmp, PAGE_TIMEOUT_S)


def _console_errors(stderr: str) -> list[str]:
    # With --enable-logging=stderr chromium logs page console messages as
    # 'CONSOLE(…)' / '"…", source: file://…'; uncaught exceptions say 'Uncaught'.
    lines = [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "source: file://" in ln]
    # Refused loads (a CSP violation, a blocked fetch) would mean the page wanted the network.
    lines += [ln for ln in stderr.splitlines() if "Refused to" in ln or "net::ERR_" in ln]
    return lines


def _check_page(html: str, name: str, tmp: Path, chart_ids: tuple[str, ...]) -> str:
    """The page as chromium laid it out (its DOM), after every check passed."""
    page = tmp / f"{name}.html"
    page.write_text(html, encoding="utf-8")
    url = page.resolve().as_uri()

    shot = tmp / f"{name}.png"
    # one launch lays the page out, prints its DOM and saves a screenshot of it
    dom = _chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000", "--window-size=1280,2000", f"--screenshot={shot}", "--dump-dom", url], tmp)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    svg_ids = re.findall(r'<svg id="([^"]+)"', dom.stdout)
    for cid in chart_ids:
        assert cid in svg_ids, (cid, svg_ids)
    # every chart was laid out with its marks, not just present as an empty tag
    for cid in chart_ids:
        body = dom.stdout.split(f'<svg id="{cid}"', 1)[1].split("</svg>", 1)[0]
        assert "<rect" in body or "<polyline" in body, cid
    assert dom.stdout.count("<polyline") >= 2

    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a real, non-blank render
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SHOTS / shot.name)
    return dom.stdout


def _error_bars(dom: str, chart_id: str) -> tuple[int, int]:
    """(error bars, faded ones) laid out in a chart of the rendered DOM."""
    body = dom.split(f'<svg id="{chart_id}"', 1)[1].split("</svg>", 1)[0]
    return body.count('class="errbar'), body.count('class="errbar faded"')


def test_result_report_renders_in_chromium(tmp_path: Path, real_results: RealResults) -> None:
    """With standard errors kept (the last depths thin): the bars and the faded depths are
    in the rendered page, not only in the markup."""
    sim = with_standard_errors(real_results.sim, thin_from=3)
    dom = _check_page(
        render_html(sim), "report", tmp_path,
        ("chart-depth", "chart-speedup", "chart-hist-accept", "chart-hist-kl", "chart-domain", "chart-entropy", "chart-position"),
    )
    bars, faded = _error_bars(dom, "chart-depth")
    assert bars > faded > 0
    assert _error_bars(dom, "chart-speedup")[0] == len(sim.k_table) + len(sim.measured.k_table if sim.measured else [])
    assert '<td class="thin">' in dom


def test_compare_report_renders_in_chromium(tmp_path: Path, real_results: RealResults) -> None:
    table = load_table()
    base, cand = (with_standard_errors(r, thin_from=4) for r in (real_results.twin, real_results.skip))
    comparison = judge(compare_results(base, cand, table=table, allow_procedure_change=True), table, fail_on="warning")
    dom = _check_page(render_compare_html(comparison), "compare", tmp_path, ("chart-domain", "chart-depth", "chart-speedup"))
    assert _error_bars(dom, "chart-depth")[1] > 0 and _error_bars(dom, "chart-speedup")[0] == 2 * len(comparison.k_table)
    assert 'id="compare-k"' in dom and "SE — " in dom
