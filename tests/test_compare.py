"""The regression gate: compare metrics, the SP5xx rules (golden pass/fail cases), refusals
of incomparable pairs, and the `specprobe compare` command's exit codes and outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.catalog import CATALOG
from specprobe.cli.main import app
from specprobe.compare import compare_results, judge, kl_band_edges
from specprobe.errors import InputError
from specprobe.report.load import load_result, parse_result, to_json_text
from specprobe.rules import load_table
from tests.test_report_factory import make_result

runner = CliRunner()


@pytest.fixture(scope="module")
def table():
    return load_table()


@pytest.fixture(scope="module")
def baseline() -> dict:
    return make_result(alpha=0.78, cost_ratio=0.08, with_positions=False)


def _fired(comparison: dict) -> set[str]:
    return {f["rule_id"] for f in comparison["findings"]}


def _judge(base: dict, cand: dict, table, **kw) -> dict:
    return judge(compare_results(base, cand, table=table, **kw), table)


# ----------------------------------------------------------------------------- metrics
def test_compare_metrics_are_in_the_catalogue(baseline: dict, table) -> None:
    comp = compare_results(baseline, baseline, table=table)
    for name in comp["metrics"]:
        assert name in CATALOG and CATALOG[name].source == "compare", name
    for rule in table.family("5"):
        assert all(CATALOG[m].source == "compare" for m in rule.metrics)


def test_identical_results_have_zero_deltas_and_no_regression(baseline: dict, table) -> None:
    comp = _judge(baseline, baseline, table)
    m = comp["metrics"]
    assert m["overall_accept_prob_rel_change"] == 0 and m["accept_prob_rel_drop_frac"] == 0
    assert m["depth_decay_excess"] == 0 and m["kl_band_worsened"] == 0
    assert comp["findings"] == [] and comp["verdict"] == "no regression"
    assert {e["rule_id"] for e in comp["evaluations"]} == {"SP501", "SP502", "SP503", "SP504"}
    assert "baseline and candidate name the same drafter spec" in comp["notes"]


def test_deltas_per_domain_and_depth(baseline: dict, table) -> None:
    cand = make_result(alpha=0.70, cost_ratio=0.08, seed=1, with_positions=False, drafter="self:layers=27")
    comp = compare_results(baseline, cand, table=table)
    dom = {d["group"]: d for d in comp["by_domain"]}
    b_code = next(r for r in baseline["by_domain"] if r["group"] == "code")["accept_prob_mean"]
    c_code = next(r for r in cand["by_domain"] if r["group"] == "code")["accept_prob_mean"]
    assert dom["code"]["delta"] == pytest.approx(c_code - b_code)
    assert [d["depth"] for d in comp["by_depth"]] == list(range(1, 9))
    d1 = comp["by_depth"][0]
    assert d1["conditional_baseline"] == baseline["depth"]["conditional"][0]
    overall = {r["metric"]: r for r in comp["overall"]}
    assert overall["accept_prob_mean"]["worse"] is True
    assert overall["kl_target_draft_nats"]["higher_is_better"] is False


def test_measured_depth_used_only_when_both_sides_have_it(table) -> None:
    a = make_result(command="simulate", alpha=0.7, with_positions=False)
    b = make_result(command="simulate", alpha=0.7, seed=2, with_positions=False, drafter="x")
    comp = compare_results(a, b, table=table)
    assert comp["depth_source"] == "measured" and len(comp["by_depth"]) == 4
    c = make_result(alpha=0.7, seed=2, with_positions=False, drafter="x")
    assert compare_results(a, c, table=table)["depth_source"] == "estimate"


def test_kl_band_edges_come_from_the_rules(table, tmp_path: Path) -> None:
    assert kl_band_edges(table) == [0.5, 1.0, 4.0]
    extra = tmp_path / "bands.yaml"
    extra.write_text("rules:\n  - {id: SP103, name: kl-marginal, severity: info, when: '0.3 <= kl_target_draft_nats < 1.0', diagnosis: d, remedy: r}\n")
    assert kl_band_edges(load_table([extra])) == [0.3, 0.5, 1.0, 4.0]


# ----------------------------------------------------------------------------- SP5xx golden cases
# Each rule: metrics that must fire it, and near-misses that must not.
GOLDEN = {
    "SP501": (
        {"accept_prob_rel_drop_frac": 0.25, "accept_prob_mean_baseline": 0.6, "accept_prob_mean_candidate": 0.45},
        [{"accept_prob_rel_drop_frac": 0.20}, {"accept_prob_rel_drop_frac": 0.0}],
    ),
    "SP502": (
        {"domain_worst_accept_prob_baseline": 0.76, "domain_worst_accept_prob_candidate": 0.55, "accept_prob_rel_drop_frac": 0.04, "domain_worst_rel_drop_frac": 0.28},
        [
            {"domain_worst_accept_prob_baseline": 0.66, "domain_worst_accept_prob_candidate": 0.55, "accept_prob_rel_drop_frac": 0.04},  # was already under 70%
            {"domain_worst_accept_prob_baseline": 0.80, "domain_worst_accept_prob_candidate": 0.71, "accept_prob_rel_drop_frac": 0.04},  # still above
            {"domain_worst_accept_prob_baseline": 0.80, "domain_worst_accept_prob_candidate": 0.50, "accept_prob_rel_drop_frac": 0.30},  # overall fell too: SP501's case
        ],
    ),
    "SP503": (
        {"depth_decay_excess": 0.3, "cond_accept_decay_baseline": 0.8, "cond_accept_decay_candidate": 0.5, "depth_compared": 8},
        [{"depth_decay_excess": 0.1}, {"depth_decay_excess": -0.2}],
    ),
    "SP504": (
        {"kl_band_worsened": 1, "kl_target_draft_nats_baseline": 0.45, "kl_target_draft_nats_candidate": 0.7, "kl_band_boundary_crossed_nats": 0.5},
        [{"kl_band_worsened": 0}],
    ),
}


@pytest.mark.parametrize("rule_id", sorted(GOLDEN))
def test_regression_rule_golden_cases(rule_id: str, table) -> None:
    fire, misses = GOLDEN[rule_id]
    rule = table.get(rule_id)
    found = table.findings(fire, families=["5"])
    f = next(x for x in found if x.rule_id == rule_id)
    assert "{" not in f.message, f.message  # every placeholder filled in
    assert f.remedy and f.threshold
    for miss in misses:
        assert rule_id not in {x.rule_id for x in table.findings(miss, families=["5"])}, miss
    assert rule.family == "regression"


def test_acceptance_drop_fires_sp501(baseline: dict, table) -> None:
    cand = make_result(alpha=0.55, cost_ratio=0.08, seed=5, with_positions=False, drafter="self:layers=24")
    comp = _judge(baseline, cand, table)
    assert "SP501" in _fired(comp) and comp["worst_severity"] == "error" and comp["verdict"] == "regression"
    f = next(x for x in comp["findings"] if x["rule_id"] == "SP501")
    assert "Acceptance dropped from 72.4% to" in f["message"]


def test_one_domain_falling_fires_sp502_not_sp501(baseline: dict, table) -> None:
    cand = make_result(alpha=0.78, cost_ratio=0.08, seed=0, domain_offset={"code": -0.25}, with_positions=False, drafter="self:layers=26")
    comp = _judge(baseline, cand, table)
    assert "SP502" in _fired(comp) and "SP501" not in _fired(comp)
    f = next(x for x in comp["findings"] if x["rule_id"] == "SP502")
    assert f["evidence"][0].startswith("code: ")  # the worst domain is named first


def test_faster_depth_decay_fires_sp503(baseline: dict, table) -> None:
    cand = make_result(alpha=0.78, cost_ratio=0.08, seed=0, depth_decay=0.85, with_positions=False, drafter="eagle3-v2")
    comp = _judge(baseline, cand, table)
    assert "SP503" in _fired(comp)
    assert comp["metrics"]["depth_decay_excess"] > 0.1
    # the first-token acceptance is the same: only the shape changed
    assert comp["by_depth"][0]["cumulative_candidate"] == pytest.approx(comp["by_depth"][0]["cumulative_baseline"])


def test_kl_crossing_a_band_fires_sp504(table) -> None:
    base = make_result(alpha=0.78, kl_scale=1.3, with_positions=False)
    cand = make_result(alpha=0.78, kl_scale=2.2, with_positions=False, drafter="v2")
    assert base["metrics"]["kl_target_draft_nats"] < 0.5 <= cand["metrics"]["kl_target_draft_nats"]
    comp = _judge(base, cand, table)
    assert "SP504" in _fired(comp)
    assert comp["metrics"]["kl_band_boundary_crossed_nats"] == 0.5


# ----------------------------------------------------------------------------- refusals
def test_another_target_is_refused_unless_allowed(baseline: dict, table) -> None:
    other = make_result(alpha=0.78, with_positions=False, target="qwen2.5-0.5b")
    other["target"]["name"] = "Qwen2.5-0.5B-Instruct"
    with pytest.raises(InputError, match="another|target 'SmolLM2-135M-Instruct'.*'Qwen2.5-0.5B-Instruct'") as e:
        compare_results(baseline, other, table=table)
    assert "--allow-target-change" in e.value.hint
    comp = compare_results(baseline, other, table=table, allow_target_change=True)
    assert any("target changed" in n for n in comp["notes"])


def test_another_prompt_set_is_refused_unless_allowed(baseline: dict, table) -> None:
    other = make_result(alpha=0.78, with_positions=False, prompt_sha256="0" * 64)
    with pytest.raises(InputError, match="prompt set") as e:
        compare_results(baseline, other, table=table)
    assert "--allow-prompt-change" in e.value.hint
    assert compare_results(baseline, other, table=table, allow_prompt_change=True)["notes"]


# ----------------------------------------------------------------------------- CLI
def _save(tmp_path: Path, name: str, result: dict) -> Path:
    p = tmp_path / name
    p.write_text(to_json_text(result), encoding="utf-8")
    return p


def test_compare_cli_exit_codes(tmp_path: Path, baseline: dict) -> None:
    b = _save(tmp_path, "base.json", baseline)
    same = runner.invoke(app, ["compare", str(b), str(b)])
    assert same.exit_code == 0, same.output
    assert "verdict: no regression" in same.stdout
    worse = _save(tmp_path, "worse.json", make_result(alpha=0.55, cost_ratio=0.08, seed=5, with_positions=False, drafter="self:layers=24"))
    res = runner.invoke(app, ["compare", str(b), str(worse)])
    assert res.exit_code == 1 and "SP501" in res.stdout
    assert runner.invoke(app, ["compare", str(b), str(worse), "--fail-on", "never"]).exit_code == 0
    dom = _save(tmp_path, "dom.json", make_result(alpha=0.78, cost_ratio=0.08, domain_offset={"code": -0.25}, with_positions=False, drafter="d"))
    assert runner.invoke(app, ["compare", str(b), str(dom)]).exit_code == 0  # warning < error
    assert runner.invoke(app, ["compare", str(b), str(dom), "--fail-on", "warning"]).exit_code == 1


def test_compare_cli_bad_input_is_exit_2(tmp_path: Path, baseline: dict) -> None:
    b = _save(tmp_path, "base.json", baseline)
    other = make_result(alpha=0.78, with_positions=False)
    other["target"]["name"] = "Llama-3.2-1B"
    o = _save(tmp_path, "other.json", other)
    res = runner.invoke(app, ["compare", str(b), str(o)])
    assert res.exit_code == 2 and "--allow-target-change" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert runner.invoke(app, ["compare", str(b), str(o), "--allow-target-change"]).exit_code == 0
    v2 = dict(baseline, schema_version=2)
    res = runner.invoke(app, ["compare", str(b), str(_save(tmp_path, "v2.json", v2))])
    assert res.exit_code == 2 and "schema_version 2" in res.stderr
    cut = tmp_path / "cut.json"
    cut.write_text(b.read_text()[:300])
    res = runner.invoke(app, ["compare", str(cut), str(b)])
    assert res.exit_code == 2 and "truncated" in res.stderr


def test_compare_cli_writes_reports(tmp_path: Path, baseline: dict) -> None:
    b = _save(tmp_path, "base.json", baseline)
    c = _save(tmp_path, "cand.json", make_result(alpha=0.74, cost_ratio=0.08, seed=3, domain_offset={"code": -0.25}, depth_decay=0.85, drafter="self:layers=26", with_positions=False))
    out = tmp_path / "out"
    res = runner.invoke(app, [
        "compare", str(b), str(c), "--fail-on", "warning",
        "--html", str(out / "c.html"), "--markdown", str(out / "c.md"), "--junit", str(out / "c.xml"), "--json", str(out / "c.json"), "--csv", str(out / "csv"),
    ])
    assert res.exit_code == 1, res.output
    comp = parse_result((out / "c.json").read_text(), "c.json", commands=("compare",))
    assert _fired(comp) >= {"SP502", "SP503"}
    assert comp["config"]["fail_on"] == "warning"
    junit = ET.fromstring((out / "c.xml").read_text())
    assert junit.get("tests") == "4" and int(junit.get("failures")) == len(comp["findings"])
    md = (out / "c.md").read_text()
    assert "## specprobe compare: `self:layers=26` against baseline `self:layers=28`" in md and "| code |" in md
    page = (out / "c.html").read_text()
    assert '<svg id="chart-domain"' in page and '<svg id="chart-depth"' in page and "<script" not in page
    assert (out / "csv" / "by_depth.csv").exists()
    # a compare JSON is not a diagnose result: `report` refuses it by name
    with pytest.raises(InputError, match="is a 'compare' result"):
        load_result(out / "c.json")
    json.loads((out / "c.json").read_text())  # plain JSON, no NaN
