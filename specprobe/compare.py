"""The regression gate: compare a candidate drafter's result against a baseline's.

`compare_results` turns two saved results into deltas (overall, per domain, per draft
depth) and a flat dict of compare metrics (catalogue source "compare"); the SP5xx rules
in the rules table judge those metrics, so what counts as a regression is data, not
code. Pure functions over plain dicts: no torch, nothing printed.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

from specprobe import __version__
from specprobe.catalog import CATALOG
from specprobe.errors import InputError
from specprobe.report.load import describe, measured, num, rows
from specprobe.rules import Chain, Num, RuleTable, Var, sort_findings, verdict, worst_severity

# Overall metrics shown in the delta table, in reading order.
OVERALL_METRICS = (
    "accept_prob_mean",
    "greedy_agree_frac",
    "kl_target_draft_nats",
    "tv_mean",
    "accept_prob_domain_min",
    "accept_prob_high_entropy",
    "cond_accept_depth_decay",
    "tau_tokens",
    "best_k",
    "speedup_best",
    "cost_ratio",
)


def _rel(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base == 0:
        return None
    return (cand - base) / abs(base)


def _delta(base: float | None, cand: float | None) -> float | None:
    return None if base is None or cand is None else cand - base


def _identity(result: Mapping[str, Any]) -> dict[str, Any]:
    target = result.get("target") or {}
    drafter = result.get("drafter") or {}
    cfg = result.get("config") or {}
    ps = result.get("prompt_set") or {}
    return {
        "command": result.get("command"),
        "created": result.get("created"),
        "target": target.get("spec") or cfg.get("target"),
        "target_name": target.get("name"),
        "drafter": drafter.get("spec") or cfg.get("drafter"),
        "drafter_kind": drafter.get("kind"),
        "prompt_set": ps.get("name") or cfg.get("prompts"),
        "prompt_sha256": ps.get("sha256"),
        "temperature": cfg.get("temperature"),
        "draft_temperature": cfg.get("draft_temperature"),
        "reference": result.get("reference"),
        "verdict": result.get("verdict"),
        "describe": describe(result),
    }


def check_comparable(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    allow_target_change: bool = False,
    allow_prompt_change: bool = False,
) -> list[str]:
    """Refuse pairs that cannot be compared; return notes about differences allowed."""
    b, c = _identity(baseline), _identity(candidate)
    notes: list[str] = []
    b_target = b["target_name"] or b["target"]
    c_target = c["target_name"] or c["target"]
    if b_target != c_target:
        if not allow_target_change:
            raise InputError(
                f"the baseline was measured on target {b_target!r}, the candidate on {c_target!r}",
                "acceptance is only comparable on one target; pass --allow-target-change to compare anyway",
            )
        notes.append(f"target changed: {b_target} → {c_target} (allowed by --allow-target-change)")
    b_ps, c_ps = b["prompt_sha256"], c["prompt_sha256"]
    if b_ps != c_ps or b["prompt_set"] != c["prompt_set"]:
        if not allow_prompt_change:
            raise InputError(
                f"the baseline used prompt set {b['prompt_set']!r} ({str(b_ps)[:12]}), the candidate {c['prompt_set']!r} ({str(c_ps)[:12]})",
                "re-run both on the same prompts, or pass --allow-prompt-change",
            )
        notes.append(f"prompt set changed: {b['prompt_set']} ({str(b_ps)[:12]}) → {c['prompt_set']} ({str(c_ps)[:12]}) (allowed by --allow-prompt-change)")
    if b["temperature"] != c["temperature"]:
        notes.append(f"target temperature differs: {b['temperature']} → {c['temperature']}; acceptance depends on it")
    if b["reference"] != c["reference"]:
        notes.append(f"reference trajectories differ: {b['reference']} → {c['reference']}")
    if b["drafter"] == c["drafter"]:
        notes.append("baseline and candidate name the same drafter spec")
    return notes


def _depth_curve(result: Mapping[str, Any], prefer_measured: bool) -> tuple[list[float | None], list[float | None], str]:
    """(cumulative, conditional, source); measured when asked and present."""
    m = measured(result).get("depth")
    if prefer_measured and isinstance(m, dict) and m.get("cumulative"):
        return [num(x) for x in m.get("cumulative", [])], [num(x) for x in m.get("conditional", [])], "measured"
    d = result.get("depth") or {}
    return [num(x) for x in d.get("cumulative", [])], [num(x) for x in d.get("conditional", [])], str(d.get("source") or "estimate")


def kl_band_edges(table: RuleTable | None) -> list[float]:
    """Band boundaries on KL: the constants KL is compared with in the SP1xx rules.

    Taken from the loaded table so that a team that moves the bands with --rules gets
    a regression rule that follows them."""
    edges: set[float] = set()
    for rule in table.family("1") if table else ():
        stack = [rule.condition]
        while stack:
            node = stack.pop()
            if isinstance(node, Chain):
                names = {o.name for o in node.operands if isinstance(o, Var)}
                if names == {"kl_target_draft_nats"}:
                    edges.update(o.value for o in node.operands if isinstance(o, Num))
            elif hasattr(node, "args"):
                stack.extend(node.args)
    return sorted(edges) or [0.5, 1.0, 4.0]


def _band(value: float, edges: Sequence[float]) -> int:
    return sum(1 for e in edges if value >= e)


def compare_results(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    table: RuleTable | None = None,
    allow_target_change: bool = False,
    allow_prompt_change: bool = False,
) -> dict[str, Any]:
    """Deltas and compare metrics (no rules applied; see `judge`)."""
    notes = check_comparable(baseline, candidate, allow_target_change=allow_target_change, allow_prompt_change=allow_prompt_change)
    bm, cm = baseline.get("metrics") or {}, candidate.get("metrics") or {}

    overall = []
    for name in OVERALL_METRICS:
        b, c = num(bm.get(name)), num(cm.get(name))
        if b is None and c is None:
            continue
        hib = CATALOG[name].higher_is_better if name in CATALOG else None
        d = _delta(b, c)
        worse = None if d is None or hib is None else (d < 0 if hib else d > 0)
        overall.append({"metric": name, "baseline": b, "candidate": c, "delta": d, "rel_change": _rel(b, c), "higher_is_better": hib, "worse": worse})

    b_dom = {r.get("group"): r for r in rows(baseline, "by_domain")}
    c_dom = {r.get("group"): r for r in rows(candidate, "by_domain")}
    by_domain = []
    for g in list(b_dom) + [g for g in c_dom if g not in b_dom]:
        b = num((b_dom.get(g) or {}).get("accept_prob_mean"))
        c = num((c_dom.get(g) or {}).get("accept_prob_mean"))
        by_domain.append({
            "group": g,
            "baseline": b,
            "candidate": c,
            "delta": _delta(b, c),
            "rel_change": _rel(b, c),
            "kl_baseline": num((b_dom.get(g) or {}).get("kl_target_draft_nats")),
            "kl_candidate": num((c_dom.get(g) or {}).get("kl_target_draft_nats")),
            "positions_baseline": (b_dom.get(g) or {}).get("positions"),
            "positions_candidate": (c_dom.get(g) or {}).get("positions"),
        })

    # Compare like with like: measured curves only when both sides have them.
    both_measured = bool(measured(baseline).get("depth")) and bool(measured(candidate).get("depth"))
    b_cum, b_cond, src = _depth_curve(baseline, both_measured)
    c_cum, c_cond, _ = _depth_curve(candidate, both_measured)
    by_depth = []
    for j in range(max(len(b_cum), len(c_cum))):
        bc = b_cum[j] if j < len(b_cum) else None
        cc = c_cum[j] if j < len(c_cum) else None
        ba = b_cond[j] if j < len(b_cond) else None
        ca = c_cond[j] if j < len(c_cond) else None
        by_depth.append({
            "depth": j + 1,
            "cumulative_baseline": bc,
            "cumulative_candidate": cc,
            "conditional_baseline": ba,
            "conditional_candidate": ca,
            "delta_conditional": _delta(ba, ca),
            "rel_change_cumulative": _rel(bc, cc),
        })

    b_k = {r.get("k"): r for r in rows(baseline, "k_table")}
    c_k = {r.get("k"): r for r in rows(candidate, "k_table")}
    k_table = [
        {
            "k": k,
            "tau_baseline": num((b_k.get(k) or {}).get("tau_tokens")),
            "tau_candidate": num((c_k.get(k) or {}).get("tau_tokens")),
            "speedup_baseline": num((b_k.get(k) or {}).get("speedup")),
            "speedup_candidate": num((c_k.get(k) or {}).get("speedup")),
        }
        for k in sorted(set(b_k) | set(c_k), key=lambda x: (x is None, x))
    ]

    metrics = compare_metrics(bm, cm, by_domain, by_depth, kl_band_edges(table))
    return {
        "schema_version": 1,
        "command": "compare",
        "specprobe_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline": _identity(baseline),
        "candidate": _identity(candidate),
        "notes": notes,
        "metrics": metrics,
        "overall": overall,
        "by_domain": by_domain,
        "by_depth": by_depth,
        "depth_source": src,
        "k_table": k_table,
        "verdict": "not judged",
        "worst_severity": None,
        "findings": [],
        "evaluations": [],
    }


def compare_metrics(
    bm: Mapping[str, Any],
    cm: Mapping[str, Any],
    by_domain: Sequence[Mapping[str, Any]],
    by_depth: Sequence[Mapping[str, Any]],
    kl_edges: Sequence[float],
) -> dict[str, Any]:
    """The flat compare metrics the SP5xx rules read (None when not measurable)."""
    b_a, c_a = num(bm.get("accept_prob_mean")), num(cm.get("accept_prob_mean"))
    rel = _rel(b_a, c_a)
    out: dict[str, Any] = {
        "accept_prob_mean_baseline": b_a,
        "accept_prob_mean_candidate": c_a,
        "overall_accept_prob_rel_change": rel,
        "accept_prob_rel_drop_frac": None if rel is None else max(0.0, -rel),
        "speedup_best_rel_change": _rel(num(bm.get("speedup_best")), num(cm.get("speedup_best"))),
        "tau_tokens_rel_change": _rel(num(bm.get("tau_tokens")), num(cm.get("tau_tokens"))),
    }

    paired = [d for d in by_domain if d["baseline"] is not None and d["candidate"] is not None]
    out["domain_accept_prob_min_baseline"] = min((d["baseline"] for d in paired), default=None)
    out["domain_accept_prob_min_candidate"] = min((d["candidate"] for d in paired), default=None)
    # The domain that lost most (relative): "did one domain fall while the mean held?"
    worst = min(paired, key=lambda d: d["rel_change"] if d["rel_change"] is not None else 0.0, default=None)
    out["domain_worst_accept_prob_baseline"] = worst["baseline"] if worst else None
    out["domain_worst_accept_prob_candidate"] = worst["candidate"] if worst else None
    out["domain_worst_rel_drop_frac"] = max(0.0, -(worst["rel_change"] or 0.0)) if worst else None

    # Depth decay: conditional acceptance at the deepest depth both curves reach, over
    # depth 1. The level can move with the drafter; the *shape* says whether deeper
    # drafts compound errors faster.
    pairs = [d for d in by_depth if d["conditional_baseline"] is not None and d["conditional_candidate"] is not None]
    b_decay = c_decay = None
    if len(pairs) >= 2 and pairs[0]["conditional_baseline"] and pairs[0]["conditional_candidate"]:
        b_decay = pairs[-1]["conditional_baseline"] / pairs[0]["conditional_baseline"]
        c_decay = pairs[-1]["conditional_candidate"] / pairs[0]["conditional_candidate"]
    out["cond_accept_decay_baseline"] = b_decay
    out["cond_accept_decay_candidate"] = c_decay
    out["depth_decay_excess"] = None if b_decay is None or c_decay is None else b_decay - c_decay
    out["depth_compared"] = pairs[-1]["depth"] if pairs else None

    b_kl, c_kl = num(bm.get("kl_target_draft_nats")), num(cm.get("kl_target_draft_nats"))
    out["kl_target_draft_nats_baseline"] = b_kl
    out["kl_target_draft_nats_candidate"] = c_kl
    if b_kl is None or c_kl is None:
        out["kl_band_worsened"] = None
        out["kl_band_boundary_crossed_nats"] = None
    else:
        worsened = _band(c_kl, kl_edges) > _band(b_kl, kl_edges)
        crossed = [e for e in kl_edges if b_kl < e <= c_kl]
        out["kl_band_worsened"] = 1 if worsened else 0
        out["kl_band_boundary_crossed_nats"] = max(crossed) if crossed else None
    return out


def _evidence(comparison: Mapping[str, Any]) -> dict[str, list[str]]:
    """Lines that point at the rows behind each compare metric."""
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def signed(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:+.1f}%"

    dom_lines = [
        f"{d['group']}: {pct(d['baseline'])} → {pct(d['candidate'])} ({signed(d['rel_change'])} relative)"
        for d in sorted(comparison["by_domain"], key=lambda d: d["rel_change"] if d["rel_change"] is not None else 0.0)
        if d["baseline"] is not None and d["candidate"] is not None
    ][:3]
    depth_lines = [
        f"depth {d['depth']}: conditional {pct(d['conditional_baseline'])} → {pct(d['conditional_candidate'])}"
        for d in comparison["by_depth"]
        if d["conditional_baseline"] is not None and d["conditional_candidate"] is not None
    ]
    depth_lines = depth_lines[:1] + depth_lines[-1:] if len(depth_lines) > 1 else depth_lines
    return {
        "domain_worst_accept_prob_candidate": dom_lines,
        "depth_decay_excess": depth_lines,
    }


def judge(comparison: dict[str, Any], table: RuleTable, *, fail_on: str = "error") -> dict[str, Any]:
    """Apply the SP5xx rules to a comparison; fills findings, evaluations and verdict."""
    evals = table.evaluate(comparison["metrics"], families=["5"], evidence=_evidence(comparison))
    findings = sort_findings(e.finding for e in evals if e.finding is not None)
    comparison["findings"] = [f.to_dict() for f in findings]
    comparison["evaluations"] = [{"rule_id": e.rule.id, "name": e.rule.name, "severity": e.rule.severity, "status": e.status} for e in evals]
    comparison["verdict"] = verdict(findings, default="no regression")
    comparison["worst_severity"] = worst_severity(findings)
    comparison.setdefault("config", {})["fail_on"] = fail_on
    comparison["config"]["rules"] = list(table.sources)
    return comparison
