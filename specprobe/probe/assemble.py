"""Result assembly, shared by check, diagnose and simulate: the run's header, the
estimate's sections from the accumulators, the measured block's catalogue metrics, the
rules' verdict — and the typed `Result` they make (specprobe/result/).

The pipelines compute; this module only arranges what they computed. A new section of
the result (renewal τ, per-category tables, drill-down, head coverage, shard
provenance) is filled in here, next to the others, and declared once in result/run.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from specprobe import __version__
from specprobe.core.environment import environment
from specprobe.engines import GREEDY, get
from specprobe.judge.rules import RuleTable, worst_severity
from specprobe.metrics.uncertainty import combined_z
from specprobe.result import NOTHING_SCORED, Evaluation, Finding, Measured, Result

if TYPE_CHECKING:
    from specprobe.probe.scoring import Scored
    from specprobe.prompts import PromptSet
    from specprobe.settings.pipeline import DiagnoseConfig, SimulateConfig

# Rule families each command judges: alignment, divergence, acceptance, cost (+ calibration).
DIAGNOSE_FAMILIES = ("alignment", "divergence", "acceptance", "cost")
SIMULATE_FAMILIES = (*DIAGNOSE_FAMILIES, "calibration")


# What a result that reached no position says instead of a verdict: without positions,
# the cost ratio alone would set the headline. (Positions reached but all left out for
# non-finite logits are something to judge: SP107 names them.)


def nothing_scored(metrics: Any) -> bool:
    return not metrics.get("num_positions") and not metrics.get("nonfinite_logit_positions")


def created_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- rules
def evaluate_rules(table: RuleTable, metrics: dict[str, Any], kind: str, evidence: dict[str, list[str]] | None = None, families: tuple[str, ...] = DIAGNOSE_FAMILIES) -> tuple[list[Finding], list[Evaluation]]:
    """(findings, worst first; one evaluation per rule: pass / fail / skipped)."""
    return table.evaluate(metrics, kind=kind, families=families, evidence=evidence)


def verdict_fields(table: RuleTable, findings: list[Finding], evaluations: list[Evaluation], default: str = "no findings") -> dict[str, Any]:
    """verdict, worst_severity, findings, evaluations: the fields every result ends with."""
    return {
        "verdict": table.verdict(findings, default=default),
        "worst_severity": worst_severity(findings),
        "findings": findings,
        "evaluations": evaluations,
    }


# ----------------------------------------------------------------------------- check
def check_result(config: dict[str, Any], target: dict[str, Any], drafter: dict[str, Any], sampling: Any, alignment: Any, table: RuleTable) -> Result:
    """`check`: the alignment report judged by the SP0xx rules, no forward pass.
    target/drafter: spec, name (and kind); sampling: the resolved SamplingPair;
    alignment: the AlignmentReport (metrics, evidence, facts)."""
    findings, evals = evaluate_rules(table, alignment.metrics, drafter.get("kind") or "", alignment.evidence, families=("alignment",))
    fields = verdict_fields(table, findings, evals)
    if all(f.severity == "info" for f in findings):
        fields["verdict"] = "aligned"
    return Result.model_validate({
        "command": "check",
        "specprobe_version": __version__,
        "created": created_now(),
        "config": config,
        "target": target,
        "drafter": drafter,
        "sampling": sampling_section(sampling),
        "alignment": {"facts": alignment.facts, "evidence": alignment.evidence},
        "metrics": alignment.metrics,
        **fields,
    })


def sampling_section(pair: Any) -> dict[str, Any]:
    return {"target": pair.target.to_dict(), "draft": pair.draft.to_dict(), "sources": pair.sources}


# ----------------------------------------------------------------------------- diagnose
KV_NOTE = "fp8 KV cache simulated: keys and values rounded to e4m3 with scales 1.0 as the attention reads them"


def kv_note(kv: str) -> str:
    """What a simulated KV cache of `kv` did (fp8, or a llama.cpp ggml type / K/V pair)."""
    if kv == "fp8":
        return KV_NOTE
    return f"{kv} KV cache simulated as llama.cpp stores it: each head's keys and values rounded by ggml's blocks (after its Hadamard rotation for a quantized type), the query as ggml's dot product converts it"


def served(loaded: Any) -> dict[str, Any]:
    """{"quant": …} for a model served quantized or with an fp8 KV cache
    (specprobe.precision.quant), else nothing."""
    q = getattr(loaded, "quant", None)
    kv = getattr(loaded, "kv_cache_dtype", None)
    on_disk = getattr(loaded, "checkpoint_quant", None)  # a quantized checkpoint, dequantized as loaded
    if q is None and kv is None and on_disk is None:
        return {}
    out: dict[str, Any] = {"weights": q.scheme, **{k: v for k, v in q.record().items() if k != "scheme"}} if q is not None else dict(on_disk) if on_disk is not None else {"note": kv_note(str(kv))}
    if kv is not None:
        out["kv_cache_dtype"] = kv
    return {"quant": out}


def served_drafter(drafter: Any) -> dict[str, Any]:
    """The drafter's own quantization, or the target's when it shares the target's weights
    (a self-draft)."""
    own = getattr(drafter, "loaded", None)
    if own is not None:
        return served(own)
    shared = served(getattr(drafter, "target", None)) if drafter.kind in ("layer_skip", "independent") else {}
    if shared:
        shared["quant"]["shared_with_target"] = True
    return shared


def result_header(cfg: DiagnoseConfig, pair: Any, prompt_set: PromptSet) -> dict[str, Any]:
    """What was run, on what, where: the fields every diagnose/simulate result starts with."""
    target, drafter, align = pair.target, pair.drafter, pair.alignment
    return {
        "command": "diagnose",
        "specprobe_version": __version__,
        "created": created_now(),
        "config": cfg.to_dict(),
        "environment": environment(target.device, target.dtype),
        "target": {"spec": cfg.target, "name": target.name, "num_layers": target.num_layers, "vocab_size": target.vocab_size, "params": target.params, **served(target)},
        "drafter": {"spec": cfg.drafter, "kind": drafter.kind, "name": drafter.name, "num_layers": drafter.num_layers, "params": drafter.params, **served_drafter(drafter)},
        "prompt_set": {"name": prompt_set.name, "source": prompt_set.source, "sha256": prompt_set.sha256, "num_prompts": len(prompt_set.prompts), "domains": prompt_set.domains},
        "reference": "off-policy" if cfg.reference == "dataset" else "on-policy",
        "sampling": sampling_section(pair.sampling),
        "procedure": procedure_section(cfg.engine, cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min, thresholds=cfg.thresholds),
        "alignment": {"facts": align.facts, "evidence": align.evidence},
    }


def procedure_section(engine: str, drafting: str, *, p_min: float = 0.0, n_min: int = 0, thresholds: tuple[float, float] = (1.0, 1.0)) -> dict[str, Any]:
    """What the estimates follow: the engine, its drafting and one draft token's acceptance
    law, in words for the headline (with the engine's early stop or relaxed thresholds
    where set), and the engine's own knob for the adaptive threshold."""
    e = get(engine)
    relaxed = drafting == GREEDY and min(thresholds) < 1
    acceptance = "p_target(draft token)" if drafting == GREEDY else "Σ min(p, q)"
    if relaxed:
        acceptance = f"1 where p_target(draft) ≥ {thresholds[0]:g}, else min(1, p_target(draft) ÷ {thresholds[1]:g}) (lossy)"
    words = e.describe(drafting)
    if relaxed:
        words = f"as {e.label} verifies it: greedy drafts, acceptance = {acceptance}"
    if p_min > 0:
        words += f"; drafts stop below --spec-draft-p-min {p_min:g}"
    if n_min > 1:
        words += f", shorter than {n_min} dropped"
    return {
        "engine": e.name,
        "engine_label": e.label,
        "drafting": drafting,
        "acceptance": acceptance,
        "description": words,
        "adaptive_knob": e.adaptive_knob if drafting == GREEDY else None,
    }


