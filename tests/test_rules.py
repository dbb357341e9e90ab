"""The rules engine, the default table's golden cases, and every rules file in the repo."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specprobe.core.errors import ConfigError
from specprobe.judge.catalog import CATALOG
from specprobe.judge.rules import (
    evaluate,
    exit_code_for,
    load_rules_file,
    load_table,
    parse_condition,
    threshold_text,
    verdict,
)

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
    fail = [e for e in table.evaluate(case["fail"], kind=kind) if e.rule.id == rule_id][0]
    assert fail.status == "fail", f"{rule_id} should fire on {case['fail']}"
    f = fail.finding
    assert f is not None and f.measured and f.threshold and f.remedy
    assert "{" not in f.message, f"unfilled placeholder in {rule_id}: {f.message}"
    ok = [e for e in table.evaluate(case["pass"], kind=kind) if e.rule.id == rule_id][0]
    assert ok.status == "pass", f"{rule_id} should not fire on {case['pass']}"
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
    assert verdict(findings) == "undertrained or domain-shifted"
    assert exit_code_for(findings, "error") == 0
    assert exit_code_for(findings, "warning") == 1
    assert exit_code_for(findings, "never") == 0
    bad = table.findings({"accept_prob_mean": 0.01, "token_id_mismatch_frac": 0.3})
    assert verdict(bad) == "catastrophic mismatch"
    assert exit_code_for(bad, "error") == 1
