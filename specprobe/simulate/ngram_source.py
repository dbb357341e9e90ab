"""An n-gram drafter (`drafters.ngram`) as a `DraftSource`: no model, no cache; each row
keeps its sequence so far and its own drafter slot.

Round 1 proposes nothing: the engines draft only after the prompt's pass has sampled
the first token (llama-server calls its speculator's `begin` with the prompt then, and
so does this source). Every later round, row b's slot drafts from prompt + verified
tokens (the last one just sampled), at most cap[b] tokens; a draft is deterministic,
so q is one-hot at each drafted token and the verify step accepts it with p(token).
Verify's accepted count goes back to the slot (`Slot.accept`), as the engine does.
`seconds` is the matching time; `calls` counts the rounds that matched."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specprobe.drafters.ngram import NgramDrafter, Slot
from specprobe.simulate.draft_source import DraftRule, Proposal


class SlotRows:
    """Rows that each hold an n-gram drafter's slot: `select` ends the finished rows'
    requests (their slots see the text they emitted) and keeps the per-row lists named in
    `per_row` for the rows left."""

    per_row: tuple[str, ...]
    slots: list[Slot]
    history: list[list[int]]

    def compact(self) -> None:
        pass

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        for r in sorted(set(range(len(self.slots))) - set(keep)):  # finished rows: their requests end
            self.slots[r].finish(self.history[r])
        for name in self.per_row:
            seq = getattr(self, name)
            setattr(self, name, [seq[r] for r in keep])


class NgramDraft(SlotRows):
    """The rows' n-gram slots over a batch (see module doc)."""

    max_depth = None

    per_row = ("prompts", "history", "slots", "started", "drafted", "by")

    def __init__(self, drafter: NgramDrafter, prompts: Sequence[Sequence[int]], k: int | None = None) -> None:
        self.drafter = drafter
        self.prompts = [list(p) for p in prompts]
        self.history = [list(p) for p in prompts]  # per row: prompt + verified tokens
        self.slots: list[Slot] = [drafter.slot(k) for _ in prompts]
        self.started = [False] * len(prompts)  # the prompt's pass has run
        self.drafted = [0] * len(prompts)  # this round's draft length per row
        self.by: list[str | None] = [None] * len(prompts)  # the type that drafted it
        self.calls = 0
        self.seconds = 0.0

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        nb = cap.shape[0]
        prop = Proposal.nothing(nb, rule.k, cap.device)
        self.drafted = [0] * nb
        self.by = [None] * nb
        caps = cap.tolist()
        spent, any_row = 0.0, False
        for r in range(nb):
            if not self.started[r] or caps[r] <= 0:
                continue
            d = self.slots[r].propose(self.history[r], int(caps[r]))
            spent += d.seconds
            any_row = True
            if d.tokens:
                m = len(d.tokens)
                prop.tokens[r, :m] = torch.tensor(d.tokens, dtype=torch.long, device=cap.device)
                self.drafted[r] = m
                self.by[r] = d.by
        self.seconds += spent
        self.calls += int(any_row)
        if not any(self.drafted):
            return prop
        prop.drafted = torch.tensor(self.drafted, dtype=torch.long, device=cap.device)
        width = prop.tokens.shape[1]
        onehot = torch.zeros((nb, width, rule.vocab), dtype=torch.float32, device=cap.device)
        onehot.scatter_(-1, prop.tokens[..., None], 1.0)  # the verify step sees q = onehot(draft)
        prop.q = list(onehot.unbind(1))
        return prop

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return forward()

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        nl, xl = n.tolist(), nxt.tolist()
        for r in range(len(nl)):
            self.history[r].extend(prop.tokens[r, : nl[r]].tolist() + [xl[r]])
            if not self.started[r]:
                self.started[r] = True
                self.slots[r].begin(self.prompts[r])
            elif self.drafted[r]:
                self.slots[r].accept(nl[r])

