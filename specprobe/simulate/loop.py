"""The draft → verify loop, batch by batch, round by round.

Each round, for every live row of a batch:

    draft      the drafter proposes up to K tokens autoregressively (its own KV cache)
    verify     the target scores them all in one forward pass; rejection sampling
               keeps an accepted prefix of n tokens and picks the next token
    roll back  the rejected drafts become holes in both caches
    count      vLLM's counters (`counters.SimCounters`)
    emit       the n accepted drafts + the next token go to the output; a row that hit
               EOS or its budget leaves the batch

Like transformers' assisted generation, a row drafts at most `remaining − 1` tokens
near the end of its budget, so it never overshoots it. k = 0 (or no drafter) is plain
autoregressive decoding with the same machinery: the baseline.

The drafter is a causal LM (its own `Stream`) or a head drafter (EAGLE-1/2, EAGLE-3,
Medusa, MTP; `models.heads.live.LiveHead`), which reads the target's states from every
verify pass, drafts from the round after the prefill and keeps only verified tokens in
its cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specprobe.metrics.core import align_vocab
from specprobe.metrics.sampling import Sampling, probs
from specprobe.models.kvcache import Stream, right_align
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.rejection import verify_greedy, verify_sampled

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
    run: SimRun | None = None,
    advance: Advance | None = None,
) -> SimRun:
    """Speculative decoding of every prompt (token id lists) -> SimRun.

    draft_model: a causal LM, a head drafter (`models.heads.chain.HeadDrafter`, over
    this target), or None. k = 0 (or no drafter) is plain autoregressive decoding with the same machinery: the
    baseline. `threshold` stops a row's drafting at the first depth whose drafter
    confidence max q is below it (adaptive K; max q is 1 for a greedy drafter, as in the
    estimate). `run` is filled as it goes, so a caller that catches KeyboardInterrupt
    keeps what was measured."""
    if draft_model is None:
        k = 0
    device = next(target_model.parameters()).device
    settings = Settings(
        k=k,
        target_sampling=target_sampling,
        draft_sampling=draft_sampling or target_sampling,
        eos=frozenset(int(e) for e in eos_ids),
        threshold=threshold,
        vocab=int(target_model.get_output_embeddings().weight.shape[0]),
        device=device,
    )
    run = run or SimRun(SimCounters(k, threshold))
    run.outputs = [[] for _ in prompts]
    c = run.counters
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
    draft_sampling: Sampling
    eos: frozenset[int]
    threshold: float | None  # adaptive K: stop drafting below this drafter confidence
    vocab: int  # the target's; drafter logits are indexed by target ids
    device: Any


@dataclass
class Batch:
    """A batch between rounds: its live rows and what each cache has yet to see."""

    target: Stream
    drafter: Stream | None
    head: Any  # LiveHead for a head drafter (then drafter is None), else None
    rows: list[int]  # live row -> prompt index
    t_todo: list[list[int]]  # per live row: tokens not yet in the target's cache
    d_todo: list[list[int]]  # … not yet in the drafter's cache
    remaining: list[int]  # per live row: tokens it may still emit
    gen: torch.Generator

    @classmethod
    def start(cls, target_model: Any, draft_model: Any | None, prompts: list[Sequence[int]], index: list[int], max_new: int, gen: torch.Generator, device: Any) -> Batch:
        b = len(prompts)
        head = None
        if is_head(draft_model):
            from specprobe.models.heads.live import LiveHead

            head, draft_model = LiveHead(draft_model, b, device), None
        return cls(
            target=Stream(target_model, b, device),
            drafter=Stream(draft_model, b, device) if draft_model is not None else None,
            head=head,
            rows=list(index),
            t_todo=[list(p) for p in prompts],  # round 1 feeds the prompts
            d_todo=[list(p) for p in prompts],
            remaining=[max_new] * b,
            gen=gen,
        )


@dataclass
class Proposal:
    """One round's drafts."""

    tokens: torch.Tensor  # [B, K]; row b's draft is tokens[b, :drafted[b]]
    drafted: torch.Tensor  # [B] tokens proposed
    fed: torch.Tensor  # [B] drafts written back into the drafter's cache
    q: list[torch.Tensor]  # K × [B, V] drafter probabilities per depth (empty: no drafter ran)
    first_slot: int  # drafter-cache slot of d_1 (its roll-back point); a head's first chain slot

    @property
    def drafter_ran(self) -> bool:
        return bool(self.q)


