"""The rules engine: loads rule tables (data in rules/*.yaml), parses each condition with a
small grammar (never eval), checks every metric name against the catalogue, and turns a
metrics dict into Findings that carry the measured value, the threshold and the remedy.

The condition grammar lives in `specprobe.judge.conditions`. A condition over a metric that was not measured (missing or nan) is "not evaluated".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from specprobe.core.errors import ConfigError
from specprobe.judge.catalog import CATALOG, format_value
from specprobe.judge.conditions import (  # noqa: F401  (the grammar, re-exported for rule users)
    BoolOp,
    Chain,
    Num,
    Var,
    condition_metrics,
    evaluate,
    parse_condition,
    threshold_text,
)

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"error": 3, "warning": 2, "info": 1, "never": 99}
FAMILIES = {"0": "alignment", "1": "divergence", "2": "acceptance", "3": "cost/speedup", "4": "monitoring", "5": "regression", "6": "calibration"}
DRAFTER_KINDS = ("independent", "layer_skip", "medusa", "mtp", "eagle3", "eagle")
_ID_RE = re.compile(r"^SP\d{3}$")
_ALLOWED_KEYS = {"id", "name", "severity", "when", "diagnosis", "remedy", "verdict", "kinds", "doc", "example", "disable"}

# ----------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    when: str
    diagnosis: str
    remedy: str
    verdict: str = ""
    kinds: tuple[str, ...] = ()
    doc: str = ""
    example: str = ""
    source: str = ""

    @property
    def family(self) -> str:
        return FAMILIES.get(self.id[2], "other")

    @property
    def condition(self) -> Any:
        return _parsed(self.when)

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(condition_metrics(self.condition)))

    def applies_to(self, kind: str | None) -> bool:
        return not self.kinds or kind is None or kind in self.kinds


@cache
def _parsed(text: str) -> Any:
    return parse_condition(text)


@dataclass(frozen=True)
class Finding:
    rule_id: str
    name: str
    severity: str
    message: str
    remedy: str
    threshold: str
    measured: dict[str, Any]
    verdict: str = ""
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "remedy": self.remedy,
            "threshold": self.threshold,
            "measured": self.measured,
            "verdict": self.verdict,
            "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class Evaluation:
    """A rule evaluated against metrics: passed, failed (a finding) or not evaluated."""

    rule: Rule
    status: str  # "fail" | "pass" | "skipped"
    finding: Finding | None = None


@dataclass
class RuleTable:
    rules: list[Rule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def get(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise ConfigError(f"unknown rule {rule_id!r}", f"available: {', '.join(r.id for r in self.rules)}")

    def family(self, *digits: str) -> list[Rule]:
        return [r for r in self.rules if r.id[2] in digits]

    def evaluate(
        self,
        metrics: Mapping[str, Any],
        *,
        kind: str | None = None,
        families: Iterable[str] | None = None,
        evidence: Mapping[str, Iterable[str]] | None = None,
    ) -> list[Evaluation]:
        fams = set(families) if families is not None else None
        out: list[Evaluation] = []
        for rule in self.rules:
            if fams is not None and rule.id[2] not in fams:
                continue
            if not rule.applies_to(kind):
                out.append(Evaluation(rule, "skipped"))
                continue
            result = evaluate(rule.condition, metrics)
            if result is None:
                out.append(Evaluation(rule, "skipped"))
            elif result:
                out.append(Evaluation(rule, "fail", make_finding(rule, metrics, evidence)))
            else:
                out.append(Evaluation(rule, "pass"))
        return out

    def findings(self, metrics: Mapping[str, Any], **kw: Any) -> list[Finding]:
        found = [e.finding for e in self.evaluate(metrics, **kw) if e.finding is not None]
        return sort_findings(found)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], f.rule_id))


_FIELD_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render(template: str, metrics: Mapping[str, Any], threshold: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "threshold":
            return threshold
        if name in metrics:
            v = metrics[name]
            if isinstance(v, float) and math.isnan(v):
                return "n/a"  # not measurable from this source (e.g. a rate without K)
            return str(v) if isinstance(v, str) else format_value(name, v)
        if name in CATALOG:
            return "n/a"  # a catalogue metric this run did not measure
        return m.group(0)

    return _FIELD_RE.sub(sub, template).strip()


def make_finding(rule: Rule, metrics: Mapping[str, Any], evidence: Mapping[str, Iterable[str]] | None = None) -> Finding:
    threshold = threshold_text(rule.condition)
    measured = {n: metrics.get(n) for n in rule.metrics}
    ev: list[str] = []
    for n in rule.metrics:
        ev.extend(e for e in (evidence or {}).get(n, ()) if e not in ev)
    return Finding(
        rule_id=rule.id,
        name=rule.name,
        severity=rule.severity,
        message=render(rule.diagnosis, metrics, threshold),
        remedy=render(rule.remedy, metrics, threshold),
        threshold=threshold,
        measured=measured,
        verdict=rule.verdict,
        evidence=tuple(ev),
    )


def worst_severity(findings: Iterable[Finding]) -> str | None:
    best = None
    for f in findings:
        if best is None or SEVERITY_RANK[f.severity] > SEVERITY_RANK[best]:
            best = f.severity
    return best


# Among findings of equal severity the headline prefers the root cause (alignment), then
# the acceptance band users reason in, then divergence, cost, and the rest.
_VERDICT_FAMILY_ORDER = "0261354"


def verdict(findings: Iterable[Finding], default: str = "no findings") -> str:
    """The headline: the verdict (or name) of the worst finding."""
    ordered = sort_findings(findings)
    if not ordered:
        return default
    top = ordered[0]
    same = [f for f in ordered if f.severity == top.severity]
    same.sort(key=lambda f: (_VERDICT_FAMILY_ORDER.find(f.rule_id[2]) % 10, f.rule_id))
    with_verdict = [f for f in same if f.verdict]
    return with_verdict[0].verdict if with_verdict else same[0].name


def exit_code_for(findings: Iterable[Finding], fail_on: str) -> int:
    if fail_on == "never":
        return 0
    limit = SEVERITY_RANK[fail_on]
    return 1 if any(SEVERITY_RANK[f.severity] >= limit for f in findings) else 0


# ----------------------------------------------------------------------------- loading
def default_rules_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # specprobe/ (a wheel holds specprobe/_rules)
    for candidate in (package / "_rules", package.parent / "rules"):
        if (candidate / "default.yaml").is_file():
            return candidate
    raise ConfigError("the default rules table is missing from this install", "reinstall specprobe")


def _rule_from_dict(raw: Any, where: str) -> Rule | str:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: each rule must be a mapping, got {type(raw).__name__}", "see rules/default.yaml for the format")
    unknown = set(raw) - _ALLOWED_KEYS
    rid = raw.get("id")
    if unknown:
        raise ConfigError(f"{where}: rule {rid or '?'} has unknown key(s) {', '.join(sorted(unknown))}", f"allowed: {', '.join(sorted(_ALLOWED_KEYS))}")
    if not isinstance(rid, str) or not _ID_RE.match(rid):
        raise ConfigError(f"{where}: rule id {rid!r} is not of the form SP123", "ids are SP followed by three digits")
    if raw.get("disable"):
        return rid
    for key in ("name", "severity", "when", "diagnosis", "remedy"):
        if not raw.get(key):
            raise ConfigError(f"{where}: rule {rid} has no {key!r}", "every rule needs id, name, severity, when, diagnosis, remedy")
    for key in ("name", "when", "diagnosis", "remedy", "verdict", "doc", "example"):
        if isinstance(raw.get(key), (list, dict)):
            raise ConfigError(f"{where}: rule {rid}: {key!r} must be text, got a {type(raw[key]).__name__}", "write it as one string")
    if raw["severity"] not in SEVERITIES:
        raise ConfigError(f"{where}: rule {rid} has severity {raw['severity']!r}", f"use one of {', '.join(SEVERITIES)}")
    try:
        node = parse_condition(str(raw["when"]))
    except ValueError as e:
        raise ConfigError(f"{where}: rule {rid} has a bad condition {raw['when']!r}: {e}", "write e.g. 'accept_prob_mean < 0.05 and kl_target_draft_nats > 4'") from e
    for name in condition_metrics(node):
        if name not in CATALOG:
            raise ConfigError(f"{where}: rule {rid} names unknown metric {name!r}", "run 'specprobe rules metrics' for the catalogue")
    kinds = raw.get("kinds") or ()
    if isinstance(kinds, str):
        kinds = (kinds,)
    bad = [k for k in kinds if k not in DRAFTER_KINDS]
    if bad:
        raise ConfigError(f"{where}: rule {rid} has unknown drafter kind(s) {', '.join(bad)}", f"use {', '.join(DRAFTER_KINDS)}")
    return Rule(
        id=rid,
        name=str(raw["name"]),
        severity=str(raw["severity"]),
        when=str(raw["when"]),
        diagnosis=str(raw["diagnosis"]),
        remedy=str(raw["remedy"]),
        verdict=str(raw.get("verdict") or ""),
        kinds=tuple(kinds),
        doc=str(raw.get("doc") or ""),
        example=str(raw.get("example") or ""),
        source=where,
    )


def load_rules_file(path: Path) -> tuple[list[Rule], list[str]]:
    """Rules defined and ids disabled by one file."""
    from specprobe.core.safe_load import UnsafeDocument, load_yaml

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"rules file {path} is a folder", "pass a YAML file to --rules")
    if not path.is_file():
        raise ConfigError(f"rules file {path} does not exist", "pass an existing YAML file to --rules")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"rules file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})", "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read rules file {path}: {e.strerror or e}", "check the path and its permissions") from None
    except UnsafeDocument as e:
        raise ConfigError(f"rules file {path} refused: {e}", e.hint) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"rules file {path} is not valid YAML: {str(e).splitlines()[0]}", "fix the YAML syntax") from e
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ConfigError(f"rules file {path} has no 'rules:' list", "the file must be a mapping with a 'rules' list")
    rules: list[Rule] = []
    disabled: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["rules"]):
        item = _rule_from_dict(raw, f"{path.name} rule #{i + 1}")
        rid = item if isinstance(item, str) else item.id
        if rid in seen:
            raise ConfigError(f"{path.name}: duplicate rule id {rid}", "each id may appear once per file; use another file to override")
        seen.add(rid)
        if isinstance(item, str):
            disabled.append(item)
        else:
            rules.append(item)
    return rules, disabled


def load_table(extra: Iterable[Path] = (), *, include_default: bool = True) -> RuleTable:
    """The default table, then each extra file adding rules or overriding/disabling by id."""
    table = RuleTable()
    files: list[Path] = []
    if include_default:
        files.append(default_rules_dir() / "default.yaml")
    files.extend(Path(p) for p in extra)
    by_id: dict[str, Rule] = {}
    for f in files:
        rules, disabled = load_rules_file(f)
        for r in rules:
            by_id[r.id] = r
        for rid in disabled:
            by_id.pop(rid, None)
        table.sources.append(str(f))
    table.rules = sorted(by_id.values(), key=lambda r: r.id)
    return table
