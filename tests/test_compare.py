"""The regression gate on results of the real pipeline (tests/conftest.py
`real_results`): compare metrics, the SP5xx rules (golden pass/fail cases), refusals of
incomparable pairs, and the `specprobe compare` command's exit codes and outputs.

Baseline: the identical twin (α = 1). Candidates: real drafters (the one-layer
self-draft, the random drafter) and, where a real tiny model cannot show one regression
alone, the twin's result with one section edited (`_edited`)."""

from __future__ import annotations

import itertools
import json
import math
import operator
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import InputError
from specprobe.judge.catalog import CATALOG
from specprobe.judge.compare import compare_results, judge, kl_band_edges
from specprobe.judge.rules import load_table
from specprobe.report.load import gate_exit_code, load_comparison, load_result
from specprobe.result import Comparison, Result
from tests.conftest import RealResults
from tests.helpers.noise import with_standard_errors, without_standard_errors

runner = CliRunner()


@pytest.fixture(scope="module")
def table():
    return load_table()


@pytest.fixture(scope="module")
def baseline(real_results: RealResults) -> Result:
    return real_results.twin


def _edited(r: Result, drafter: str, **sections: Any) -> Result:
    """The result with its drafter renamed and some sections replaced: one regression at a time."""
    return r.model_copy(update={"drafter": r.drafter.model_copy(update={"spec": drafter}), **sections})


def _domain_fell(r: Result, group: str, alpha: float) -> Result:
    rows = [row.model_copy(update={"accept_prob_mean": alpha}) if row.group == group else row for row in r.by_domain]
    return _edited(r, "one-domain-worse", by_domain=rows)


def _faster_decay(r: Result) -> Result:
    assert r.depth is not None
    cond = [0.9**j for j in range(len(r.depth.depth))]  # a_j falls with depth
    cum = list(itertools.accumulate(cond, operator.mul))
    return _edited(r, "decays-faster", depth=r.depth.model_copy(update={"conditional": cond, "cumulative": cum}))


def _fired(comparison: Comparison) -> set[str]:
    return {f.rule_id for f in comparison.findings}


def _judge(base: Result, cand: Result, table, **kw) -> Comparison:
    return judge(compare_results(base, cand, table=table, **kw), table)


# ----------------------------------------------------------------------------- metrics
def test_compare_metrics_are_in_the_catalogue(baseline: Result, table) -> None:
    comp = compare_results(baseline, baseline, table=table)
    for name in comp.metrics:
        assert name in CATALOG and CATALOG[name].source == "compare", name
    for rule in table.family("regression"):
        assert all(CATALOG[m].source == "compare" for m in rule.metrics)


def test_identical_results_have_zero_deltas_and_no_regression(baseline: Result, table) -> None:
    comp = _judge(baseline, baseline, table)
    m = comp.metrics
    assert m["overall_accept_prob_rel_change"] == 0 and m["accept_prob_rel_drop_frac"] == 0
    assert m["depth_decay_excess"] == 0 and m["kl_band_worsened"] == 0
    assert comp.findings == [] and comp.verdict == "no regression"
    assert {e.rule_id for e in comp.evaluations} == {"SP501", "SP502", "SP503", "SP504", "SP505", "SP506"}
    assert "baseline and candidate name the same drafter spec" in comp.notes


def test_deltas_per_domain_and_depth(baseline: Result, real_results: RealResults, table) -> None:
    cand = real_results.skip
    comp = compare_results(baseline, cand, table=table, allow_procedure_change=True)  # the twin's drafts are sampled
    dom = {d.group: d for d in comp.by_domain}
    assert set(dom) == {r.group for r in baseline.by_domain}
    for row in cand.by_domain:
        b = next(r for r in baseline.by_domain if r.group == row.group)
        assert dom[row.group].delta == pytest.approx(row.accept_prob_mean - b.accept_prob_mean)
        assert dom[row.group].positions_candidate == row.positions
    assert [d.depth for d in comp.by_depth] == baseline.depth.depth == [1, 2, 3, 4]
    assert comp.by_depth[0].conditional_baseline == baseline.depth.conditional[0]
    assert comp.by_depth[0].conditional_candidate == cand.depth.conditional[0]
    overall = {r.metric: r for r in comp.overall}
    assert overall["accept_prob_mean"].worse is True and overall["accept_prob_mean"].candidate == cand.metrics["accept_prob_mean"]
    assert overall["kl_target_draft_nats"].higher_is_better is False
    assert [k.k for k in comp.k_table] == [1, 2, 3, 4] and comp.k_table[3].tau_baseline == pytest.approx(5.0, abs=1e-3)


