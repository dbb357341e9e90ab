"""diagnose for an n-gram drafter (`drafters.ngram`): its proposals, teacher-forced over
the target's own references, priced with the target's measured verify pass.

The walk. For each reference (prompt + the target's continuation), the engine's steps
are replayed along it: the first token comes from the prompt's pass (no draft, as the
engines do); then at each step the drafter proposes from prompt + continuation so far
(its last token the one just sampled), at most `remaining − 1` tokens; the accepted
count n is how many proposed tokens the continuation itself goes on with, and the next
step starts n + 1 tokens later. A draft is deterministic and the continuation is the
target's own sample (greedy at T = 0), so this is one real run of the loop, not an
approximation: the draft d is accepted with probability p_target(d) and the reference
token equals d with that same probability; after a rejection the engine's next token
follows p conditioned on not being d, and so does the reference's (the two verify
procedures have one law, `simulate.procedure`). SGLang's NGRAM drafts a tree: the
accepted count is the longest tree path the continuation goes on with — at T = 0
greedy tree verification exactly; at T > 0 SGLang's target-only tree sampling accepts
child c with probability p(c) (one coin against the children's summed target
probabilities) and emits a token distributed as p, so coupling it with the reference
sample is exact in distribution too (`drafters.sglang_ngram`: all but its token-0 padding,
which it biases). Its steps all verify the whole padded tree, matched or not. What it counts, per request, category
and domain: the verify steps, the steps that proposed anything, the proposed and
accepted tokens, and the time the matching took.

Priced: a step that proposed m tokens costs v_m (the target's pass over m + 1 tokens ÷
one decode step, timed on the device; linear beyond the deepest K timed) plus the
matching time ÷ the target's decode step; the speedup is the tokens the steps yield over
their cost (the first token, the same either way, left out)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from specprobe.core.progress import Progress
from specprobe.drafters.ngram import VLLM_NGRAM, NgramDrafter, Slot
from specprobe.drafters.ngram_mix import MixedDrafter
from specprobe.engines import get
from specprobe.estimates.costs import cost_tables
from specprobe.judge.rules import RuleTable
from specprobe.probe.assemble import evaluate_rules, verdict_fields
from specprobe.probe.references import references_by_turn
from specprobe.probe.timing import cost_block, timing_settings
from specprobe.result import Result
from specprobe.settings.pipeline import DiagnoseConfig

VERIFY_TIMED_MAX = 16  # the deepest verify pass timed; longer drafts extrapolate linearly


# ----------------------------------------------------------------------------- the walk (pure)
@dataclass
class Steps:
    """Counts of a set of walked steps (mergeable)."""

    requests: int = 0
    steps: int = 0  # verify steps after the first token
    drafts: int = 0  # steps that proposed ≥ 1 token
    drafted: int = 0
    accepted: int = 0
    match_s: float = 0.0  # time in the drafter's matching
    by_length: dict[int, int] = field(default_factory=dict)  # draft length m -> steps
    model_drafts: int = 0  # n-gram types beside a draft model: the steps the model drafted
    model_forwards: int = 0  # and the draft model's forwards (each step's catch-up included)

    def add(self, other: Steps) -> None:
        self.requests += other.requests
        self.steps += other.steps
        self.drafts += other.drafts
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.match_s += other.match_s
        self.model_drafts += other.model_drafts
        self.model_forwards += other.model_forwards
        for m, c in other.by_length.items():
            self.by_length[m] = self.by_length.get(m, 0) + c

    @property
    def proposal_frac(self) -> float:
        return self.drafts / self.steps if self.steps else math.nan

    @property
    def draft_tokens_mean(self) -> float:
        return self.drafted / self.drafts if self.drafts else math.nan

    @property
    def accept_frac(self) -> float:
        """Accepted per proposed token (vLLM's acceptance rate)."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def tau_tokens(self) -> float:
        """Tokens per verify step, the bonus token included."""
        return (self.steps + self.accepted) / self.steps if self.steps else math.nan

    def speedup(self, verify: Sequence[float], target_step_s: float, cost_ratio: float = 0.0) -> float:
        """Tokens over cost in target decode steps (module doc). verify[K−1] = v_K;
        cost_ratio: a draft model's forward ÷ a target step (n-gram types beside one)."""
        if not self.steps:
            return math.nan
        cost = sum(c * verify_cost(m, verify) for m, c in self.by_length.items())
        if self.model_forwards and cost_ratio == cost_ratio:
            cost += cost_ratio * self.model_forwards
        if target_step_s > 0:
            cost += self.match_s / target_step_s
        return (self.steps + self.accepted) / cost if cost > 0 else math.nan


def verify_cost(m: int, verify: Sequence[float]) -> float:
    """v_m: the pass over m + 1 tokens in decode steps (v_0 = 1; linear past the last timed)."""
    if m <= 0:
        return 1.0
    v = [1.0] + [float(x) if x == x else 1.0 for x in verify]
    if m < len(v):
        return v[m]
    slope = v[-1] - v[-2] if len(v) >= 2 else 0.0
    return v[-1] + slope * (m - (len(v) - 1))


def _begin(slot: Slot, prompt: Sequence[int], continuation: Sequence[int]) -> tuple[Steps, list[int], list[int]]:
    """A request's start -> its (empty) Steps, the continuation, and the history its first
    step sees: the prompt and the first token (the prefill's). The slot begins on the
    prompt unless the continuation is empty (nothing to walk)."""
    cont = list(continuation)
    if cont:
        slot.begin(list(prompt))
    return Steps(requests=1), cont, list(prompt) + cont[:1]


def walk(slot: Slot, prompt: Sequence[int], continuation: Sequence[int], max_new_tokens: int, eog: Collection[int] = ()) -> Steps:
    """The engine's steps along one reference (module doc) -> their counts. `eog`:
    llama.cpp's end-of-generation tokens — its verify stops accepting at a drafted EOG
    that is not the draft's last token (that EOG is the emitted token, not an accepted
    draft: `common_sampler_sample_and_accept_n`); empty for the other engines."""
    out, cont, history = _begin(slot, prompt, continuation)
    if not cont:
        return out
    t = 1  # tokens of the continuation emitted so far
    while t < len(cont):
        cap = max(0, max_new_tokens - t - 1)  # llama-server: n_remaining − 1, never past the budget
        d = slot.propose(history, cap)
        out.match_s += d.seconds
        if d.tree is not None:  # SGLang's NGRAM: a padded tree of the same size every step
            n = d.tree.accepted(cont[t:])  # the longest tree path the reference goes on with
            out.accepted += n
            if d.tree.real:
                out.drafts += 1
                out.drafted += d.tree.real
            out.steps += 1
            out.by_length[d.tree.width] = out.by_length.get(d.tree.width, 0) + 1  # every step verifies the whole tree
            step = min(n + 1, len(cont) - t)
            history.extend(cont[t : t + step])
            t += step
            continue
        m = len(d.tokens)
        n = 0
        while n < m and t + n < len(cont) and d.tokens[n] == cont[t + n]:
            if cont[t + n] in eog and n + 1 < m:
                break
            n += 1
        if m:
            slot.accept(n)
            out.drafts += 1
            out.drafted += m
            out.accepted += n
        out.steps += 1
        out.by_length[m] = out.by_length.get(m, 0) + 1
        step = min(n + 1, len(cont) - t)
        history.extend(cont[t : t + step])
        t += step
    slot.finish(history)  # suffix decoding keeps the whole response for later requests
    return out


@dataclass
class ModelTrace:
    """A draft model teacher-forced along one reference: top[j] its top token where the
    continuation's token j comes next (after the prompt and cont[:j]), p[j] its probability."""

    top: list[int]
    p: list[float]


def model_trace(model: Any, prompt: Sequence[int], cont: Sequence[int], vocab: int) -> ModelTrace:
    """One forward of the draft model over prompt + continuation -> its `ModelTrace`."""
    import torch

    from specprobe.metrics.core import align_vocab, finite

    dev = next(model.parameters()).device
    ids = torch.tensor([[*prompt, *cont[:-1]]], dtype=torch.long, device=dev)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 :]  # [len(cont), V']
        pr = torch.softmax(align_vocab(finite(logits), vocab).float(), dim=-1)
        p, top = pr.max(dim=-1)
    return ModelTrace(top.tolist(), p.tolist())


