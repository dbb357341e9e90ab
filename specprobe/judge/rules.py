"""The rules engine: loads rule tables (data in rules/*.yaml), parses each condition with a
small grammar (never eval), checks every metric name against the catalogue, and turns a
metrics dict into Findings that carry the measured value, the threshold and the remedy.

Findings and Evaluations are the result schema's own types (`specprobe.result.base`):
what the engine returns is what a result file stores. Each rule carries its family,
and the table lists its families in headline order with the id prefix each claims; a
rule file may leave `family:` out, and only then does the loader place the rule by
those prefixes.

The condition grammar lives in `specprobe.judge.conditions`. A condition over a metric that was not measured (missing or nan) is "not evaluated".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from specprobe.core.errors import ConfigError
from specprobe.core.safe_load import UnsafeDocument, load_yaml
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
from specprobe.result.base import Evaluation, Finding, Severity

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"error": 3, "warning": 2, "info": 1, "never": 99}
DRAFTER_KINDS = ("independent", "layer_skip", "medusa", "mtp", "eagle3", "eagle", "ngram")
_ID_RE = re.compile(r"^SP\d{3}$")
_FAMILY_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
_FAMILY_IDS_RE = re.compile(r"^SP\d{0,3}$")
_ALLOWED_KEYS = {"id", "family", "name", "severity", "when", "diagnosis", "remedy", "verdict", "kinds", "doc", "example", "disable"}
_FAMILY_KEYS = {"name", "ids"}


# ----------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    name: str
    ids: str = ""  # id prefix a rule without `family:` is placed by; "" places none


def family_of(rule_id: str, families: Iterable[Family]) -> str | None:
    """The family a rule id falls into by the families' id prefixes (the longest wins),
    for rules that do not name one and for results that carry only the id."""
    best: Family | None = None
    for fam in families:
        if fam.ids and rule_id.startswith(fam.ids) and (best is None or len(fam.ids) > len(best.ids)):
            best = fam
    return best.name if best else None


def _families_from(data: Mapping[str, Any], name: str) -> tuple[Family, ...] | None:
    """The file's `families:` list, validated; None when the file has none."""
    raw = data.get("families")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"rules file {name}: 'families' must be a non-empty list", "write e.g. families: [{name: alignment, ids: SP0}]")
    out: list[Family] = []
    for i, item in enumerate(raw):
        where = f"{name} family #{i + 1}"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: each family must be a name or a mapping, got {type(item).__name__}", "write e.g. {name: alignment, ids: SP0}")
        unknown = set(item) - _FAMILY_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}", f"allowed: {', '.join(sorted(_FAMILY_KEYS))}")
        fname, ids = item.get("name"), item.get("ids") or ""
        if not isinstance(fname, str) or not _FAMILY_NAME_RE.match(fname):
            raise ConfigError(f"{where}: family name {fname!r} is not a lowercase word", "write e.g. alignment or cost")
        if not isinstance(ids, str) or (ids and not _FAMILY_IDS_RE.match(ids)):
            raise ConfigError(f"{where}: family {fname} has ids {ids!r}, not an id prefix", "write SP followed by up to three digits, e.g. SP0")
        if any(f.name == fname for f in out):
            raise ConfigError(f"{name}: duplicate family {fname}", "each family may appear once")
        if ids and any(f.ids == ids for f in out):
            raise ConfigError(f"{name}: families {next(f.name for f in out if f.ids == ids)} and {fname} both claim ids {ids}", "give each family its own id prefix")
        out.append(Family(fname, ids))
    return tuple(out)


@cache
def default_families() -> tuple[Family, ...]:
    """The families of the shipped table: what a rules file without its own list uses."""
    path = default_rules_dir() / "default.yaml"
    families = _families_from(_read_rules_yaml(path), path.name)
    if families is None:
        raise ConfigError(f"the default rules table {path} lists no families", "reinstall specprobe")
    return families


# ----------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: Severity
    when: str
    diagnosis: str
    remedy: str
    family: str
    verdict: str = ""
    kinds: tuple[str, ...] = ()
    doc: str = ""
    example: str = ""
    source: str = ""

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