def test_measured_depth_used_only_when_both_sides_have_it(real_results: RealResults, table) -> None:
    sim = real_results.sim
    comp = compare_results(sim, sim, table=table)
    assert comp.depth_source == "measured" and len(comp.by_depth) == len(sim.measured.depth.depth)
    assert [d.cumulative_baseline for d in comp.by_depth] == sim.measured.depth.cumulative
    assert compare_results(sim, real_results.skip, table=table).depth_source == "estimate"


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
    found = table.findings(fire, families=["regression"])
    f = next(x for x in found if x.rule_id == rule_id)
    assert "{" not in f.message, f.message  # every placeholder filled in
    assert f.remedy and f.threshold
    for miss in misses:
        assert rule_id not in {x.rule_id for x in table.findings(miss, families=["regression"])}, miss
    assert rule.family == "regression"


def test_a_worse_real_drafter_fires_sp501_and_sp504(baseline: Result, real_results: RealResults, table) -> None:
    cand = real_results.skip  # the one-layer self-draft against the identical twin
    comp = _judge(baseline, cand, table, allow_procedure_change=True)
    assert {"SP501", "SP504"} <= _fired(comp) and comp.worst_severity == "error" and comp.verdict == "regression"
    f = next(x for x in comp.findings if x.rule_id == "SP501")
    assert f"Acceptance dropped from {100 * baseline.metrics['accept_prob_mean']:.1f}% to {100 * cand.metrics['accept_prob_mean']:.1f}%" in f.message
    # KL went from 0 to tens of nats: every band boundary crossed, the highest reported
    assert comp.metrics["kl_band_boundary_crossed_nats"] == 4.0
    assert _judge(baseline, real_results.broken, table, allow_procedure_change=True).verdict == "regression"


def test_one_domain_falling_fires_sp502_not_sp501(baseline: Result, table) -> None:
    cand = _domain_fell(baseline, "code", 0.55)
    comp = _judge(baseline, cand, table)
    assert "SP502" in _fired(comp) and "SP501" not in _fired(comp)
    f = next(x for x in comp.findings if x.rule_id == "SP502")
    assert f.evidence[0].startswith("code: 100.0% → 55.0%")  # the worst domain is named first


def test_faster_depth_decay_fires_sp503(baseline: Result, table) -> None:
    comp = _judge(baseline, _faster_decay(baseline), table)
    assert _fired(comp) == {"SP503"}
    assert comp.metrics["depth_decay_excess"] == pytest.approx(1 - 0.9**3)
    # the first-token acceptance is the same: only the shape changed
    assert comp.by_depth[0].cumulative_candidate == pytest.approx(comp.by_depth[0].cumulative_baseline)


# ----------------------------------------------------------------------------- standard errors
def _tau_pair(r: Result, *, base_se: float | None, cand_se: float | None, scale: float = 0.8) -> tuple[Result, Result]:
    """The real result twice, each with standard errors kept, the candidate's renewal τ
    scaled at every K (its acceptance and speedup rows left as they were)."""
    base = with_standard_errors(r, depth_se=0.01, thin_from=4, tau_se=base_se, rate_se=0.02, speedup_se=0.04)
    cand = with_standard_errors(r, depth_se=0.02, thin_from=3, tau_se=cand_se, rate_se=0.03, speedup_se=0.05, tau_scale=scale)
    return base, _edited(cand, f"tau-x{scale}")


