"""Numbers as text, for every report: percentages, fixed decimals, signed changes and
catalogue metrics with their units. Each report passes the mark it shows for a value
that was not measured (`none`), so the terminal, Markdown and HTML keep their looks."""

from __future__ import annotations

import math
from typing import Any

from specprobe.judge.catalog import CATALOG, format_value
from specprobe.metrics.uncertainty import AGREE_SE, combined_z
from specprobe.result import NOTHING_SCORED

DASH = "–"  # en dash: Markdown and HTML
EM_DASH = "—"  # the terminal


def num(value: Any) -> float | None:
    """A number, or None for null/NaN/inf/missing/non-numeric."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    return None


def pct(x: Any, digits: int = 1, none: str = DASH) -> str:
    """0.724 → '72.4%'."""
    v = num(x)
    return none if v is None else f"{100 * v:.{digits}f}%"


def signed_pct(x: Any, none: str = DASH) -> str:
    """-0.05 → '-5.0%' (a relative change)."""
    v = num(x)
    return none if v is None else f"{100 * v:+.1f}%"


def fixed(x: Any, fmt: str = ".3f", none: str = DASH) -> str:
    """A number in a format spec, e.g. fixed(2.345, '.2f') → '2.35'."""
    v = num(x)
    return none if v is None else format(v, fmt)


def plus_minus(x: Any, se: Any, fmt: str = ".2f", none: str = DASH) -> str:
    """A figure ± its standard error in one format: '1.84 ± 0.04' (the figure alone when
    its SE is unknown)."""
    v, s = num(x), num(se)
    if v is None:
        return none
    return format(v, fmt) if s is None else f"{format(v, fmt)} ± {format(s, fmt)}"


def pct_pm(x: Any, se: Any, digits: int = 1, none: str = DASH) -> str:
    """A rate ± its standard error in percent: '48.0 ± 1.2%'."""
    v, s = num(x), num(se)
    if v is None:
        return none
    return pct(v, digits) if s is None else f"{100 * v:.{digits}f} ± {100 * s:.{digits}f}%"


def se_apart(z: Any, none: str = "SE unknown") -> str:
    """A gap in standard errors of the difference, and whether that is agreement:
    '+1.3 SE: within 2' / '−2.6 SE: outside 2'."""
    v = num(z)
    if v is None:
        return none
    return f"{v:+.1f} SE: {'within' if abs(v) <= AGREE_SE else 'outside'} {AGREE_SE:g}"


def metric(name: str, x: Any, none: str = DASH) -> str:
    """A catalogue metric with its unit (counts and flags as integers)."""
    v = num(x)
    if v is None:
        return none
    unit = CATALOG[name].unit if name in CATALOG else ""
    return format_value(name, int(v) if unit in ("count", "bool") else v)


def signed_delta(name: str, x: Any, none: str = DASH) -> str:
    """A difference of two values of a metric: percentage points for fractions."""
    v = num(x)
    if v is None:
        return none
    unit = CATALOG[name].unit if name in CATALOG else ""
    return f"{100 * v:+.1f} pts" if unit == "frac" else f"{v:+.3g}"


# ----------------------------------------------------------------------------- noise
# A change is told from noise at AGREE_SE (two) standard errors (about 95% two-sided under a
# normal law): the reports' "beyond noise" / "within noise", compare's gate and the
# estimate-against-loop agreement all read that one constant. A change of exactly two is within it.
NOISE_Z = AGREE_SE


def metric_se(name: str, x: Any, se: Any, none: str = DASH) -> str:
    """A catalogue metric with its standard error in its unit: '62.3% ± 1.2%',
    '1.84 ± 0.05 tokens', '1.31× ± 0.04'; the metric alone without one."""
    v, s = num(x), num(se)
    if v is None or s is None:
        return metric(name, x, none)
    unit = CATALOG[name].unit if name in CATALOG else ""
    if unit == "frac":
        return pct_pm(v, s)
    if unit == "tokens":
        return f"{v:.2f} ± {s:.2f} tokens"
    if unit == "x":
        return f"{v:.2f}× ± {s:.2f}"
    return f"{metric(name, v)} ± {s:.3g}"


def noise_words(z: Any) -> str:
    """'beyond noise' when a change is more than NOISE_Z standard errors from zero, else
    'within noise'; '' when no standard error is known."""
    v = num(z)
    return "" if v is None else ("beyond noise" if abs(v) > NOISE_Z else "within noise")


def change_with_noise(rel: Any, rel_se: Any, z: Any, none: str = DASH) -> str:
    """A relative change, its standard error and how far it is from noise:
    '+3.1% ± 1.2%, 2.6 SE — beyond noise' (or '… — within noise'); the change alone
    when the results carry no standard error."""
    r, s, zz = num(rel), num(rel_se), num(z)
    if r is None:
        return none
    if s is None or zz is None:
        return signed_pct(r)
    return f"{signed_pct(r)} ± {pct(s)}, {abs(zz):.1f} SE — {noise_words(zz)}"


def k_change_lines(comparison: Any) -> list[str]:
    """τ, acceptance and speedup at the compared K, each with its standard error and the
    change's against its noise: 'τ at K=4: 2.10 ± 0.05 → 1.75 ± 0.06 (−16.7% ± 3.7%, 4.5
    SE — beyond noise)'. Empty when no K was compared."""
    m = comparison.metrics
    k = m.get("compare_k")
    r = next((row for row in comparison.k_table if row.k == k), None)
    if r is None:
        return []
    lines = []
    for label, name, b, b_se, c, c_se in (
        ("τ", "tau_tokens", r.tau_baseline, r.tau_baseline_se, r.tau_candidate, r.tau_candidate_se),
        ("acceptance (accepted ÷ drafted)", "accept_rate", r.accept_rate_baseline, r.accept_rate_baseline_se, r.accept_rate_candidate, r.accept_rate_candidate_se),
        ("speedup", "speedup", r.speedup_baseline, r.speedup_baseline_se, r.speedup_candidate, r.speedup_candidate_se),
    ):
        if b is None and c is None:
            continue
        show = (lambda x, s: pct_pm(x, s, none="n/a")) if name == "accept_rate" else (lambda x, s: plus_minus(x, s, ".2f", none="n/a"))
        change = change_with_noise(m.get(f"{name}_rel_change"), m.get(f"{name}_rel_change_se"), m.get(f"{name}_change_z"), none="n/a")
        lines.append(f"{label} at K={k}: {show(b, b_se)} → {show(c, c_se)} ({change})")
    return lines