def walk_mixed(
    slot: Slot, trace: ModelTrace, prompt: Sequence[int], continuation: Sequence[int], max_new_tokens: int, k: int,
    p_min: float = 0.0, n_min: int = 0, eog: Collection[int] = (),
) -> Steps:
    """`walk` for n-gram types beside a draft model (`drafters.ngram_mix`): each step the
    n-gram types draft first; when none does, the draft model drafts its top tokens from
    the reference so far — at most min(k, remaining − 1), stopping before one under p_min,
    none when fewer than n_min. While its tokens match the reference its inputs are the
    reference's, so the accepted count is exact from the teacher-forced `trace`; a draft
    goes on past its first rejected token from its own tokens, which the trace does not
    see, so its length there is taken as the limit when p_min = 0 (exact: nothing stops it
    early) and as ending at the rejected token otherwise (the verify cost of the tokens
    after a rejection, never their acceptance). Every step the draft model also takes in
    the verify batch (one forward, llama.cpp's `process`); a model draft of m tokens adds
    m forwards (one when it drafts nothing)."""
    out, cont, history = _begin(slot, prompt, continuation)
    if not cont:
        return out
    t = 1
    while t < len(cont):
        cap = max(0, max_new_tokens - t - 1)
        d = slot.propose(history, cap)
        out.match_s += d.seconds
        out.model_forwards += 1  # the draft model takes in the last verify batch
        draft = list(d.tokens)
        by_model = False
        if not draft and cap > 0:  # no n-gram type drafted: the draft model does
            lim = min(k, cap)
            forwards = 0
            while len(draft) < lim:
                j = t + len(draft)
                if j >= len(cont):  # past the reference's end (its EOS): on to the limit
                    draft += [-1] * (lim - len(draft))
                    forwards = lim
                    break
                forwards += 1
                if trace.p[j] < p_min:
                    break
                draft.append(trace.top[j])
                if trace.top[j] != cont[j]:  # rejected here: what follows is its own text
                    if p_min <= 0:
                        draft += [-1] * (lim - len(draft))
                        forwards = lim
                    break
            if len(draft) < n_min:
                draft = []
            out.model_forwards += max(forwards, 1)
            by_model = bool(draft)
        m = len(draft)
        n = 0
        while n < m and t + n < len(cont) and draft[n] == cont[t + n]:
            if cont[t + n] in eog and n + 1 < m:
                break
            n += 1
        if m:
            if not by_model:
                slot.accept(n)  # the n-gram type that drafted hears it; the model ignores it
            out.drafts += 1
            out.drafted += m
            out.accepted += n
            out.model_drafts += int(by_model)
        out.steps += 1
        out.by_length[m] = out.by_length.get(m, 0) + 1
        step = min(n + 1, len(cont) - t)
        history.extend(cont[t : t + step])
        t += step
    slot.finish(history)
    return out