def test_changes_carry_the_standard_error_of_the_difference(real_results: RealResults, table) -> None:
    """τ fell 20% with small standard errors: the change, its standard error
    sqrt(se_b² + se_c²) and its z are saved, SP505 fires and its evidence says beyond noise."""
    skip = real_results.skip
    k = skip.best_k
    base, cand = _tau_pair(skip, base_se=0.03, cand_se=0.04)
    comp = _judge(base, cand, table, ks=[k])
    row = next(r for r in comp.k_table if r.k == k)
    tb = next(r.tau_renewal_tokens for r in skip.k_table if r.k == k)
    assert (row.tau_baseline, row.tau_candidate) == (pytest.approx(tb), pytest.approx(0.8 * tb))
    assert (row.tau_baseline_se, row.tau_candidate_se, row.accept_rate_baseline_se, row.accept_rate_candidate_se, row.speedup_baseline_se, row.speedup_candidate_se) == (0.03, 0.04, 0.02, 0.03, 0.04, 0.05)
    m = comp.metrics
    assert m["tau_tokens_rel_change"] == pytest.approx(-0.2)
    assert m["tau_tokens_rel_change_se"] == pytest.approx(0.05 / tb)  # sqrt(0.03² + 0.04²) over the baseline τ
    assert m["tau_tokens_change_z"] == pytest.approx(-0.2 * tb / 0.05) and m["tau_change_within_noise"] == 0
    assert m["accept_rate_rel_change"] == 0 and m["accept_rate_change_z"] == 0 and m["accept_rate_rel_change_se"] == pytest.approx(math.hypot(0.02, 0.03) / row.accept_rate_baseline)
    assert m["speedup_change_z"] == 0 and m["speedup_rel_change_se"] == pytest.approx(math.hypot(0.04, 0.05) / row.speedup_baseline)
    assert "SP505" in _fired(comp) and "SP506" not in _fired(comp)
    f = next(x for x in comp.findings if x.rule_id == "SP505")
    assert f.evidence == [f"τ at K={k}: {tb:.2f} ± 0.03 → {0.8 * tb:.2f} ± 0.04 (-20.0% ± {100 * 0.05 / tb:.1f}%, {0.2 * tb / 0.05:.1f} SE — beyond noise)"]
    overall = {r.metric: r for r in comp.overall}["tau_tokens"]  # the headline τ: at the best K, compared here
    assert overall.delta_se == pytest.approx(0.05) and overall.delta_z == pytest.approx(m["tau_tokens_change_z"])
    # the depth curve keeps each side's standard errors and thin depths
    assert [d.cumulative_baseline_se for d in comp.by_depth][:2] == [0.01, 0.02] and comp.by_depth[0].cumulative_candidate_se == 0.02
    assert [d.thin_baseline for d in comp.by_depth] == [False, False, False, True] and [d.thin_candidate for d in comp.by_depth] == [False, False, True, True]


def test_a_drop_within_noise_is_reported_not_gated(real_results: RealResults, table) -> None:
    """The same 20% drop with standard errors as large as a fifth of τ: within two standard
    errors of the difference, so SP505 holds back and SP506 (info) says why."""
    skip = real_results.skip
    tb = next(r.tau_renewal_tokens for r in skip.k_table if r.k == skip.best_k)
    base, cand = _tau_pair(skip, base_se=0.2 * tb, cand_se=0.2 * tb)
    comp = _judge(base, cand, table, ks=[skip.best_k])
    m = comp.metrics
    assert m["tau_rel_drop_frac"] == pytest.approx(0.2) and m["tau_change_within_noise"] == 1
    assert m["tau_tokens_change_z"] == pytest.approx(-0.2 / math.hypot(0.2, 0.2))
    assert "SP505" not in _fired(comp) and "SP506" in _fired(comp)
    f = next(x for x in comp.findings if x.rule_id == "SP506")
    assert f.severity == "info" and f.message.startswith(f"τ at K={skip.best_k} dropped by 20.0% ± 28.3% of the baseline's (-0.7 SE): within noise, so not judged a regression")
    assert comp.verdict == "inconclusive (within noise)"
    assert gate_exit_code(comp, "warning") == 0 and gate_exit_code(comp, "info") == 1