def stopped_result(header: dict[str, Any], metrics: dict[str, Any], table: RuleTable, kind: str, evidence: dict[str, list[str]], blocking: list[str]) -> Result:
    """A run that alignment errors stopped before any forward pass: the header, the
    alignment metrics and every rule's verdict on them."""
    findings, evals = evaluate_rules(table, metrics, kind, evidence)
    return Result.model_validate({
        **header,
        "metrics": metrics,
        "stopped": f"alignment errors ({', '.join(blocking)}) make scoring meaningless; no forward pass was run (use --force to score anyway)",
        **verdict_fields(table, findings, evals),
    })


def build_result(header: dict[str, Any], metrics: dict[str, Any], scored: Scored, cost: dict[str, Any], cfg: DiagnoseConfig, table: RuleTable, kind: str, evidence: dict[str, list[str]]) -> Result:
    """Header + alignment metrics + scores + cost -> the finished diagnose result."""
    sections = summarise(scored, cost, cfg)
    metrics = {**metrics, **sections.pop("metrics")}
    if scored.drill is not None:  # token-level evidence and what-ifs (specprobe.probe.drilldown)
        sections["drilldown"], drill_metrics = scored.drill.section(metrics.get("best_k"), sections["by_domain"], metrics.get("accept_prob_mean"))
        metrics.update(drill_metrics)
    # deferred, as in summarise: it reaches the scoring's modules
    from specprobe.probe import long_context

    by_length = long_context.attached(scored)
    if by_length is not None:  # --context-lengths: α, τ and decay by (domain, length); SP209 reads this table
        sections["context_lengths"], length_metrics = by_length.section(metrics.get("best_k"), cfg.k_max, sections.get("cost"))
        metrics.update(length_metrics)
    if scored.nonfinite:  # the prompts SP107 names: left out of every other metric
        evidence = {**evidence, "nonfinite_logit_positions": scored.nonfinite}
    whatif = scored.served_whatif  # a target served quantized (probe.served)
    if whatif is not None:
        metrics.update(whatif.metrics())
    families: tuple[str, ...] = DIAGNOSE_FAMILIES
    if scored.live is not None:  # diagnose --against: the live server beside the prediction (probe.live)
        sections["live"], live_metrics, live_evidence = scored.live
        metrics.update(live_metrics)
        evidence = {**evidence, **live_evidence}
        families = (*DIAGNOSE_FAMILIES, "serving")
    if scored.remote is not None:  # diagnose --target-server: both ends, and what top-n logprobs cannot give (probe.remote)
        sections["remote"], left_out = scored.remote
        metrics.update(left_out)
        sections["by_entropy"] = []  # the target's entropy needs its whole distribution
        for table_name in ("by_domain", "by_category", "by_position"):
            sections[table_name] = [{**row, **{k: None for k in left_out if k in row}} for row in sections.get(table_name) or []]
        if sections.get("histograms"):
            sections["histograms"] = {**sections["histograms"], "kl_target_draft_nats": None}
    metrics["alignment_errors"] = alignment_errors(table, metrics, kind)
    findings, evals = evaluate_rules(table, metrics, kind, evidence, families=families)
    if nothing_scored(metrics):
        findings, evals = _alignment_only(table, metrics, kind, evidence, findings, evals)
    return _nothing_scored(Result.model_validate({
        **header,
        "interrupted": scored.interrupted,
        "scored": True,
        "metrics": metrics,
        **sections,
        "positions": scored.rows if cfg.keep_positions else None,
        **verdict_fields(table, findings, evals),
    }))