@dataclass
class RuleTable:
    rules: list[Rule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    families: tuple[Family, ...] = ()

    def get(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise ConfigError(f"unknown rule {rule_id!r}", f"available: {', '.join(r.id for r in self.rules)}")

    def _known(self, names: Iterable[str]) -> set[str]:
        wanted = set(names)
        known = {f.name for f in self.families}
        unknown = sorted(wanted - known)
        if unknown:
            raise ConfigError(f"unknown rule family {', '.join(map(repr, unknown))}", f"families: {', '.join(f.name for f in self.families)}")
        return wanted

    def family(self, *names: str) -> list[Rule]:
        wanted = self._known(names)
        return [r for r in self.rules if r.family in wanted]

    def evaluate(
        self,
        metrics: Mapping[str, Any],
        *,
        kind: str | None = None,
        families: Iterable[str] | None = None,
        evidence: Mapping[str, Iterable[str]] | None = None,
    ) -> tuple[list[Finding], list[Evaluation]]:
        """(findings, worst first; one evaluation per rule considered: pass / fail / skipped)."""
        wanted = self._known(families) if families is not None else None
        found: list[Finding] = []
        evaluations: list[Evaluation] = []
        for rule in self.rules:
            if wanted is not None and rule.family not in wanted:
                continue
            result = evaluate(rule.condition, metrics) if rule.applies_to(kind) else None
            if result:
                found.append(make_finding(rule, metrics, evidence))
            status: Literal["pass", "fail", "skipped"] = "skipped" if result is None else "fail" if result else "pass"
            evaluations.append(Evaluation(rule_id=rule.id, name=rule.name, severity=rule.severity, status=status))
        return sort_findings(found), evaluations

    def findings(self, metrics: Mapping[str, Any], **kw: Any) -> list[Finding]:
        return self.evaluate(metrics, **kw)[0]

    def verdict(self, findings: Iterable[Finding], default: str = "no findings") -> str:
        """The headline: the verdict (or name) of the worst finding; among equals, of the
        family listed first in the table's `families`."""
        ordered = sort_findings(findings)
        if not ordered:
            return default
        rank = {f.name: i for i, f in enumerate(self.families)}
        family = {r.id: r.family for r in self.rules}
        same = [f for f in ordered if f.severity == ordered[0].severity]
        same.sort(key=lambda f: (rank.get(family.get(f.rule_id, ""), len(rank)), f.rule_id))
        with_verdict = [f for f in same if f.verdict]
        return with_verdict[0].verdict if with_verdict else same[0].name


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
        evidence=ev,
    )


def worst_severity(findings: Iterable[Finding]) -> str | None:
    best = None
    for f in findings:
        if best is None or SEVERITY_RANK[f.severity] > SEVERITY_RANK[best]:
            best = f.severity
    return best


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


def _rule_family(raw: Mapping[str, Any], rid: str, where: str, families: Sequence[Family]) -> str:
    names = ", ".join(f.name for f in families)
    fam = raw.get("family")
    if fam is None:
        derived = family_of(rid, families)
        if derived is None:
            raise ConfigError(f"{where}: rule {rid} names no family and no family's ids match its id", f"add family: one of {names}")
        return derived
    if not isinstance(fam, str) or fam not in {f.name for f in families}:
        raise ConfigError(f"{where}: rule {rid} has unknown family {fam!r}", f"use one of {names}")
    return fam


def _rule_from_dict(raw: Any, where: str, families: Sequence[Family]) -> Rule | str:
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
        severity=cast(Severity, raw["severity"]),
        when=str(raw["when"]),
        diagnosis=str(raw["diagnosis"]),
        remedy=str(raw["remedy"]),
        family=_rule_family(raw, rid, where, families),
        verdict=str(raw.get("verdict") or ""),
        kinds=tuple(kinds),
        doc=str(raw.get("doc") or ""),
        example=str(raw.get("example") or ""),
        source=where,
    )


def _read_rules_yaml(path: Path) -> dict[str, Any]:
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
    return data


def _load_file(path: Path, families: Sequence[Family] | None) -> tuple[list[Rule], list[str], tuple[Family, ...] | None]:
    """Rules defined, ids disabled and the families listed by one file; its rules are
    checked against its own families, else the given ones, else the default table's."""
    path = Path(path)
    data = _read_rules_yaml(path)
    own = _families_from(data, path.name)
    in_effect = own or (tuple(families) if families is not None else default_families())
    rules: list[Rule] = []
    disabled: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["rules"]):
        item = _rule_from_dict(raw, f"{path.name} rule #{i + 1}", in_effect)
        rid = item if isinstance(item, str) else item.id
        if rid in seen:
            raise ConfigError(f"{path.name}: duplicate rule id {rid}", "each id may appear once per file; use another file to override")
        seen.add(rid)
        if isinstance(item, str):
            disabled.append(item)
        else:
            rules.append(item)
    return rules, disabled, own


def load_rules_file(path: Path, families: Sequence[Family] | None = None) -> tuple[list[Rule], list[str]]:
    """Rules defined and ids disabled by one file."""
    rules, disabled, _ = _load_file(path, families)
    return rules, disabled


def load_table(extra: Iterable[Path] = (), *, include_default: bool = True) -> RuleTable:
    """The default table, then each extra file adding rules or overriding/disabling by id;
    a file with its own `families:` list replaces the families (and so the headline order)."""
    table = RuleTable()
    files: list[Path] = []
    if include_default:
        files.append(default_rules_dir() / "default.yaml")
    files.extend(Path(p) for p in extra)
    by_id: dict[str, Rule] = {}
    families: tuple[Family, ...] | None = None
    for f in files:
        rules, disabled, own = _load_file(f, families)
        for r in rules:
            by_id[r.id] = r
        for rid in disabled:
            by_id.pop(rid, None)
        if own is not None:
            families = own
            names = {fam.name for fam in own}
            for r in by_id.values():
                if r.family not in names:
                    raise ConfigError(f"{r.source}: rule {r.id} has family {r.family!r}, which {Path(f).name} does not list", f"list it in {Path(f).name}'s families or override the rule there")
        elif families is None:
            families = default_families()
        table.sources.append(str(f))
    table.rules = sorted(by_id.values(), key=lambda r: r.id)
    table.families = families if families is not None else default_families()
    return table
