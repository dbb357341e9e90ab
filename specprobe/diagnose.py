"""The diagnose pipeline, top to bottom: prompts → reference continuations
(`references`) → teacher-forced scoring of target vs drafter (`scoring`) → cost ratio
(`costs`) → accumulators → estimates → rules → a plain result dict (the JSON schema every
report renders). The CLI only wires flags into `DiagnoseConfig`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from specprobe import __version__
from specprobe.alignment import BLOCKING_RULES, compare, effective_sampling
from specprobe.costs import cost_block, environment
from specprobe.errors import ConfigError
from specprobe.metrics.accumulate import THRESHOLDS
from specprobe.options import DiagnoseConfig  # noqa: F401  (re-exported)
from specprobe.progress import Progress
from specprobe.prompts import PromptSet
from specprobe.references import (  # noqa: F401  (encode_prompt, load_prompt_set re-exported)
    dataset_references,
    encode_prompt,
    encode_prompts,
    generate_references,
    load_prompt_set,
)
from specprobe.rules import RuleTable, sort_findings, verdict, worst_severity
from specprobe.scoring import Scored, score

SCHEMA_VERSION = 1


# ----------------------------------------------------------------------------- the pair
@dataclass
class Pair:
    target: Any
    drafter: Any
    sampling: Any
    alignment: Any


def load_pair(cfg: DiagnoseConfig, progress: Progress, target: Any = None, drafter: Any = None) -> Pair:
    """Load target + drafter and run the alignment check (no forward pass yet)."""
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_info, load_model

    if target is None:
        progress.note(f"loading target {cfg.target}")
        tinfo = load_info(cfg.target, progress)
        dinfo = drafter_info(cfg.drafter, tinfo, progress)
        target = load_model(cfg.target, cfg.device, cfg.dtype, progress, info=tinfo)
    if drafter is None:
        dinfo = drafter_info(cfg.drafter, target.info, progress)
        progress.note(f"building drafter {cfg.drafter}")
        drafter = build_drafter(cfg.drafter, target, cfg.device, cfg.dtype, progress, info=None if dinfo is target.info else dinfo)
    draft_gen = None if drafter.info is target.info else drafter.info.generation_config
    pair = effective_sampling(cfg.sampling, target.info.generation_config, draft_gen)
    return Pair(target, drafter, pair, compare(target.info, drafter.info, pair))


# ----------------------------------------------------------------------------- the pipeline
def run_diagnose(cfg: DiagnoseConfig, progress: Progress | None = None, table: RuleTable | None = None, pair: Pair | None = None) -> dict[str, Any]:
    """The whole diagnose job; returns the result dict (JSON schema v1)."""
    from specprobe.rules import load_table

    progress = progress or Progress()
    _check_ranges(cfg)
    table = table or load_table([Path(p) for p in cfg.rules])
    prompt_set = load_prompt_set(cfg)
    pair = pair or load_pair(cfg, progress)
    target, drafter, align = pair.target, pair.drafter, pair.alignment
    result = result_header(cfg, pair, prompt_set)
    metrics: dict[str, Any] = dict(align.metrics)

    # 1. alignment: a pair whose token ids or sampling disagree is not worth a forward pass
    findings0, _ = evaluate_rules(table, metrics, drafter.kind, align.evidence, families=("0",))
    blocking = [f for f in findings0 if f.rule_id in BLOCKING_RULES and f.severity == "error"]
    if blocking and not cfg.force:
        result["metrics"] = metrics
        findings, evals = evaluate_rules(table, metrics, drafter.kind, align.evidence)
        result.update(verdict_block(findings, evals))
        result["stopped"] = f"alignment errors ({', '.join(f.rule_id for f in blocking)}) make scoring meaningless; no forward pass was run (use --force to score anyway)"
        return result

    # 2. references: what the target would write (or the dataset's responses)
    prompts = list(prompt_set.prompts)
    encoded = encode_prompts(target, prompts, cfg.max_new_tokens)
    if cfg.reference == "dataset":
        conts = dataset_references(target.tokenizer, prompts, cfg.max_new_tokens)
    else:
        conts = generate_references(target, encoded, pair.sampling.target, cfg, progress)
    references_cut = bool(getattr(conts, "interrupted", False))
    if references_cut:
        progress.note("interrupted while generating references: scoring the prompts finished so far")

    # 3. scoring: target vs drafter, teacher-forced over those references
    scored = score(target, drafter, prompts, encoded, conts, pair.sampling, cfg, progress)
    scored.interrupted = scored.interrupted or references_cut

    # 4. cost: the drafter's price per step, then estimates and rules
    progress.note("measuring the drafter/target cost ratio on the device")
    cost = cost_block(target, drafter, cfg.cost_ratio)
    return build_result(result, metrics, scored, cost, cfg, table, drafter.kind, align.evidence)


def _check_ranges(cfg: DiagnoseConfig) -> None:
    if cfg.k_max < 1 or cfg.k_max > 32:
        raise ConfigError(f"--k-max {cfg.k_max} is out of range", "use 1 ≤ K ≤ 32")
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {cfg.max_new_tokens} must be at least 1", "use e.g. 64")
    if cfg.batch_size < 1:
        raise ConfigError(f"--batch-size {cfg.batch_size} must be at least 1", "use e.g. 8")


# ----------------------------------------------------------------------------- the result dict
# (result assembly: to move into a shared typed-result module)
def result_header(cfg: DiagnoseConfig, pair: Pair, prompt_set: PromptSet) -> dict[str, Any]:
    """What was run, on what, where: the result's first keys (scored/interrupted false)."""
    target, drafter, align = pair.target, pair.drafter, pair.alignment
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "diagnose",
        "specprobe_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "environment": environment(target.device, target.dtype),
        "target": {"spec": cfg.target, "name": target.name, "num_layers": target.num_layers, "vocab_size": target.vocab_size, "params": target.params},
        "drafter": {"spec": cfg.drafter, "kind": drafter.kind, "name": drafter.name, "num_layers": drafter.num_layers, "params": drafter.params},
        "prompt_set": {"name": prompt_set.name, "source": prompt_set.source, "sha256": prompt_set.sha256, "num_prompts": len(prompt_set.prompts), "domains": prompt_set.domains},
        "reference": "off-policy" if cfg.reference == "dataset" else "on-policy",
        "sampling": {"target": pair.sampling.target.to_dict(), "draft": pair.sampling.draft.to_dict(), "sources": pair.sampling.sources},
        "alignment": {"facts": align.facts, "evidence": align.evidence},
        "interrupted": False,
        "scored": False,
    }