def best_k_rivals(rows: Any) -> list[Any]:
    """The other Ks the timing cannot tell from the recommended one: with it, the Ks
    whose speedup range overlaps the fastest K's (`estimate.equivalent_ks`); the smallest
    of them is recommended (`estimate.best_k`) and the rest are its rivals — said so
    (SP312: "K = 1–2 equivalent") rather than presented as measured apart. Nearest in
    speedup first."""
    from specprobe.estimates.estimate import equivalent_ks

    eq = equivalent_ks(rows)
    if len(eq) < 2:
        return []
    rec = eq[0]
    return sorted(eq[1:], key=lambda r: (abs(rec.speedup - r.speedup), r.k))


def _per_drafted(row: Any, drafted: Any) -> Any:
    """Under an early stop a round drafts fewer than K: the renewal acceptance rate is
    accepted ÷ drafted, (τ − 1) over the mean draft length Σ_i D_i ÷ D_1, as llama-server
    counts it — not (τ − 1) ÷ K."""
    d = drafted[row.k - 1, : row.k]
    if d[0] <= 0 or math.isnan(row.tau_renewal_tokens):
        return row
    return replace(row, accept_rate_renewal=(row.tau_renewal_tokens - 1.0) / (float(d.sum()) / float(d[0])))


def _with_standard_errors(rows: list[Any], acc: Any) -> list[Any]:
    """Each K's renewal acceptance, τ and speedup with their standard errors over prompts
    (`Accumulator.renewal_se`); τ − 1 is the acceptance times the mean draft length, and
    the speedup is τ over a round cost fixed at each K, so its relative SE is τ's (the
    cost's own timing spread is speedup_low–speedup_high)."""
    rate_se, _ = acc.renewal_se()
    out = []
    for row in rows:
        se = float(rate_se[row.k - 1]) if row.k <= len(rate_se) else math.nan
        d = acc.renewal_drafted[row.k - 1, : row.k] if row.k <= acc.k_max else None
        length = float(d.sum() / d[0]) if d is not None and d[0] > 0 else float(row.k)
        tau = row.tau_renewal_tokens
        speedup_se = row.speedup * se * length / tau if tau and not math.isnan(tau) else math.nan  # nan τ: the speedup is the window's
        pos, pse = acc.renewal_per_position(row.k)  # per draft position, as the engine counts it
        out.append(replace(row, accept_rate_renewal_se=se, tau_renewal_se=se * length, speedup_se=speedup_se, per_position_renewal=pos, per_position_renewal_se=pse))
    return out


