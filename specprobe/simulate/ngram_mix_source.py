"""llama.cpp's n-gram types beside a draft model (`drafters.ngram_mix`) as one `DraftSource`:
each round the n-gram slots draft first (`NgramDraft`); the rows none of them drafted
for are drafted by the model (`LMDraft`, at most the run's K, its --spec-draft-n-max),
the others cap 0 for it. The model's cache takes in every verified token whoever drafted
(llama.cpp's draft model processes every batch the target decodes): a row the n-gram
types drafted for hands the model its accepted tokens and the next one as unseen
tokens, fed with its next forward. A deterministic n-gram draft has a one-hot q; the
model's q is its own distribution, so each engine's verify procedure applies row by row.
`seconds` and `calls` add both sides (the matching and the model's forwards)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specprobe.drafters.ngram_mix import MixedDrafter
from specprobe.simulate.draft_source import DraftRule, Proposal
from specprobe.simulate.ngram_source import NgramDraft


class MixedDraft:
    """The rows' n-gram slots and the draft model over one batch (module doc)."""

    max_depth = None

    def __init__(self, drafter: MixedDrafter, prompts: Sequence[Sequence[int]], lm: Any, k: int) -> None:
        self.k = k  # the model's longest draft; the n-gram types draft their own lengths
        self.ngram = NgramDraft(drafter.ngram, prompts)
        self.lm = lm  # the draft model's own source (`sources.LMDraft` over the same prompts)
        self.by_model = [False] * len(prompts)

    @property
    def calls(self) -> int:
        return self.ngram.calls + self.lm.calls

    @property
    def seconds(self) -> float:
        return self.ngram.seconds + self.lm.seconds

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        first = self.ngram.propose(cap, rule, gen)
        took = torch.tensor([d > 0 for d in self.ngram.drafted], dtype=torch.bool, device=cap.device)
        # round 1 (the prompt's pass) drafts nothing on either side: the n-gram slots start after it
        started = torch.tensor(self.ngram.started, dtype=torch.bool, device=cap.device)
        lm_cap = torch.where(took | ~started, torch.zeros_like(cap), cap.clamp(max=self.k))
        second = self.lm.propose(lm_cap, rule, gen)
        self.by_model = [bool(x) for x in (second.drafted > 0).tolist()]
        if not bool(took.any()):
            return second
        if not any(self.by_model):
            return first
        merged = Proposal.nothing(cap.shape[0], rule.k, cap.device)
        merged.tokens = torch.where(took[:, None], first.tokens, second.tokens)
        merged.drafted = torch.where(took, first.drafted, second.drafted)
        merged.q = [torch.where(took[:, None], a, b) for a, b in zip(first.q, second.q, strict=True)]  # both K × [B, V]
        return merged

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return forward()

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        self.ngram.accept(prop, n, nxt)  # the n-gram slots hear only their own drafts' counts
        self.lm.accept(prop, n, nxt)  # n-gram rows: the accepted tokens and nxt, unseen by the model

    def compact(self) -> None:
        self.lm.compact()

    def select(self, rows: torch.Tensor) -> None:
        self.ngram.select(rows)
        self.lm.select(rows)
        keep = rows.tolist()
        self.by_model = [self.by_model[r] for r in keep]
