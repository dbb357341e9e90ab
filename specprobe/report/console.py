"""The terminal report: verdict first (and which finding set it), then findings with
remedies, then the evidence tables. Renders the typed result, so `report` can re-render
saved JSON. Every table is a `Grid` (report.terminal): it fits 80 columns by dropping
or moving columns, never by cutting a rule id, a flag or a number."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from specprobe.metrics.uncertainty import MIN_DRAFTS, MIN_PROMPTS
from specprobe.report.fmt import (
    EM_DASH,
    NGRAM_NOTE,
    adaptive_wording,
    agreement_lines,
    alignment_note,
    change_with_noise,
    fixed,
    greedy_procedure,
    headline_others,
    headline_source,
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
    top_trees,
    tree_depth_rows,
    tree_label,
    tree_lines,
)
from specprobe.report.terminal import Column, Grid
from specprobe.result import BucketRow, Comparison, DomainRow, Finding, Result, SamplingSide

SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", None: "green"}


def _pct(x: float | None) -> str:
    return pct(x, none=EM_DASH)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return fixed(x, fmt, none=EM_DASH)


def _sampling(x: SamplingSide) -> str:
    if x.temperature <= 0:
        return "greedy"
    return f"T={x.temperature:g}" + (f" top_k={x.top_k}" if x.top_k else "") + (f" top_p={x.top_p:g}" if x.top_p < 1 else "")


# ----------------------------------------------------------------------------- the verdict
def headline_reason(result: Result | Comparison) -> Text | None:
    """The headline's finding, styled; None when there are no findings."""
    src = headline_source(result)
    if src is None:
        return None
    line = Text("from ", style="dim")
    line.append(f"{src.rule_id} {src.name}", style=SEV_STYLE.get(src.severity, ""))
    line.append(f" ({src.severity})", style="dim")
    others = headline_others(result)
    if others:
        said = "; ".join(f'{f.rule_id} says "{f.verdict}" ({f.severity})' for f in others)
        line.append(f"; {said} — the most severe finding sets the headline", style="dim")
    return line


def _served_line(tq: Any, dq: Any) -> str | None:
    """Which side was scored with quantized weights, and that it is a simulation."""
    def side(q: Any) -> str:
        acts = f"{q.activations} activations" if getattr(q, "activations", None) else None
        return " + ".join(x for x in (q.weights, acts, f"{q.kv_cache_dtype} KV cache" if q.kv_cache_dtype else None) if x)

    parts = []
    if tq is not None:
        parts.append(f"target {side(tq)}")
    if dq is not None and not dq.shared_with_target:
        parts.append(f"drafter {side(dq)}")
    elif dq is not None:
        parts.append("drafter shares the target's")
    if not parts:
        return None
    rtn = any(q is not None and q.weights and q.method == "rtn" for q in (tq, dq))
    stored = any(q is not None and q.weights and q.method == "checkpoint" for q in (tq, dq))  # a quantized checkpoint or GGUF
    how = " — round-to-nearest simulation, not AWQ/GPTQ calibration" if rtn else " — the weights as the file stores them" if stored else " — simulated"
    return "served quantized: " + ", ".join(parts) + how


def _cost_note(result: Result) -> str | None:
    c = result.cost
    if c is None or c.measured or result.config.cost_ratio is not None:
        return None
    if result.interrupted:
        return "cost ratio not measured (interrupted): speedups assume a drafter that costs nothing"
    return "cost ratio not measured (this drafter has no step model to time): speedups assume a drafter that costs nothing"


def nothing_scored(result: Result) -> bool:
    """A scored run that reached no position (Ctrl-C before the first reference token):
    its numbers are empty, so nothing is judged or tabled."""
    m = result.metrics
    return bool(result.scored) and not m.get("num_positions") and not m.get("nonfinite_logit_positions")