# ----------------------------------------------------------------------------- one batch
def decode_batch(batch: Batch, s: Settings, run: SimRun) -> None:
    """Rounds of draft → verify → roll back → count → emit until every row is done."""
    c = run.counters
    try:
        while batch.rows:
            prop = draft(batch, s)
            n, nxt = verify(batch, s, prop)  # [B] accepted drafts, [B] next token
            if batch.head is not None:
                _queue_head(batch, prop, n, nxt)
            roll_back(batch, prop, n)
            count(c, prop, n, s.k)
            emit(batch, run, prop, n, nxt, s.eos)
    finally:
        c.target_calls += batch.target.calls
        c.target_s += batch.target.seconds
        for d in (batch.drafter, batch.head):
            if d is not None:
                c.draft_calls += d.calls
                c.draft_s += d.seconds


def draft(batch: Batch, s: Settings) -> Proposal:
    """Up to K autoregressive drafter steps; the first one also catches the drafter up on
    last round's tokens (1–2 per row; the prompt in round 1). A head catches up on the
    positions the last verify accepted (nothing to draft from before the prefill)."""
    nb, k, dev = len(batch.rows), s.k, s.device
    limit = batch.head.max_depth if batch.head is not None and batch.head.max_depth else k  # Medusa: one depth per head
    cap = torch.tensor([max(0, min(k, limit, r - 1)) for r in batch.remaining], device=dev)  # [B] draft length cap
    prop = Proposal(
        tokens=torch.zeros((nb, max(k, 1)), dtype=torch.long, device=dev),
        drafted=torch.zeros(nb, dtype=torch.long, device=dev),
        fed=torch.zeros(nb, dtype=torch.long, device=dev),
        q=[],
        first_slot=0,
    )
    dft, head = batch.drafter, batch.head
    if not bool((cap > 0).any()):
        return prop
    if head is not None:
        if not head.has_pending:
            return prop  # round 1: the target has not run yet
        logits = head.catch_up()  # [B, V]
        prop.first_slot = head.length
        step: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] = head.step
    elif dft is not None:
        ids, valid = right_align(batch.d_todo, dev)
        prop.first_slot = dft.length + ids.shape[1]
        logits = dft.forward(ids, valid, keep=1)[:, -1]  # [B, V']

        def step(x: torch.Tensor, feed: torch.Tensor, depth: int) -> torch.Tensor:
            return dft.forward(x[:, None], feed[:, None], keep=1)[:, -1]
    else:
        return prop
    live = cap > 0  # [B] rows still drafting
    for j in range(k):
        logits = _numbers(logits)
        q = probs(align_vocab(logits, s.vocab), s.draft_sampling)  # [B, V] over the target's ids
        if s.threshold is not None:
            live &= q.amax(dim=-1) >= s.threshold  # stop at the first unconfident depth
        live &= j < cap
        x = _draw(q, s.draft_sampling, batch.gen)  # [B]
        prop.tokens[:, j] = x
        prop.q.append(q)
        prop.drafted += live.long()
        feed = live & (j + 1 < cap)  # rows that need depth j+2
        if j + 1 >= k or not bool(feed.any()):
            break
        logits = step(x, feed, j + 2)
        prop.fed += feed.long()
    prop.q += [prop.q[-1]] * (k - len(prop.q))  # rows never reach these; keep shapes [B, K, V]
    return prop


