"""The rules engine: loads rule tables (data in rules/*.yaml), parses each condition with a
small grammar (never eval), checks every metric name against the catalogue, and turns a
metrics dict into Findings that carry the measured value, the threshold and the remedy.

Grammar:
    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | "(" expr ")" | chain
    chain   := operand (cmp operand)+          # 0.3 <= accept_prob_mean < 0.5
    operand := NUMBER | METRIC_NAME | "true" | "false"
    cmp     := "<" | "<=" | ">" | ">=" | "==" | "!="
A condition over a metric that was not measured (missing or nan) is "not evaluated".
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

from specprobe.catalog import CATALOG, format_value
from specprobe.errors import ConfigError

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"error": 3, "warning": 2, "info": 1, "never": 99}
FAMILIES = {"0": "alignment", "1": "divergence", "2": "acceptance", "3": "cost/speedup", "4": "monitoring", "5": "regression", "6": "calibration"}
DRAFTER_KINDS = ("independent", "layer_skip", "medusa", "mtp", "eagle3", "eagle")
_ID_RE = re.compile(r"^SP\d{3}$")
_ALLOWED_KEYS = {"id", "name", "severity", "when", "diagnosis", "remedy", "verdict", "kinds", "doc", "example", "disable"}

# ----------------------------------------------------------------------------- grammar
_TOKEN_RE = re.compile(r"\s*(?:(?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?%?)|(?P<op><=|>=|==|!=|<|>)|(?P<par>[()])|(?P<name>[A-Za-z_][A-Za-z0-9_]*))")
_CMP = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_PRETTY_OP = {"<": "<", "<=": "≤", ">": ">", ">=": "≥", "==": "=", "!=": "≠"}


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Chain:
    operands: tuple[Num | Var, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class BoolOp:
    op: str  # and | or | not
    args: tuple[Any, ...]


def _tokenize(text: str) -> list[tuple[str, str]]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"unexpected character {text[pos:].strip()[:1]!r} at position {pos}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ValueError("condition ends too early")
        self.i += 1
        return tok

    def parse(self) -> Any:
        if not self.toks:
            raise ValueError("empty condition")
        node = self.or_()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def or_(self) -> Any:
        args = [self.and_()]
        while self.peek() == ("name", "or"):
            self.take()
            args.append(self.and_())
        return args[0] if len(args) == 1 else BoolOp("or", tuple(args))

    def and_(self) -> Any:
        args = [self.not_()]
        while self.peek() == ("name", "and"):
            self.take()
            args.append(self.not_())
        return args[0] if len(args) == 1 else BoolOp("and", tuple(args))

    def not_(self) -> Any:
        tok = self.peek()
        if tok == ("name", "not"):
            self.take()
            return BoolOp("not", (self.not_(),))
        if tok == ("par", "("):
            self.take()
            node = self.or_()
            if self.take() != ("par", ")"):
                raise ValueError("missing ')'")
            return node
        return self.chain()

    def operand(self) -> Num | Var:
        kind, text = self.take()
        if kind == "num":
            return Num(float(text[:-1]) / 100 if text.endswith("%") else float(text))
        if kind == "name" and text in ("true", "false"):
            return Num(1.0 if text == "true" else 0.0)
        if kind == "name" and text not in ("and", "or", "not"):
            return Var(text)
        raise ValueError(f"expected a metric name or a number, got {text!r}")

    def chain(self) -> Chain:
        operands = [self.operand()]
        ops: list[str] = []
        while self.peek() is not None and self.peek()[0] == "op":  # type: ignore[index]
            ops.append(self.take()[1])
            operands.append(self.operand())
        if not ops:
            raise ValueError(f"{operands[0]} is not a comparison (write e.g. 'metric < 0.5')")
        return Chain(tuple(operands), tuple(ops))


def parse_condition(text: str) -> Any:
    return _Parser(text).parse()


def condition_metrics(node: Any) -> list[str]:
    if isinstance(node, Var):
        return [node.name]
    if isinstance(node, Chain):
        return [n for o in node.operands for n in condition_metrics(o)]
    if isinstance(node, BoolOp):
        return [n for a in node.args for n in condition_metrics(a)]
    return []


def _value(node: Num | Var, metrics: Mapping[str, Any]) -> float | None:
    if isinstance(node, Num):
        return node.value
    v = metrics.get(node.name)
    if v is None or isinstance(v, (list, dict, str)):
        return None
    v = float(v)
    return None if math.isnan(v) else v


def evaluate(node: Any, metrics: Mapping[str, Any]) -> bool | None:
    """True/False, or None when a metric it needs was not measured."""
    if isinstance(node, Chain):
        vals = [_value(o, metrics) for o in node.operands]
        if any(v is None for v in vals):
            return None
        return all(_CMP[op](vals[i], vals[i + 1]) for i, op in enumerate(node.ops))  # type: ignore[arg-type]
    if isinstance(node, BoolOp):
        results = [evaluate(a, metrics) for a in node.args]
        if node.op == "not":
            return None if results[0] is None else not results[0]
        if node.op == "and":
            if any(r is False for r in results):
                return False
            return None if any(r is None for r in results) else True
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    raise TypeError(node)


def threshold_text(node: Any) -> str:
    """The condition with constants in each metric's unit: 'accept_prob_mean < 5.0%'."""
    if isinstance(node, Chain):
        metric = next((o.name for o in node.operands if isinstance(o, Var)), None)
        parts = []
        for i, o in enumerate(node.operands):
            parts.append(o.name if isinstance(o, Var) else format_value(metric or "", o.value))
            if i < len(node.ops):
                parts.append(_PRETTY_OP[node.ops[i]])
        return " ".join(parts)
    if isinstance(node, BoolOp):
        if node.op == "not":
            return f"not ({threshold_text(node.args[0])})"
        return f" {node.op} ".join(threshold_text(a) for a in node.args)
    return ""


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
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):
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
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"rules file {path} does not exist", "pass an existing YAML file to --rules")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
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