def test_results_without_standard_errors_gate_on_the_threshold_alone(real_results: RealResults, table) -> None:
    """Results written before standard errors were kept: nothing to call noise, so SP505
    fires on the threshold as it always did, and no standard error is made up."""
    skip = without_standard_errors(real_results.skip)
    base, cand = skip, _edited(with_standard_errors(skip, tau_se=None, rate_se=None, speedup_se=None, tau_scale=0.8), "tau-fell")
    cand = cand.model_copy(update={"depth": skip.depth})
    comp = _judge(base, cand, table, ks=[skip.best_k])
    m = comp.metrics
    assert m["tau_rel_drop_frac"] == pytest.approx(0.2) and m["tau_change_within_noise"] == 0
    assert m["tau_tokens_rel_change_se"] is None and m["tau_tokens_change_z"] is None and m["speedup_change_z"] is None
    assert all(r.tau_baseline_se is None and r.speedup_candidate_se is None for r in comp.k_table)
    assert all(d.cumulative_baseline_se is None and d.thin_baseline is None for d in comp.by_depth)
    assert all(r.delta_se is None and r.delta_z is None for r in comp.overall)
    assert "SP505" in _fired(comp) and "SP506" not in _fired(comp)
    f = next(x for x in comp.findings if x.rule_id == "SP505")
    tb = next(r.tau_renewal_tokens for r in skip.k_table if r.k == skip.best_k)
    assert f.evidence == [f"τ at K={skip.best_k}: {tb:.2f} → {0.8 * tb:.2f} (-20.0%)"]