# ----------------------------------------------------------------------------- the headline
_SEV_RANK = {"error": 3, "warning": 2, "info": 1}


def headline_source(result: Any) -> Any:
    """The finding the headline verdict of a result (or comparison) comes from: the most
    severe finding whose verdict (or name) the headline repeats."""
    if result.verdict == NOTHING_SCORED:  # the verdict of no finding: nothing to name
        return None
    worst = [f for f in result.findings if f.severity == result.worst_severity]
    return next((f for f in worst if (f.verdict or f.name) == result.verdict), worst[0] if worst else None)


def headline_others(result: Any) -> list[Any]:
    """Less severe findings whose verdict differs from the headline (the acceptance band
    saying "fair" beside a warning that set the headline)."""
    src = headline_source(result)
    if src is None:
        return []
    return [f for f in result.findings if f.verdict and f.verdict != result.verdict and _SEV_RANK[f.severity] < _SEV_RANK[src.severity]]


def headline_reason(result: Any) -> str:
    """'from SP102 kl-undertrained (warning); SP204 says "fair" (info) — the most severe
    finding sets the headline', or '' when there are no findings."""
    src = headline_source(result)
    if src is None:
        return ""
    text = f"from {src.rule_id} {src.name} ({src.severity})"
    others = headline_others(result)
    if others:
        text += "; " + "; ".join(f'{f.rule_id} says "{f.verdict}" ({f.severity})' for f in others) + " — the most severe finding sets the headline"
    return text


# ----------------------------------------------------------------------------- the procedure
# What the alignment measure is called wherever it stands beside the procedure's numbers.
ALIGNMENT = "alignment α = Σ min(p, q)"


def greedy_procedure(result: Any) -> bool:
    """Whether the result's τ and speedups follow greedy drafts (acceptance p_target(draft))."""
    p = getattr(result, "procedure", None)
    return p is not None and p.drafting == "greedy"