def verdict_panel(result: Result) -> Panel:
    sev = result.worst_severity
    m = result.metrics
    empty = nothing_scored(result)
    lines: list[Text] = [Text(result.verdict.upper(), style="bold yellow" if empty else SEV_STYLE.get(sev, "bold"))]
    why = None if empty else headline_reason(result)
    if why is not None:
        lines.append(why)
    t, d = result.target, result.drafter
    lines.append(Text(f"target  {t.name or t.spec}   drafter  {d.name or d.spec} [{d.kind or '?'}]"))
    served = _served_line(t.quant, d.quant)
    if served:
        lines.append(Text(served, style="yellow"))
    cost = m.get("quant_accept_cost")
    if cost is not None:
        lines.append(Text(
            f"what-if: against the full-precision target the drafter accepts {_pct(m.get('accept_prob_full_target'))}; "
            f"quantization costs {100 * cost:.1f} points of acceptance; the served target accepts {_pct(m.get('target_quant_accept'))} of the full target's own drafts"
        ))
    s = result.sampling
    if s is not None:
        lines.append(Text(f"sampling  target {_sampling(s.target)}   drafter {_sampling(s.draft)}"))
    if empty:
        lines.append(Text("0 positions scored: no acceptance, KL, τ or speedup to show", style="yellow"))
    elif result.scored and is_ngram(result):
        ref = result.reference or "on-policy"
        lines.append(Text(procedure_headline(result, none=EM_DASH), style="bold"))
        lines.append(Text(
            f"{ngram_headline(result, none=EM_DASH)}   speedup {_f(m.get('speedup_best'), '.2f')}×   "
            f"({m.get('num_positions')} positions, {m.get('num_prompts')} prompts, {ref} references, walked along them)"
        ))
        lines.append(Text("no model: α, KL and greedy agreement do not apply", style="dim"))
    elif result.scored:
        ref = result.reference or "on-policy"
        lines.append(Text(procedure_headline(result, none=EM_DASH), style="bold"))
        lines.append(Text(
            f"acceptance {_pct(m.get('accept_prob_engine_mean', m.get('accept_prob_mean')))} per draft token   speedup {_f(m.get('speedup_best'), '.2f')}×   "
            f"({m.get('num_positions')} positions, {m.get('num_prompts')} prompts, {ref} references, teacher-forced estimate)"
        ))
        lines.append(Text(f"{alignment_note(result, none=EM_DASH)}   KL(target‖draft) {_f(m.get('kl_target_draft_nats'))} nats"))
    if result.stopped:
        lines.append(Text(f"stopped: {result.stopped}", style="red"))
    if result.interrupted:
        lines.append(Text("interrupted: these numbers cover only what was computed before Ctrl-C", style="yellow"))
    note = _cost_note(result) if result.scored and not empty else None
    if note:
        lines.append(Text(note, style="yellow"))
    return Panel(Group(*lines), title=f"specprobe {result.command}", border_style=SEV_STYLE.get(sev, "green"))


# ----------------------------------------------------------------------------- findings
def findings_table(findings: list[Finding], title: str = "findings") -> Grid:
    """Severity, rule id and name on the row; the diagnosis, its evidence and the remedy
    under it (moved into columns only where the terminal is wide enough for all)."""
    g = Grid(
        [
            Column("severity", "sev"),
            Column("rule"),
            Column("name"),
            Column("diagnosis", fallback="under", order=1),
            Column("remedy", fallback="under", order=2, label="remedy: "),
        ],
        title=title,
        spaced=True,
    )
    for f in findings:
        g.add(Text(f.severity, style=SEV_STYLE[f.severity]), f.rule_id, f.name, f.message, f.remedy, notes=[f"· {e}" for e in f.evidence])
    return g


# ----------------------------------------------------------------------------- evidence tables
def _group_table(title: str, rows: list[DomainRow] | list[BucketRow], greedy: bool = False) -> Grid:
    """greedy: the procedure's acceptance p_target(draft) beside α, which then differs."""
    cols = [
        Column("group"),
        Column("positions", "n", "right", "drop", 1),
        Column("α alignment", "α", "right"),
        *([Column("accept greedy", "accept", "right", "drop", 5)] if greedy else []),
        Column("greedy agree", "greedy", "right", "drop", 3),
        Column("KL nats", "KL", "right"),
        Column("entropy nats", "H nats", "right", "drop", 4),
        Column("draft conf", "conf", "right", "drop", 2),
    ]
    g = Grid(cols, title=title)
    for r in rows:
        engine = [_pct(r.accept_prob_engine_mean)] if greedy else []
        g.add(r.group, str(r.positions), _pct(r.accept_prob_mean), *engine, _pct(r.greedy_agree_frac), _f(r.kl_target_draft_nats), _f(r.target_entropy_nats), _pct(r.draft_confidence_mean))
    return g


def ngram_group_table(title: str, rows: list[DomainRow]) -> Grid:
    """An n-gram drafter's walk by group: how often it proposes, how long, how much of it
    is accepted, τ and the speedup there."""
    g = Grid(
        [
            Column("group"),
            Column("verify steps", "steps", "right", "drop", 1),
            Column("proposed", "prop", "right"),
            Column("tokens a draft", "len", "right"),
            Column("accepted per token", "accept", "right"),
            Column("τ", None, "right"),
            Column("speedup"),
        ],
        title=title,
    )
    for r in rows:
        g.add(r.group, str(r.positions), _pct(r.ngram_proposal_frac), _f(r.ngram_draft_tokens_mean, ".2f"), _pct(r.accept_prob_engine_mean), _f(r.tau_tokens, ".2f"), f"{_f(r.speedup, '.2f')}×")
    return g


def ngram_k_table(result: Result) -> Grid:
    """An n-gram drafter's draft lengths walked: τ, accepted per drafted token, the verify
    pass's cost and the speedup (no depth curve: a draft's length is the match's)."""
    g = Grid(
        [Column("K (longest draft)", "K", "right"), Column("τ tokens", "τ", "right"), Column("accepted per token", "accept", "right"), Column("v_K", None, "right", "drop", 1), Column("speedup")],
        title="by longest draft K (walked along the references; τ includes the bonus token)",
    )
    best = result.best_k
    for row in result.k_table:
        g.add(str(row.k), _f(row.tau_tokens, ".2f"), _pct(row.accept_rate), _f(row.verify_factor, ".2f"), f"{_f(row.speedup, '.2f')}×" + (" ◀ best" if row.k == best and len(result.k_table) > 1 else ""))
    return g