def alignment_errors(table: RuleTable, metrics: dict[str, Any], kind: str) -> int:
    """How many error-level pre-flight (alignment) rules fail on this pair: whether a
    near-zero acceptance can be a broken pairing (SP101, SP201) or is a drafter that never
    learnt the target (SP108, SP216)."""
    findings, _ = evaluate_rules(table, metrics, kind, families=DIAGNOSE_FAMILIES[:1])
    return sum(f.severity == "error" for f in findings)


def _alignment_only(table: RuleTable, metrics: dict[str, Any], kind: str, evidence: dict[str, list[str]], findings: list[Any], evals: list[Evaluation]) -> tuple[list[Any], list[Evaluation]]:
    """No position scored: the alignment rules still judge the pair; every other rule
    reads scores or prices them, so it is skipped rather than failed."""
    _, align = evaluate_rules(table, metrics, kind, evidence, families=DIAGNOSE_FAMILIES[:1])
    ids = {e.rule_id for e in align}
    return [f for f in findings if f.rule_id in ids], [e if e.rule_id in ids or e.status != "fail" else e.model_copy(update={"status": "skipped"}) for e in evals]


def _nothing_scored(result: Result) -> Result:
    if not nothing_scored(result.metrics):
        return result
    return result.model_copy(update={"verdict": NOTHING_SCORED})


