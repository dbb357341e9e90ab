"""The token-level drill-down section of a diagnose result: where, on what tokens and
why the drafter loses acceptance, and what-ifs computed from the same logits.

Bounded in size whatever the run: every scored token of every prompt (top-1 of each
side only), both sides' top-5 only for the worst positions and the worst prompts, and
ranked summaries. Token ids are the target's; `vocab` gives the text of every id the
section names. Probabilities are each side's untruncated tempered softmax (T = 1 when
it decodes greedily), as KL uses them: the distributions, not the sampler's cut.
"""

from __future__ import annotations

from pydantic import Field

from specprobe.result.base import Num, Part

DISTRIBUTIONS = "each side's untruncated tempered softmax (T = 1 when greedy)"


class TopTokens(Part):
    """One side's top-5 at a position, with the other side's probability of each id."""

    ids: list[int]
    probs: list[Num]
    other_probs: list[Num] = Field(description="The other side's probability of the same ids.")


class WorstPosition(Part):
    """One position among the worst (lowest α, or highest KL)."""

    prompt_id: str
    domain: str
    position: int = Field(description="Index of the predicted token in prompt + continuation.")
    index: int = Field(description="Index of the token in the prompt's continuation (from 0).")
    token: int = Field(description="The reference token (target id).")
    accept_prob: Num
    kl_target_draft_nats: Num
    target: TopTokens
    draft: TopTokens
    before: str = Field(description="Text just before the token.")
    after: str = Field(description="Text just after it.")


class TokenTops(Part):
    """Both sides' top-5 for every token of a prompt ([token][rank])."""

    target_ids: list[list[int]]
    target_probs: list[list[Num]]
    draft_ids: list[list[int]]
    draft_probs: list[list[Num]]


class PromptTokens(Part):
    """Every scored token of one prompt; the columns have one entry per token."""

    prompt_id: str
    domain: str
    prompt_tail: str = Field(description="The last tokens of the encoded prompt, chat template included.")
    accept_prob_mean: Num
    kl_target_draft_nats: Num
    start: int = Field(description="Position of the first scored token in prompt + continuation.")
    tokens: list[int]
    accept_prob: list[Num]
    kl_target_draft_nats_by_token: list[Num]
    target_top1: list[int]
    target_top1_prob: list[Num]
    draft_top1: list[int]
    draft_top1_prob: list[Num]
    tops: TokenTops | None = Field(default=None, description="Both top-5 lists per token: only for the worst prompts.")


class Confusion(Part):
    """Positions where the target's top-1 was `target` and the drafter's `draft`."""

    target: int
    draft: int
    count: int
    accept_prob_lost: Num = Field(description="Σ (1 − α) over those positions.")
    share_of_loss: Num = Field(description="accept_prob_lost ÷ Σ (1 − α) over all positions.")
    accept_prob_mean: Num


class OverProposed(Part):
    """A token the drafter puts mass on where the target puts little."""

    token: int
    excess_mass: Num = Field(description="Σ over positions of max(0, q − p) where the token is in the drafter's top-5.")
    excess_per_position: Num
    draft_top1_count: int
    target_top1_count: int


class TokenClassRow(Part):
    """α over the positions whose reference token is of one class."""

    token_class: str
    positions: int
    accept_prob_mean: Num
    kl_target_draft_nats: Num
    share_of_loss: Num


class WhatIf(Part):
    """A counterfactual beside the real value, both on the same sampled positions."""

    key: str  # aligned_sampling | greedy | temperature | vocab_ceiling
    name: str
    temperature: Num = None
    positions: int = Field(default=0, description="Positions this what-if was computed on (the grid temperatures take turns over the sampled prompts).")
    accept_prob: Num
    accept_prob_real: Num
    tau_tokens: Num = None
    tau_tokens_real: Num = None


class Counterfactuals(Part):
    every: int = Field(description="Computed on every n-th prompt (1: all).")
    sample_prompts: int
    sample_positions: int
    k: int | None = Field(default=None, description="The draft length τ is given at (the run's best K).")
    rows: list[WhatIf] = Field(default_factory=list)


class DomainGain(Part):
    """A domain's α against the overall, and what matching the best domain would add."""

    domain: str
    positions: int
    accept_prob_mean: Num
    vs_overall: Num = Field(description="Domain α − overall α.")
    gain_if_best: Num = Field(description="Overall α gained if this domain reached the best domain's α.")


class DrillDown(Part):
    """Token-level evidence: per prompt, worst positions, confusions, classes, what-ifs."""

    distributions: str = DISTRIBUTIONS
    joiner: str = Field(default="", description="What goes between two token texts when they are written out ('' for byte-level BPE).")
    vocab: dict[int, str] = Field(default_factory=dict, description="Target id → token text, for every id in this section.")
    special_ids: list[int] = Field(default_factory=list)
    positions: int = 0
    token_classes: list[TokenClassRow] = Field(default_factory=list)
    confusions: list[Confusion] = Field(default_factory=list)
    over_proposed: list[OverProposed] = Field(default_factory=list)
    worst: list[WorstPosition] = Field(default_factory=list, description="Lowest α first (ties: higher KL first).")
    worst_kl: list[WorstPosition] = Field(default_factory=list, description="Highest KL first.")
    prompts: list[PromptTokens] = Field(default_factory=list, description="Worst prompts (lowest mean α) first.")
    prompts_omitted: int = Field(default=0, description="Prompts left out to keep the file bounded (the best ones).")
    counterfactuals: Counterfactuals | None = None
    domains: list[DomainGain] = Field(default_factory=list, description="Largest gain first.")

    def text(self, token: int) -> str:
        return self.vocab.get(token, f"<{token}>")

    def prompt(self, prompt_id: str) -> PromptTokens | None:
        return next((p for p in self.prompts if p.prompt_id == prompt_id), None)