# ----------------------------------------------------------------------------- diagnose
def draft_lengths(drafter: NgramDrafter | MixedDrafter, k_max: int) -> list[int]:
    """The K rows to walk: vLLM's `ngram` without k= drafts the run's K, so every K up to
    k_max; a spec whose length is its own (k=, llama.cpp's types), that one; n-gram types
    beside a draft model, every K (the model's --spec-draft-n-max)."""
    if isinstance(drafter, MixedDrafter):
        return list(range(1, k_max + 1))
    if any(t.name == VLLM_NGRAM and t.max_draft is None for t in drafter.types):
        return list(range(1, k_max + 1))
    return [drafter.max_draft()]


def diagnose_ngram(
    cfg: DiagnoseConfig, pair: Any, prompt_set: Any, header: dict[str, Any], metrics: dict[str, Any], table: RuleTable, evidence: dict[str, list[str]], progress: Progress,
    on_references: Any = None, refs: Any = None, walked: dict[tuple[str, str, int], tuple[float, float]] | None = None,
) -> Result:
    """references (or the `refs` given: sweep's, shared with its other drafters) → walk
    for every K row → the verify pass timed → the result. `walked`, when given, receives
    (scope, group, K) → (τ, speedup) for every group and K (sweep's per-group advice); the
    result's group rows are at the best K."""
    target, drafter = pair.target, pair.drafter
    if refs is None:
        refs = references_by_turn(target, list(prompt_set.prompts), cfg, pair.sampling.target, progress)
        if on_references is not None:
            on_references(refs)
    ks = draft_lengths(drafter, cfg.k_max)
    per_k: dict[int, Steps] = {}
    groups: dict[tuple[int, str, str], Steps] = {}
    eog = end_of_generation(target) if get(cfg.engine).drafts_stop_at_end_of_generation else frozenset()
    items = [(it, e, c) for it, e, c in zip(refs.items, refs.encoded, refs.conts, strict=True) if c]
    mixed = isinstance(drafter, MixedDrafter)
    traces: list[ModelTrace] = []
    if mixed:  # the draft model beside the n-gram types, teacher-forced along each reference once
        vocab = int(target.model.get_output_embeddings().weight.shape[0])
        with progress.task(f"the draft model {drafter.model.name} along {len(items)} references", len(items)) as advance:
            for _, enc, cont in items:
                traces.append(model_trace(drafter.step_model(), enc, cont, vocab))
                advance(1)
    with progress.task(f"walking {drafter.name} along {len(items)} references", len(items) * len(ks)) as advance:
        for k in ks:
            drafter.reset()  # each K a fresh server: suffix decoding's cache sees the set from its start
            total = Steps()
            for i, (item, enc, cont) in enumerate(items):
                if mixed:
                    s = walk_mixed(drafter.ngram.slot(k), traces[i], enc, cont, cfg.max_new_tokens, k, cfg.draft_p_min, cfg.draft_n_min, eog)
                else:
                    s = walk(drafter.slot(k), enc, cont, cfg.max_new_tokens, eog)
                total.add(s)
                for key in (("domain", item.domain), ("category", item.category)):
                    groups.setdefault((k, *key), Steps()).add(s)
                advance(1)
            per_k[k] = total
    drafter.reset()  # and a fresh one for what runs next (simulate's measured pass)

    # the verify pass over m + 1 tokens, timed (or --verify-factor); no drafter step to time
    # (beside n-gram types, the draft model's step too, or --cost-ratio)
    timing = timing_settings(cfg, refs.encoded, refs.conts, None)
    timing["k_max"] = min(VERIFY_TIMED_MAX, max(ks))
    progress.note("timing the target's verify pass on the device" + (" and the draft model's step" if mixed else ""))
    given = cfg.cost_ratio if mixed else 0.0
    raw = cost_block(target, drafter.model if mixed else drafter, given, **timing)
    tables = cost_tables(raw, timing["k_max"], given, cfg.verify_factor)
    head = next((t for t in tables if t.batch_size == cfg.batch_size), tables[0] if tables else None)
    verify = [r.verify_factor for r in head.rounds] if head is not None else []
    step_ms = ((head.raw.get("target_step") or {}).get("median_ms") if head is not None else None) or math.nan
    step_s = step_ms / 1e3 if step_ms == step_ms else 0.0

    model_c = head.cost_ratio if mixed and head is not None else 0.0
    speedups = {k: per_k[k].speedup(verify, step_s, model_c) for k in ks}
    k_rows: list[dict[str, Any]] = [
        {"k": k, "tau_tokens": per_k[k].tau_tokens, "accept_rate": per_k[k].accept_frac, "iid_tau_tokens": None, "speedup": speedups[k], "tau_renewal_tokens": per_k[k].tau_tokens, "verify_factor": verify_cost(k, verify) if verify else None}
        for k in ks
    ]
    best_k = max(ks, key=lambda k: speedups[k] if speedups[k] == speedups[k] else -1.0)
    s = per_k[best_k]
    match_ratio = (s.match_s / s.steps) / step_s if s.steps and step_s > 0 else math.nan
    metrics = {
        **metrics,
        "ngram_proposal_frac": s.proposal_frac,
        "ngram_draft_tokens_mean": s.draft_tokens_mean,
        "ngram_accept_frac": s.accept_frac,
        "tau_tokens": s.tau_tokens,
        "best_k": best_k,
        "speedup_best": speedups[best_k],
        # the matching per step ÷ a target decode step (beside a draft model: the model's step)
        "cost_ratio": model_c if mixed else match_ratio,
        "num_positions": sum(len(c) for _, _, c in items),
        "num_prompts": len(items),
    }
    metrics = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    rows: dict[str, list[dict[str, Any]]] = {"domain": [], "category": []}
    for (k, kind, name), g in sorted(groups.items()):
        if k == best_k:
            rows[kind].append(_group_row(name, g, verify, step_s, model_c))
        if walked is not None:
            walked[(kind, name, k)] = (g.tau_tokens, g.speedup(verify, step_s, model_c))
    findings, evals = evaluate_rules(table, metrics, drafter.kind, evidence)
    return Result.model_validate({
        **header,
        "interrupted": bool(refs.interrupted),
        "scored": True,
        "metrics": metrics,
        "by_domain": rows["domain"],
        "by_category": rows["category"],
        "k_table": [_clean(r) for r in k_rows],
        "cost": _cost(cfg, head, model_c if mixed else match_ratio, s, step_ms, mixed),
        **verdict_fields(table, findings, evals),
    })


