"""Reports from results of the real pipeline (tests/conftest.py `real_results`): the
loader and its errors, schema v1 files, JUnit, Markdown, CSV, HTML, the committed JSON
Schema, and the `specprobe report` command (which must not import torch)."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import InputError
from specprobe.report.csv_out import write_csv
from specprobe.report.html import render_html
from specprobe.report.junit import render_junit
from specprobe.report.load import load_result, parse_result
from specprobe.report.markdown import render_markdown
from specprobe.result import SCHEMA_VERSION, Result, json_schema
from tests.conftest import RealResults
from tests.helpers import runs_without
from tests.helpers.noise import with_standard_errors, without_standard_errors

runner = CliRunner()
V1 = Path(__file__).parent / "data" / "results" / "v1"
SCHEMA_FILE = Path(__file__).parents[1] / "docs" / "result.schema.json"


@pytest.fixture(scope="module")
def saved(real_results: RealResults, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's results written as `--json` files."""
    folder = tmp_path_factory.mktemp("saved")
    out = {}
    for name in ("skip", "sim", "twin"):
        out[name] = folder / f"{name}.json"
        out[name].write_text(getattr(real_results, name).to_json(), encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- loading
def test_results_round_trip_through_json(real_results: RealResults, saved: dict[str, Path]) -> None:
    for name in ("skip", "sim", "twin"):
        original: Result = getattr(real_results, name)
        again = load_result(saved[name])
        assert again == original, name
        assert json.loads(saved[name].read_text())["schema_version"] == SCHEMA_VERSION == 3
    assert real_results.sim.command == "simulate" and real_results.sim.measured is not None
    assert real_results.skip.command == "diagnose" and real_results.skip.measured is None


def test_every_metric_is_in_the_catalogue(real_results: RealResults) -> None:
    from specprobe.judge.catalog import CATALOG

    for r in (real_results.twin, real_results.skip, real_results.broken, real_results.sim):
        assert r.metrics and set(r.metrics) <= set(CATALOG)
    with pytest.raises(ValueError, match="not in the catalogue: made_up_nats"):
        Result.model_validate({**real_results.skip.model_dump(), "metrics": {"made_up_nats": 1.0}})


@pytest.mark.parametrize("name", ["diagnose", "simulate", "diagnose_stopped"])
def test_schema_v1_files_still_open(name: str) -> None:
    """Files written before schema 2 (tests/data/results/v1, made by that code) load,
    keep every number, and lose only the top-level best_k (now read from the metrics).
    Their τ and speedups came from Σ min(p, q): they are labelled probabilistic drafting,
    and the procedure's mean acceptance is their accept_prob_mean."""
    raw = json.loads((V1 / f"{name}.json").read_text())
    r = load_result(V1 / f"{name}.json")
    assert r.schema_version == 3 and r.command == raw["command"] and r.verdict == raw["verdict"]
    assert {k: v for k, v in r.metrics.items() if k != "accept_prob_engine_mean"} == raw["metrics"]
    assert r.metrics.get("accept_prob_engine_mean") == raw["metrics"].get("accept_prob_mean")
    assert r.procedure is not None and r.procedure.drafting == "probabilistic" and r.procedure.acceptance == "Σ min(p, q)" and r.procedure.engine is None
    assert all(row.accept_prob_engine_mean == row.accept_prob_mean for row in r.by_domain)
    assert r.best_k == raw.get("best_k")
    assert [f.model_dump() for f in r.findings] == raw["findings"]
    if raw.get("k_table"):
        assert [row.tau_tokens for row in r.k_table] == [row["tau_tokens"] for row in raw["k_table"]]
    if name == "simulate":
        assert r.measured is not None and r.measured.depth is not None
        assert r.measured.depth.cumulative == raw["measured"]["depth"]["cumulative"]
    if name == "diagnose_stopped":
        assert not r.scored and "no forward pass" in (r.stopped or "") and r.depth is None
    # and every report renders from it
    assert "<svg" in render_html(r) or not r.scored
    assert render_markdown(r).startswith(f"## specprobe {r.command}")


def test_v1_comparison_still_opens() -> None:
    from specprobe.report.load import load_comparison

    c = load_comparison(V1 / "compare.json")
    assert c.schema_version == 3 and c.verdict == "no regression" and c.config.fail_on == "error"
    assert {e.rule_id for e in c.evaluations} == {"SP501", "SP502", "SP503", "SP504"}


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda t: t[: len(t) // 2], r"truncated \(line \d+"),
        (lambda t: "", "is empty"),
        (lambda t: "[1, 2]", "holds a JSON list"),
        (lambda t: "{not json}", "not valid JSON"),
        (lambda t: json.dumps({**json.loads(t), "schema_version": 4}), "schema_version 4; this specprobe reads versions 1 to 3"),
        (lambda t: json.dumps({"schema_version": 2, "command": "monitor"}), "is a 'monitor' result; expected 'diagnose' or 'simulate'"),
        (lambda t: json.dumps({"hello": 1}), "not a specprobe result"),
        (lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "verdict"}), "has no 'verdict' section"),
        (lambda t: json.dumps({**json.loads(t), "metrics": []}), "section 'metrics' has the wrong type"),
        (lambda t: json.dumps({**json.loads(t), "k_table": [{"k": "two"}]}), r"section 'k_table\.0\.k' has the wrong type"),
        (lambda t: json.dumps({**json.loads(t), "surprise": 1}), "unexpected field 'surprise'"),
    ],
)
def test_bad_result_files_are_one_line_input_errors(tmp_path: Path, saved: dict[str, Path], mutate, pattern: str) -> None:
    p = tmp_path / "r.json"
    p.write_text(mutate(saved["skip"].read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(InputError, match=pattern) as e:
        load_result(p)
    assert "\n" not in e.value.one_line() and e.value.hint


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_result(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a folder"):
        load_result(tmp_path)


def test_nan_and_inf_are_null_in_memory_and_on_disk(real_results: RealResults) -> None:
    import numpy as np

    r = Result.model_validate({**real_results.skip.model_dump(), "metrics": {"accept_prob_high_entropy": float("nan"), "tau_tokens": np.float32("inf"), "num_prompts": np.int64(6)}})
    assert r.metrics == {"accept_prob_high_entropy": None, "tau_tokens": None, "num_prompts": 6}
    text = r.to_json()
    assert "NaN" not in text and "Infinity" not in text
    assert parse_result(text).metrics["accept_prob_high_entropy"] is None


def test_committed_json_schema_is_current() -> None:
    """docs/result.schema.json is what the models say (regenerate: python -m specprobe.result > docs/result.schema.json)."""
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == json_schema()


# ----------------------------------------------------------------------------- JUnit
def test_junit_one_testcase_per_rule_evaluated(real_results: RealResults) -> None:
    r = real_results.skip
    root = ET.fromstring(render_junit(r, fail_on="warning"))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == len(r.evaluations) == int(suite.get("tests"))
    failures = [c for c in cases if c.find("failure") is not None]
    # with --fail-on warning every warning/error finding is a failure; info findings pass
    gating = [f for f in r.findings if f.severity in ("warning", "error")]
    assert len(failures) == len(gating) == int(suite.get("failures")) > 0
    first = gating[0]
    case = next(c for c in failures if c.get("name").startswith(first.rule_id))
    failure = case.find("failure")
    assert failure.get("type") == first.severity and failure.get("message") == first.message
    body = failure.text
    for name in first.measured:
        assert f"measured: {name} = " in body
    assert f"threshold: {first.threshold}" in body and f"remedy: {first.remedy}" in body
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == int(suite.get("skipped")) == sum(e.status == "skipped" for e in r.evaluations)
    assert case.get("classname").startswith("specprobe.")


def test_junit_follows_fail_on(real_results: RealResults) -> None:
    skip, broken = real_results.skip, real_results.broken
    assert {f.severity for f in skip.findings} <= {"warning", "info"}  # no errors: passes an error gate
    assert ET.fromstring(render_junit(skip, fail_on="error")).get("failures") == "0"
    assert ET.fromstring(render_junit(skip, fail_on="never")).get("failures") == "0"
    assert int(ET.fromstring(render_junit(broken, fail_on="error")).get("failures")) == sum(f.severity == "error" for f in broken.findings) > 0


# ----------------------------------------------------------------------------- Markdown
def test_markdown_summary(real_results: RealResults) -> None:
    sim = real_results.sim
    md = render_markdown(sim, fail_on="warning")
    assert md.startswith(f"## specprobe simulate: `{sim.describe()}`")
    assert f"{sim.verdict.capitalize()}  (gate: fail on warning)" in md
    for row in sim.by_domain:
        assert f"| {row.group} | {row.positions} | {100 * row.accept_prob_mean:.1f}% |" in md
    assert "τ measured" in md and f"**{sim.best_k}** (best" in md  # "(best)" or "(best, K = a–b equivalent)" under timed costs
    assert all(f.rule_id in md for f in sim.findings)
    # tables are well-formed: every table row has as many cells as its header
    for block in re.findall(r"((?:^\|.*\|\n)+)", md, flags=re.M):
        widths = {line.count("|") for line in block.strip().splitlines()}
        assert len(widths) == 1, block


# ----------------------------------------------------------------------------- CSV
def test_csv_tables(tmp_path: Path, real_results: RealResults) -> None:
    diag, sim = real_results.skip, real_results.sim
    paths = write_csv(diag, tmp_path / "csv")
    names = sorted(p.name for p in paths)
    assert names == sorted(["summary.csv", "findings.csv", "by_domain.csv", "by_entropy.csv", "by_position.csv", "depth.csv", "k_table.csv", "k_positions.csv", "positions.csv"])
    per_pos = pd.read_csv(tmp_path / "csv" / "k_positions.csv")  # each K's rate per draft position, as the engines count it
    assert list(per_pos.columns) == ["k", "position", "rate", "se"] and len(per_pos) == sum(r.k for r in diag.k_table)
    last = diag.k_table[-1]
    assert per_pos[per_pos.k == last.k].rate.tolist() == pytest.approx(last.per_position_renewal, rel=1e-5)
    assert "per_position_renewal" not in pd.read_csv(tmp_path / "csv" / "k_table.csv").columns  # lists stay out of the flat table
    pos = pd.read_csv(tmp_path / "csv" / "positions.csv")
    assert len(pos) == diag.metrics["num_positions"] and list(pos.columns)[:3] == ["prompt_id", "domain", "position"]
    summary = pd.read_csv(tmp_path / "csv" / "summary.csv")
    row = summary[summary.metric == "accept_prob_mean"].iloc[0]
    assert row.unit == "frac" and abs(row.value - diag.metrics["accept_prob_mean"]) < 1e-6
    by_domain = pd.read_csv(tmp_path / "csv" / "by_domain.csv")
    assert list(by_domain.columns)[:2] == ["group", "positions"] and sorted(by_domain.group) == sorted(r.group for r in diag.by_domain)
    # simulate: measured columns beside the estimates; no positions table
    paths = write_csv(sim, tmp_path / "sim")
    assert "positions.csv" not in {p.name for p in paths}
    depth = pd.read_csv(tmp_path / "sim" / "depth.csv")
    assert list(depth.columns) == ["depth", "cumulative_estimate", "conditional_estimate", "cumulative_se_estimate", "thin_estimate",
                                   "cumulative_measured", "conditional_measured", "cumulative_se_measured", "thin_measured"]
    assert depth.cumulative_se_measured.notna().sum() == len(sim.measured.depth.depth)  # each rate with its standard error
    measured_to = len(sim.measured.depth.depth)
    assert depth.depth.tolist() == list(range(1, len(sim.depth.depth) + 1)) and depth.cumulative_measured.notna().sum() == measured_to
    k = pd.read_csv(tmp_path / "sim" / "k_table.csv")
    assert {"speedup", "measured_speedup", "measured_tokens_per_s"} <= set(k.columns)
    assert k.measured_speedup.notna().sum() == len(sim.measured.k_table)


def test_csv_rewrites_an_existing_folder_and_leaves_no_temp(tmp_path: Path, real_results: RealResults) -> None:
    dest = tmp_path / "csv"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    (dest / "summary.csv").write_text("stale")
    write_csv(real_results.skip, dest)
    assert (dest / "keep.txt").read_text() == "mine"
    assert (dest / "summary.csv").read_text().startswith("target,drafter,metric,value,unit,source")
    assert [p.name for p in tmp_path.iterdir()] == ["csv"]  # temp folder gone


def test_csv_into_a_file_is_an_output_error(tmp_path: Path, real_results: RealResults) -> None:
    from specprobe.core.errors import OutputError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        write_csv(real_results.skip, f)


# ----------------------------------------------------------------------------- HTML
CHART_IDS = ("chart-depth", "chart-speedup", "chart-hist-accept", "chart-hist-kl", "chart-domain", "chart-entropy", "chart-position")


def test_html_is_self_contained_with_every_chart(real_results: RealResults) -> None:
    diag = real_results.skip
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
    assert diag.verdict in page and all(f'id="finding-{f.rule_id}"' in page for f in diag.findings)
    # each chart has its table beside it
    assert page.count('<div class="row">') == len(CHART_IDS) and page.count("<table>") >= len(CHART_IDS)
    assert f'data-mark="{diag.best_k}"' in page  # best K marked on the speedup chart
    assert f"{100 * diag.metrics['accept_prob_mean']:.1f}%" in page
    assert "@media print" in page


def test_html_shows_estimate_and_measurement_together(real_results: RealResults) -> None:
    page = render_html(real_results.sim)
    assert "cumulative r_j (estimate)" in page and "cumulative (measured)" in page
    assert "speedup (measured)" in page and "r_j meas." in page


def _svg(page: str, chart_id: str) -> str:
    return page.split(f'<svg id="{chart_id}"', 1)[1].split("</svg>", 1)[0]


def test_html_draws_standard_errors_and_greys_thin_depths(real_results: RealResults) -> None:
    """A result that kept its standard errors: ±2 SE bars on the depth and speedup charts
    (estimate and measurement), '± SE' in the tables and key metrics, thin depths faded and
    greyed with the reason said once."""
    sim = with_standard_errors(real_results.sim, depth_se=0.01, thin_from=3, tau_se=0.05, rate_se=0.02, speedup_se=0.03)
    page = render_html(sim)
    assert sim.depth is not None and sim.measured is not None and sim.measured.depth is not None
    depth = _svg(page, "chart-depth")
    drawn = [x for x in sim.depth.cumulative if x is not None] + [x for x in sim.measured.depth.cumulative if x is not None]
    per_draft = next(r for r in sim.k_table if r.k == sim.measured.depth.k).per_position_renewal  # the estimate counted as the loop counts
    assert per_draft and "per draft at K=" in depth
    drawn += [x for x in per_draft if x is not None]
    assert depth.count('<path class="errbar') == len(drawn)  # one bar per cumulative point, none on the conditional curves
    thin_points = sum(1 for d, x in zip(sim.depth.depth, sim.depth.cumulative, strict=True) if d >= 3 and x is not None)
    thin_points += sum(1 for d, x in zip(sim.measured.depth.depth, sim.measured.depth.cumulative, strict=True) if d >= 3 and x is not None)
    assert depth.count('<path class="errbar faded"') == thin_points and 'class="faded"' in depth
    # the bar at depth 1 spans ±2 SE: its tooltip says so in the chart's unit
    r1 = sim.depth.cumulative[0]
    assert f"(± 2%: {100 * max(r1 - 0.02, 0):.0f}%–{100 * (r1 + 0.02):.0f}%)" in depth
    speed = _svg(page, "chart-speedup")
    assert speed.count('<path class="errbar"') == len(sim.k_table) + len(sim.measured.k_table)
    # the tables: one standard error beside each figure
    row = next(r for r in sim.k_table if r.k == sim.best_k)
    assert f"<td>{row.tau_renewal_tokens:.2f} ± 0.05</td>" in page and f"<td>{row.speedup:.2f}× ± 0.03</td>" in page
    assert f"<td>{100 * row.accept_rate_renewal:.1f} ± 2.0%</td>" in page
    mrow = sim.measured.k_table[0]
    assert f"<td>{mrow.tau_tokens:.2f} ± 0.05</td>" in page and "Measured over 2 seeds." in page
    assert f"{100 * sim.depth.cumulative[0]:.1f} ± 1.0%" in page
    assert f"{sim.metrics['tau_tokens']:.2f} ± 0.05 tokens" in page  # the key metric τ
    # thin depths: greyed cells that say so, and the reason under the chart
    thin_cells = re.findall(r'<td class="thin">([^<]*)</td>', page)
    assert thin_cells and all(c.endswith("(thin)") or "%" in c for c in thin_cells)
    assert sum(c.endswith("(thin)") for c in thin_cells) == 2 * thin_points  # r_j and a_j of each thin depth, estimate and measured
    assert page.count("too thin to read — too few prompts or drafts reach them") == 1
    assert "bars span ± 2 standard errors" in page
    assert "<script" not in page.lower()


def test_html_of_results_without_standard_errors_has_no_bars(real_results: RealResults) -> None:
    """Results written before standard errors were kept (schema-1 files, and the fields
    emptied) render as before: no bars, nothing greyed, no ± and no note about them."""
    for r in (without_standard_errors(real_results.sim), load_result(V1 / "simulate.json")):
        page = render_html(r)
        assert 'class="errbar' not in page and 'class="faded"' not in page and 'class="thin"' not in page
        assert "(thin)" not in page and "standard error" not in page and " ± " not in page
        assert '<svg id="chart-depth"' in page and '<svg id="chart-speedup"' in page


def test_html_shows_the_live_check_per_position_with_error_bars(real_results: RealResults) -> None:
    """diagnose --against: the served and predicted per-position rates, each with its
    ±2-SE bar, and the gap in standard errors (a result without the check has no section)."""
    from specprobe.result.run import LiveCheck

    live = LiveCheck(
        url="http://127.0.0.1:8000", model="m", engine="vLLM", engine_version="0.32.0", k=3, prompts=6, requests=6, drafts=40, draft_tokens=120, accepted=54,
        accept_rate=0.45, accept_rate_se=0.03, per_position=[0.7, 0.4, 0.25], per_position_se=[0.04, 0.05, 0.06],
        predicted_accept_rate=0.5, predicted_accept_rate_se=0.02, predicted_per_position=[0.72, 0.47, 0.31], predicted_per_position_se=[0.02, 0.03, 0.03],
        gap_rel=-0.1, gap_z=-0.05 / math.hypot(0.03, 0.02),
    )
    page = render_html(real_results.skip.model_copy(update={"live": live}))
    chart = _svg(page, "chart-live")
    assert chart.count('<path class="errbar"') == 6 and "(± 8%: 62%–78%)" in chart  # served position 1: 70% ± 2·4%
    assert "<td>70.0 ± 4.0%</td><td>72.0 ± 2.0%</td>" in page
    z = 0.05 / math.hypot(0.03, 0.02)
    assert f"<td>45.0 ± 3.0%</td><td>50.0 ± 2.0%</td><td>-10.0% ± {100 * 0.1 / z:.1f}%, {z:.1f} SE — within noise</td>" in page
    assert '<svg id="chart-live"' not in render_html(real_results.skip)


def test_html_escapes_user_text(real_results: RealResults) -> None:
    r = real_results.skip
    evil = r.model_copy(update={"drafter": r.drafter.model_copy(update={"spec": "<img src=x onerror=alert(1)>"})})
    page = render_html(evil)
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_html_of_a_run_stopped_before_scoring(tmp_path: Path) -> None:
    r = load_result(V1 / "diagnose_stopped.json")
    page = render_html(r)
    assert "<svg" not in page and 'id="verdict"' in page and "catastrophic mismatch" in page


# ----------------------------------------------------------------------------- CLI
def test_report_command_writes_every_format(tmp_path: Path, saved: dict[str, Path], real_results: RealResults) -> None:
    res = runner.invoke(app, ["report", str(saved["sim"]), "--html", str(tmp_path / "r.html"), "--csv", str(tmp_path / "csv"), "--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "s.md")])
    assert res.exit_code == 0, res.output
    assert f"verdict: {real_results.sim.verdict}" in res.stdout
    assert "accept_prob_mean" in res.stdout and "measured (real draft→verify loop)" in res.stdout
    for name in ("r.html", "j.xml", "s.md", "csv/summary.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_report_fail_on_sets_the_exit_code(saved: dict[str, Path]) -> None:
    skip = str(saved["skip"])  # warnings, no errors
    assert runner.invoke(app, ["report", skip, "-q"]).exit_code == 0  # renders only
    assert runner.invoke(app, ["report", skip, "-q", "--fail-on", "warning"]).exit_code == 1
    assert runner.invoke(app, ["report", skip, "-q", "--fail-on", "error"]).exit_code == 0
    assert runner.invoke(app, ["report", skip, "-q", "--fail-on", "bogus"]).exit_code == 2


def test_report_bad_input_exit_2_one_line(tmp_path: Path, saved: dict[str, Path]) -> None:
    p = tmp_path / "cut.json"
    p.write_text(saved["skip"].read_text(encoding="utf-8")[:5000], encoding="utf-8")
    res = runner.invoke(app, ["report", str(p)])
    assert res.exit_code == 2
    assert "truncated" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_report_unwritable_output_exit_2(tmp_path: Path, saved: dict[str, Path]) -> None:
    (tmp_path / "dir.html").mkdir()
    res = runner.invoke(app, ["report", str(saved["skip"]), "-q", "--html", str(tmp_path / "dir.html")])
    assert res.exit_code == 2 and "folder" in res.stderr


def test_report_does_not_import_torch(tmp_path: Path, saved: dict[str, Path]) -> None:
    """`specprobe report` runs where there is no model: it must not pull in torch."""
    out = {k: repr(str(tmp_path / v)) for k, v in (("html", "r.html"), ("junit", "j.xml"), ("markdown", "m.md"), ("csv", "csv"))}
    runs_without([["'report'", repr(str(saved["sim"]))] + [x for k, v in out.items() for x in (repr(f"--{k}"), v)]], ("torch", "transformers", "safetensors", "accelerate"))