def build_result(result: dict[str, Any], metrics: dict[str, Any], scored: Scored, cost: dict[str, Any], cfg: DiagnoseConfig, table: RuleTable, kind: str, evidence: dict[str, list[str]]) -> dict[str, Any]:
    """Header + alignment metrics + scores + cost -> the finished, JSON-safe result."""
    summary = summarise(scored, cost, cfg)
    metrics.update(summary.pop("metrics"))
    summary.pop("accumulator")
    result.update(summary)
    result["metrics"] = metrics
    result["scored"] = True
    result["interrupted"] = scored.interrupted
    if cfg.keep_positions:
        result["positions"] = scored.rows
    findings, evals = evaluate_rules(table, metrics, kind, evidence)
    result.update(verdict_block(findings, evals))
    return clean_json(result)


def summarise(scored: Scored, cost: dict[str, Any], cfg: DiagnoseConfig) -> dict[str, Any]:
    """Accumulators + cost -> metrics, tables, depth curves, K table, adaptive K."""
    from specprobe import estimate

    acc = scored.acc
    s = acc.summary()
    c = cfg.cost_ratio if cfg.cost_ratio is not None else cost["cost_ratio"]
    if c is None or (isinstance(c, float) and math.isnan(c)):
        c = 0.0
    cum = acc.cumulative_depth().tolist()
    cond = estimate.conditional(cum)
    ktab = estimate.k_table(cum, float(s["accept_prob_mean"]), c, cfg.verify_factor) if acc.num_positions else []
    best = estimate.best_k(ktab) if ktab else None
    adaptive = estimate.adaptive_threshold(THRESHOLDS, acc.adaptive, c, cfg.verify_factor) if acc.num_positions else None
    dom = acc.by_domain()
    pos = acc.by_position()
    dom_alpha = [d["accept_prob_mean"] for d in dom if d["positions"]]
    metrics: dict[str, Any] = {
        "accept_prob_mean": s["accept_prob_mean"],
        "greedy_agree_frac": s["greedy_agree_frac"],
        "kl_target_draft_nats": s["kl_target_draft_nats"],
        "kl_target_draft_p90_nats": acc.kl_percentile(0.9),
        "tv_mean": s["tv_mean"],
        "target_entropy_nats": s["target_entropy_nats"],
        "draft_confidence_mean": s["draft_confidence_mean"],
        "accept_prob_domain_min": min(dom_alpha) if dom_alpha else None,
        "accept_prob_domain_spread": (max(dom_alpha) - min(dom_alpha)) if len(dom_alpha) > 1 else None,
        "accept_prob_high_entropy": acc.high_entropy_accept,
        "accept_prob_long_context_ratio": (pos[-1]["accept_prob_mean"] / pos[0]["accept_prob_mean"]) if len(pos) > 1 and pos[0]["accept_prob_mean"] > 0 and pos[-1]["positions"] >= 32 else None,
        "cond_accept_depth_decay": (cond[-1] / cond[0]) if cond and cond[0] and not math.isnan(cond[-1]) else None,
        "tau_tokens": best.tau_tokens if best else None,
        "accept_rate_best_k": best.accept_rate if best else None,
        "best_k": best.k if best else None,
        "speedup_best": best.speedup if best else None,
        "speedup_adaptive": adaptive.speedup if adaptive else None,
        "cost_ratio": c,
        "num_positions": acc.num_positions,
        "num_prompts": acc.num_prompts,
        "reference_off_policy": int(cfg.reference == "dataset"),
    }
    return {
        "metrics": metrics,
        "by_domain": dom,
        "by_entropy": acc.by_entropy(),
        "by_position": pos,
        "histograms": acc.histograms(),
        "depth": {"depth": list(range(1, cfg.k_max + 1)), "cumulative": cum, "conditional": cond, "source": "estimate", "head_depths": list(scored.head_depths)},
        "k_table": [asdict(r) for r in ktab],
        "best_k": best.k if best else None,
        "adaptive": asdict(adaptive) if adaptive else None,
        "cost": {**cost, "cost_ratio": c, "verify_factor": cfg.verify_factor, "measured": cost.get("measured", False) and cfg.cost_ratio is None},
        "accumulator": acc.to_state(),
    }


def evaluate_rules(table: RuleTable, metrics: dict[str, Any], kind: str, evidence: dict[str, list[str]] | None = None, families: tuple[str, ...] = ("0", "1", "2", "3")) -> tuple[list[Any], list[dict[str, Any]]]:
    evals = table.evaluate(metrics, kind=kind, families=families, evidence=evidence)
    findings = sort_findings([e.finding for e in evals if e.finding is not None])
    summary = [{"rule_id": e.rule.id, "name": e.rule.name, "severity": e.rule.severity, "status": e.status} for e in evals]
    return findings, summary


def verdict_block(findings: list[Any], evals: list[dict[str, Any]]) -> dict[str, Any]:
    """verdict, worst_severity, findings, evaluations: the keys every result ends with."""
    return {
        "verdict": verdict(findings, default="no findings"),
        "worst_severity": worst_severity(findings),
        "findings": [f.to_dict() for f in findings],
        "evaluations": evals,
    }


def clean_json(x: Any) -> Any:
    """JSON-safe: nan/inf -> None, numpy -> python."""
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(x, np.integer):
        return int(x)
    return x


# the old private names, still imported by cli/diagnose_cmd.py
_verdict_block = verdict_block
_clean = clean_json