def length_table(result: Result) -> Grid:
    """diagnose --context-lengths: α, the engine's acceptance, τ and the decay by domain and length."""
    k = result.context_lengths[0].k
    g = Grid([Column("domain"), Column("context tokens", "tokens", "right"), Column("positions", "n", "right", "drop", 2), Column("α alignment", "α", "right"),
              Column("accept", "acc", "right", "drop", 3), Column(f"τ at K={k}", "τ", "right"), Column("α ÷ α shortest", "decay", "right", "drop", 1),
              Column(f"speedup at K={k}", "×", "right", "drop", 4)],
             title="by context length (prompts built to each length; speedup under each length's own costs)")
    for r in result.context_lengths:
        g.add(r.domain, str(r.context_tokens), str(r.positions), _pct(r.accept_prob_mean), _pct(r.accept_prob_engine_mean), _f(r.tau_tokens, ".2f"), _f(r.decay, ".2f"),
              f"{_f(r.speedup, '.2f')}×" if r.speedup is not None else EM_DASH)
    return g


def per_position_estimate(result: Result, k: int | None) -> tuple[list[Any], list[Any]]:
    """The estimate to set beside a per-draft-position count at K (vLLM's counting):
    the K row's renewal rates (rounds start where the previous one ended, as in the
    loop), else the depth curve (every start position), which reads higher where a
    rejection is followed by harder text."""
    row = next((r for r in result.k_table if r.k == k), None)
    if row is not None and row.per_position_renewal:
        return list(row.per_position_renewal), list(row.per_position_renewal_se)
    return (list(result.depth.cumulative), list(result.depth.cumulative_se)) if result.depth else ([], [])


def depth_k_table(result: Result) -> Grid:
    g = Grid(
        [
            Column("K", justify="right"),
            Column("r_K cumulative", "r_K", "right"),
            Column("± standard error of r_K over prompts", "r ±SE", "right", "drop", 8),
            Column("a_K conditional", "a_K", "right", "drop", 2),
            Column("τ(K) tokens", "τ(K)", "right"),
            Column("± standard error of τ(K) over prompts", "±SE", "right", "drop", 7),
            Column("τ window", "τ win", "right", "drop", 5),
            Column("accept rate", "acc", "right", "drop", 3),
            Column("i.i.d. τ", "iid τ", "right", "drop", 4),
            Column("v_K", None, "right", "drop", 6),
            Column("speedup", justify="left"),
        ],
        title="by draft depth / K (teacher-forced" + (f", acceptance = {result.procedure.acceptance}" if result.procedure else "") + "; τ(K) renewal, τ win window)",
    )
    cum = result.depth.cumulative if result.depth else []
    cum_se = result.depth.cumulative_se if result.depth else []
    thin = result.depth.thin if result.depth else []
    cond = result.depth.conditional if result.depth else []
    best = result.best_k
    equivalent = result.best_k_equivalent  # Ks the cost timing cannot tell apart; best is the smallest (SP312)
    for i, row in enumerate(result.k_table):
        mark = (" ◀ best ≈" if equivalent else " ◀ best") if row.k == best else ""
        if row.k != best and row.k in equivalent:
            mark = " ≈ best"  # within the timing's spread of it (SP312)
        tau = row.tau_renewal_tokens if row.tau_renewal_tokens is not None else row.tau_tokens
        rate = row.accept_rate_renewal if row.accept_rate_renewal is not None else row.accept_rate
        speedup = f"{_f(row.speedup, '.2f')}×" + (f" ± {_f(row.speedup_se, '.2f')}" if row.speedup_se is not None else "")
        g.add(
            _thin(str(row.k), thin, i), _thin(_pct(cum[i] if i < len(cum) else None), thin, i), _pct(cum_se[i] if i < len(cum_se) else None), _pct(cond[i] if i < len(cond) else None),
            _f(tau, ".2f"), _f(row.tau_renewal_se, ".2f"), _f(row.tau_tokens, ".2f"), _pct(rate), _f(row.iid_tau_tokens, ".2f"), _f(row.verify_factor, ".2f"),
            f"{speedup}{mark}",
        )
    if any(thin):
        g.caption = THIN_NOTE
    return g


THIN_NOTE = f"dim: a depth too thin to read (under {MIN_PROMPTS} prompts or {MIN_DRAFTS} drafts reach it, or its SE ≥ its rate)"


def _thin(text: str, thin: list[bool], i: int) -> Text | str:
    """A depth's cell, dimmed where the depth is too thin to read."""
    return Text(text, style="dim") if i < len(thin) and thin[i] else text


