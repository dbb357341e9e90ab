"""Per-group thresholds: a rules file's `groups:` section sets, for the groups whose value
matches a glob, another threshold for a rule (`code: {SP408: 0.6}`), so one task may have
its own floor. Each group's evaluation uses the table with those rules rewritten; every
other group and the row of all requests use the table as it is.

    groups:
      code: {SP408: 0.6}       # task=code: the per-group floor at 60 %
      "tenant-*": {SP402: 0.4}

A rule whose condition holds more than one number cannot take a single threshold and is
refused, as is an unknown rule id.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path

from specprobe.core.errors import ConfigError
from specprobe.core.safe_load import load_yaml
from specprobe.judge.rules import RuleTable

_NUM_RE = re.compile(r"(?<![A-Za-z_0-9.])-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?%?(?![A-Za-z_0-9])")
Overrides = list[tuple[str, dict[str, float]]]  # (glob over the group's value, {rule id: threshold})


def read_overrides(paths: Iterable[Path], table: RuleTable) -> Overrides:
    out: Overrides = []
    for path in paths:
        try:
            data = load_yaml(Path(path).read_text(encoding="utf-8"))
        except Exception:  # noqa: BLE001 - load_table has read (and checked) the file already
            continue
        groups = data.get("groups") if isinstance(data, dict) else None
        if groups is None:
            continue
        if not isinstance(groups, dict):
            raise ConfigError(f"rules file {path}: 'groups' must be a mapping of group values to {{rule id: threshold}}", "write e.g. groups: {code: {SP408: 0.6}}")
        for pattern, rules in groups.items():
            if not isinstance(rules, dict) or not rules:
                raise ConfigError(f"rules file {path}: groups.{pattern} must map rule ids to thresholds", "write e.g. code: {SP408: 0.6}")
            parsed: dict[str, float] = {}
            for rid, value in rules.items():
                rule = table.get(str(rid))  # an unknown id is refused, naming the ids there are
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"rules file {path}: groups.{pattern}.{rid} is {value!r}, not a number", "write the rule's threshold, e.g. 0.6")
                if len(_NUM_RE.findall(rule.when)) != 1:
                    raise ConfigError(f"rules file {path}: groups.{pattern}.{rid}: rule {rid}'s condition {rule.when!r} does not hold exactly one number", "override it with a rule of its own (same id) in a rules file instead")
                parsed[str(rid)] = float(value)
            out.append((str(pattern), parsed))
    return out


def group_value(label: str) -> str:
    """'task=code' → 'code'."""
    return label.split("=", 1)[1] if "=" in label else label


def table_for(table: RuleTable, overrides: Overrides, label: str) -> RuleTable:
    """The table with this group's thresholds (later patterns win)."""
    value = group_value(label)
    chosen: dict[str, float] = {}
    for pattern, rules in overrides:
        if fnmatch.fnmatchcase(value, pattern) or fnmatch.fnmatchcase(label, pattern):
            chosen.update(rules)
    if not chosen:
        return table
    rewritten = [
        dataclasses.replace(r, when=_NUM_RE.sub(f"{chosen[r.id]:g}", r.when, count=1)) if r.id in chosen else r
        for r in table.rules
    ]
    return RuleTable(rules=rewritten, sources=table.sources, families=table.families)