def summarise(scored: Scored, cost: dict[str, Any], cfg: DiagnoseConfig) -> dict[str, Any]:
    """Accumulators + cost -> the estimate's metrics and sections: tables by domain,
    entropy and position, histograms, depth curves, K table (renewal τ the headline, the
    window τ beside it), speedup per batch size, adaptive K, cost. The depth curves, τ,
    speedups and adaptive K follow the procedure the accumulator was made for
    (`Accumulator.drafting`); accept_prob_mean stays Σ min(p, q), the alignment measure."""
    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.estimates import estimate
    from specprobe.estimates.costs import price
    from specprobe.metrics.accumulate import THRESHOLDS

    acc = scored.acc
    s = acc.summary()
    cum = acc.cumulative_depth().tolist()
    cond = estimate.conditional(cum)
    # a head that answers fixed depths (Medusa: one per head) drafts nothing deeper: the K
    # table (and every recommendation) stops at its deepest head
    deepest = max(scored.head_depths, default=0)
    k_top = deepest if 1 < deepest < cfg.k_max else cfg.k_max
    priced = price(
        cost, cumulative=cum[:k_top] if acc.num_positions else [], alpha_mean=float(s["accept_prob_engine_mean"]), renewal=acc.renewal_tau()[:k_top].tolist(),
        k_max=k_top, batch_size=cfg.batch_size, cost_ratio=cfg.cost_ratio, verify_factor=cfg.verify_factor, origins=cfg.cost_origins,
        budget=(acc.renewal_tokens, acc.renewal_rounds[:k_top], acc.renewal_drafted[:k_top, :k_top]),  # the renewal sums: speedup at this run's token budget
    )
    ktab, c = priced.k_table, priced.cost_ratio
    if acc.p_min > 0 or acc.n_min > 1:
        ktab = [_per_drafted(r, acc.renewal_drafted) for r in ktab]
    ktab = _with_standard_errors(ktab, acc)
    rivals = best_k_rivals(ktab)
    top = next((r for r in ktab if priced.best is not None and r.k == priced.best.k), None)  # the recommended K (the smallest of those within noise)
    adaptive = estimate.adaptive_threshold(THRESHOLDS, acc.adaptive, c, cfg.verify_factor, priced.verify) if acc.num_positions else None
    dom = acc.by_domain()
    pos = acc.by_position()
    dom_alpha = [d["accept_prob_mean"] for d in dom if d["positions"]]
    metrics: dict[str, Any] = {
        "accept_prob_mean": s["accept_prob_mean"],
        "accept_prob_engine_mean": s["accept_prob_engine_mean"],
        "greedy_agree_frac": s["greedy_agree_frac"],
        "kl_target_draft_nats": s["kl_target_draft_nats"],
        "kl_target_draft_p90_nats": acc.kl_percentile(0.9),
        "tv_mean": s["tv_mean"],
        "target_entropy_nats": s["target_entropy_nats"],
        "draft_confidence_mean": s["draft_confidence_mean"],
        "accept_prob_domain_min": min(dom_alpha) if dom_alpha else None,
        "accept_prob_domain_spread": (max(dom_alpha) - min(dom_alpha)) if len(dom_alpha) > 1 else None,
        "accept_prob_high_entropy": acc.high_entropy_accept,
        "accept_prob_long_context_ratio": acc.long_context_ratio(),
        "cond_accept_depth_decay": (cond[-1] / cond[0]) if cond and cond[0] and not math.isnan(cond[-1]) else None,
        **priced.metrics,
        "speedup_adaptive": adaptive.speedup if adaptive else None,  # the threshold's, winning or not (`adaptive.beats_fixed`)
        "num_positions": acc.num_positions,
        "num_prompts": acc.num_prompts,
        "nonfinite_logit_positions": scored.nonfinite_positions,
        "reference_off_policy": int(cfg.reference == "dataset"),
        "best_k_rivals": len(rivals),
        "best_k_rival": rivals[0].k if rivals else None,
        "best_k_equivalent_max": max(r.k for r in rivals) if rivals else None,
        "speedup_best_low": top.speedup_low if top else None,
        "speedup_best_high": top.speedup_high if top else None,
        "speedup_rival": rivals[0].speedup if rivals else None,
        "speedup_rival_low": rivals[0].speedup_low if rivals else None,
        "speedup_rival_high": rivals[0].speedup_high if rivals else None,
        "acceptance_lossy": int(cfg.lossy),
        "accept_threshold_single": cfg.accept_threshold_single,
        "accept_threshold_acc": cfg.accept_threshold_acc,
    }
    trees = None
    if scored.tree is not None and acc.num_positions:  # draft trees (probe.tree): priced as the chain is
        from specprobe.probe.tree import by_batch as tree_by_batch
        from specprobe.probe.tree import tree_batch, tree_metrics, tree_section

        trees = tree_section(scored.tree, c, priced.verify, tree_batch(cost, cfg.batch_size), cfg.verify_factor)
        trees["by_batch"] = tree_by_batch(scored.tree, cost, k_top, cfg.cost_ratio, cfg.verify_factor)
        metrics.update(tree_metrics(trees, top))
    return {
        "trees": trees,
        "metrics": metrics,
        "by_domain": dom,
        "by_category": acc.by_category(),
        "by_entropy": acc.by_entropy(),
        "by_position": pos,
        "histograms": acc.histograms(),
        "depth": {"depth": list(range(1, cfg.k_max + 1)), "cumulative": cum, "conditional": cond, "source": "estimate", "head_depths": list(scored.head_depths),
                  "cumulative_se": acc.depth_se().tolist(), "thin": acc.depth_thin()},
        "k_table": [asdict(r) for r in ktab],
        # never worse than the best fixed K: a threshold that loses to it is reported, not recommended
        "adaptive": {**asdict(adaptive), "beats_fixed": bool(adaptive.speedup > (priced.metrics.get("speedup_best") or 0.0))} if adaptive else None,
        "cost": priced.section,
    }