def tree_tables(result: Result) -> list[Grid]:
    """Draft trees: the run's tree by depth and accepted rank, and the grid's fastest shapes."""
    out = []
    rows = tree_depth_rows(result, none=EM_DASH)
    if rows:
        assert result.trees is not None and result.trees.tree is not None
        g = Grid([Column("depth", justify="right"), Column("accepted", "acc", "right"), Column("rank 1", "r1", "right"), Column("rank 2", "r2", "right"),
                  Column("rank 3", "r3", "right", "drop", 2), Column("rank ≥ 4", "r4+", "right", "drop", 1)],
                 title=f"draft tree {tree_label(result.trees.tree)}: acceptance by depth, and the accepted node's rank among its parent's candidates")
        for r in rows:
            g.add(*r)
        out.append(g)
    best = top_trees(result)
    if best:
        assert result.trees is not None
        bt, bc = result.trees.best_tree, result.trees.best_chain
        g = Grid([Column("tree"), Column("τ", None, "right"), Column("τ window", "τ win", "right", "drop", 2), Column("round cost", "cost", "right", "drop", 1), Column("speedup", justify="left")],
                 title="fastest draft trees and chains (teacher-forced; SGLang's steps, topk, tokens)")
        for r in best:
            mark = " ◀ best tree" if bt is not None and r == bt else " ◀ best chain" if bc is not None and r == bc else ""
            g.add(tree_label(r), _f(r.tau_tokens, ".2f"), _f(r.tau_window_tokens, ".2f"), _f(r.round_cost, ".2f"), f"{_f(r.speedup, '.2f')}×{mark}")
        out.append(g)
    if result.trees is not None and len(result.trees.by_batch) > 1:
        g = Grid([Column("batch", justify="right"), Column("best tree"), Column("speedup", "×", "right"), Column("best chain"), Column("chain speedup", "chain ×", "right")],
                 title="best draft tree and chain by batch size (costs timed at each)")
        for b in result.trees.by_batch:
            g.add(str(b.batch_size), tree_label(b.best_tree) if b.best_tree else EM_DASH, f"{_f(b.best_tree.speedup if b.best_tree else None, '.2f')}×",
                  tree_label(b.best_chain) if b.best_chain else EM_DASH, f"{_f(b.best_chain.speedup if b.best_chain else None, '.2f')}×")
        out.append(g)
    return out


def batch_table(result: Result) -> Grid | None:
    """Estimated speedup per (batch size, K) when several batch sizes were timed."""
    c = result.cost
    if c is None or len(c.batches) < 2:
        return None
    ks = [r.k for r in c.batches[0].rows]
    cols = [Column("batch", justify="right"), Column("c", None, "right", "drop", 1)]
    cols += [Column(f"K={k}", None, "right", "drop", 10 + k) for k in ks]
    g = Grid([*cols, Column("best K", "K*", "right"), Column("best", justify="left")], title="estimated speedup by batch size and K (costs timed at each)")
    for b in c.batches:
        by_k = {r.k: r.speedup for r in b.rows}
        mark = " ◀ run" if b.batch_size == c.batch_size else ""
        g.add(str(b.batch_size), _f(b.cost_ratio, ".3f"), *[f"{_f(by_k.get(k), '.2f')}×" for k in ks], str(b.best_k), f"{_f(b.speedup_best, '.2f')}×{mark}")
    return g


def live_table(result: Result) -> Grid | None:
    """diagnose --against: the live server's acceptance beside the prediction, per
    position and overall, each ± its standard error over prompts."""
    v = result.live
    if v is None:
        return None

    def pm(x: float | None, se: float | None) -> str:
        return f"{_pct(x)} ± {_pct(se)}" if se is not None else _pct(x)

    title = (f"against the live server: {v.engine} {v.engine_version or ''} at {v.url}, K = {v.k}, {v.requests} of {v.prompts} prompts"
             f" ({v.counting}{'; ' + v.stopped if v.stopped else ''})")
    g = Grid([Column(""), Column("served", justify="right"), Column("predicted", justify="right"), Column("gap", justify="right")], title=title)
    for i, (s, sse, p, pse) in enumerate(zip(v.per_position, v.per_position_se, v.predicted_per_position, v.predicted_per_position_se, strict=False), start=1):
        g.add(f"position {i}", pm(s, sse), pm(p, pse), "")
    gap = EM_DASH if v.gap_rel is None else f"{v.gap_rel:+.1%} ({_f(v.gap_z, '+.1f')} SE)"
    g.add("accepted ÷ drafted", pm(v.accept_rate, v.accept_rate_se), pm(v.predicted_accept_rate, v.predicted_accept_rate_se), gap)
    return g


def remote_table(result: Result) -> Grid | None:
    """diagnose --target-server: the K table at both ends of the served target's bounds,
    and how many positions were exact."""
    v = result.remote
    if v is None:
        return None
    exact = "every position exact" if v.exact else f"{v.exact_positions:,} of {v.positions:,} positions exact; the tables above are the LOW ends"
    title = (f"target served by {v.engine} {v.engine_version or ''} at {v.url} ({v.model}), top-{v.logprobs if v.logprobs >= 0 else 'all'} logprobs: {exact}")
    g = Grid([Column("K", justify="right"), Column("τ", justify="right"), Column("accept rate", justify="right"), Column("speedup", justify="right")], title=title)

    def rng(lo: float | None, hi: float | None, fmt: str, unit: str = "") -> str:
        if lo is None or hi is None:
            return EM_DASH
        a, b = format(lo, fmt), format(hi, fmt)
        return f"{a}{unit}" if v.exact or a == b else f"{a}–{b}{unit} (bounds)"

    for r in v.k_table:
        g.add(str(r.k), rng(r.tau_low, r.tau_high, ".3f"), rng(r.accept_rate_low, r.accept_rate_high, ".3f"), rng(r.speedup_low, r.speedup_high, ".2f", "×"))
    g.add("mean", "", rng(v.accept_low, v.accept_high, ".4f"), f"best K {v.best_k_low}" + ("" if v.best_k_low == v.best_k_high else f"–{v.best_k_high}"))
    return g