def _cost(cfg: DiagnoseConfig, head: Any, match_ratio: float, s: Steps, step_ms: float, mixed: bool = False) -> dict[str, Any] | None:
    """The cost block: the matching per step (timed on the CPU, where the engines match)
    against the target's decode step and verify passes (timed on the device)."""
    if head is None:
        return None
    match_ms = 1e3 * s.match_s / s.steps if s.steps else math.nan
    if mixed:  # beside a draft model: its step is the drafter's cost (the matching is left out)
        match_ms = match_ratio * step_ms if match_ratio == match_ratio and step_ms == step_ms else math.nan
    source = ("given" if cfg.cost_ratio is not None else "the draft model's step, timed") if mixed else "the matching per step, timed"
    return _clean({
        "cost_ratio": match_ratio,
        "target_step_ms": step_ms,
        "draft_step_ms": match_ms,
        "measured": not (mixed and cfg.cost_ratio is not None),
        "verify_factor": cfg.verify_factor,
        "batch_size": head.batch_size,
        "sources": {"cost_ratio": source, "verify_factor": "given" if cfg.verify_factor is not None else "measured" if any(head.raw.get("verify_ratios") or []) else "not timed (v = 1: the speedup is τ)"},
    })


def end_of_generation(target: Any) -> frozenset[int]:
    """The target's end-of-generation ids: its tokenizer's EOS and its generation config's."""
    ids: set[int] = set()
    for src in (getattr(target.info.generation_config, "eos_token_id", None), getattr(target.tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return frozenset(ids)


def _group_row(name: str, g: Steps, verify: Sequence[float], step_s: float, cost_ratio: float = 0.0) -> dict[str, Any]:
    return _clean({
        "group": name,
        "positions": g.steps,
        "accept_prob_mean": g.accept_frac,  # Σ min(p, q) = p(draft) for a one-hot q
        "accept_prob_engine_mean": g.accept_frac,
        "ngram_proposal_frac": g.proposal_frac,
        "ngram_draft_tokens_mean": g.draft_tokens_mean,
        "tau_tokens": g.tau_tokens,
        "speedup": g.speedup(verify, step_s, cost_ratio),
    })


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v) for k, v in row.items()}


def summary_line(steps: Steps) -> str:
    """One line for a log: proposals, length, acceptance, τ."""
    return (
        f"{steps.drafts}/{steps.steps} steps proposed ({steps.proposal_frac:.1%}), {steps.draft_tokens_mean:.1f} tokens a draft, "
        f"{steps.accepted}/{steps.drafted} accepted ({steps.accept_frac:.1%}), τ {steps.tau_tokens:.2f}"
    )

