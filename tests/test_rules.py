"""The rules engine, the default table's golden cases, and every rules file in the repo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from specprobe.core.errors import ConfigError
from specprobe.judge.catalog import CATALOG
from specprobe.judge.rules import (
    default_families,
    evaluate,
    exit_code_for,
    family_of,
    load_rules_file,
    load_table,
    parse_condition,
    threshold_text,
)
from specprobe.result import Evaluation, Finding

ROOT = Path(__file__).resolve().parent.parent
CASES = yaml.safe_load((Path(__file__).parent / "data" / "rule_cases.yaml").read_text())


def test_every_file_in_rules_dir_loads() -> None:
    files = sorted((ROOT / "rules").glob("*.yaml"))
    assert files, "rules/ has no files"
    for f in files:
        rules, _ = load_rules_file(f)
        assert rules
        for r in rules:
            assert all(m in CATALOG for m in r.metrics)


def test_every_default_rule_has_golden_cases() -> None:
    ids = {r.id for r in load_table().rules}
    assert ids - set(CASES) == set(), "rules without golden cases in tests/data/rule_cases.yaml"
    assert set(CASES) - ids == set(), "golden cases for rules that no longer exist"


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_golden_cases(rule_id: str) -> None:
    table = load_table()
    rule = table.get(rule_id)
    case = CASES[rule_id]
    kind = case.get("kind")
    findings, evals = table.evaluate(case["fail"], kind=kind)
    fail = [e for e in evals if e.rule_id == rule_id][0]
    assert fail.status == "fail", f"{rule_id} should fire on {case['fail']}"
    f = next((x for x in findings if x.rule_id == rule_id), None)
    assert f is not None and f.measured and f.threshold and f.remedy
    assert "{" not in f.message, f"unfilled placeholder in {rule_id}: {f.message}"
    findings, evals = table.evaluate(case["pass"], kind=kind)
    ok = [e for e in evals if e.rule_id == rule_id][0]
    assert ok.status == "pass", f"{rule_id} should not fire on {case['pass']}"
    assert rule_id not in {x.rule_id for x in findings}
    assert rule.family


def test_grammar_chains_booleans_and_missing_metrics() -> None:
    node = parse_condition("0.3 <= accept_prob_mean < 0.5 and not (kl_target_draft_nats > 4 or cost_ratio >= 1)")
    assert evaluate(node, {"accept_prob_mean": 0.4, "kl_target_draft_nats": 1, "cost_ratio": 0.1}) is True
    assert evaluate(node, {"accept_prob_mean": 0.5, "kl_target_draft_nats": 1, "cost_ratio": 0.1}) is False
    assert evaluate(parse_condition("accept_prob_mean < 5%"), {"accept_prob_mean": 0.04}) is True
    assert evaluate(node, {"accept_prob_mean": 0.4}) is None  # not measured: not evaluated
    assert evaluate(parse_condition("accept_prob_mean < 0.5"), {"accept_prob_mean": float("nan")}) is None
    assert threshold_text(parse_condition("accept_prob_mean < 0.05")) == "accept_prob_mean < 5.0%"


@pytest.mark.parametrize(
    "when,match",
    [
        ("accept_prob_mean <", "bad condition"),
        ("accept_prob_mean", "bad condition"),
        ("__import__('os') > 1", "bad condition"),
        ("nonexistent_metric > 1", "unknown metric"),
        ("accept_prob_mean < 0.5 )", "bad condition"),
    ],
)
def test_bad_rules_files_are_config_errors(tmp_path: Path, when: str, match: str) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"rules": [{"id": "SP901", "name": "x", "severity": "error", "when": when, "diagnosis": "d", "remedy": "r"}]}))
    with pytest.raises(ConfigError, match=match):
        load_table([f])


def test_duplicate_ids_and_unknown_keys(tmp_path: Path) -> None:
    rule = {"id": "SP901", "name": "x", "severity": "error", "when": "accept_prob_mean < 0.1", "diagnosis": "d", "remedy": "r"}
    f = tmp_path / "dup.yaml"
    f.write_text(yaml.safe_dump({"rules": [rule, rule]}))
    with pytest.raises(ConfigError, match="duplicate rule id SP901"):
        load_table([f])
    f.write_text(yaml.safe_dump({"rules": [{**rule, "severty": "x"}]}))
    with pytest.raises(ConfigError, match="unknown key"):
        load_table([f])
    f.write_text(yaml.safe_dump({"rules": [{**rule, "severity": "fatal"}]}))
    with pytest.raises(ConfigError, match="severity"):
        load_table([f])
    f.write_text("rules: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_table([f])


def test_override_and_disable(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"rules": [
        {"id": "SP203", "name": "stricter", "severity": "error", "when": "accept_prob_mean < 0.6", "diagnosis": "{accept_prob_mean} < {threshold}", "remedy": "r"},
        {"id": "SP302", "disable": True},
        {"id": "SP950", "name": "mine", "severity": "info", "when": "best_k >= 4", "diagnosis": "K={best_k}", "remedy": "r"},
    ]}))
    table = load_table([f])
    assert table.get("SP203").name == "stricter"
    assert "SP302" not in {r.id for r in table.rules}
    findings = table.findings({"accept_prob_mean": 0.55, "best_k": 5})
    assert {x.rule_id for x in findings} >= {"SP203", "SP950"}
    msg = next(x for x in findings if x.rule_id == "SP203").message
    assert msg == "55.0% < accept_prob_mean < 60.0%"


def test_verdict_and_exit_codes() -> None:
    table = load_table()
    findings = table.findings({"accept_prob_mean": 0.4, "kl_target_draft_nats": 1.2})
    assert table.verdict(findings) == "undertrained or domain-shifted"
    assert exit_code_for(findings, "error") == 0
    assert exit_code_for(findings, "warning") == 1
    assert exit_code_for(findings, "never") == 0
    bad = table.findings({"accept_prob_mean": 0.01, "token_id_mismatch_frac": 0.3})
    assert table.verdict(bad) == "catastrophic mismatch"
    assert exit_code_for(bad, "error") == 1


# ----------------------------------------------------------------------------- families
def _rule(rid: str, **kw: object) -> dict[str, object]:
    return {"id": rid, "name": f"r{rid}", "severity": "warning", "when": "accept_prob_mean < 0.5", "diagnosis": "d", "remedy": "r", **kw}


def test_every_default_rule_names_a_known_family_that_matches_its_ids() -> None:
    raw = yaml.safe_load((ROOT / "rules" / "default.yaml").read_text())
    names = [f.name for f in default_families()]
    assert [f["name"] for f in raw["families"]] == names
    missing = [r["id"] for r in raw["rules"] if not r.get("family")]
    assert missing == [], "rules without an explicit family in rules/default.yaml"
    for r in raw["rules"]:
        assert r["family"] in names, r["id"]
        assert family_of(r["id"], default_families()) == r["family"], r["id"]
    table = load_table()
    assert {r.family for r in table.rules} <= set(names) and "other" not in {r.family for r in table.rules}


def test_unknown_family_is_one_line_naming_file_and_rule(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"rules": [_rule("SP250"), _rule("SP251", family="acceptence")]}))
    with pytest.raises(ConfigError, match=r"mine\.yaml rule #2: rule SP251 has unknown family 'acceptence'") as e:
        load_table([f])
    assert "\n" not in e.value.one_line() and "acceptance" in e.value.hint
    f.write_text(yaml.safe_dump({"rules": [_rule("SP251", family=["acceptance"])]}))
    with pytest.raises(ConfigError, match="unknown family"):
        load_rules_file(f)


def test_user_rules_without_a_family_take_the_one_their_id_names(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"rules": [_rule("SP250"), _rule("SP960"), _rule("SP261", family="divergence")]}))
    table = load_table([f])
    assert [table.get(i).family for i in ("SP250", "SP960", "SP261")] == ["acceptance", "other", "divergence"]
    assert {r.id for r in table.family("acceptance")} >= {"SP201", "SP250"} and "SP261" in {r.id for r in table.family("divergence")}
    # a table whose families claim no catch-all prefix cannot place SP960
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"families": [{"name": "acceptance", "ids": "SP2"}], "rules": [_rule("SP250"), _rule("SP960")]}))
    with pytest.raises(ConfigError, match=r"own\.yaml rule #2: rule SP960 names no family") as e:
        load_table([own], include_default=False)
    assert "\n" not in e.value.one_line()


def test_families_list_is_validated(tmp_path: Path) -> None:
    f = tmp_path / "fam.yaml"
    for families, match in [
        ([{"name": "a", "ids": "SP0"}, {"name": "a", "ids": "SP1"}], "duplicate family a"),
        ([{"name": "a", "ids": "SP0"}, {"name": "b", "ids": "SP0"}], "both claim ids SP0"),
        ([{"name": "a", "ids": "X1"}], "not an id prefix"),
        ([{"name": "Cost/Speedup"}], "not a lowercase word"),
        ([{"name": "a", "prefix": "SP0"}], "unknown key"),
        ([], "non-empty list"),
    ]:
        f.write_text(yaml.safe_dump({"families": families, "rules": []}))
        with pytest.raises(ConfigError, match=match):
            load_table([f], include_default=False)
    # families that drop one the default rules use are refused, naming such a rule
    f.write_text(yaml.safe_dump({"families": [{"name": "alignment", "ids": "SP0"}], "rules": []}))
    with pytest.raises(ConfigError, match=r"default\.yaml rule #\d+: rule SP\d+ has family '\w+', which fam\.yaml does not list"):
        load_table([f])


def test_verdict_order_follows_the_families_list(tmp_path: Path) -> None:
    rules = [_rule("SP010", verdict="misaligned"), _rule("SP210", verdict="undertrained")]
    metrics = {"accept_prob_mean": 0.1}
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({"families": [{"name": "alignment", "ids": "SP0"}, {"name": "acceptance", "ids": "SP2"}], "rules": rules}))
    table = load_table([f], include_default=False)
    assert table.verdict(table.findings(metrics)) == "misaligned"
    f.write_text(yaml.safe_dump({"families": [{"name": "acceptance", "ids": "SP2"}, {"name": "alignment", "ids": "SP0"}], "rules": rules}))
    table = load_table([f], include_default=False)
    assert table.verdict(table.findings(metrics)) == "undertrained"
    # the order follows a rule's named family, not its id
    f.write_text(yaml.safe_dump({"families": ["alignment", "acceptance"], "rules": [{**rules[0], "family": "alignment"}, {**rules[1], "family": "alignment"}, {**rules[0], "id": "SP011", "family": "acceptance", "verdict": "late"}]}))
    table = load_table([f], include_default=False)
    assert table.verdict(table.findings(metrics)) == "misaligned"
    assert table.verdict([x for x in table.findings(metrics) if x.rule_id != "SP010"]) == "undertrained"
    # a user file may reorder the shipped table's headline
    both = {"accept_prob_mean": 0.2, "temperature_abs_diff": 0.3, "draft_greedy_target_sampling": 0, "draft_temperature_applies": 1}
    default = load_table()
    assert default.verdict(default.findings(both)) == default.get("SP012").verdict
    flipped = tmp_path / "flip.yaml"
    names = [x.name for x in default.families]
    names.remove("acceptance")
    flipped.write_text(yaml.safe_dump({"families": ["acceptance", *names], "rules": []}))
    reordered = load_table([flipped])
    assert reordered.verdict(reordered.findings(both)) == default.get("SP202").verdict


def test_the_engine_speaks_the_result_types_and_family_names() -> None:
    table = load_table()
    findings, evals = table.evaluate({"accept_prob_mean": 0.4}, families=["acceptance"])
    assert findings and all(type(f) is Finding for f in findings)
    assert evals and all(type(e) is Evaluation for e in evals)
    assert {e.rule_id for e in evals} == {r.id for r in table.family("acceptance")}
    with pytest.raises(ConfigError, match="unknown rule family '2'"):
        table.evaluate({"accept_prob_mean": 0.4}, families=["2"])
    with pytest.raises(ConfigError, match="unknown rule family"):
        table.family("5")


def test_result_does_not_import_the_rules_engine() -> None:
    for py in sorted((ROOT / "specprobe" / "result").glob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("specprobe.judge.rules") for n in names), py.name