def remote_lines(result: Result) -> list[str]:
    v = result.remote
    if v is None:
        return []
    rate = f", {v.positions_per_min:,.0f} positions/min" if v.positions_per_min else (f", {v.positions_per_s:,.0f} positions/s" if v.positions_per_s else "")
    wait = f" ({v.server_wait_s:.1f} s waiting on the server)" if v.server_wait_s is not None and v.positions_per_min else ""
    resumed = f"; {v.resumed_prompts} prompts' scores kept from an earlier run" if v.resumed_prompts else ""
    lines = [f"left out (they need the whole target distribution): {', '.join(v.left_out)}",
             f"scoring: {v.requests} requests, {v.bytes / 1e6:.2f} MB, {_f(v.scoring_s, '.1f')} s{rate}{wait}; references {_f(v.reference_s, '.1f')} s{resumed}"]
    if v.widened is not None:
        w = v.widened
        top = "all" if w.logprobs < 0 else str(w.logprobs)
        lines.append(f"widened to top-{top}: {w.made_exact:,} of {w.positions:,} loose positions made exact ({w.prompts} prompts, {w.requests} requests, {w.bytes / 1e6:.2f} MB, {_f(w.seconds, '.1f')} s)")
    return [*lines, *v.notes]


def cost_line(result: Result) -> str | None:
    """How the speedups were priced: what was timed (where, how often, how noisy) and
    what was given."""
    c = result.cost
    if c is None:
        return None
    src = c.sources or {}
    where = f" at batch size {c.batch_size}" + (f" over a {c.context_tokens}-token context" if c.context_tokens else "")
    head = next((b for b in c.batches if b.batch_size == c.batch_size), None)
    parts = [f"round cost K·c + v_K{where}: c = {_f(c.cost_ratio, '.3f')} ({src.get('cost_ratio', 'measured' if c.measured else 'given')}), v_K {src.get('verify_factor', 'given')}"]
    if c.verify_factor is not None:
        parts[0] = f"round cost (1 + K·c)·v{where}: c = {_f(c.cost_ratio, '.3f')} ({src.get('cost_ratio', 'given')}), v = {_f(c.verify_factor, '.2f')} ({src.get('verify_factor', 'given')})"
    if head is not None and head.repeats:
        spread = f", spread {_pct(c.spread_rel)} (IQR ÷ median)" if c.spread_rel is not None else ""
        parts.append(f"{head.repeats} interleaved repeats{spread}, {_f(c.elapsed_s, '.0f')} s")
    return "; ".join(parts) + "".join(f"\n  {n}" for n in [*c.notes, *c.skipped])


def check_facts_table(result: Result) -> Grid:
    g = Grid([Column(""), Column("target", fallback="under", order=1, label="target:  "), Column("drafter", fallback="under", order=2, label="drafter: ")], title="alignment")
    if result.alignment is None:
        return g
    tg, dr = result.alignment.facts.target, result.alignment.facts.drafter
    for key in ("name", "vocab", "tokenizer", "context", "sampling"):
        g.add(key, str(getattr(tg, key)), str(getattr(dr, key)))
    return g


def _ids(xs: list[int] | None) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]" if xs else "[]"


def head_facts(result: Result) -> list[str]:
    """A head drafter's facts as check found them (the same as `--json` writes), one
    short line each: files and widths, the draft vocabulary and its map, the target
    layers each engine feeds it, its embedding and verifier, Medusa heads / MTP layers."""
    head = getattr(result.alignment.facts, "head", None) if result.alignment else None
    if not isinstance(head, dict):
        return []
    top = f"head  {head.get('layout') or head.get('kind')}  {head.get('path', '')}".rstrip()
    hid = head.get("hidden") or {}
    width = f"hidden {hid.get('head', head.get('hidden_size'))}"
    if hid.get("target") is not None:
        width += f" (target {hid['target']})"
    if hid.get("fc_in") is not None:
        n = hid["fc_in"] / hid["target"] if hid.get("target") else None
        width += f", fc input {hid['fc_in']}" + (f" = {n:g} × {hid['target']}" if n and n == int(n) else "")
    lines = [top, f"  {width}" if hid or head.get("hidden_size") is not None else ""]
    v = head.get("vocab")
    if isinstance(v, dict) and v.get("draft") is not None:
        vd, vt = v["draft"], v.get("target")
        cover = f" of the target's {vt} ids ({_pct(vd / vt)})" if vt else ""
        m = result.metrics
        d2t = "d2t absent" if not v.get("d2t") else "d2t all zero" if m.get("d2t_all_zero") else f"d2t {_pct(m['d2t_invalid_frac'])} invalid" if m.get("d2t_invalid_frac") else "d2t valid"
        t2d = "t2d absent" if not v.get("t2d") else "t2d inconsistent" if m.get("t2d_inconsistent") else "t2d consistent"
        maps = f"{d2t}, {t2d}"
        lines.append(f"  draft vocabulary {vd}{cover}; {maps}")
    aux = head.get("aux_layers")
    if isinstance(aux, dict):
        given = f"ids {_ids(aux.get('ids'))}" if aux.get("ids") else "no ids (default 2, L//2, L−3)"
        lines.append(f"  aux layers {given}: vLLM reads hidden_states{_ids(aux.get('vllm'))}, SGLang {_ids(aux.get('sglang'))}; scored {_ids(aux.get('scored'))}")
    heads = head.get("heads")
    if isinstance(heads, dict):
        lines.append(f"  {heads.get('num_heads')} Medusa heads × {heads.get('num_layers')} layers, lm_head {heads.get('lm_head')}")
    mtp = head.get("mtp")
    if isinstance(mtp, dict):
        declared = f" (config declares {mtp['declared']})" if mtp.get("declared") not in (None, mtp.get("layers")) else ""
        lines.append(f"  {mtp.get('layers')} MTP layers{declared}, input {mtp.get('concat')}")
    rest = []
    if head.get("embedding"):
        rest.append(f"embedding {head['embedding']}")
    ver = head.get("verifier")
    if isinstance(ver, dict) and (ver.get("name_or_path") or ver.get("architectures")):
        archs = f" ({', '.join(ver['architectures'])})" if ver.get("architectures") else ""
        rest.append(f"verifier {ver.get('name_or_path') or '?'}{archs}")
    if rest:
        lines.append("  " + "; ".join(rest))
    return [x for x in lines if x]


