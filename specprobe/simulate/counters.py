"""What a speculative run counted, and the rates read off those counts.

Counting follows vLLM (`v1/spec_decode/metrics.py`): one *draft* is one verify step of
one row that proposed ≥ 1 token. The rates come from `metrics.spec_counts`, the
definitions `monitor` reads the engines' counters with: `cumulative()` is the rate of
positions proposed (r_i, what the estimate predicts), `cumulative_vllm()` vLLM's
per-position rate (÷ all drafts); they differ only when drafts are shorter than K. τ
includes the bonus token. Counts only, so runs (and shards of a run) add up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specprobe.metrics import spec_counts


@dataclass
class SimCounters:
    """Mergeable counts of one run (one K, or plain decoding when k = 0)."""

    k: int
    threshold: float | None = None
    verify_steps: int = 0  # row-level verify steps (incl. steps that drafted nothing)
    num_drafts: int = 0  # row-level verify steps that proposed ≥ 1 token
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0  # tokens appended to outputs (after EOS truncation)
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] drafts with positions 1..i accepted
    drafted_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] drafts that proposed position i
    target_calls: int = 0
    target_s: float = 0.0
    draft_calls: int = 0
    draft_s: float = 0.0
    wall_s: float = 0.0
    prompts: int = 0
    early_stop: bool = False  # drafts cut by llama.cpp's p_min / n_min: τ is per draft made
    tree: Any = None  # a tree run: the `estimates.tree.TreeShape` it verified (k = its depth)
    label: int | None = None  # the K it is reported at when that is not k (n-gram types beside a draft model: the model's K; k the loop's width)
    by_rank: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [S, T] accepted depth-d nodes that were their parent's rank-r candidate

    def __post_init__(self) -> None:
        if len(self.accepted_at) != self.k:
            self.accepted_at = np.zeros(self.k)
            self.drafted_at = np.zeros(self.k)

    def cumulative(self) -> list[float]:
        """r_i: accepted at position i ÷ drafts that proposed position i (depth from 1)."""
        return spec_counts.per_position_rate_of_proposed(self.accepted_at.tolist(), self.drafted_at.tolist())

    def cumulative_vllm(self) -> list[float]:
        """vLLM's per-position acceptance rate: accepted at position i ÷ all drafts."""
        return spec_counts.per_position_rate_vllm(self.accepted_at.tolist(), self.num_drafts)

    def conditional(self) -> list[float]:
        return spec_counts.conditional_rates(self.cumulative())

    @property
    def tau_tokens(self) -> float:
        """1 + Σ_i r_i: expected tokens per full-length verify step, bonus token included
        (equals vLLM's 1 + accepted/drafts when every draft is K long)."""
        if self.k == 0:
            return 1.0
        if self.num_drafts == 0:
            return float("nan")
        if self.early_stop:  # drafts of every length: tokens per draft made, as llama-server counts
            return self.mean_acceptance_length
        return spec_counts.expected_length(self.cumulative())

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's mean acceptance length 1 + accepted ÷ drafts (short drafts included)."""
        return spec_counts.mean_acceptance_length(self.accepted_tokens, self.num_drafts)

    @property
    def tokens_per_verify(self) -> float:
        """Emitted tokens ÷ row verify steps, end-of-budget steps included: what assisted
        generation's generated tokens ÷ target forward calls measures. Tokens past an EOS
        or the budget were never emitted, so they do not count."""
        return self.emitted_tokens / self.verify_steps if self.verify_steps else float("nan")

    @property
    def accept_rate(self) -> float:
        return spec_counts.acceptance_rate(self.accepted_tokens, self.drafted_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.emitted_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def mean_k(self) -> float:
        return self.drafted_tokens / self.num_drafts if self.num_drafts else float("nan")


@dataclass
class SimRun:
    """Outputs (emitted token ids per prompt, in input order) and the counters."""

    counters: SimCounters
    outputs: list[list[int]] = field(default_factory=list)