def procedure_headline(result: Any, none: str = DASH) -> str:
    """'τ 1.96 at K=4 — as vLLM verifies it: greedy drafts, acceptance = p_target(draft token)';
    'τ 1.02 at K=1 (K = 1–2 equivalent) — …' where the cost timing could not tell the best
    K from others (the smallest of them is the best K)."""
    m = result.metrics
    k = m.get("best_k")
    head = f"τ {fixed(m.get('tau_tokens'), '.2f', none=none)} at K={none if k is None else int(k)}"
    words = result.best_k_equivalent_words() if hasattr(result, "best_k_equivalent_words") else None
    if words:  # the timing could not tell these Ks apart: the smallest is the one shown
        head += f" ({words})"
    p = getattr(result, "procedure", None)
    return f"{head} — {p.description}" if p is not None else head


def alignment_note(result: Any, none: str = DASH) -> str:
    """'alignment α = Σ min(p, q) 51.0% (how close q is to p, whatever the engine)', beside
    the procedure's own acceptance."""
    return f"{ALIGNMENT} {pct(result.metrics.get('accept_prob_mean'), none=none)} (how close q is to p, whatever the engine)"


def adaptive_wording(result: Any, threshold: Any, none: str = DASH) -> str:
    """How the adaptive threshold reads in this engine: its own knob where it has one
    (llama.cpp --spec-draft-p-min), else a drafter-confidence threshold."""
    knob = getattr(getattr(result, "procedure", None), "adaptive_knob", None)
    theta = fixed(threshold, ".2f", none=none)
    if knob:
        return f"{knob} {theta} (stop drafting before the first draft whose probability among the drafter's 10 best is below it)"
    return f"stop drafting when drafter confidence < {theta}"


# ----------------------------------------------------------------------------- n-gram drafters
def is_ngram(result: Any) -> bool:
    """Whether the drafter is a model-free n-gram drafter (prompt lookup, llama.cpp's
    ngram-* types): its result counts proposals, not α, KL or greedy agreement."""
    return getattr(getattr(result, "drafter", None), "kind", None) == "ngram"


def ngram_headline(result: Any, none: str = DASH) -> str:
    """'proposes at 36.0% of verify steps, 1.48 tokens a draft, 60.0% of drafted tokens accepted'."""
    m = result.metrics
    return (
        f"proposes at {pct(m.get('ngram_proposal_frac'), none=none)} of verify steps, "
        f"{fixed(m.get('ngram_draft_tokens_mean'), '.2f', none=none)} tokens a draft, "
        f"{pct(m.get('ngram_accept_frac'), none=none)} of drafted tokens accepted"
    )


def ngram_cost_note(result: Any, none: str = DASH) -> str:
    """How an n-gram drafter's speedup was priced: each step's verify pass over its draft
    plus the matching time, timed."""
    c = getattr(result, "cost", None)
    ratio = fixed(result.metrics.get("cost_ratio"), ".4f", none=none)
    match = f"matching {fixed(c.draft_step_ms, '.3f', none=none)} ms a step = {ratio} of a target decode step ({fixed(c.target_step_ms, '.2f', none=none)} ms)" if c is not None else f"matching {ratio} of a target decode step"
    where = f" at batch size {c.batch_size}" if c is not None and c.batch_size else ""
    return f"priced: a step that drafts m tokens costs the target's pass over m + 1 tokens (v_m, timed{where}) plus the matching; {match}"


NGRAM_NOTE = (
    "n-gram drafter (no model) walked along the target's own references: each step proposes from the text so far, "
    "and the reference's next tokens say how many are accepted (a deterministic draft token is accepted with p_target(token)); "
    "α, KL and greedy agreement do not apply."
)


# ----------------------------------------------------------------------------- draft trees
def tree_label(row: Any) -> str:
    """A tree row as its knobs: 'steps=3,topk=4,tokens=8', a static tree by its size."""
    if getattr(row, "paths", None):
        return f"static tree ({len(row.paths)} nodes, depth {row.steps})"
    if row.topk == 1:
        return f"chain K={row.steps}"
    return f"steps={row.steps},topk={row.topk},tokens={row.tokens}"


