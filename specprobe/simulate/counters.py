"""What a speculative run counted, and the rates read off those counts.

Counting follows vLLM (`v1/spec_decode/metrics.py`): one *draft* is one verify step of
one row that proposed ≥ 1 token; the cumulative per-position rate at position i is
drafts whose first i tokens were all accepted ÷ drafts that proposed position i; the
conditional rate is that ÷ the previous; τ (mean acceptance length) includes the bonus
token. Counts only, so runs (and shards of a run) add up."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


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

    def __post_init__(self) -> None:
        if len(self.accepted_at) != self.k:
            self.accepted_at = np.zeros(self.k)
            self.drafted_at = np.zeros(self.k)

    def cumulative(self) -> list[float]:
        """vLLM's per-position rate r_i (depth from 1); nan where nothing was drafted."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return [float(a / d) if d > 0 else float("nan") for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    def conditional(self) -> list[float]:
        out, prev = [], 1.0
        for r in self.cumulative():
            out.append(float(r / prev) if prev > 0 and not math.isnan(prev) and not math.isnan(r) else float("nan"))
            prev = r
        return out

    @property
    def tau_tokens(self) -> float:
        """1 + Σ_i r_i: expected tokens per full-length verify step, bonus token included
        (equals vLLM's 1 + accepted/drafts when every draft is K long)."""
        if self.k == 0:
            return 1.0
        if self.num_drafts == 0:
            return float("nan")
        return 1.0 + float(np.nansum(self.cumulative()))

    @property
    def tokens_per_verify(self) -> float:
        """Emitted tokens ÷ row verify steps, end-of-budget steps included: what assisted
        generation's generated tokens ÷ target forward calls measures."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else float("nan")

    @property
    def accept_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else float("nan")

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
