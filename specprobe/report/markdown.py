"""Markdown reports for CI job summaries ($GITHUB_STEP_SUMMARY) and PR comments.

GitHub-flavoured Markdown only: headings, tables, one emoji per severity so the verdict
reads at a glance in a list of checks. Pure functions: dict in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specprobe.catalog import CATALOG, format_value
from specprobe.report.load import describe, effective_temperatures, measured, num, rows

ICON = {"error": "🛑", "warning": "⚠️", "info": "ℹ️", None: "✅"}


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in body]
    return out + [""]


def _pct(x: Any) -> str:
    v = num(x)
    return "–" if v is None else f"{100 * v:.1f}%"


def _val(name: str, x: Any) -> str:
    v = num(x)
    if v is None:
        return "–"
    unit = CATALOG[name].unit if name in CATALOG else ""
    return format_value(name, int(v) if unit in ("count", "bool") else v)


def _findings(findings: Sequence[Mapping[str, Any]], empty: str) -> list[str]:
    if not findings:
        return [empty, ""]
    out = []
    for f in findings:
        out.append(f"- {ICON.get(f.get('severity'), '')} **{f.get('rule_id')} {f.get('name')}** ({f.get('severity')}): {f.get('message')}  ")
        out.append(f"  threshold `{f.get('threshold')}` — **remedy:** {f.get('remedy')}")
        out.extend(f"  - {e}" for e in f.get("evidence") or [])
    return out + [""]


def _headline(result: Mapping[str, Any], fail_on: str | None) -> str:
    sev = result.get("worst_severity")
    return f"### {ICON.get(sev, '')} {str(result.get('verdict') or 'no verdict').capitalize()}" + (f"  (gate: fail on {fail_on})" if fail_on else "")


def render_markdown(result: Mapping[str, Any], *, fail_on: str | None = None) -> str:
    """A CI summary of a diagnose or simulate result."""
    if result.get("command") == "compare":
        return render_compare_markdown(result, fail_on=fail_on)
    cfg = result.get("config") or {}
    m = result.get("metrics") or {}
    ps = result.get("prompt_set") or {}
    fail_on = fail_on or cfg.get("fail_on")
    lines = [
        f"## specprobe {result.get('command')}: `{describe(result)}`",
        "",
        _headline(result, fail_on),
        "",
        f"Temperature {effective_temperatures(result)[0]} (drafter {effective_temperatures(result)[1]}) · prompts {ps.get('name') or cfg.get('prompts')} "
        f"({m.get('num_prompts')} prompts, {m.get('num_positions')} positions) · references {result.get('reference') or cfg.get('reference')} · {result.get('created')}",
        "",
        "#### Findings",
        "",
    ]
    lines += _findings(result.get("findings") or [], "No rule fired.")
    lines += ["#### Key metrics", ""]
    names = ["accept_prob_mean", "kl_target_draft_nats", "greedy_agree_frac", "accept_prob_domain_min", "tau_tokens", "best_k", "speedup_best", "cost_ratio"]
    lines += _table(("metric", "value"), [[n, _val(n, m.get(n))] for n in names if n in m])

    dom = rows(result, "by_domain")
    if dom:
        lines += ["#### α by domain", ""]
        lines += _table(("domain", "positions", "α", "greedy", "KL nats"), [[r.get("group"), r.get("positions"), _pct(r.get("accept_prob_mean")), _pct(r.get("greedy_agree_frac")), _val("kl_target_draft_nats", r.get("kl_target_draft_nats"))] for r in dom])
    kt = rows(result, "k_table")
    mk = {r.get("k"): r for r in rows(measured(result), "k_table")}
    if kt:
        best = result.get("best_k")
        lines += ["#### τ and speedup by K (estimate" + (", measured" if mk else "") + ")", ""]
        head = ["K", "τ(K)", "accept rate", "speedup"] + (["τ measured", "speedup measured"] if mk else [])
        body = []
        for r in kt:
            k = r.get("k")
            row = [f"**{k}** (best)" if k == best else k, f"{num(r.get('tau_tokens')) or 0:.2f}", _pct(r.get("accept_rate")), f"{num(r.get('speedup')) or 0:.2f}×"]
            if mk:
                mm = mk.get(k) or {}
                row += [f"{num(mm.get('tau_tokens')):.2f}" if num(mm.get("tau_tokens")) is not None else "–", f"{num(mm.get('speedup')):.2f}×" if num(mm.get("speedup")) is not None else "–"]
            body.append(row)
        lines += _table(head, body)
    d = result.get("depth") or {}
    if d.get("cumulative"):
        lines += ["#### Acceptance by draft depth (estimate; depth from 1)", ""]
        lines += _table(("depth", "cumulative r_j", "conditional a_j"), [[j, _pct(c), _pct(a)] for j, c, a in zip(d.get("depth") or [], d.get("cumulative") or [], d.get("conditional") or [], strict=False)])
    lines.append("_Estimates from teacher forcing" + ("; measured values from real speculative decoding._" if mk else "._"))
    return "\n".join(lines) + "\n"


def render_compare_markdown(comparison: Mapping[str, Any], *, fail_on: str | None = None) -> str:
    """A CI summary of a compare result (the drafter release gate)."""
    b, c = comparison.get("baseline") or {}, comparison.get("candidate") or {}
    fail_on = fail_on or (comparison.get("config") or {}).get("fail_on")
    lines = [
        f"## specprobe compare: `{c.get('drafter')}` against baseline `{b.get('drafter')}`",
        "",
        _headline(comparison, fail_on),
        "",
        f"Target {c.get('target_name') or c.get('target')} · prompts {c.get('prompt_set')}",
        "",
    ]
    lines += [f"> {n}" for n in comparison.get("notes") or []]
    if comparison.get("notes"):
        lines.append("")
    lines += ["#### Findings", ""]
    lines += _findings(comparison.get("findings") or [], "No regression rule fired.")
    ov = comparison.get("overall") or []
    if ov:
        lines += ["#### Overall", ""]
        body = []
        for r in ov:
            rel = num(r.get("rel_change"))
            mark = " 🔻" if r.get("worse") and rel is not None and abs(rel) >= 0.05 else ""
            body.append([r["metric"], _val(r["metric"], r.get("baseline")), _val(r["metric"], r.get("candidate")), ("–" if rel is None else f"{100 * rel:+.1f}%") + mark])
        lines += _table(("metric", "baseline", "candidate", "relative"), body)
    dom = comparison.get("by_domain") or []
    if dom:
        lines += ["#### α by domain", ""]
        lines += _table(("domain", "baseline", "candidate", "relative"), [[d["group"], _pct(d.get("baseline")), _pct(d.get("candidate")), "–" if num(d.get("rel_change")) is None else f"{100 * d['rel_change']:+.1f}%"] for d in dom])
    dep = comparison.get("by_depth") or []
    if dep:
        lines += [f"#### Acceptance by draft depth ({comparison.get('depth_source')}; depth from 1)", ""]
        lines += _table(("depth", "r_j base", "r_j cand", "a_j base", "a_j cand"), [[d["depth"], _pct(d.get("cumulative_baseline")), _pct(d.get("cumulative_candidate")), _pct(d.get("conditional_baseline")), _pct(d.get("conditional_candidate"))] for d in dep])
    return "\n".join(lines) + "\n"