def tree_depth_rows(result: Any, none: str = DASH) -> list[list[str]]:
    """The run's tree by depth: acceptance of depths 1..d and the accepted node's rank
    (rank 1, 2, 3, 4 and beyond, as shares)."""
    t = result.trees.tree if result.trees is not None else None
    if t is None:
        return []
    rows = []
    for d, acc in enumerate(t.depth_accept, start=1):
        shares = t.rank_shares[d - 1] if d - 1 < len(t.rank_shares) else []
        head = [pct(shares[r], none=none) if r < len(shares) else none for r in range(3)]
        rest = [x for x in shares[3:] if x is not None]
        rows.append([str(d), pct(acc, none=none), *head, pct(sum(rest), none=none) if rest else none])
    return rows


def _tau_range(t: Any) -> str:
    lo, hi = getattr(t, "paths_tau_low_tokens", None), getattr(t, "paths_tau_high_tokens", None)
    return f" (τ {fixed(lo, '.2f', DASH)}–{fixed(hi, '.2f', DASH)} within one standard error of that shift)" if lo is not None and hi is not None else ""


def _ordinal(n: int) -> str:
    """2 -> 2nd, 3 -> 3rd, 11 -> 11th, 21 -> 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def tree_lines(result: Any, none: str = DASH) -> list[str]:
    """The tree section in sentences: the run's tree against its chain, and the grid's
    best tree against its best chain, with how the rounds were priced."""
    tr = result.trees
    if tr is None:
        return []
    out = []
    t = tr.tree
    if t is not None:
        out.append(f"{tree_label(t)}: τ {fixed(t.tau_tokens, '.2f', none)} tokens per round, speedup {fixed(t.speedup, '.2f', none)}× "
                   f"(its chain, K={t.steps}: τ {fixed(t.chain_tau_tokens, '.2f', none)}, {fixed(t.chain_speedup, '.2f', none)}×)")
        if getattr(t, "estimate", None) == "paths":
            stride = getattr(t, "paths_stride", None) or 1
            where = "at every start" if stride == 1 else (f"at every {_ordinal(stride)} start ({t.paths_starts} of {t.paths_positions}), the others estimated along "
                                                          f"the reference shifted by what those measured{_tau_range(t)}")
            out.append(f"this tree was drafted on its candidate paths (each node's children and acceptance after its own path) {where}; "
                       f"the grid's way, along the reference, gives it τ {fixed(t.tau_reference_tokens, '.2f', none)}")
    bt, bc = tr.best_tree, tr.best_chain
    if bt is not None:
        vs = f" against the best chain ({tree_label(bc)}, τ {fixed(bc.tau_tokens, '.2f', none)}, {fixed(bc.speedup, '.2f', none)}×)" if bc is not None else ""
        out.append(f"best tree of the grid: {tree_label(bt)}, τ {fixed(bt.tau_tokens, '.2f', none)}, {fixed(bt.speedup, '.2f', none)}×{vs}")
    if tr.costs:
        out.append(f"tree rounds: {tr.costs}")
    return out


def top_trees(result: Any, n: int = 6) -> list[Any]:
    """The grid's fastest shapes (trees and chains), best first."""
    tr = result.trees
    if tr is None:
        return []
    rows = [r for r in tr.grid if num(r.speedup) is not None]
    return sorted(rows, key=lambda r: (-r.speedup, r.tokens, r.steps))[:n]


def agreement_lines(result: Any) -> list[str]:
    """Per measured K: the estimate against the loop in standard errors of their
    difference (each side's over prompts; the loop's seeds pooled per prompt)."""
    m = result.measured
    out = []
    for r in m.k_table if m is not None else []:
        if r.tau_estimate is None or r.tau_tokens is None:
            continue
        z = combined_z(r.tau_estimate - r.tau_tokens, *(x if x is not None else math.nan for x in (r.tau_estimate_se, r.tau_se)))
        seeds = f" × {r.seeds} seeds" if r.seeds > 1 else ""
        out.append(f"K={r.k}: τ est {plus_minus(r.tau_estimate, r.tau_estimate_se, '.3f')}, meas {plus_minus(r.tau_tokens, r.tau_se, '.3f')} "
                   f"({r.prompts} prompts{seeds}): {signed_pct((r.tau_estimate - r.tau_tokens) / r.tau_tokens if r.tau_tokens else None)}, {se_apart(z)}")
    return out
