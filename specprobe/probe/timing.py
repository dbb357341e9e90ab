"""Timing on the run's device: the target's decode step, its verify pass over K + 1 tokens
and the drafter's step (a head's too), at each batch size over a KV cache as long as the
prompts' typical context, with the loop and budget of `specprobe.estimates.costs`; what to time for
a diagnose run; and the environment (device, dtype, package versions) recorded in a
result."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from specprobe.estimates.costs import (
    MIN_REPEATS,
    Clock,
    Samples,
    batch_timings,
    budget_for,
    interleaved,
)
from specprobe.models.base import TargetPass
from specprobe.models.kvcache import Stream, crop, sync


def cost_block(
    target: Any,
    drafter: Any,
    given: float | None = None,
    *,
    verify_factor: float | None = None,
    k_max: int = 8,
    batch_sizes: Sequence[int] = (),
    context_tokens: int = 64,
    budget_s: float = math.inf,
    cap_s: float = math.inf,
    clock: Clock = time.perf_counter,
) -> dict[str, Any]:
    """Time what the cost model needs at each batch size — nothing when both the cost
    ratio (`given`) and the verify factor are given — and return the raw cost entry:
    per-batch timing statistics and per-repeat ratios, context length, budget, time spent.
    No batch sizes: nothing is timed (a run stopped before its costs)."""
    need_draft, need_verify = given is None, verify_factor is None
    sizes = sorted({int(b) for b in batch_sizes})
    raw: dict[str, Any] = {
        "measured": False, "context_tokens": context_tokens, "budget_s": None if math.isinf(budget_s) else budget_s,
        "cap_s": None if math.isinf(cap_s) else cap_s, "elapsed_s": 0.0, "stopped_by_budget": False, "notes": [],
    }
    if not sizes:
        raw["batches"] = []
        return raw
    if not need_draft and not need_verify:
        raw["batches"] = [{"batch_size": b, "repeats": 0, "draft_ratios": [], "verify_ratios": []} for b in sizes]
        return raw
    start = clock()
    batches: list[dict[str, Any]] = []
    for j, b in enumerate(sizes):
        spent, share = clock() - start, len(sizes) - j  # what is left, shared by the sizes still to time
        try:
            samples = _time_batch(target, drafter, b, context_tokens, k_max, need_draft, need_verify, clock, (budget_s - spent) / share, (cap_s - spent) / share)
        except Exception as e:  # noqa: BLE001  (out of memory at a large batch: report it, time the others)
            if not _is_oom(e):
                raise
            raw["notes"].append(f"batch size {b}: out of memory while timing; not measured")
            batches.append({"batch_size": b, "repeats": 0, "draft_ratios": [], "verify_ratios": []})
            continue
        raw["stopped_by_budget"] = raw["stopped_by_budget"] or samples.stopped_by_budget
        batches.append(batch_timings(samples, k_max, b))
    raw["batches"] = batches
    raw["elapsed_s"] = clock() - start
    raw["measured"] = any(x.get("repeats") for x in batches)
    few = [str(x["batch_size"]) for x in batches if 0 < int(x.get("repeats") or 0) < MIN_REPEATS]
    if few:
        raw["notes"].append(f"batch size {', '.join(few)}: fewer than {MIN_REPEATS} repeats fit in the time the scoring took; the spread is not known")
    if need_draft and not any(x.get("draft_ratios") for x in batches):
        raw["notes"].append("the drafter has no step that could be timed")
    return raw


def _is_oom(e: Exception) -> bool:
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _time_batch(target: Any, drafter: Any, batch: int, context: int, k_max: int, need_draft: bool, need_verify: bool, clock: Clock, budget_s: float, cap_s: float) -> Samples:
    import torch

    with torch.inference_mode():
        gen = torch.Generator().manual_seed(batch)
        t = _Decoder(target.model, batch, context, target.device, gen)
        calls: dict[str, Callable[[], object]] = {"target": t.call(1)}
        if need_draft:
            step = drafter.step_model()
            if step is not None:
                calls["draft"] = _Decoder(step, batch, context, target.device, gen).call(1)
            else:
                head = _head_step(target, drafter, batch, gen)
                if head is not None:
                    calls["draft"] = head
        if need_verify:
            for k in range(1, k_max + 1):
                calls[f"verify{k}"] = t.call(k + 1)
        samples = interleaved(calls, clock=clock, budget_s=budget_s, cap_s=cap_s)
    if str(target.device).startswith("cuda"):
        torch.cuda.empty_cache()
    return samples


class _Decoder:
    """One model's KV cache over `batch` rows of `context` random tokens; `call(n)` is a
    function that runs one forward pass over n new tokens per row (logits for those n
    only, as the simulate loop asks for them) and crops the cache back, so every call sees
    the same context. Uses the simulate loop's own stream, so the timed pass is the one
    `simulate` runs."""

    def __init__(self, model: Any, batch: int, context: int, device: Any, gen: Any) -> None:
        import torch


        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.stream = Stream(model, batch, device)
        self.context, self.batch, self.gen, self.device = context, batch, gen, device
        ids = torch.randint(0, self.vocab, (batch, context), generator=gen).to(device)  # [B, L]
        self.stream.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)

    def call(self, n: int) -> Callable[[], object]:
        import torch


        ids = torch.randint(0, self.vocab, (self.batch, n), generator=self.gen).to(self.device)  # [B, n]
        valid = torch.ones_like(ids, dtype=torch.bool)
        s = self.stream

        def run() -> object:
            s.forward(ids, valid, keep=n)  # synchronises a GPU before returning
            crop(s.cache, n)
            s.valid = s.valid[:, : self.context]
            return None

        return run


def _head_step(target: Any, drafter: Any, batch: int, gen: Any) -> Callable[[], object] | None:
    """A head drafter's step: its features and depth-1 logits for one new position over
    the target's hidden states (what an engine runs per drafted token); None when this
    drafter cannot run on a bare two-position pass."""
    import torch


    dev = target.device
    h = int(target.config.hidden_size)
    dtype = next(target.model.parameters()).dtype
    ids = torch.randint(0, int(target.vocab_size), (batch, 2), generator=gen).to(dev)  # [B, 2]
    hid = torch.randn((batch, 2, h), generator=gen).to(device=dev, dtype=dtype)  # [B, 2, H]
    tp = TargetPass(ids, torch.ones_like(ids), hid, {layer: hid for layer in drafter.target_layers_needed()})

    def run() -> object:
        feats = drafter.hidden(tp)
        drafter.logits(feats[1][:, -1], 1)  # [B, V]
        sync(dev)
        return None

    try:
        run()
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError, NotImplementedError):
        return None
    return run


def timing_settings(cfg: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], scoring_s: float | None) -> dict[str, Any]:
    """`cost_block`'s keyword arguments for a diagnose run: its verify factor, K range and
    batch sizes, the context its prompts reach, and a budget from its scoring time."""
    budget, cap = budget_for(scoring_s)
    return {
        "verify_factor": cfg.verify_factor,
        "k_max": cfg.k_max,
        "batch_sizes": cfg.cost_batch_sizes(),
        "context_tokens": context_length([len(e) for e in encoded], [len(c) for c in conts]),
        "budget_s": budget,
        "cap_s": cap,
    }


def context_length(prompt_lengths: Sequence[int], continuation_lengths: Sequence[int]) -> int:
    """The context a decode step sees on these prompts: the median of prompt length + half
    its continuation (the mean cache length over the generation); 64 when none."""
    import statistics

    xs = [p + c / 2 for p, c in zip(prompt_lengths, continuation_lengths, strict=False) if c]
    return max(1, int(round(statistics.median(xs)))) if xs else 64


