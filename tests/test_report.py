"""Reports from saved results: loader errors, JUnit, Markdown, CSV, HTML, and the
`specprobe report` command (which must not import torch)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.errors import InputError
from specprobe.report.csv_out import write_csv
from specprobe.report.html import render_html
from specprobe.report.junit import render_junit
from specprobe.report.load import load_result, parse_result, to_json_text
from specprobe.report.markdown import render_markdown
from tests.test_report_factory import EXAMPLE, SIM_EXAMPLE, make_result

runner = CliRunner()


@pytest.fixture(scope="module")
def diag() -> dict:
    return load_result(EXAMPLE)


@pytest.fixture(scope="module")
def sim() -> dict:
    return load_result(SIM_EXAMPLE)


# ----------------------------------------------------------------------------- loading
def test_loads_saved_examples(diag: dict, sim: dict) -> None:
    assert diag["command"] == "diagnose" and sim["command"] == "simulate"


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda t: t[: len(t) // 2], r"truncated \(line \d+"),
        (lambda t: "", "is empty"),
        (lambda t: "[1, 2]", "holds a JSON list"),
        (lambda t: "{not json}", "not valid JSON"),
        (lambda t: json.dumps({"schema_version": 2, "command": "diagnose"}), "schema_version 2; this specprobe reads version 1"),
        (lambda t: json.dumps({"schema_version": 1, "command": "monitor"}), "is a 'monitor' result; expected 'diagnose' or 'simulate'"),
        (lambda t: json.dumps({"hello": 1}), "not a specprobe result"),
        (lambda t: json.dumps({"schema_version": 1, "command": "diagnose", "config": {}, "metrics": {}}), "no 'findings' section"),
        (lambda t: json.dumps({"schema_version": 1, "command": "diagnose", "config": {}, "metrics": [], "findings": []}), "section 'metrics' has the wrong type"),
    ],
)
def test_bad_result_files_are_one_line_input_errors(tmp_path: Path, mutate, pattern: str) -> None:
    p = tmp_path / "r.json"
    p.write_text(mutate(EXAMPLE.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(InputError, match=pattern) as e:
        load_result(p)
    assert "\n" not in e.value.one_line() and e.value.hint


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_result(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a folder"):
        load_result(tmp_path)


def test_nan_is_written_as_null_and_reads_back() -> None:
    r = make_result(with_positions=False)
    r["metrics"]["accept_prob_high_entropy"] = float("nan")
    text = to_json_text(r)
    assert "NaN" not in text
    assert parse_result(text)["metrics"]["accept_prob_high_entropy"] is None


# ----------------------------------------------------------------------------- JUnit
def test_junit_one_testcase_per_rule_evaluated(diag: dict) -> None:
    root = ET.fromstring(render_junit(diag, fail_on="warning"))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == len(diag["evaluations"]) == int(suite.get("tests"))
    failures = [c for c in cases if c.find("failure") is not None]
    # with --fail-on warning every warning/error finding is a failure; info findings pass
    gating = [f for f in diag["findings"] if f["severity"] in ("warning", "error")]
    assert len(failures) == len(gating) == int(suite.get("failures")) > 0
    f = next(c for c in failures if c.get("name").startswith("SP102"))
    failure = f.find("failure")
    assert failure.get("type") == "warning"
    assert "KL(target‖draft) is" in failure.get("message")
    body = failure.text
    assert "measured: kl_target_draft_nats = " in body and "nats" in body
    assert "threshold: 1.000 nats ≤ kl_target_draft_nats ≤ 4.000 nats" in body
    assert "remedy: Distil" in body
    info = next(c for c in cases if c.get("name").startswith("SP204"))
    assert info.find("failure") is None and "fair" in info.find("system-out").text
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == int(suite.get("skipped")) == sum(e["status"] == "skipped" for e in diag["evaluations"])
    assert f.get("classname") == "specprobe.divergence"


def test_junit_follows_fail_on(diag: dict) -> None:
    errors_only = ET.fromstring(render_junit(diag, fail_on="error"))
    assert errors_only.get("failures") == "0"  # this drafter has warnings, no errors
    never = ET.fromstring(render_junit(diag, fail_on="never"))
    assert never.get("failures") == "0"


# ----------------------------------------------------------------------------- Markdown
def test_markdown_summary(sim: dict) -> None:
    md = render_markdown(sim, fail_on="warning")
    assert md.startswith("## specprobe simulate: `self:layers=28 → smollm2`")
    assert "### ⚠️ Undertrained or domain-shifted  (gate: fail on warning)" in md
    assert "| translation |" in md and "τ measured" in md
    assert re.search(r"\*\*\d\*\* \(best\)", md)
    # tables are well-formed: every table row has as many cells as its header
    for block in re.findall(r"((?:^\|.*\|\n)+)", md, flags=re.M):
        widths = {line.count("|") for line in block.strip().splitlines()}
        assert len(widths) == 1, block


# ----------------------------------------------------------------------------- CSV
def test_csv_tables(tmp_path: Path, diag: dict, sim: dict) -> None:
    paths = write_csv(diag, tmp_path / "csv")
    names = sorted(p.name for p in paths)
    assert names == sorted(["summary.csv", "findings.csv", "by_domain.csv", "by_entropy.csv", "by_position.csv", "depth.csv", "k_table.csv", "positions.csv"])
    pos = pd.read_csv(tmp_path / "csv" / "positions.csv")
    assert len(pos) == diag["metrics"]["num_positions"]
    summary = pd.read_csv(tmp_path / "csv" / "summary.csv")
    row = summary[summary.metric == "accept_prob_mean"].iloc[0]
    assert row.unit == "frac" and abs(row.value - diag["metrics"]["accept_prob_mean"]) < 1e-6
    # simulate: measured columns beside the estimates; no positions table
    paths = write_csv(sim, tmp_path / "sim")
    assert "positions.csv" not in {p.name for p in paths}
    depth = pd.read_csv(tmp_path / "sim" / "depth.csv")
    assert list(depth.columns) == ["depth", "cumulative_estimate", "conditional_estimate", "cumulative_measured", "conditional_measured"]
    assert depth.depth.tolist() == list(range(1, 9)) and depth.cumulative_measured.isna().sum() == 4
    k = pd.read_csv(tmp_path / "sim" / "k_table.csv")
    assert {"speedup", "measured_speedup", "measured_tokens_per_s"} <= set(k.columns)


def test_csv_rewrites_an_existing_folder_and_leaves_no_temp(tmp_path: Path, diag: dict) -> None:
    dest = tmp_path / "csv"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    (dest / "summary.csv").write_text("stale")
    write_csv(diag, dest)
    assert (dest / "keep.txt").read_text() == "mine"
    assert (dest / "summary.csv").read_text().startswith("metric,value,unit,source")
    assert [p.name for p in tmp_path.iterdir()] == ["csv"]  # temp folder gone


def test_csv_into_a_file_is_an_output_error(tmp_path: Path, diag: dict) -> None:
    from specprobe.errors import OutputError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        write_csv(diag, f)


# ----------------------------------------------------------------------------- HTML
CHART_IDS = ("chart-depth", "chart-speedup", "chart-hist-accept", "chart-hist-kl", "chart-domain", "chart-entropy", "chart-position")


def test_html_is_self_contained_with_every_chart(diag: dict) -> None:
    page = render_html(diag)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    # nothing that a browser would fetch: no external src/href/url()
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#|data:)""", page, flags=re.I)
    assert "url(" not in page and "@import" not in page
    for cid in CHART_IDS:
        assert f'<svg id="{cid}"' in page, cid
    # the verdict and findings come before the charts
    assert page.index('id="verdict"') < page.index('id="findings"') < page.index("chart-depth")
    assert "undertrained or domain-shifted" in page
    # each chart has its table beside it
    assert page.count('<div class="row">') == len(CHART_IDS) and page.count("<table>") >= len(CHART_IDS)
    assert f'data-mark="{diag["best_k"]}"' in page  # best K marked on the speedup chart
    assert "@media print" in page