def verify(batch: Batch, s: Settings, prop: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
    """The target scores [todo, d_1..d_n] in one pass -> (accepted count n [B], next token [B])."""
    nb, k, dev = len(batch.rows), s.k, s.device
    drafted = prop.drafted
    dl = drafted.tolist()
    blocks = [batch.t_todo[r] + prop.tokens[r, : dl[r]].tolist() for r in range(nb)]
    ids, valid = right_align(blocks, dev)
    last = min(k + 1, ids.shape[1])
    forward = lambda: batch.target.forward(ids, valid, keep=last)  # noqa: E731
    # a head reads the target's states at every verified position
    logits = _numbers(batch.head.watch(ids, forward) if batch.head is not None else forward())  # [B, K+1, V]: the last K+1 columns
    # p_0 (after the last todo token) … p_n (bonus) sit in the last n+1 columns
    col = (last - 1 - drafted[:, None] + torch.arange(k + 1, device=dev)[None, :]).clamp_(max=last - 1)  # [B, K+1]
    tl = logits.gather(1, col[..., None].expand(-1, -1, logits.shape[-1]))  # [B, K+1, V]
    if k == 0:
        return torch.zeros(nb, dtype=torch.long, device=dev), _draw(probs(tl[:, 0], s.target_sampling), s.target_sampling, batch.gen)
    if s.target_sampling.greedy:
        return verify_greedy(prop.tokens, drafted, tl)
    q_all = torch.stack(prop.q, dim=1) if prop.q else tl.new_zeros((nb, k, tl.shape[-1]), dtype=torch.float32)  # [B, K, V]
    return verify_sampled(prop.tokens, drafted, q_all, probs(tl, s.target_sampling), batch.gen)


def roll_back(batch: Batch, prop: Proposal, n: torch.Tensor) -> None:
    """Rejected drafts become holes in both caches; a head drops its whole chain (the
    accepted drafts come back as entries from the target's states at the next catch-up)."""
    tgt = batch.target
    tgt.invalidate_from(tgt.length - (prop.drafted - n))
    if prop.drafter_ran and batch.drafter is not None:
        batch.drafter.invalidate_from(prop.first_slot + n)
    if prop.drafter_ran and batch.head is not None:
        batch.head.invalidate_from(prop.first_slot)


def _queue_head(batch: Batch, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
    """The verify block of row r is [todo, d_1..d_drafted] right-aligned: its first
    len(todo) + n positions were accepted, and `nxt` follows them."""
    todo = torch.tensor([len(t) for t in batch.t_todo], device=n.device)  # [B]
    block = int((todo + prop.drafted).max())
    batch.head.queue(block - todo - prop.drafted, todo + n, nxt)


def count(c: SimCounters, prop: Proposal, n: torch.Tensor, k: int) -> None:
    """vLLM conventions: a draft is one row's verify step that proposed ≥ 1 token."""
    drafted = prop.drafted
    c.verify_steps += int(drafted.shape[0])
    c.num_drafts += int((drafted > 0).sum())
    c.drafted_tokens += int(drafted.sum())
    c.accepted_tokens += int(n.sum())
    if k > 0:
        depth = torch.arange(k, device=drafted.device)[None, :]  # [1, K]
        c.accepted_at += (n[:, None] > depth).sum(0).cpu().numpy()  # first i+1 all accepted
        c.drafted_at += (drafted[:, None] > depth).sum(0).cpu().numpy()  # proposed depth i+1


def emit(batch: Batch, run: SimRun, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor, eos: frozenset[int]) -> None:
    """Accepted drafts + next token to each row's output; queue them for the caches; rows
    that hit EOS or their budget leave the batch, and all-hole tail slots are cropped."""
    nl, xl, fl = n.tolist(), nxt.tolist(), prop.fed.tolist()
    keep: list[int] = []
    for r in range(len(batch.rows)):
        new = prop.tokens[r, : nl[r]].tolist() + [xl[r]]
        out, done = _emit(new, batch.remaining[r], eos)
        run.outputs[batch.rows[r]].extend(out)
        run.counters.emitted_tokens += len(out)
        batch.remaining[r] -= len(out)
        batch.t_todo[r] = [xl[r]]
        if batch.drafter is None:
            pass  # a head or plain decoding: no drafter cache to feed
        elif prop.drafter_ran:
            # the drafter saw d_1..d_fed; a last accepted draft it never saw comes first
            batch.d_todo[r] = ([int(prop.tokens[r, nl[r] - 1])] if nl[r] > fl[r] else []) + [xl[r]]
        else:
            batch.d_todo[r] = batch.d_todo[r] + new
        if not done:
            keep.append(r)
    if len(keep) < len(batch.rows):
        _retire(batch, keep)
    batch.target.compact()
    for d in (batch.drafter, batch.head):
        if d is not None:
            d.compact()


# ----------------------------------------------------------------------------- helpers
def _retire(batch: Batch, keep: list[int]) -> None:
    """Keep only rows `keep` (finished rows leave the batch and both caches)."""
    sel = torch.tensor(keep, dtype=torch.long, device=batch.target.device)
    batch.target.select(sel)
    for d in (batch.drafter, batch.head):
        if d is not None:
            d.select(sel)
    batch.rows = [batch.rows[r] for r in keep]
    batch.t_todo = [batch.t_todo[r] for r in keep]
    batch.d_todo = [batch.d_todo[r] for r in keep]
    batch.remaining = [batch.remaining[r] for r in keep]


def is_head(drafter: Any) -> bool:
    from specprobe.models.heads.chain import HeadDrafter

    return isinstance(drafter, HeadDrafter)


def _batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    # similar lengths together: less left padding
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _numbers(logits: torch.Tensor) -> torch.Tensor:
    """NaN → 0 and ±inf → the largest finite values, as transformers' generate does with
    remove_invalid_values: a model whose logits are not numbers still runs to the end
    (the estimate names those positions, rule SP107) instead of failing to sample."""
    # −inf alone is a token the model rules out (a head's unmapped ids): left as it is
    return torch.nan_to_num(logits, nan=0.0) if bool((logits.isnan() | logits.isposinf()).any()) else logits


def _draw(q: torch.Tensor, s: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    if s.greedy:
        return q.argmax(dim=-1)
    return torch.multinomial(q, 1, generator=generator).squeeze(1)


def _emit(tokens: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at the budget; -> (tokens, finished)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    tokens = tokens[:budget]
    return tokens, len(tokens) >= budget
