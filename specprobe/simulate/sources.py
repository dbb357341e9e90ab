"""The draft sources the loop runs (`draft_source.DraftSource`):

    NoDraft   plain target decoding: proposes nothing (the baseline)
    LMDraft   a causal LM with its own KV cache (`models.kvcache.Stream`)
    HeadDraft a head drafter (EAGLE-1/2, EAGLE-3, Medusa, MTP; `models.heads.live.LiveHead`)
              that reads the target's states from every verify pass
    NgramDraft an n-gram drafter (`drafters.ngram`, no model; `ngram_source`)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specprobe.drafters.ngram import NgramDrafter
from specprobe.drafters.ngram_mix import MixedDrafter
from specprobe.models.heads.chain import HeadDrafter
from specprobe.models.heads.live import HeadTimed, LiveHead
from specprobe.models.kvcache import Stream, StreamTimed, right_align
from specprobe.simulate.draft_source import DraftRule, DraftSource, Proposal, chain
from specprobe.simulate.ngram_mix_source import MixedDraft
from specprobe.simulate.ngram_source import NgramDraft


def is_head(drafter: Any) -> bool:
    return isinstance(drafter, HeadDrafter)


def open_source(drafter: Any | None, prompts: Sequence[Sequence[int]], device: Any) -> DraftSource:
    """The source for a drafter (a causal LM, a head drafter, an n-gram drafter or None)
    over a batch of prompts."""
    if drafter is None:
        return NoDraft()
    if isinstance(drafter, NgramDrafter):
        return NgramDraft(drafter, prompts)
    if isinstance(drafter, MixedDrafter):  # llama.cpp's n-gram types beside a draft model
        assert drafter.model_k is not None, "a mixed drafter runs with_k(K)"
        return MixedDraft(drafter, prompts, LMDraft(drafter.step_model(), prompts, device), drafter.model_k)
    if is_head(drafter):
        return HeadDraft(drafter, len(prompts), device)
    return LMDraft(drafter, prompts, device)


class NoDraft:
    """Plain target decoding."""

    max_depth = 0
    calls = 0
    seconds = 0.0

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        return Proposal.nothing(cap.shape[0], rule.k, cap.device)

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return forward()

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        pass

    def compact(self) -> None:
        pass

    def select(self, rows: torch.Tensor) -> None:
        pass


class LMDraft(StreamTimed):
    """A causal LM drafting from its own cache. Its first forward of a round catches it up
    on the verified tokens it has not seen (the prompt in round 1, then 1–2 a round) and
    gives depth 1; each further depth feeds back the token just drafted."""

    max_depth = None

    def __init__(self, model: Any, prompts: Sequence[Sequence[int]], device: Any) -> None:
        self.stream = Stream(model, len(prompts), device)
        self.todo = [list(p) for p in prompts]  # per row: verified tokens not yet in its cache
        self._round: tuple[int, torch.Tensor] | None = None  # (slot of d_1, drafts fed back) when it drafted

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        self._round = None
        if not bool((cap > 0).any()):
            return Proposal.nothing(cap.shape[0], rule.k, cap.device)
        ids, valid = right_align(self.todo, self.stream.device)  # [B, T]
        first = self.stream.length + ids.shape[1]
        logits = self.stream.forward(ids, valid, keep=1)[:, -1]  # [B, V']
        prop, fed = chain(logits, self._step, cap, rule, gen)
        self._round = (first, fed)
        return prop

    def _step(self, x: torch.Tensor, feed: torch.Tensor, depth: int) -> torch.Tensor:
        return self.stream.forward(x[:, None], feed[:, None], keep=1)[:, -1]

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return forward()

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        """d_{n+1}.. become holes. When it drafted, its cache holds todo and d_1..d_fed with
        fed ≥ m − 1 ≥ n − 1, so left to feed are d_n when it was never fed back, and nxt;
        when it did not (n = 0), todo grows by nxt."""
        unseen = self.todo
        fed = torch.zeros_like(n)
        if self._round is not None:
            first, fed = self._round
            self.stream.invalidate_from(first + n)
            unseen = [[] for _ in self.todo]
        nl, fl, xl = n.tolist(), fed.tolist(), nxt.tolist()
        self.todo = [unseen[r] + prop.tokens[r, fl[r] : nl[r]].tolist() + [xl[r]] for r in range(len(nl))]

    def compact(self) -> None:
        self.stream.compact()

    def select(self, rows: torch.Tensor) -> None:
        self.stream.select(rows)
        self.todo = [self.todo[r] for r in rows.tolist()]


class HeadDraft(HeadTimed):
    """A head drafter: it catches up on the positions the last verify pass accepted, from
    the target's own states there, and drafts depth 1 from the last of them; nothing in
    round 1, before the target has run. Its chain entries are dropped after verify, the
    accepted ones included: they come back as catch-up entries (see `LiveHead`)."""

    def __init__(self, drafter: Any, batch: int, device: Any) -> None:
        self.head = LiveHead(drafter, batch, device)
        self._first: int | None = None  # this round's first chain slot, when it drafted
        self._block: tuple[int, torch.Tensor] | None = None  # the last verify block: width, real tokens [B]

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        self._first = None
        if not bool((cap > 0).any()) or not self.head.has_pending:
            return Proposal.nothing(cap.shape[0], rule.k, cap.device)
        logits = self.head.catch_up()  # [B, V]
        self._first = self.head.length
        prop, _ = chain(logits, self.head.step, cap, rule, gen)
        return prop

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._block = (int(ids.shape[1]), valid.sum(dim=1))
        return self.head.watch(ids, forward)

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        """Row b's block is [todo, d_1..d_m] right-aligned: its first len(todo) + n
        positions were accepted, and nxt follows them."""
        assert self._block is not None, "accept() follows watch()"
        width, real = self._block  # real = len(todo) + m
        self.head.queue(width - real, real - prop.drafted + n, nxt)
        if self._first is not None:
            self.head.invalidate_from(self._first)

    def compact(self) -> None:
        self.head.compact()

    def select(self, rows: torch.Tensor) -> None:
        self.head.select(rows)
