"""Prometheus recording and alerting rules, and a Grafana dashboard on them, for one
engine's own speculative-decoding metrics (`specprobe alerts`). Pure: a rules table and
a few settings in, plain data out (the command writes it as YAML / JSON).

Recording rules (`specprobe:spec_decode_<quantity>:<window>`), per `model_name` (vLLM,
SGLang) or per scraped `instance` (llama.cpp's server has no model label):

  acceptance_rate          accepted ÷ drafted tokens over the window (rate ÷ rate)
  mean_acceptance_length   1 + accepted ÷ drafts (bonus token included)
  acceptance_rate_per_position  accepted at position i ÷ drafts (label `position`, 0-based)
  draft_tokens             drafted tokens in the window (increase)
  …_baseline               the same over the baseline window just before (offset window)
  acceptance_drop          1 − current ÷ baseline acceptance
  depth_decay              deepest ÷ first per-position rate (min over positions: the
                           cumulative rates never rise with depth)
  depth_decay_excess       1 − current ÷ baseline depth decay
  acceptance_trend_drop    the least-squares fall of the acceptance series over the
                           drift window, 1 − fit(end) ÷ fit(start), from deriv()
  acceptance_rate_by_engine  vLLM only: per `engine` label (data-parallel engines)

SGLang exposes gauges (the last logging interval's accept length and rate), averaged
over the window with avg_over_time; it has no per-position series, so the depth rules
are not generated for it.

Alerting rules are translated from the rules table's monitoring rules: every condition
over the catalogue metrics above becomes PromQL filters over the recording rules (a
chain `0.05 <= x < 0.5` as `x >= 0.05 and x < 0.5`), so the thresholds are the table's
own; rules over metrics that only per-request records or the monitor's drift tests
have (groups, request-weighted acceptance, change points) are listed as not translated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specprobe.judge.conditions import BoolOp, Chain, Num, Var, parse_condition
from specprobe.judge.rules import Rule, RuleTable
from specprobe.monitor.dialects import dialects
from specprobe.monitor.windows import prom_duration

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class EngineNames:
    by: str  # the label the rules are kept per
    counters: dict[str, str] | None  # accepted / draft_tokens / drafts → counter name (with _total)
    per_pos: str | None
    gauges: dict[str, str] | None  # accept_rate / accept_len → gauge name
    engine_label: bool = False


# each engine's names, from its `monitor` module's RULES (`dialects`), by engine name
NAMES = {engine.name: EngineNames(**mod.RULES) for engine, _, mod in dialects() if hasattr(mod, "RULES")}
ENGINES = tuple(NAMES)  # `specprobe alerts --engine`


def _w(seconds: float) -> str:
    """A window as a rule-name suffix and a PromQL range: 300 → '5m'."""
    text = prom_duration(seconds)
    n = int(text[:-1]) if text.endswith("s") and not text.endswith("ms") else None
    if n is not None:
        if n % 3600 == 0:
            return f"{n // 3600}h"
        if n % 60 == 0:
            return f"{n // 60}m"
    return text


@dataclass(frozen=True)
class Windows:
    window: float = 300.0
    baseline: float = 3600.0
    drift: float = 6 * 3600.0

    @property
    def w(self) -> str:
        return _w(self.window)

    @property
    def b(self) -> str:
        return _w(self.baseline)

    @property
    def d(self) -> str:
        return _w(self.drift)


def record_names(win: Windows) -> dict[str, str]:
    """Catalogue metric → the recording rule that holds it."""
    w, b, d = win.w, win.b, win.d
    return {
        "monitor_accept_rate": f"specprobe:spec_decode_acceptance_rate:{w}",
        "monitor_accept_rate_baseline": f"specprobe:spec_decode_acceptance_rate_baseline:{b}",
        "monitor_accept_rate_drop_rel": f"specprobe:spec_decode_acceptance_drop:{w}",
        "monitor_mean_accept_len_tokens": f"specprobe:spec_decode_mean_acceptance_length:{w}",
        "monitor_mean_accept_len_baseline_tokens": f"specprobe:spec_decode_mean_acceptance_length_baseline:{b}",
        "monitor_depth_decay_ratio": f"specprobe:spec_decode_depth_decay:{w}",
        "monitor_depth_decay_excess": f"specprobe:spec_decode_depth_decay_excess:{w}",
        "monitor_draft_tokens": f"specprobe:spec_decode_draft_tokens:{w}",
        "monitor_drift_drop_rel": f"specprobe:spec_decode_acceptance_trend_drop:{d}",
    }


def recording_rules(engine: str, win: Windows) -> list[dict[str, str]]:
    n = NAMES[engine]
    r = record_names(win)
    by = n.by
    w, b = win.w, win.b
    off = f" offset {w}"
    rules: list[dict[str, str]] = []

    def rec(name: str, expr: str) -> None:
        rules.append({"record": name, "expr": expr})

    if n.counters is not None:
        c = n.counters

        def inc(metric: str, rng: str, offset: str = "", labels: str = by) -> str:
            return f"sum by ({labels}) (increase({metric}[{rng}]{offset}))"

        rec(r["monitor_accept_rate"], f"{inc(c['accepted'], w)} / {inc(c['draft_tokens'], w)}")
        rec(r["monitor_mean_accept_len_tokens"], f"1 + {inc(c['accepted'], w)} / {inc(c['drafts'], w)}")
        rec(r["monitor_draft_tokens"], inc(c["draft_tokens"], w))
        rec(r["monitor_accept_rate_baseline"], f"{inc(c['accepted'], b, off)} / {inc(c['draft_tokens'], b, off)}")
        rec(r["monitor_mean_accept_len_baseline_tokens"], f"1 + {inc(c['accepted'], b, off)} / {inc(c['drafts'], b, off)}")
        rec(r["monitor_accept_rate_drop_rel"], f"1 - {r['monitor_accept_rate']} / {r['monitor_accept_rate_baseline']}")
        if n.per_pos is not None:
            pp, ppb = f"specprobe:spec_decode_acceptance_rate_per_position:{w}", f"specprobe:spec_decode_acceptance_rate_per_position_baseline:{b}"
            rec(pp, f"{inc(n.per_pos, w, labels=f'{by}, position')} / ignoring (position) group_left {inc(c['drafts'], w)}")
            rec(ppb, f"{inc(n.per_pos, b, off, labels=f'{by}, position')} / ignoring (position) group_left {inc(c['drafts'], b, off)}")
            decay = f"min by ({by}) ({pp}) / on ({by}) sum by ({by}) ({pp}{{position=\"0\"}})"
            decay_b = f"min by ({by}) ({ppb}) / on ({by}) sum by ({by}) ({ppb}{{position=\"0\"}})"
            rec(r["monitor_depth_decay_ratio"], decay)
            rec(f"specprobe:spec_decode_depth_decay_baseline:{b}", decay_b)
            rec(r["monitor_depth_decay_excess"], f"1 - {r['monitor_depth_decay_ratio']} / specprobe:spec_decode_depth_decay_baseline:{b}")
        if n.engine_label:
            lab = f"{by}, engine"
            rec(f"specprobe:spec_decode_acceptance_rate_by_engine:{w}", f"{inc(c['accepted'], w, labels=lab)} / {inc(c['draft_tokens'], w, labels=lab)}")
            rec(f"specprobe:spec_decode_mean_acceptance_length_by_engine:{w}", f"1 + {inc(c['accepted'], w, labels=lab)} / {inc(c['drafts'], w, labels=lab)}")
    else:
        g = n.gauges or {}

        def avg(metric: str, rng: str, offset: str = "") -> str:
            return f"avg by ({by}) (avg_over_time({metric}[{rng}]{offset}))"

        rec(r["monitor_accept_rate"], avg(g["accept_rate"], w))
        rec(r["monitor_mean_accept_len_tokens"], avg(g["accept_len"], w))
        rec(r["monitor_accept_rate_baseline"], avg(g["accept_rate"], b, off))
        rec(r["monitor_mean_accept_len_baseline_tokens"], avg(g["accept_len"], b, off))
        # Builds without the rate gauge: accepted tokens per draft (length − 1) falls by the same fraction at a fixed K.
        rec(r["monitor_accept_rate_drop_rel"],
            f"(1 - {r['monitor_accept_rate']} / {r['monitor_accept_rate_baseline']}) or "
            f"(1 - ({r['monitor_mean_accept_len_tokens']} - 1) / ({r['monitor_mean_accept_len_baseline_tokens']} - 1))")
    # The fall of the least-squares line over the drift window: −slope·T ÷ fit(start), fit(start) = mean − slope·T/2.
    series, dr, t = r["monitor_accept_rate"], win.d, win.drift
    rec(r["monitor_drift_drop_rel"],
        f"-(deriv({series}[{dr}]) * {t:g}) / (avg_over_time({series}[{dr}]) - deriv({series}[{dr}]) * {t / 2:g})")
    return rules


# ----------------------------------------------------------------------------- alerts
class NotTranslated(ValueError):
    pass


def _operand(node: Num | Var, names: dict[str, str]) -> str:
    if isinstance(node, Num):
        return f"{node.value:g}"
    if node.name not in names:
        raise NotTranslated(node.name)
    return names[node.name]


def to_promql(node: Any, names: dict[str, str]) -> str:
    """A rule condition as PromQL filters over the recording rules."""
    if isinstance(node, BoolOp):
        if node.op == "not":
            raise NotTranslated("not")
        return f" {node.op} ".join(f"({to_promql(a, names)})" for a in node.args)
    if isinstance(node, Chain):
        parts = []
        for left, op, right in zip(node.operands, node.ops, node.operands[1:], strict=False):
            if isinstance(left, Num) and isinstance(right, Num):
                raise NotTranslated("a comparison of two numbers")
            if isinstance(left, Num):
                left, right, op = right, left, _FLIP[op]
            parts.append(f"{_operand(left, names)} {op} {_operand(right, names)}")
        return parts[0] if len(parts) == 1 else " and ".join(f"({p})" for p in parts)
    raise NotTranslated(type(node).__name__)


def alert_name(rule: Rule) -> str:
    return rule.id + "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", rule.name) if p)


def alerting_rules(table: RuleTable, engine: str, win: Windows, for_: float = 300.0) -> tuple[list[dict[str, Any]], list[str]]:
    """(alerting rules, one line per monitoring rule that could not be translated)."""
    names = {k: v for k, v in record_names(win).items() if _recorded(engine, v, win)}
    by = NAMES[engine].by
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for rule in table.family("monitoring"):
        try:
            expr = to_promql(parse_condition(rule.when), names)
        except NotTranslated as e:
            skipped.append(f"{rule.id} {rule.name} ({rule.when}): {e} has no Prometheus series for {engine}")
            continue
        first = next(iter(rule.metrics), "")
        value = "{{ $value | humanizePercentage }}" if first.endswith(("_rate", "_rel", "_baseline", "_excess")) or "rate" in first else "{{ $value | printf \"%.3g\" }}"
        rule_out: dict[str, Any] = {
            "alert": alert_name(rule),
            "expr": expr,
            "labels": {"severity": rule.severity, "rule_id": rule.id, "engine": engine},
            "annotations": {
                "summary": f"{rule.id} {rule.name} on {{{{ $labels.{by} }}}}: {first} = {value} ({rule.when})",
                "description": _prom_text(rule.diagnosis),
                "remedy": rule.remedy,
            },
        }
        if for_ > 0:
            rule_out["for"] = _w(for_)
        out.append(rule_out)
    return out, skipped


def _prom_text(template: str) -> str:
    """The diagnosis with its {metric} placeholders named, not filled (Prometheus has
    only the alert's own value)."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: m.group(1), template)


def _recorded(engine: str, record: str, win: Windows) -> bool:
    return any(r["record"] == record for r in recording_rules(engine, win))


def rules_document(table: RuleTable, engine: str, win: Windows, *, for_: float = 300.0, interval: float | None = None) -> tuple[dict[str, Any], list[str]]:
    alerts, skipped = alerting_rules(table, engine, win, for_)
    slug = engine.replace(".", "")
    rec_group: dict[str, Any] = {"name": f"specprobe-{slug}-spec-decode-recording", "rules": recording_rules(engine, win)}
    alert_group: dict[str, Any] = {"name": f"specprobe-{slug}-spec-decode-alerts", "rules": alerts}
    if interval:
        rec_group["interval"] = alert_group["interval"] = _w(interval)
    return {"groups": [rec_group, alert_group]}, skipped


# ----------------------------------------------------------------------------- grafana
def dashboard(table: RuleTable, engine: str, win: Windows) -> dict[str, Any]:
    """A Grafana dashboard (schema 39) over the recording rules, one panel per quantity,
    the table's acceptance floors drawn as thresholds."""
    r = record_names(win)
    by = NAMES[engine].by
    floors = sorted({f for f in (_floor(rule) for rule in table.family("monitoring")) if f is not None})
    ds = {"type": "prometheus", "uid": "${datasource}"}
    sel = f'{{{by}=~"${by}"}}'

    def panel(i: int, title: str, exprs: list[tuple[str, str]], unit: str, desc: str, thresholds: list[float] | None = None) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": "red", "value": None}]
        colours = ["orange", "green"]
        for j, t in enumerate(thresholds or []):
            steps.append({"color": colours[min(j, 1)], "value": t})
        if not thresholds:
            steps = [{"color": "green", "value": None}]
        return {
            "id": i, "type": "timeseries", "title": title, "description": desc, "datasource": ds,
            "gridPos": {"h": 8, "w": 12, "x": 12 * ((i - 1) % 2), "y": 8 * ((i - 1) // 2)},
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                         "custom": {"thresholdsStyle": {"mode": "line" if thresholds else "off"}}}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [{"refId": chr(65 + k), "datasource": ds, "expr": e, "legendFormat": lf} for k, (e, lf) in enumerate(exprs)],
        }

    w = win.w
    drops = sorted({t for t in (_threshold(x, "monitor_accept_rate_drop_rel") for x in table.family("monitoring")) if t is not None})
    panels = [
        panel(1, f"Acceptance rate ({w} window)", [(r["monitor_accept_rate"] + sel, f"{{{{{by}}}}}"), (r["monitor_accept_rate_baseline"] + sel, f"{{{{{by}}}}} baseline {win.b}")],
              "percentunit", "Accepted ÷ drafted tokens; the lines are the rules' acceptance floors.", floors),
        panel(2, f"Mean acceptance length ({w} window)", [(r["monitor_mean_accept_len_tokens"] + sel, f"{{{{{by}}}}}")], "short",
              "1 + accepted ÷ drafts: tokens per verify step, the bonus token included."),
        panel(3, "Acceptance drop against the baseline", [(r["monitor_accept_rate_drop_rel"] + sel, f"{{{{{by}}}}}")], "percentunit",
              "1 − current ÷ baseline acceptance.", drops),
        panel(4, f"Acceptance trend over {win.d}", [(r["monitor_drift_drop_rel"] + sel, f"{{{{{by}}}}}")], "percentunit",
              "Fall of the least-squares line through the acceptance series over the drift window."),
    ]
    if NAMES[engine].per_pos is not None:
        panels.append(panel(5, f"Per-position acceptance ({w} window)", [(f"specprobe:spec_decode_acceptance_rate_per_position:{w}{sel}", f"{{{{{by}}}}} d{{{{position}}}}")],
                            "percentunit", "Accepted at draft position i ÷ drafts (position 0-based as the engine labels it)."))
        panels.append(panel(6, "Depth decay (deepest ÷ first position)", [(r["monitor_depth_decay_ratio"] + sel, f"{{{{{by}}}}}")], "percentunit",
                            "How much of depth 1's acceptance survives to the deepest position."))
    if NAMES[engine].engine_label:
        panels.append(panel(7, f"Acceptance per engine ({w} window)", [(f"specprobe:spec_decode_acceptance_rate_by_engine:{w}{sel}", f"{{{{{by}}}}} engine {{{{engine}}}}")],
                            "percentunit", "vLLM's engine label: one series per data-parallel engine.", floors))
    var_query = f"label_values({r['monitor_accept_rate']}, {by})"
    return {
        "title": f"Speculative decoding acceptance — {engine} (specprobe)",
        "uid": f"specprobe-{engine.replace('.', '')}-spec-decode",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["specprobe", "speculative-decoding", engine],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": by, "type": "query", "datasource": ds, "query": {"query": var_query, "refId": "vars"}, "definition": var_query,
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": panels,
        "annotations": {"list": [{"name": "alerts", "datasource": ds, "enable": True, "iconColor": "red",
                                  "expr": 'ALERTS{alertstate="firing", rule_id=~"SP4.*"}', "titleFormat": "{{alertname}}"}]},
    }


def _threshold(rule: Rule, metric: str) -> float | None:
    node = parse_condition(rule.when)
    if isinstance(node, Chain) and len(node.ops) == 1 and any(isinstance(o, Var) and o.name == metric for o in node.operands):
        nums = [o.value for o in node.operands if isinstance(o, Num)]
        return nums[0] if nums else None
    return None


def _floor(rule: Rule) -> float | None:
    """The upper number of a condition `… monitor_accept_rate < N` (an acceptance floor)."""
    node = parse_condition(rule.when)
    if not isinstance(node, Chain):
        return None
    for left, op, right in zip(node.operands, node.ops, node.operands[1:], strict=False):
        if isinstance(left, Var) and left.name == "monitor_accept_rate" and op in ("<", "<=") and isinstance(right, Num):
            return right.value
    return None
