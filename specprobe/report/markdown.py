"""Markdown reports for CI job summaries ($GITHUB_STEP_SUMMARY) and PR comments.

GitHub-flavoured Markdown only: headings, tables, one emoji per severity so the verdict
reads at a glance in a list of checks. Pure functions: result in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specprobe.metrics.uncertainty import MIN_DRAFTS, MIN_PROMPTS
from specprobe.report.fmt import (
    DASH,
    NGRAM_NOTE,
    agreement_lines,
    alignment_note,
    change_with_noise,
    fixed,
    greedy_procedure,
    headline_reason,
    is_ngram,
    k_change_lines,
    metric,
    metric_se,
    ngram_cost_note,
    ngram_headline,
    noise_words,
    pct,
    pct_pm,
    plus_minus,
    procedure_headline,
    signed_pct,
    top_trees,
    tree_depth_rows,
    tree_label,
    tree_lines,
)
from specprobe.result import Comparison, Finding, Result

ICON = {"error": "🛑", "warning": "⚠️", "info": "ℹ️", None: "✅"}


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in body]
    return out + [""]


def _findings(findings: Sequence[Finding], empty: str) -> list[str]:
    if not findings:
        return [empty, ""]
    out = []
    for f in findings:
        out.append(f"- {ICON.get(f.severity, '')} **{f.rule_id} {f.name}** ({f.severity}): {f.message}  ")
        out.append(f"  threshold `{f.threshold}` — **remedy:** {f.remedy}")
        out.extend(f"  - {e}" for e in f.evidence)
    return out + [""]


def _headline(result: Result | Comparison, fail_on: str | None) -> str:
    why = headline_reason(result)
    return f"### {ICON.get(result.worst_severity, '')} {(result.verdict or 'no verdict').capitalize()}" + (f"  (gate: fail on {fail_on})" if fail_on else "") + (f"\n\n_{why}_" if why else "")


def render_markdown(result: Result | Comparison, *, fail_on: str | None = None) -> str:
    """A CI summary of a diagnose or simulate result."""
    if isinstance(result, Comparison):
        return render_compare_markdown(result, fail_on=fail_on)
    cfg = result.config
    m = result.metrics
    fail_on = fail_on or cfg.fail_on
    t_temp, d_temp = result.temperatures()
    lines = [
        f"## specprobe {result.command}: `{result.describe()}`",
        "",
        _headline(result, fail_on),
        "",
        f"Temperature {t_temp} (drafter {d_temp}) · prompts {result.prompt_set.name if result.prompt_set else cfg.prompts} "
        f"({m.get('num_prompts')} prompts, {m.get('num_positions')} positions) · references {result.reference or cfg.reference} · {result.created}",
        "",
    ]
    if result.scored and m.get("num_positions") and is_ngram(result):
        lines += [f"**{procedure_headline(result)}** · {ngram_headline(result)} · no model: α, KL and greedy agreement do not apply", ""]
    elif result.scored and m.get("num_positions"):
        lines += [f"**{procedure_headline(result)}** · acceptance {pct(m.get('accept_prob_engine_mean', m.get('accept_prob_mean')))} per draft token · {alignment_note(result)}", ""]
    lines += [
        "#### Findings",
        "",
    ]
    lines += _findings(result.findings, "No rule fired.")
    lines += ["#### Key metrics", ""]
    names = ["accept_prob_mean", "accept_prob_engine_mean", "ngram_proposal_frac", "ngram_draft_tokens_mean", "ngram_accept_frac", "kl_target_draft_nats", "greedy_agree_frac", "accept_prob_domain_min", "tau_tokens", "best_k", "speedup_best", "cost_ratio"]
    lines += _table(("metric", "value"), [[n, metric(n, m.get(n))] for n in names if n in m])

    if is_ngram(result):
        return "\n".join(lines + _ngram_lines(result)) + "\n"
    # α is the alignment measure; under greedy drafting the procedure's acceptance differs: beside it
    extra = ("accept (greedy drafts)",) if greedy_procedure(result) else ()
    engine = (lambda r: [pct(r.accept_prob_engine_mean)]) if extra else (lambda r: [])
    if result.by_domain:
        lines += ["#### α by domain", ""]
        lines += _table(("domain", "positions", "α", "greedy", "KL nats", *extra), [[r.group, r.positions, pct(r.accept_prob_mean), pct(r.greedy_agree_frac), metric("kl_target_draft_nats", r.kl_target_draft_nats), *engine(r)] for r in result.by_domain])
    if result.categories:
        lines += ["#### α by the prompt file's category", ""]
        lines += _table(("category", "positions", "α", "greedy", "KL nats", *extra), [[r.group, r.positions, pct(r.accept_prob_mean), pct(r.greedy_agree_frac), metric("kl_target_draft_nats", r.kl_target_draft_nats), *engine(r)] for r in result.categories])
    mk = {r.k: r for r in result.measured.k_table} if result.measured else {}
    if result.k_table:
        best = result.best_k
        eq, eq_words = result.best_k_equivalent, result.best_k_equivalent_words()  # the smallest of Ks within noise is the best
        lines += ["#### τ and speedup by K (estimate" + (", measured" if mk else "") + ")", ""]
        head = ["K", "τ(K) ± SE", "τ window", "accept rate ± SE", "v_K", "speedup ± SE"] + (["τ measured ± SE", "speedup measured ± SE"] if mk else [])
        body = []
        for r in result.k_table:
            tau = r.tau_renewal_tokens if r.tau_renewal_tokens is not None else r.tau_tokens
            rate = r.accept_rate_renewal if r.accept_rate_renewal is not None else r.accept_rate
            row: list[Any] = [
                f"**{r.k}** (best{', ' + eq_words if eq_words else ''})" if r.k == best else f"{r.k} (≈ best)" if r.k in eq else r.k, plus_minus(tau, r.tau_renewal_se if r.tau_renewal_tokens is not None else None), fixed(r.tau_tokens, ".2f"),
                pct_pm(rate, r.accept_rate_renewal_se if r.accept_rate_renewal is not None else None), fixed(r.verify_factor, ".2f"), _times(r.speedup or 0, r.speedup_se),
            ]
            if mk:
                mm = mk.get(r.k)
                row += [plus_minus(mm.tau_tokens, mm.tau_se) if mm else DASH, _times(mm.speedup, mm.speedup_se) if mm else DASH]
            body.append(row)
        lines += _table(head, body)
        lines += [f"- {line}" for line in agreement_lines(result)] + ([""] if mk else [])
        lines += _cost_lines(result)
    lines += _tree_lines(result)
    d = result.depth
    if d and d.cumulative:
        lines += ["#### Acceptance by draft depth (estimate; depth from 1)", ""]
        se = d.cumulative_se if len(d.cumulative_se) == len(d.depth) else [None] * len(d.depth)
        thin = d.thin if len(d.thin) == len(d.depth) else [False] * len(d.depth)
        lines += _table(("depth", "cumulative r_j ± SE", "conditional a_j"), [[f"{j} (thin)" if t else j, pct_pm(c, e), pct(a)] for j, c, e, a, t in zip(d.depth, d.cumulative, se, d.conditional, thin, strict=False)])
        if any(thin):
            lines += [f"_thin: a depth too thin to read (under {MIN_PROMPTS} prompts or {MIN_DRAFTS} drafts reach it, or its standard error is as large as its rate)._", ""]
    lines.append("_Estimates from teacher forcing" + ("; measured values from real speculative decoding._" if mk else "._"))
    return "\n".join(lines) + "\n"


def _times(x: Any, se: Any) -> str:
    """A speedup ± its standard error: '0.93× ± 0.03'."""
    v = fixed(x, ".2f")
    if v == DASH:
        return v
    return f"{v}×" + (f" ± {fixed(se, '.2f')}" if fixed(se, ".2f") != DASH else "")


def _tree_lines(result: Result) -> list[str]:
    """Draft trees: the run's tree by depth and accepted rank, the fastest shapes, the best tree beside the best chain."""
    if result.trees is None:
        return []
    out: list[str] = []
    rows = tree_depth_rows(result)
    if rows and result.trees.tree is not None:
        out += [f"#### Draft tree `{tree_label(result.trees.tree)}` (estimate)", ""]
        out += _table(("depth", "accepted", "rank 1", "rank 2", "rank 3", "rank ≥ 4"), rows)
    best = top_trees(result)
    if best:
        out += ["#### Fastest draft trees and chains (estimate)", ""]
        out += _table(("tree", "τ", "τ window", "round cost", "speedup"), [[f"`{tree_label(r)}`", fixed(r.tau_tokens, ".2f"), fixed(r.tau_window_tokens, ".2f"), fixed(r.round_cost, ".2f"), f"{fixed(r.speedup, '.2f')}×"] for r in best])
    out += [*(f"- {line}" for line in tree_lines(result)), ""] if tree_lines(result) else []
    return out