# ----------------------------------------------------------------------------- simulate
def simulate_result(estimate: Result, cfg: SimulateConfig, measured: dict[str, Any] | None, table: RuleTable, *, interrupted: bool = False) -> Result:
    """The diagnose estimate on the same prompts + what the real loop measured -> the
    simulate result: its own command and settings, the measured block, the calibration
    metrics, and every rule (SP6xx included) judged again on all the metrics.

    measured None: nothing was measured (the estimate was stopped or interrupted)."""
    fields: dict[str, Any] = {
        **estimate.model_dump(),
        "command": "simulate",
        "config": {**estimate.config.model_dump(), "k": list(cfg.ks), "adaptive_threshold": cfg.adaptive_threshold, "seeds": cfg.seeds},
    }
    if measured is None:
        return Result.model_validate(fields)
    block = Measured.model_validate({**measured, "interrupted": interrupted})
    metrics = {**estimate.metrics, **measured_metrics(block)}
    evidence = dict(estimate.alignment.evidence) if estimate.alignment else {}
    for f in estimate.findings:  # the prompts SP107 named in the estimate stay named
        if "nonfinite_logit_positions" in f.measured:
            evidence.setdefault("nonfinite_logit_positions", list(f.evidence))
    findings, evals = evaluate_rules(table, metrics, estimate.drafter.kind or "", evidence, families=SIMULATE_FAMILIES)
    return Result.model_validate({**fields, "measured": block, "interrupted": interrupted, "metrics": metrics, **verdict_fields(table, findings, evals)})


def measured_metrics(m: Measured) -> dict[str, Any]:
    """Catalogue metrics (source=simulate) from the measured block. Calibration compares
    estimate and measurement at the deepest K measured, where they drift apart first."""
    if not m.k_table:
        return {}
    cal = max(m.k_table, key=lambda r: r.k)
    best = max(m.k_table, key=lambda r: (r.speedup if r.speedup is not None else -1.0, -r.k))
    tau_m, tau_e = cal.tau_tokens, cal.tau_estimate  # tau_estimate: the renewal estimate
    gap = (tau_e - tau_m) / tau_m if tau_m and tau_e is not None else None
    z = combined_z(tau_e - tau_m, *(x if x is not None else math.nan for x in (cal.tau_estimate_se, cal.tau_se))) if tau_m is not None and tau_e is not None else math.nan
    s_gap = cal.speedup_gap
    return {
        "calibration_k": cal.k,
        "tau_measured_tokens": tau_m,
        "tau_estimated_tokens": tau_e,
        "tau_window_estimated_tokens": cal.tau_window,
        "tau_gap_rel": gap,
        "tau_gap_rel_abs": abs(gap) if gap is not None else None,
        "tau_gap_z": None if math.isnan(z) else z,
        "tau_gap_z_abs": None if math.isnan(z) else abs(z),
        "speedup_estimated_cal_k": cal.speedup_estimate,
        "speedup_measured_cal_k": cal.speedup,
        "speedup_gap_rel": s_gap,
        "speedup_gap_rel_abs": abs(s_gap) if s_gap is not None else None,
        "accept_rate_measured": cal.accept_rate,
        "num_drafts_measured": cal.num_drafts,
        "speedup_measured": best.speedup,
        "best_k_measured": best.k,
        "tokens_per_s_measured": best.tokens_per_s,
        "speedup_adaptive_measured": m.adaptive.speedup if m.adaptive else None,
    }
