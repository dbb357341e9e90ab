"""The draft → verify loop, batch by batch, round by round.

Each round, for every live row of a batch:

    draft      the draft source proposes d_1..d_m, m ≤ K: the drafter's argmax (greedy
               drafting) or x_j ~ q_j (probabilistic), as the `Procedure` says
    verify     the target scores them all in one forward pass; rejection sampling (or
               llama.cpp's sample-and-compare) keeps an accepted prefix of n tokens and
               picks the next token
    roll back  d_{n+1}..d_m become holes in the target's cache; the source rolls back
               its own and takes in what was verified
    count      vLLM's counters (`counters.SimCounters`)
    emit       the n accepted drafts + the next token go to the output; a row that hit
               EOS or its budget leaves the batch

Like transformers' assisted generation, a row drafts at most `remaining − 1` tokens
near the end of its budget, so it never overshoots it. k = 0 (or no drafter) is plain
autoregressive decoding with the same machinery: the baseline.

The loop sees the drafter only as a `DraftSource` (`draft_source`): a causal LM with its
own cache, a head drafter reading the target's states from every verify pass, or nothing
(`sources`). It proposes; the loop verifies."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specprobe.metrics.core import finite
from specprobe.metrics.sampling import Sampling, probs
from specprobe.models.kvcache import Stream, right_align
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.draft_source import DraftRule, DraftSource, Proposal, draw
from specprobe.simulate.procedure import SAMPLE_MATCH, THRESHOLD, Procedure
from specprobe.simulate.rejection import (
    verify_greedy,
    verify_match,
    verify_sampled,
    verify_thresholds,
)
from specprobe.simulate.sources import open_source

Advance = Callable[[int], Any]


def speculate(
    target_model: Any,
    draft_model: Any | None,
    prompts: Sequence[Sequence[int]],
    *,
    k: int,
    target_sampling: Sampling,
    draft_sampling: Sampling | None = None,
    max_new_tokens: int = 64,
    eos_ids: Iterable[int] = (),
    seed: int = 0,
    batch_size: int = 8,
    threshold: float | None = None,
    procedure: Procedure | None = None,
    run: SimRun | None = None,
    advance: Advance | None = None,
) -> SimRun:
    """Speculative decoding of every prompt (token id lists) -> SimRun.

    draft_model: a causal LM, a head drafter (`models.heads.chain.HeadDrafter`, over
    this target), or None. k = 0 (or no drafter) is plain autoregressive decoding with
    the same machinery: the baseline. `threshold` stops a row's drafting at the first
    depth whose drafter confidence is below it (adaptive K: max q, which is 1 for a greedy
    drafter, as in the estimate; llama.cpp's --spec-draft-p-min under its procedure);
    without it, the procedure's own p_min (--draft-p-min) does.
    `procedure`: how drafts are made and verified (an engine's, `Procedure.of`); None:
    drafts sampled from q, verified by rejection sampling. `run` is filled as it goes, so
    a caller that catches KeyboardInterrupt keeps what was measured."""
    if draft_model is None:
        k = 0
    proc = procedure or Procedure()
    device = next(target_model.parameters()).device
    vocab = int(target_model.get_output_embeddings().weight.shape[0])
    settings = Settings(
        k=k,
        target_sampling=target_sampling,
        draft=DraftRule(k=k, sampling=draft_sampling or target_sampling, threshold=threshold if threshold is not None else (proc.p_min or None), vocab=vocab, greedy=proc.greedy, confidence=proc.confidence, n_min=proc.n_min),
        eos=frozenset(int(e) for e in eos_ids),
        device=device,
        procedure=proc,
    )
    run = run or SimRun(SimCounters(k, threshold))
    run.outputs = [[] for _ in prompts]
    c = run.counters
    c.open_units(len(prompts))
    with torch.inference_mode():
        for bi, idx in enumerate(_batches(prompts, batch_size)):
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + bi)
            t0 = time.perf_counter()
            try:
                batch = Batch.start(target_model, draft_model if k > 0 else None, [prompts[i] for i in idx], idx, max_new_tokens, gen, device)
                decode_batch(batch, settings, run)
            finally:
                c.wall_s += time.perf_counter() - t0
            c.prompts += len(idx)
            if advance:
                advance(len(idx))
    return run


# ----------------------------------------------------------------------------- state
@dataclass(frozen=True)
class Settings:
    """What stays fixed for a whole run."""

    k: int  # draft length (0: plain decoding)
    target_sampling: Sampling
    draft: DraftRule
    eos: frozenset[int]
    device: Any
    procedure: Procedure = Procedure()


@dataclass
class Batch:
    """A batch between rounds: its live rows and what the target's cache has yet to see."""

    target: Stream
    source: DraftSource
    rows: list[int]  # live row -> prompt index
    todo: list[list[int]]  # per live row: tokens not yet in the target's cache
    remaining: list[int]  # per live row: tokens it may still emit
    gen: torch.Generator

    @classmethod
    def start(cls, target_model: Any, draft_model: Any | None, prompts: list[Sequence[int]], index: list[int], max_new: int, gen: torch.Generator, device: Any) -> Batch:
        return cls(
            target=Stream(target_model, len(prompts), device),
            source=open_source(draft_model, prompts, device),
            rows=list(index),
            todo=[list(p) for p in prompts],  # round 1 feeds the prompts
            remaining=[max_new] * len(prompts),
            gen=gen,
        )


# ----------------------------------------------------------------------------- one batch
def decode_batch(batch: Batch, s: Settings, run: SimRun) -> None:
    """Rounds of draft → verify → roll back → count → emit until every row is done."""
    c = run.counters
    try:
        while batch.rows:
            prop = draft(batch, s)  # [B, K] drafts d_1..d_m, m = prop.drafted [B]
            n, nxt = verify(batch, s, prop)  # [B] accepted drafts n ≤ m, [B] next token
            roll_back(batch, prop, n)
            batch.source.accept(prop, n, nxt)  # rolls back d_{n+1}..d_m, queues what was verified
            count(c, prop, n, s.k, batch.rows)
            emit(batch, run, prop, n, nxt, s.eos)
    finally:
        c.target_calls += batch.target.calls
        c.target_s += batch.target.seconds
        c.draft_calls += batch.source.calls
        c.draft_s += batch.source.seconds


def draft(batch: Batch, s: Settings) -> Proposal:
    """Up to K drafts a row: fewer than its remaining budget (it never overshoots it) and no
    deeper than the source drafts (Medusa: one depth per head)."""
    depth = s.k if batch.source.max_depth is None else min(s.k, batch.source.max_depth)
    cap = torch.tensor([max(0, min(depth, r - 1)) for r in batch.remaining], device=s.device)  # [B]
    return batch.source.propose(cap, s.draft, batch.gen)


def verify(batch: Batch, s: Settings, prop: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
    """The target scores [todo, d_1..d_m] in one pass -> (accepted count n [B], next token [B])."""
    nb, k, dev = len(batch.rows), s.k, s.device
    drafted = prop.drafted
    dl = drafted.tolist()
    blocks = [batch.todo[r] + prop.tokens[r, : dl[r]].tolist() for r in range(nb)]
    ids, valid = right_align(blocks, dev)  # [B, T]
    last = min(k + 1, ids.shape[1])
    # through the source: a head keeps the target's states at every position
    logits = finite(batch.source.watch(ids, valid, lambda: batch.target.forward(ids, valid, keep=last)))  # [B, last, V]
    # p_0 (after the last todo token) … p_m (bonus) sit in the last m+1 columns
    col = (last - 1 - drafted[:, None] + torch.arange(k + 1, device=dev)[None, :]).clamp_(max=last - 1)  # [B, K+1]
    tl = logits.gather(1, col[..., None].expand(-1, -1, logits.shape[-1]))  # [B, K+1, V]
    if k == 0:
        return torch.zeros(nb, dtype=torch.long, device=dev), draw(probs(tl[:, 0], s.target_sampling), s.target_sampling, batch.gen)
    if s.target_sampling.greedy:
        return verify_greedy(prop.tokens, drafted, tl)  # what either verification does at T = 0
    p = probs(tl, s.target_sampling)  # [B, K+1, V]
    if s.procedure.verify == SAMPLE_MATCH:
        return verify_match(prop.tokens, drafted, p, batch.gen)
    if s.procedure.verify == THRESHOLD:
        return verify_thresholds(prop.tokens, drafted, p, *s.procedure.thresholds, batch.gen)
    q_all = torch.stack(prop.q, dim=1) if prop.q else tl.new_zeros((nb, k, tl.shape[-1]), dtype=torch.float32)  # [B, K, V]
    return verify_sampled(prop.tokens, drafted, q_all, p, batch.gen)


def roll_back(batch: Batch, prop: Proposal, n: torch.Tensor) -> None:
    """The target's rejected drafts d_{n+1}..d_m (the last m − n slots) become holes."""
    tgt = batch.target
    tgt.invalidate_from(tgt.length - (prop.drafted - n))


def count(c: SimCounters, prop: Proposal, n: torch.Tensor, k: int, rows: list[int] | None = None) -> None:
    """vLLM conventions: a draft is one row's verify step that proposed ≥ 1 token. rows:
    each live row's prompt, for the per-prompt counts."""
    drafted = prop.drafted
    c.verify_steps += int(drafted.shape[0])
    c.num_drafts += int((drafted > 0).sum())
    c.drafted_tokens += int(drafted.sum())
    c.accepted_tokens += int(n.sum())
    if k > 0:
        depth = torch.arange(k, device=drafted.device)[None, :]  # [1, K]
        c.accepted_at += (n[:, None] > depth).sum(0).cpu().numpy()  # first i+1 all accepted
        c.drafted_at += (drafted[:, None] > depth).sum(0).cpu().numpy()  # proposed depth i+1
    if rows is not None:
        c.count_units(rows, n.cpu().numpy(), drafted.cpu().numpy())


def emit(batch: Batch, run: SimRun, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor, eos: frozenset[int]) -> None:
    """d_1..d_n + next token to each row's output, next token to the target's todo; rows
    that hit EOS or their budget leave the batch, and all-hole tail slots are cropped."""
    nl, xl = n.tolist(), nxt.tolist()
    keep: list[int] = []
    for r in range(len(batch.rows)):
        out, done = _emit(prop.tokens[r, : nl[r]].tolist() + [xl[r]], batch.remaining[r], eos)
        run.outputs[batch.rows[r]].extend(out)
        run.counters.emitted_tokens += len(out)
        batch.remaining[r] -= len(out)
        batch.todo[r] = [xl[r]]
        if not done:
            keep.append(r)
    if len(keep) < len(batch.rows):
        _retire(batch, keep)
    batch.target.compact()
    batch.source.compact()


# ----------------------------------------------------------------------------- helpers
def _retire(batch: Batch, keep: list[int]) -> None:
    """Keep only rows `keep` (finished rows leave the batch and every cache)."""
    sel = torch.tensor(keep, dtype=torch.long, device=batch.target.device)
    batch.target.select(sel)
    batch.source.select(sel)
    batch.rows = [batch.rows[r] for r in keep]
    batch.todo = [batch.todo[r] for r in keep]
    batch.remaining = [batch.remaining[r] for r in keep]


def _batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    # similar lengths together: less left padding
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _emit(tokens: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at the budget; -> (tokens, finished)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    tokens = tokens[:budget]
    return tokens, len(tokens) >= budget
