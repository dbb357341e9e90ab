"""What the loop drafts from: one protocol for every source of draft tokens.

A source proposes tokens; the loop verifies them. Each round, over the batch's live rows:

    propose   up to cap[b] drafts d_1..d_m for row b, with the distribution q_j each was
              drawn from (a deterministic source: q_j one-hot at d_j)
    watch     the target's verify pass runs through the source, which keeps what it
              reads of it (a head: the target's states at every position)
    accept    verify kept d_1..d_n and picked the next token: the source rolls back
              d_{n+1}..d_m and queues the verified tokens for its next proposal

then `compact` crops trailing holes and `select` drops finished rows. `chain` is the
autoregressive proposal both model sources share: draw d_j (the drafter's argmax when
drafting greedily, else d_j ~ q_j), feed it back, repeat."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specprobe.metrics.core import align_vocab, finite
from specprobe.metrics.sampling import Sampling, probs, sampler_top_confidence

# (d_{j-1} [B], rows fed [B], depth j) -> logits of depth j [B, V']; other rows sit it out as holes
Step = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class DraftRule:
    """How a run drafts."""

    k: int  # draft length (0: plain decoding)
    sampling: Sampling  # the drafter's own: q_j = probs(logits_j)
    threshold: float | None  # adaptive K: stop a row at the first depth whose confidence is below it
    vocab: int  # the target's; q is indexed by target ids
    greedy: bool = False  # d_j = the drafter's argmax, q_j one-hot at it; else d_j ~ q_j
    confidence: int = 0  # 0: max of probs(logits_j, sampling); N: the engine's draft sampler's top probability among the drafter's N best
    n_min: int = 0  # a row that drafts fewer than this drafts nothing


@dataclass
class Proposal:
    """One round's drafts."""

    tokens: torch.Tensor  # [B, K]; row b's drafts are tokens[b, :drafted[b]]
    drafted: torch.Tensor  # [B] m: tokens proposed
    q: list[torch.Tensor]  # K × [B, V] q_j over the target's ids (empty: nothing was drafted)

    @classmethod
    def nothing(cls, rows: int, k: int, device: torch.device) -> Proposal:
        return cls(
            tokens=torch.zeros((rows, max(k, 1)), dtype=torch.long, device=device),
            drafted=torch.zeros(rows, dtype=torch.long, device=device),
            q=[],
        )


class DraftSource(Protocol):
    """A source of draft tokens over a batch of rows (see module doc)."""

    @property
    def max_depth(self) -> int | None:
        """The deepest draft it can make (Medusa: its number of heads); None: any."""
        ...

    @property
    def calls(self) -> int:
        """Forward passes so far."""
        ...

    @property
    def seconds(self) -> float:
        """Time in them."""
        ...

    def propose(self, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> Proposal:
        """Up to cap[b] ≤ K drafts for row b ([B]), from the tokens verified so far."""
        ...

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run the target's verify pass over the block ids [B, T] (valid [B, T]: the row's
        [todo, d_1..d_m], right-aligned) -> what `forward` returns."""
        ...

    def accept(self, prop: Proposal, n: torch.Tensor, nxt: torch.Tensor) -> None:
        """Verify kept row b's first n[b] drafts and picked nxt[b] after them."""
        ...

    def compact(self) -> None:
        """Crop trailing slots that are holes in every row."""
        ...

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        ...


def chain(logits: torch.Tensor, step: Step, cap: torch.Tensor, rule: DraftRule, gen: torch.Generator) -> tuple[Proposal, torch.Tensor]:
    """Autoregressive drafting from the logits of depth 1 [B, V']: d_j is drawn (see
    `DraftRule.greedy`) and fed back for depth j+1 while a row still drafts -> (the
    proposal, fed [B]: drafts fed back)."""
    nb, k = cap.shape[0], rule.k
    prop = Proposal.nothing(nb, k, cap.device)
    fed = torch.zeros(nb, dtype=torch.long, device=cap.device)
    live = cap > 0  # [B] rows still drafting
    for j in range(k):
        lg = align_vocab(finite(logits), rule.vocab)  # [B, V] over the target's ids
        if rule.greedy:
            x = lg.argmax(dim=-1)  # [B]; ties: the lowest id
            q = torch.zeros(lg.shape, dtype=torch.float32, device=lg.device).scatter_(-1, x[:, None], 1.0)  # what the verify step sees
        else:
            q = probs(lg, rule.sampling)
            x = draw(q, rule.sampling, gen)  # [B]
        if rule.threshold is not None:
            # stop before the first unconfident depth: that draft is not proposed
            live &= confidence(lg, q, rule) >= rule.threshold
        live &= j < cap
        prop.tokens[:, j] = x
        prop.q.append(q)
        prop.drafted += live.long()
        feed = live & (j + 1 < cap)  # rows that need depth j+2
        if j + 1 >= k or not bool(feed.any()):
            break
        logits = step(x, feed, j + 2)
        fed += feed.long()
    prop.q += [prop.q[-1]] * (k - len(prop.q))  # rows never reach these; keep shapes [B, K, V]
    if rule.n_min > 1:
        prop.drafted.masked_fill_(prop.drafted < rule.n_min, 0)  # a too-short draft is dropped whole
    return prop, fed


def confidence(logits: torch.Tensor, q: torch.Tensor, rule: DraftRule) -> torch.Tensor:
    """A row's drafter confidence at one depth [B]: max q under the drafter's sampling
    (1 for a greedy drafter, as in the estimate), or the engine's draft sampler's
    (`DraftRule.confidence` N > 0): it keeps the drafter's N best tokens at temperature 1
    and reads the first one's probability among them."""
    if rule.confidence:
        return sampler_top_confidence(logits, rule.confidence)
    if rule.greedy and not rule.sampling.greedy:
        q = probs(logits, rule.sampling)  # the one-hot q drafts; the confidence is the drafter's own
    return q.amax(dim=-1)


def draw(q: torch.Tensor, s: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """x ~ q [B, V] -> [B] (argmax when greedy)."""
    if s.greedy:
        return q.argmax(dim=-1)
    return torch.multinomial(q, 1, generator=generator).squeeze(1)