def render(result: Result, console: Console, full: bool = True) -> None:
    console.print(verdict_panel(result))
    if result.remote is not None and not result.remote.exact:  # never a bounded figure as exact
        v = result.remote
        console.print(f"[yellow]target scored from its served top-{v.logprobs} logprobs: {v.exact_positions:,} of {v.positions:,} positions exact, so every acceptance, τ and speedup figure here is a LOW END "
                      f"(mean acceptance {_f(v.accept_low, '.4f')}–{_f(v.accept_high, '.4f')}, best K {v.best_k_low}–{v.best_k_high}); raise --target-logprobs (and the server's --max-logprobs) to tighten[/]", highlight=False)
    if result.findings:
        console.print(findings_table(result.findings))
    if result.command == "check" or not result.scored or nothing_scored(result):
        console.print(check_facts_table(result))
        for line in head_facts(result):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    if not full:
        return
    if is_ngram(result):
        render_ngram(result, console)
        return
    greedy = greedy_procedure(result)
    if result.by_domain:
        console.print(_group_table("by domain", result.by_domain, greedy))
    if result.categories:
        console.print(_group_table("by the prompt file's category", result.categories, greedy))
    if result.by_entropy:
        console.print(_group_table("by target entropy", result.by_entropy, greedy))
    if result.by_position:
        console.print(_group_table("by context position (tokens before the predicted one)", result.by_position, greedy))
    if result.context_lengths:
        console.print(length_table(result))
    if result.k_table:
        console.print(depth_k_table(result))
    for g in tree_tables(result):
        console.print(g)
    for line in tree_lines(result, none=EM_DASH):
        console.print(line, highlight=False, markup=False)
    a, c = result.adaptive, result.cost
    if a and a.beats_fixed is False:
        best = result.metrics.get("best_k")
        console.print(f"adaptive K: no confidence threshold beats fixed K = {best} (the best, {adaptive_wording(result, a.threshold, none=EM_DASH)}, gives {_f(a.speedup, '.2f')}×): draft K = {best}", highlight=False)
    elif a:
        console.print(f"adaptive K: {adaptive_wording(result, a.threshold, none=EM_DASH)} → τ {_f(a.tau_tokens, '.2f')}, mean K {_f(a.mean_k, '.2f')}, speedup {_f(a.speedup, '.2f')}×", highlight=False)
    if c:
        note = _cost_note(result)
        if note:
            console.print(f"[yellow]{note}[/]", highlight=False)
        else:
            console.print(cost_line(result), highlight=False, markup=False)
        bt = batch_table(result)
        if bt is not None:
            console.print(bt)
    lt = live_table(result)
    if lt is not None:
        console.print(lt)
    rt = remote_table(result)
    if rt is not None:
        console.print(rt)
        for line in remote_lines(result):
            console.print(f"[dim]{line}[/]", highlight=False)
    law = f"one draft token's acceptance = {result.procedure.acceptance}" if result.procedure else "acceptance = α"
    console.print(f"[dim]τ, speedups and adaptive K follow the procedure ({law}); α = Σ min(p, q) is the alignment measure the drafter-quality findings read. KL is computed on the untruncated tempered softmax (T=1 when greedy) so it stays finite; both use each side's sampling distribution.[/]", highlight=False)


def render_ngram(result: Result, console: Console) -> None:
    """The evidence tables of an n-gram drafter's run: by domain, by category, by K and
    how the speedup was priced."""
    if result.by_domain:
        console.print(ngram_group_table("n-gram proposals by domain", result.by_domain))
    if result.categories:
        console.print(ngram_group_table("n-gram proposals by the prompt file's category", result.categories))
    if result.k_table:
        console.print(ngram_k_table(result))
    console.print(ngram_cost_note(result, none=EM_DASH), highlight=False, markup=False)
    console.print(f"[dim]{NGRAM_NOTE}[/]", highlight=False)