def _ngram_lines(result: Result) -> list[str]:
    """An n-gram drafter's walk: by domain, by category, by longest draft K, how it was priced."""
    head = ("verify steps", "proposed", "tokens a draft", "accepted per token", "τ", "speedup")

    def body(rows: Sequence[Any]) -> list[list[Any]]:
        return [[r.group, r.positions, pct(r.ngram_proposal_frac), fixed(r.ngram_draft_tokens_mean, ".2f"), pct(r.accept_prob_engine_mean), fixed(r.tau_tokens, ".2f"), fixed(r.speedup, ".2f") + "×"] for r in rows]

    lines: list[str] = []
    if result.by_domain:
        lines += ["#### n-gram proposals by domain", ""] + _table(("domain", *head), body(result.by_domain))
    if result.categories:
        lines += ["#### n-gram proposals by the prompt file's category", ""] + _table(("category", *head), body(result.categories))
    mk = {r.k: r for r in result.measured.k_table} if result.measured else {}
    if result.k_table:
        best = result.best_k
        lines += ["#### τ and speedup by longest draft K (walked" + (", measured" if mk else "") + ")", ""]
        rows = []
        for r in result.k_table:
            row: list[Any] = [f"**{r.k}** (best)" if r.k == best else r.k, fixed(r.tau_tokens, ".2f"), pct(r.accept_rate), fixed(r.verify_factor, ".2f"), fixed(r.speedup, ".2f") + "×"]
            if mk:
                mm = mk.get(r.k)
                row += [fixed(mm.tau_tokens if mm else None, ".2f"), fixed(mm.speedup if mm else None, ".2f") + ("×" if mm and mm.speedup is not None else "")]
            rows.append(row)
        lines += _table(["K", "τ", "accepted per token", "v_K", "speedup"] + (["τ measured", "speedup measured"] if mk else []), rows)
    lines += [f"_{ngram_cost_note(result)}._", "", f"_{NGRAM_NOTE}_"]
    return lines