def test_html_shows_estimate_and_measurement_together(sim: dict) -> None:
    page = render_html(sim)
    assert "cumulative r_j (estimate)" in page and "cumulative (measured)" in page
    assert "speedup (measured)" in page and "r_j meas." in page


def test_html_escapes_user_text() -> None:
    r = make_result(with_positions=False, drafter="<img src=x onerror=alert(1)>")
    page = render_html(r)
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_html_survives_missing_sections() -> None:
    r = make_result(with_positions=False)
    for key in ("by_domain", "by_entropy", "by_position", "histograms", "depth", "k_table", "adaptive", "cost"):
        r.pop(key)
    r["metrics"]["speedup_best"] = None
    page = render_html(r)
    assert "<svg" not in page and 'id="verdict"' in page


# ----------------------------------------------------------------------------- CLI
def test_report_command_writes_every_format(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", str(SIM_EXAMPLE), "--html", str(tmp_path / "r.html"), "--csv", str(tmp_path / "csv"), "--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "s.md")])
    assert res.exit_code == 0, res.output
    assert "verdict: undertrained or domain-shifted" in res.stdout
    assert "accept_prob_mean" in res.stdout and "measured (real draft→verify loop)" in res.stdout
    for name in ("r.html", "j.xml", "s.md", "csv/summary.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_report_fail_on_sets_the_exit_code() -> None:
    assert runner.invoke(app, ["report", str(EXAMPLE), "-q"]).exit_code == 0  # renders only
    assert runner.invoke(app, ["report", str(EXAMPLE), "-q", "--fail-on", "warning"]).exit_code == 1
    assert runner.invoke(app, ["report", str(EXAMPLE), "-q", "--fail-on", "error"]).exit_code == 0
    assert runner.invoke(app, ["report", str(EXAMPLE), "-q", "--fail-on", "bogus"]).exit_code == 2


def test_report_bad_input_exit_2_one_line(tmp_path: Path) -> None:
    p = tmp_path / "cut.json"
    p.write_text(EXAMPLE.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    res = runner.invoke(app, ["report", str(p)])
    assert res.exit_code == 2
    assert "truncated" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_report_unwritable_output_exit_2(tmp_path: Path) -> None:
    (tmp_path / "dir.html").mkdir()
    res = runner.invoke(app, ["report", str(EXAMPLE), "-q", "--html", str(tmp_path / "dir.html")])
    assert res.exit_code == 2 and "is a folder" in res.stderr


def test_report_does_not_import_torch(tmp_path: Path) -> None:
    """`specprobe report` runs where there is no model: it must not pull in torch."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from specprobe.cli.main import app\n"
        f"r = CliRunner().invoke(app, ['report', {str(SIM_EXAMPLE)!r}, '--html', {str(tmp_path / 'r.html')!r}, '--junit', {str(tmp_path / 'j.xml')!r}, '--markdown', {str(tmp_path / 'm.md')!r}, '--csv', {str(tmp_path / 'csv')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors', 'accelerate') if m in sys.modules)\n"
        "print('HEAVY:' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY:\n" in proc.stdout, proc.stdout