# ----------------------------------------------------------------------------- simulate: the measured block
def measured_tables(result: Result, console: Console) -> None:
    """The measured K table (with the estimate and gap beside it) and per-position rates."""
    m = result.measured
    if m is None or not m.k_table:
        if result.scored:
            console.print("[yellow]nothing was measured (interrupted before the first K finished a batch)[/]")
        return
    g = Grid(
        [
            Column("K", justify="right"),
            Column("τ measured ± SE", "τ meas", "right"),
            Column("τ estimate ± SE", "τ est", "right"),
            Column("τ window", "τ win", "right", "drop", 8),
            Column("gap est−meas", "gap", "right", "drop", 4),
            Column("accept rate ± SE", "acc", "right", "drop", 3),
            Column("tokens/s", "tok/s", "right", "drop", 1),
            Column("speedup est", "S est", "right", "drop", 2),
            Column("speedup ± SE", "speedup"),
            Column("drafts", None, "right", "drop", 5),
            Column("draft ms/step", "draft ms", "right", "drop", 7),
            Column("target ms/step", "target ms", "right", "drop", 6),
        ],
        title="measured by real speculative decoding (τ includes the bonus token; ± standard errors over prompts)",
    )
    best = max(m.k_table, key=lambda r: r.speedup if r.speedup is not None and not math.isnan(r.speedup) else -1.0)
    for r in m.k_table:
        mark = " ◀ best" if r is best else ""
        speedup = f"{_f(r.speedup, '.2f')}×" + (f" ± {_f(r.speedup_se, '.2f')}" if r.speedup_se is not None else "")
        g.add(
            str(r.k), plus_minus(r.tau_tokens, r.tau_se, none=EM_DASH), plus_minus(r.tau_estimate, r.tau_estimate_se, none=EM_DASH), _f(r.tau_window, ".2f"), _f(r.tau_gap, "+.2f"),
            pct_pm(r.accept_rate, r.accept_rate_se, none=EM_DASH), _f(r.tokens_per_s, ".1f"), f"{_f(r.speedup_estimate, '.2f')}×", f"{speedup}{mark}", str(r.num_drafts),
            _f(r.draft_ms_per_step, ".1f"), _f(r.target_ms_per_step, ".1f"),
        )
    console.print(g)
    for line in agreement_lines(result):
        console.print(line, highlight=False)
    d = m.depth
    est, est_se = per_position_estimate(result, d.k if d is not None else None)
    if d is not None and d.depth:
        g = Grid(
            [
                Column("position", "pos", "right"),
                Column("accepted", None, "right", "drop", 1),
                Column("r_i measured ± SE", "r_i meas", "right"),
                Column("a_i measured", "a_i meas", "right", "drop", 2),
                Column("r_i estimate ± SE", "r_i est", "right"),
            ],
            title=f"per draft position at K={d.k} (depth from 1; vLLM counting; ± standard errors over prompts)",
        )
        for i, pos in enumerate(d.depth):
            se = d.cumulative_se[i] if i < len(d.cumulative_se) else None
            g.add(_thin(str(pos), d.thin, i), str(d.accepted_per_position[i]), _thin(pct_pm(d.cumulative[i], se, none=EM_DASH), d.thin, i), _pct(d.conditional[i]),
                  pct_pm(est[i] if i < len(est) else None, est_se[i] if i < len(est_se) else None, none=EM_DASH))
        if any(d.thin):
            g.caption = THIN_NOTE
        console.print(g)
    console.print(f"plain target decoding (baseline): {_f(m.baseline_tokens_per_s, '.1f')} tokens/s on the same prompts, device and batch size")
    a = m.adaptive
    if a:
        console.print(
            f"adaptive K≤{a.k_max}, stop when drafter confidence < {_f(a.threshold, 'g')}: {_f(a.tokens_per_verify, '.2f')} tokens per verify, "
            f"mean K {_f(a.mean_k, '.2f')}, accept rate {_pct(a.accept_rate)}, {_f(a.tokens_per_s, '.1f')} tokens/s, speedup {_f(a.speedup, '.2f')}× (measured)"
        )
    if m.interrupted:
        console.print("[yellow]interrupted: the measured numbers cover only what ran before Ctrl-C[/]")


# ----------------------------------------------------------------------------- `report`: the short summary
SUMMARY_METRICS = ("accept_prob_mean", "accept_prob_engine_mean", "ngram_proposal_frac", "ngram_draft_tokens_mean", "ngram_accept_frac", "kl_target_draft_nats", "greedy_agree_frac", "accept_prob_domain_min", "tau_tokens", "best_k", "speedup_best", "cost_ratio", "num_prompts", "num_positions")


def _verdict_line(result: Result | Comparison, console: Console) -> None:
    console.print(f"verdict: [{SEV_STYLE.get(result.worst_severity, 'bold')}]{result.verdict}[/]", highlight=False)
    why = None if isinstance(result, Result) and nothing_scored(result) else headline_reason(result)
    if why is not None:
        console.print(Text("  ") + why)


