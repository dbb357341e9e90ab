"""`simulate`: the estimate (diagnose, teacher-forced) and the measurement (the real
draft → verify loop) on the same prompts, and the result's "measured" block."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.core.progress import Progress
from specprobe.drafters.ngram import NgramDrafter
from specprobe.drafters.ngram_mix import MixedDrafter
from specprobe.engines import get
from specprobe.judge.rules import load_table
from specprobe.models.heads.live import (
    UNSUPPORTED_HINT,
    draft_limit,
    refuse_unsupported,
    unsupported,
)
from specprobe.probe.assemble import simulate_result
from specprobe.probe.diagnose import load_pair, run_diagnose
from specprobe.probe.references import load_prompt_set, references_by_turn
from specprobe.result import Result
from specprobe.settings.pipeline import SimulateConfig
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.loop import speculate
from specprobe.simulate.ngram_tree import speculate_ngram_tree
from specprobe.simulate.procedure import Procedure
from specprobe.simulate.sources import is_head
from specprobe.simulate.tree import speculate_tree


def eos_ids(target: Any) -> set[int]:
    """EOS ids from the target's tokenizer and generation config."""
    ids: set[int] = set()
    for src in (getattr(target.info.generation_config, "eos_token_id", None), target.tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return ids


def estimate_by_k(rows: Sequence[Any]) -> dict[int, tuple[float, float, float]]:
    """The estimate's K table -> K: (renewal τ, window τ, estimated speedup); the renewal τ
    falls back to the window τ where it is unknown (as the speedup does). The speedup is
    the one at this run's token budget (final short rounds included), as the loop runs
    it, where the estimate has it; else the steady-state one."""
    out = {}
    for r in rows:
        window = r.tau_tokens if r.tau_tokens is not None else nan
        renewal = r.tau_renewal_tokens if r.tau_renewal_tokens is not None else window
        speedup = r.speedup if r.speedup is not None else nan
        budget = getattr(r, "speedup_budget", None)
        if budget is not None and budget == budget:  # nan: not known
            speedup = float(budget)
        out[r.k] = (renewal, window, speedup)
    return out


def estimate_se_by_k(rows: Sequence[Any]) -> dict[int, float]:
    """The estimate's K table -> K: the renewal τ's standard error over prompts (nan
    where it is unknown)."""
    return {r.k: float(r.tau_renewal_se) if getattr(r, "tau_renewal_se", None) is not None else nan for r in rows}


def _measured_row(c: SimCounters, baseline_tps: float, estimate: dict[int, tuple[float, float, float]], estimate_se: dict[int, float] | None = None) -> dict[str, Any]:
    """One measured K beside the estimate at that K: renewal and window τ, and the
    estimated speedup against the measured one (gaps relative to the measurement); each
    measured figure with its standard error over prompts (`SimCounters`: a prompt's
    seeds pooled into one unit), the speedup's from τ's (the round's cost is the same
    for every prompt at a K; its timing spread is not in it)."""
    k = c.label if c.label is not None else c.k
    est, window, est_speedup = estimate.get(k, (nan, nan, nan))
    tau = c.tau_tokens
    speedup = c.tokens_per_s / baseline_tps if baseline_tps and baseline_tps > 0 else nan
    tau_se = c.tau_se
    return {
        "k": k,
        "tau_tokens": tau,
        "tokens_per_verify": c.tokens_per_verify,
        "accept_rate": c.accept_rate,
        "speedup": speedup,
        "tokens_per_s": c.tokens_per_s,
        "num_drafts": c.num_drafts,
        "draft_ms_per_step": 1e3 * c.draft_s / c.draft_calls if c.draft_calls else float("nan"),
        "target_ms_per_step": 1e3 * c.target_s / c.target_calls if c.target_calls else float("nan"),
        "tau_estimate": est,
        "tau_gap": est - tau,
        "tau_window": window,
        "speedup_estimate": est_speedup,
        "speedup_gap": (est_speedup - speedup) / speedup if speedup and speedup > 0 else nan,
        "emitted_tokens": c.emitted_tokens,
        "wall_s": c.wall_s,
        "prompts": c.prompts // max(c.seeds, 1),
        "seeds": c.seeds,
        "tau_se": tau_se,
        "accept_rate_se": c.accept_rate_se,
        "speedup_se": speedup * tau_se / tau if tau and tau == tau else nan,
        "tau_estimate_se": (estimate_se or {}).get(k, nan),
    }


def tree_block(c: SimCounters, estimate: dict[int, tuple[float, float, float]]) -> dict[str, Any]:
    """A tree run's own evidence: the tree, its measured τ beside the estimate's, and per
    depth how often the accepted node was its parent's rank-1, 2, … candidate."""
    shape = c.tree
    by_rank = [[int(x) for x in row] for row in c.by_rank]
    shares = [[x / sum(row) if sum(row) else None for x in row] for row in by_rank]
    est = estimate.get(c.k, (nan, nan, nan))[0]
    return {
        **shape.to_dict(),
        "label": shape.label(),
        "tau_tokens": c.tau_tokens,
        "tau_estimate": est,
        "mean_acceptance_length": c.mean_acceptance_length,
        "depth_accept": c.cumulative(),
        "accepted_by_rank": by_rank,
        "rank_shares": shares,
        "num_drafts": c.num_drafts,
        "nodes_per_draft": c.mean_k,
    }


def measured_section(runs: list[SimCounters], baseline: SimCounters | None, adaptive: SimCounters | None, estimate: dict[int, tuple[float, float, float]], procedure: Procedure | None = None,
                     estimate_se: dict[int, float] | None = None) -> dict[str, Any]:
    """The result's "measured" block (depth indexed from 1; τ includes the bonus token);
    its note says which draft-and-verify procedure the loop ran. A tree run (its counters
    carry the tree) measures that tree alone: its row sits in k_table at K = its depth."""
    base_tps = baseline.tokens_per_s if baseline is not None else float("nan")
    k_rows = [_measured_row(c, base_tps, estimate, estimate_se) for c in runs if c.num_drafts]
    deepest = max((c for c in runs if c.num_drafts), key=lambda c: c.k, default=None)
    depth = None
    if deepest is not None:
        depth = {
            "k": deepest.k,
            "depth": list(range(1, deepest.k + 1)),
            "cumulative": deepest.cumulative(),
            "cumulative_se": deepest.cumulative_se(),
            "thin": deepest.thin(),
            "cumulative_vllm": deepest.cumulative_vllm(),
            "conditional": deepest.conditional(),
            "accepted_per_position": [int(x) for x in deepest.accepted_at],
            "drafted_per_position": [int(x) for x in deepest.drafted_at],
            "num_drafts": deepest.num_drafts,
            "source": "measured",
        }
    adapt = None
    if adaptive is not None and adaptive.verify_steps:
        adapt = {
            "threshold": adaptive.threshold,
            "k_max": adaptive.k,
            "tokens_per_verify": adaptive.tokens_per_verify,
            "mean_k": adaptive.mean_k,
            "accept_rate": adaptive.accept_rate,
            "tokens_per_s": adaptive.tokens_per_s,
            "speedup": adaptive.tokens_per_s / base_tps if base_tps and base_tps > 0 else float("nan"),
            "num_drafts": adaptive.num_drafts,
        }
    tree = next((c for c in runs if c.tree is not None and c.num_drafts), None)
    how = (procedure or Procedure()).describe()
    if tree is not None:
        how = (f"a draft tree ({tree.tree.label()}) built from real drafter forwards on each candidate path (EAGLE-2's selection), verified in one target pass under a tree "
               "attention mask: greedy, the child that is the target's argmax; sampled, SGLang's target-only tree sampling (children tried in order against one coin)")
    return {
        "k_table": k_rows,
        "depth": depth,
        "tree": tree_block(tree, estimate) if tree is not None else None,
        "baseline_tokens_per_s": base_tps,
        "baseline_wall_s": baseline.wall_s if baseline is not None else None,
        "baseline_target_ms_per_step": 1e3 * baseline.target_s / baseline.target_calls if baseline is not None and baseline.target_calls else None,
        "adaptive": adapt,
        "note": f"measured by real speculative decoding ({how}) over the same prompts; τ includes the bonus token",
    }


def _fit_head(cfg: SimulateConfig, drafter: Any, progress: Any) -> SimulateConfig:
    """A head drafter: a one-line error for what the live loop cannot run; Medusa drafts
    at most one token per head, so a larger K is measured at the number of heads (said)."""
    if not is_head(drafter):
        return cfg
    why = unsupported(drafter)
    if why:
        raise ConfigError(why, UNSUPPORTED_HINT)
    limit = draft_limit(drafter)
    if limit is None or max(cfg.ks) <= limit:
        return cfg
    ks = sorted({min(k, limit) for k in cfg.ks})
    progress.note(f"{drafter.name} has {limit} Medusa heads and drafts at most {limit} tokens per step: K={','.join(map(str, cfg.ks))} is measured as K={','.join(map(str, ks))}")
    return dataclasses.replace(cfg, ks=ks)


def run_simulate(cfg: SimulateConfig, progress: Any = None, table: Any = None, pair: Any = None, on_partial: Callable[[Result], None] | None = None) -> Result:
    """Estimate (diagnose, teacher-forced) + measurement (this loop) on the same prompts ->
    a simulate result with a "measured" block. Ctrl-C during the estimate is handled as
    diagnose does (what was computed goes to `on_partial` first, as a simulate result) and
    nothing is measured; Ctrl-C during the measurement keeps what was measured so far
    (result.interrupted) and ends the run."""
    progress = progress or Progress()
    dcfg = dataclasses.replace(cfg.diagnose, k_max=max(cfg.diagnose.k_max, max(cfg.ks)))
    table = table or load_table([Path(p) for p in dcfg.rules])
    pair = pair or load_pair(dcfg, progress, vet=refuse_unsupported)  # refused before the target loads
    cfg = _fit_head(cfg, pair.drafter, progress)  # refuse what the live loop cannot run before the estimate
    if dcfg.tree is not None and isinstance(pair.drafter, NgramDrafter):
        raise ConfigError("--tree: an n-gram drafter drafts one chain, not a tree", "leave --tree out for an n-gram drafter")
    heads = draft_limit(pair.drafter) if dcfg.tree is not None and is_head(pair.drafter) else None
    if heads is not None and dcfg.tree_shape is not None and dcfg.tree_shape.steps > heads:
        raise ConfigError(f"--tree steps={dcfg.tree_shape.steps} is deeper than {pair.drafter.name}'s {heads} Medusa heads (one depth per head)", f"use a tree of at most {heads} steps")
    keep = None if on_partial is None else (lambda est: on_partial(simulate_result(est, cfg, None, table)))
    made: list[Any] = []  # the references diagnose made (none when a finished shard was reused)
    estimate = run_diagnose(dcfg, progress, table=table, pair=pair, on_partial=keep, on_references=made.append)
    if estimate.stopped or estimate.interrupted:
        return simulate_result(estimate, cfg, None, table)  # nothing meaningful (or nothing asked for, after Ctrl-C) to measure

    target, drafter = pair.target, pair.drafter
    # a head drafter runs as itself (models.heads.live), reading the target's states
    ngram = isinstance(drafter, NgramDrafter)  # no model: the loop drafts from its slots
    mixed = isinstance(drafter, MixedDrafter)  # llama.cpp's n-gram types beside a draft model
    step = drafter if is_head(drafter) or ngram or mixed else drafter.step_model()
    if step is None:
        raise ConfigError(f"drafter {cfg.diagnose.drafter} has no autoregressive step model to run a real draft loop with", "simulate supports self, self:layers=N, independent causal LMs and head drafters (EAGLE-1/2, EAGLE-3, Medusa, MTP)")
    # the same items diagnose scored: every turn, later ones after the target's own earlier
    # answers (the references diagnose made; else read back from the on-disk cache)
    refs = made[-1] if made else references_by_turn(target, list(load_prompt_set(dcfg).prompts), dcfg, pair.sampling.target, progress)
    if refs.interrupted:
        progress.note("interrupted before the measurement: nothing was measured")
        return simulate_result(estimate, cfg, None, table).model_copy(update={"interrupted": True})
    encoded = refs.encoded
    tau_estimate = estimate_by_k(estimate.k_table)
    estimate_se = estimate_se_by_k(estimate.k_table)
    shape = dcfg.tree_shape
    if shape is not None:
        own = estimate.trees.tree if estimate.trees is not None else None
        if own is not None and own.tau_tokens is not None:  # the tree's own estimate (else the chain's at K = its depth)
            tau_estimate[shape.steps] = (own.tau_tokens, own.tau_window_tokens if own.tau_window_tokens is not None else nan, own.speedup if own.speedup is not None else nan)
            estimate_se[shape.steps] = nan  # the chain's SE is not the tree's
        progress.note(f"--tree: the tree {shape.label()} is measured, not the chains of --k")
    # the engine's own procedure, so the measurement is what that engine would measure
    procedure = Procedure.of(dcfg.engine, dcfg.drafting, n_min=dcfg.draft_n_min, p_min=dcfg.draft_p_min, thresholds=dcfg.thresholds)
    measure = _Measure(cfg, dcfg, target.model, step, encoded, pair, procedure, progress, ngram=ngram, mixed=mixed)
    pooled: _Runs | None = None
    current: _Runs | None = None
    done = 0
    interrupted = False
    try:
        for i in range(cfg.seeds):
            current = _Runs()
            measure.seed(current, dcfg.seed + i, f", seed {dcfg.seed + i} ({i + 1} of {cfg.seeds})" if cfg.seeds > 1 else "")
            pooled = current if pooled is None else pooled.add(current)
            done += 1
    except KeyboardInterrupt:
        interrupted = True
        if pooled is None:  # the first seed, as far as it got
            pooled = current
        elif cfg.seeds > 1:
            progress.note(f"interrupted: {done} of {cfg.seeds} seeds measured and pooled; the seed under way is left out")
    got = pooled or _Runs()
    runs, baseline, adaptive = got.runs, got.baseline, got.adaptive
    section = measured_section(runs, baseline, adaptive, tau_estimate, procedure, estimate_se)
    if ngram or mixed:
        _per_step_tau(section)
    return simulate_result(estimate, cfg, section, table, interrupted=interrupted)


@dataclass
class _Runs:
    """One seed's counters (or several seeds' pooled): the speculative runs in order,
    plain decoding, adaptive K."""

    runs: list[SimCounters] = field(default_factory=list)
    baseline: SimCounters | None = None
    adaptive: SimCounters | None = None

    def add(self, other: _Runs) -> _Runs:
        """Pool another seed's runs of the same prompts into these (run by run)."""
        for mine, theirs in zip(self.runs, other.runs, strict=True):
            mine.add(theirs)
        for mine_, theirs_ in ((self.baseline, other.baseline), (self.adaptive, other.adaptive)):
            if mine_ is not None and theirs_ is not None:
                mine_.add(theirs_)
        return self


@dataclass
class _Measure:
    """Everything the loop runs under one seed: plain decoding, the tree or each K's
    chain, adaptive K — each run's counters appended as it starts, so Ctrl-C keeps what
    the seed measured so far."""

    cfg: SimulateConfig
    dcfg: Any
    target: Any
    step: Any
    encoded: list[Any]
    pair: Any
    procedure: Procedure
    progress: Any
    ngram: bool = False
    mixed: bool = False

    def seed(self, out: _Runs, seed: int, said: str) -> None:
        cfg, dcfg, target, step, drafter, procedure, progress = self.cfg, self.dcfg, self.target, self.step, self.pair.drafter, self.procedure, self.progress
        n, encoded, shape = len(self.encoded), self.encoded, dcfg.tree_shape
        kw = {"target_sampling": self.pair.sampling.target, "draft_sampling": self.pair.sampling.draft, "max_new_tokens": dcfg.max_new_tokens, "eos_ids": eos_ids(self.pair.target), "seed": seed, "batch_size": dcfg.batch_size, "procedure": procedure}
        if cfg.baseline:
            run = SimRun(SimCounters(0))
            out.baseline = run.counters
            with progress.task(f"plain target decoding (baseline, {n} prompts{said})", n) as advance:
                speculate(target, None, encoded, k=0, run=run, advance=advance, **kw)
        if shape is not None:
            run = SimRun(SimCounters(shape.steps))
            out.runs.append(run.counters)
            with progress.task(f"tree speculative decoding {shape.label()} ({n} prompts{said})", n) as advance:
                speculate_tree(target, step, encoded, shape=shape, target_sampling=kw["target_sampling"], max_new_tokens=dcfg.max_new_tokens, eos_ids=kw["eos_ids"], seed=seed, batch_size=dcfg.batch_size, run=run, advance=advance,
                               thresholds=procedure.thresholds)
        # an n-gram drafter drafts its own length (vLLM's ngram without k=: each K)
        for k in [] if shape is not None else sorted({drafter.max_draft(k) for k in cfg.ks}) if self.ngram else cfg.ks:
            if self.mixed:  # the model drafts up to K, the n-gram types their own lengths: the loop's width is the longer
                run = SimRun(SimCounters(drafter.width(k), early_stop=procedure.p_min > 0 or procedure.n_min > 1, label=k))
                out.runs.append(run.counters)
                with progress.task(f"speculative decoding, the draft model's K={k} ({n} prompts{said})", n) as advance:
                    speculate(target, drafter.with_k(k), encoded, k=drafter.width(k), run=run, advance=advance, **kw)
                continue
            run = SimRun(SimCounters(k, early_stop=procedure.p_min > 0 or procedure.n_min > 1))
            out.runs.append(run.counters)
            with progress.task(f"speculative decoding K={k} ({n} prompts{said})", n) as advance:
                if self.ngram and drafter.is_tree:  # SGLang's NGRAM: its padded tree, verified as a tree
                    speculate_ngram_tree(target, drafter, encoded, target_sampling=kw["target_sampling"], max_new_tokens=dcfg.max_new_tokens, eos_ids=kw["eos_ids"], seed=seed, batch_size=dcfg.batch_size, run=run, advance=advance)
                else:
                    speculate(target, step, encoded, k=k, run=run, advance=advance, **kw)
        if cfg.adaptive_threshold is not None and not self.ngram and not self.mixed and shape is None:  # a deterministic draft's confidence is 1
            run = SimRun(SimCounters(max(cfg.ks), cfg.adaptive_threshold))
            out.adaptive = run.counters
            knob = get(dcfg.engine).adaptive_knob  # the engine's own flag, where it has one
            gate = f"{knob} {cfg.adaptive_threshold:g}" if knob else f"confidence ≥ {cfg.adaptive_threshold:g}"
            with progress.task(f"adaptive K≤{max(cfg.ks)}, {gate} ({n} prompts{said})", n) as advance:
                speculate(target, step, encoded, k=max(cfg.ks), threshold=cfg.adaptive_threshold, run=run, advance=advance, **kw)


def _per_step_tau(section: dict[str, Any]) -> None:
    """An n-gram drafter's τ is tokens per verify step, steps without a draft included (its
    estimate's, `probe.ngram`); the first round, the prompt's pass, is left out on both."""
    for row in section["k_table"]:
        steps = row["emitted_tokens"] / row["tokens_per_verify"] - row["prompts"] if row["tokens_per_verify"] else 0
        if steps > 0:
            row["tau_tokens"] = (row["emitted_tokens"] - row["prompts"]) / steps
            row["tau_gap"] = row["tau_estimate"] - row["tau_tokens"]
            row["tau_se"] = row["speedup_se"] = nan  # the per-prompt counts hold drafts, not verify steps: no SE for this τ