def test_the_threshold_only_gate_of_the_docs_restores_the_old_behaviour(real_results: RealResults, tmp_path: Path) -> None:
    """docs/reports.md's rules file (SP505 on the threshold alone, SP506 off) gates a drop
    within noise as before."""
    doc = (Path(__file__).parents[1] / "docs" / "reports.md").read_text(encoding="utf-8")
    block = doc.split("<!-- threshold-only gate -->", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    rules = tmp_path / "tau-threshold-only.yaml"
    rules.write_text(block, encoding="utf-8")
    table = load_table([rules])
    skip = real_results.skip
    tb = next(r.tau_renewal_tokens for r in skip.k_table if r.k == skip.best_k)
    comp = _judge(*_tau_pair(skip, base_se=0.2 * tb, cand_se=0.2 * tb), table, ks=[skip.best_k])
    assert comp.metrics["tau_change_within_noise"] == 1 and _fired(comp) >= {"SP505"} and "SP506" not in _fired(comp)


def test_compare_cli_prints_and_saves_the_noise(tmp_path: Path, real_results: RealResults) -> None:
    skip = real_results.skip
    tb = next(r.tau_renewal_tokens for r in skip.k_table if r.k == skip.best_k)
    out = tmp_path / "out"
    for name, se, code, words in (("noise", 0.2 * tb, 0, "within noise"), ("real", 0.02, 1, "beyond noise")):
        base, cand = _tau_pair(skip, base_se=se, cand_se=se)
        b, c = _save(tmp_path, f"b-{name}.json", base), _save(tmp_path, f"c-{name}.json", cand)
        res = runner.invoke(app, [
            "compare", str(b), str(c), "--fail-on", "warning", "--k", str(skip.best_k),
            "--json", str(out / f"{name}.json"), "--markdown", str(out / f"{name}.md"), "--html", str(out / f"{name}.html"),
        ], terminal_width=200)
        assert res.exit_code == code, res.output
        line = f"τ at K={skip.best_k}: {tb:.2f} ± {se:.2f} → {0.8 * tb:.2f} ± {se:.2f} (-20.0% ± {100 * math.hypot(se, se) / tb:.1f}%, {0.2 * tb / math.hypot(se, se):.1f} SE — {words})"
        assert line in res.stdout, res.stdout
        assert f"{tb:.2f} ± {se:.2f} tokens" in res.stdout  # the overall table's τ
        saved = json.loads((out / f"{name}.json").read_text())
        row = next(r for r in saved["k_table"] if r["k"] == skip.best_k)
        assert row["tau_baseline_se"] == pytest.approx(se) and saved["metrics"]["tau_change_within_noise"] == (1 if name == "noise" else 0)
        assert saved["metrics"]["tau_tokens_change_z"] == pytest.approx(-0.2 * tb / math.hypot(se, se))
        md = (out / f"{name}.md").read_text()
        assert f"- {line}" in md and f"#### At K = {skip.best_k}, the draft length the gate compares" in md
        page = (out / f"{name}.html").read_text()
        assert 'id="compare-k"' in page and words in page and '<path class="errbar' in page and '<td class="thin">' in page
    assert "SP506" in (out / "noise.md").read_text() and "SP505" in (out / "real.md").read_text()


# ----------------------------------------------------------------------------- refusals
def test_another_target_is_refused_unless_allowed(baseline: Result, table) -> None:
    other = baseline.model_copy(update={"target": baseline.target.model_copy(update={"name": "Qwen2.5-0.5B-Instruct"})})
    with pytest.raises(InputError, match="target 'target'.*'Qwen2.5-0.5B-Instruct'") as e:
        compare_results(baseline, other, table=table)
    assert "--allow-target-change" in e.value.hint
    comp = compare_results(baseline, other, table=table, allow_target_change=True)
    assert any("target changed" in n for n in comp.notes) and comp.config.allow_target_change


def test_another_prompt_set_is_refused_unless_allowed(baseline: Result, table) -> None:
    assert baseline.prompt_set is not None
    other = baseline.model_copy(update={"prompt_set": baseline.prompt_set.model_copy(update={"sha256": "0" * 64})})
    with pytest.raises(InputError, match="prompt set") as e:
        compare_results(baseline, other, table=table)
    assert "--allow-prompt-change" in e.value.hint
    assert compare_results(baseline, other, table=table, allow_prompt_change=True).notes


# ----------------------------------------------------------------------------- CLI
def _save(tmp_path: Path, name: str, result: Result | Comparison) -> Path:
    p = tmp_path / name
    p.write_text(result.to_json(), encoding="utf-8")
    return p


def test_compare_cli_exit_codes(tmp_path: Path, baseline: Result, real_results: RealResults) -> None:
    b = _save(tmp_path, "base.json", baseline)
    same = runner.invoke(app, ["compare", str(b), str(b)])
    assert same.exit_code == 0, same.output
    assert "verdict: no regression" in same.stdout
    worse = _save(tmp_path, "worse.json", real_results.skip)
    refused = runner.invoke(app, ["compare", str(b), str(worse)])  # sampled drafts against greedy ones
    assert refused.exit_code == 2 and "follows probabilistic drafting" in refused.output and "--allow-procedure-change" in refused.output
    res = runner.invoke(app, ["compare", str(b), str(worse), "--allow-procedure-change"])
    assert res.exit_code == 1 and "SP501" in res.stdout and "drafting changed: probabilistic → greedy" in res.stdout
    assert runner.invoke(app, ["compare", str(b), str(worse), "--fail-on", "never", "--allow-procedure-change"]).exit_code == 0
    dom = _save(tmp_path, "dom.json", _domain_fell(baseline, "code", 0.55))
    assert runner.invoke(app, ["compare", str(b), str(dom)]).exit_code == 0  # warning < error
    assert runner.invoke(app, ["compare", str(b), str(dom), "--fail-on", "warning"]).exit_code == 1


def test_compare_cli_bad_input_is_exit_2(tmp_path: Path, baseline: Result) -> None:
    b = _save(tmp_path, "base.json", baseline)
    other = baseline.model_copy(update={"target": baseline.target.model_copy(update={"name": "Llama-3.2-1B"})})
    o = _save(tmp_path, "other.json", other)
    res = runner.invoke(app, ["compare", str(b), str(o)])
    assert res.exit_code == 2 and "--allow-target-change" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert runner.invoke(app, ["compare", str(b), str(o), "--allow-target-change"]).exit_code == 0
    v3 = tmp_path / "v3.json"
    v3.write_text(json.dumps({**json.loads(b.read_text()), "schema_version": 4}))
    res = runner.invoke(app, ["compare", str(b), str(v3)])
    assert res.exit_code == 2 and "schema_version 4" in res.stderr
    cut = tmp_path / "cut.json"
    cut.write_text(b.read_text()[:300])
    res = runner.invoke(app, ["compare", str(cut), str(b)])
    assert res.exit_code == 2 and "truncated" in res.stderr


def test_compare_cli_writes_reports(tmp_path: Path, baseline: Result) -> None:
    b = _save(tmp_path, "base.json", baseline)
    cand = _faster_decay(_domain_fell(baseline, "code", 0.55))
    c = _save(tmp_path, "cand.json", cand)
    out = tmp_path / "out"
    res = runner.invoke(app, [
        "compare", str(b), str(c), "--fail-on", "warning",
        "--html", str(out / "c.html"), "--markdown", str(out / "c.md"), "--junit", str(out / "c.xml"), "--json", str(out / "c.json"), "--csv", str(out / "csv"),
    ])
    assert res.exit_code == 1, res.output
    comp = load_comparison(out / "c.json")
    assert _fired(comp) >= {"SP502", "SP503"}
    assert comp.config.fail_on == "warning" and comp.config.baseline == str(b) and comp.config.candidate == str(c)
    junit = ET.fromstring((out / "c.xml").read_text())
    sp5 = [r for r in load_table().rules if r.id.startswith("SP5")]
    assert junit.get("tests") == str(len(sp5)) and int(junit.get("failures")) == len(comp.findings)
    md = (out / "c.md").read_text()
    assert f"## specprobe compare: `decays-faster` against baseline `{baseline.drafter.spec}`" in md and "| code | 100.0% | 55.0% | -45.0% |" in md
    page = (out / "c.html").read_text()
    assert '<svg id="chart-domain"' in page and '<svg id="chart-depth"' in page and "<script" not in page
    assert (out / "csv" / "by_depth.csv").exists()
    # a compare JSON is not a diagnose result: `report` refuses it by name
    with pytest.raises(InputError, match="is a 'compare' result"):
        load_result(out / "c.json")
    json.loads((out / "c.json").read_text())  # plain JSON, no NaN


def test_results_of_two_acceptance_laws_are_refused_and_another_engine_is_noted(real_results: RealResults, table) -> None:
    """Greedy drafts (the default) against sampled ones are two acceptance laws: refused
    with the way out; the same drafting under another engine's procedure is a note."""
    from specprobe.core.errors import InputError
    from specprobe.result.run import Procedure

    skip = real_results.skip
    assert skip.procedure is not None and skip.procedure.drafting == "greedy"
    sampled = skip.model_copy(update={"procedure": skip.procedure.model_copy(update={"drafting": "probabilistic", "description": "as vLLM verifies it: sampled drafts, acceptance = Σ min(p, q)"})})
    with pytest.raises(InputError, match="follows greedy drafting .* the candidate's probabilistic"):
        compare_results(skip, _edited(sampled, "sampled"), table=table)
    assert "drafting changed: greedy → probabilistic" in " ".join(compare_results(skip, _edited(sampled, "sampled"), table=table, allow_procedure_change=True).notes)
    llama = Procedure(engine="llama.cpp", engine_label="llama.cpp", drafting="greedy", acceptance="p_target(draft token)", description="as llama.cpp verifies it: greedy drafts, acceptance = p_target(draft token)")
    notes = compare_results(skip, _edited(skip.model_copy(update={"procedure": llama}), "llama"), table=table).notes
    assert any(n.startswith("procedure differs: vLLM:") and "llama.cpp:" in n for n in notes)