def render_summary(result: Result, console: Console) -> None:
    """Verdict, findings and key metrics of a saved diagnose/simulate result."""
    console.print(f"[bold]{result.describe()}[/]  [dim]({result.command}, {result.created})[/]", highlight=False)
    _verdict_line(result, console)
    if result.findings:
        console.print(findings_table(result.findings))
    else:
        console.print("[green]no findings[/]")
    m = result.metrics
    if result.scored and not nothing_scored(result):
        console.print(procedure_headline(result, none=EM_DASH), highlight=False, markup=False)
        note = ngram_headline(result, none=EM_DASH) if is_ngram(result) else alignment_note(result, none=EM_DASH)
        console.print(f"  {note}", highlight=False, markup=False)
    g = Grid([Column("metric"), Column("value", justify="right")], title="key metrics (estimates from teacher forcing)")
    for n in SUMMARY_METRICS:
        if n in m:
            g.add(n, metric(n, m[n], none="n/a"))
    console.print(g)
    mk = result.measured.k_table if result.measured else []
    if mk:
        best = max(mk, key=lambda r: r.speedup or -1.0)
        console.print(f"measured (real draft→verify loop): best K={best.k} τ={best.tau_tokens or 0:.2f} speedup {best.speedup or 0:.2f}×")


# ----------------------------------------------------------------------------- `compare`
def render_comparison(comparison: Comparison, console: Console) -> None:
    """Verdict, findings and the overall deltas of a judged comparison; τ, acceptance and
    speedup at the compared K, each change against its noise."""
    b, c = comparison.baseline, comparison.candidate
    console.print(f"[bold]{c.drafter}[/] against baseline [bold]{b.drafter}[/] on {c.target_name or c.target}", highlight=False)
    for note in comparison.notes:
        console.print(f"[dim]note: {note}[/]", highlight=False)
    _verdict_line(comparison, console)
    if comparison.findings:
        console.print(findings_table(comparison.findings))
    g = Grid([Column("metric"), Column("baseline", justify="right"), Column("candidate", justify="right"), Column("relative (± SE)", "relative", justify="right")],
             title="overall (± one standard error over prompts where the results carry one)")
    for r in comparison.overall:
        rel = r.rel_change
        # red: a change for the worse of 5% or more that is not shown to be noise
        style = "red" if r.worse and rel is not None and abs(rel) >= 0.05 and noise_words(r.delta_z) != "within noise" else ""
        g.add(r.metric, metric_se(r.metric, r.baseline, r.baseline_se, none="n/a"), metric_se(r.metric, r.candidate, r.candidate_se, none="n/a"),
              Text(change_with_noise(rel, r.rel_change_se, r.delta_z, none="n/a"), style=style))
    console.print(g)
    for line in k_change_lines(comparison):
        console.print(line, highlight=False)


# ----------------------------------------------------------------------------- `demo`
def demo_table(rows: list[tuple[str, Result]]) -> Grid:
    """One line per demo drafter: alignment, α (the alignment measure), the procedure's
    acceptance, greedy agreement, KL, τ(4) as the engine verifies it; the verdict and the
    finding it comes from beside it, or under it on a narrow terminal."""
    proc = next((r.procedure for _, r in rows if r.procedure is not None), None)
    g = Grid(
        [
            Column("drafter"),
            Column("check"),
            Column("alignment α", "α", "right"),
            # what the engine will count: never the column that gives way
            Column("engine accept", "accept", "right"),
            Column("greedy agree", "greedy", "right", "drop", 4),
            Column("KL nats", "KL", "right", "drop", 2),
            Column("τ(4) ± SE", "τ(4)", "right"),
            Column("verdict (the finding it comes from)", "verdict", fallback="under", order=3),
        ],
        title="specprobe demo — SmolLM2-135M-Instruct target (teacher-forced, on-policy references)"
        + (f"; τ(4) and engine accept {proc.description}; α = Σ min(p, q), the alignment measure" if proc else ""),
    )
    for label, r in rows:
        m = r.metrics
        align_err = [f.rule_id for f in r.findings if f.rule_id.startswith("SP0") and f.severity == "error"]
        check = Text("✗ " + ", ".join(align_err), style="red") if align_err else Text("✓ aligned", style="green")
        row4 = next((row for row in r.k_table if row.k == 4), None)
        # the renewal τ(4) (rounds start where the previous one ended, as the engine counts)
        # ± its standard error over prompts; the window τ where a result has no renewal
        if row4 is None:
            tau4 = EM_DASH
        elif row4.tau_renewal_tokens is not None:
            tau4 = plus_minus(row4.tau_renewal_tokens, row4.tau_renewal_se)
        else:
            tau4 = _f(row4.tau_tokens, ".2f")
        top = headline_source(r)
        diag = Text(r.verdict, style=SEV_STYLE.get(r.worst_severity, "green"))
        if top:
            diag.append(f" ({top.rule_id} {top.name})", style="default")
        g.add(label, check, _pct(m.get("accept_prob_mean")), _pct(m.get("accept_prob_engine_mean")), _pct(m.get("greedy_agree_frac")), _f(m.get("kl_target_draft_nats"), ".2f"), tau4, diag)
    return g