def _cost_lines(result: Result) -> list[str]:
    """How the speedups were priced, and the speedup per (batch size, K) when several
    batch sizes were timed."""
    c = result.cost
    if c is None:
        return []
    src = c.sources or {}
    spread = f", spread (IQR ÷ median) {pct(c.spread_rel)}" if c.spread_rel is not None else ""
    lines = [
        "_τ(K): renewal estimate (rounds start where the previous one ended); τ window: every start averaged"
        + (f"; one draft token accepted with {result.procedure.acceptance}. " if result.procedure else ". ") +
        f"speedup = τ ÷ (K·c + v_K) with c = {fixed(c.cost_ratio, '.3f')} ({src.get('cost_ratio', 'measured' if c.measured else 'given')}) and v_K "
        f"({src.get('verify_factor', 'measured')}) at batch size {c.batch_size}{spread}._",
        "",
    ]
    if len(c.batches) > 1:
        ks = [r.k for r in c.batches[0].rows]
        lines += ["#### Estimated speedup by batch size and K", ""]
        body = []
        for b in c.batches:
            by_k = {r.k: r.speedup for r in b.rows}
            body.append([b.batch_size, fixed(b.cost_ratio, ".3f")] + [fixed(by_k.get(k), ".2f") + ("×" if by_k.get(k) is not None else "") for k in ks] + [b.best_k, fixed(b.speedup_best, ".2f") + "×"])
        lines += _table(["batch", "c"] + [f"K={k}" for k in ks] + ["best K", "best"], body)
    return lines


def render_compare_markdown(comparison: Comparison, *, fail_on: str | None = None) -> str:
    """A CI summary of a compare result (the drafter release gate)."""
    b, c = comparison.baseline, comparison.candidate
    fail_on = fail_on or comparison.config.fail_on
    lines = [
        f"## specprobe compare: `{c.drafter}` against baseline `{b.drafter}`",
        "",
        _headline(comparison, fail_on),
        "",
        f"Target {c.target_name or c.target} · prompts {c.prompt_set}",
        "",
    ]
    lines += [f"> {n}" for n in comparison.notes]
    if comparison.notes:
        lines.append("")
    lines += ["#### Findings", ""]
    lines += _findings(comparison.findings, "No regression rule fired.")
    if comparison.overall:
        lines += ["#### Overall", "", "± one standard error over prompts, where the results carry one; a change is beyond noise at two standard errors.", ""]
        body = []
        for r in comparison.overall:
            rel = r.rel_change
            mark = " 🔻" if r.worse and rel is not None and abs(rel) >= 0.05 and noise_words(r.delta_z) != "within noise" else ""
            body.append([r.metric, metric_se(r.metric, r.baseline, r.baseline_se), metric_se(r.metric, r.candidate, r.candidate_se), change_with_noise(rel, r.rel_change_se, r.delta_z) + mark])
        lines += _table(("metric", "baseline", "candidate", "relative"), body)
    k_lines = k_change_lines(comparison)
    if k_lines:
        lines += [f"#### At K = {comparison.metrics.get('compare_k')}, the draft length the gate compares", ""]
        lines += [f"- {line}" for line in k_lines] + [""]
    if comparison.by_domain:
        lines += ["#### α by domain", ""]
        lines += _table(("domain", "baseline", "candidate", "relative"), [[d.group, pct(d.baseline), pct(d.candidate), signed_pct(d.rel_change)] for d in comparison.by_domain])
    if comparison.by_depth:
        thin = any(d.thin_baseline or d.thin_candidate for d in comparison.by_depth)
        lines += [f"#### Acceptance by draft depth ({comparison.depth_source}; depth from 1)", ""]
        if thin:
            lines += ["_thin: a depth too thin to read (too few prompts or drafts reach it, or its standard error is as large as its rate)._", ""]

        def r_j(x: float | None, se: float | None, is_thin: bool | None) -> str:
            return pct_pm(x, se) + (" (thin)" if is_thin else "")

        lines += _table(("depth", "r_j base", "r_j cand", "a_j base", "a_j cand"), [
            [d.depth, r_j(d.cumulative_baseline, d.cumulative_baseline_se, d.thin_baseline), r_j(d.cumulative_candidate, d.cumulative_candidate_se, d.thin_candidate), pct(d.conditional_baseline), pct(d.conditional_candidate)]
            for d in comparison.by_depth
        ])
    return "\n".join(lines) + "\n"
