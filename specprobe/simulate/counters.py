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
from specprobe.metrics.uncertainty import linear_se, thin, unit_ratio_se

# the columns of `SimCounters.units` before the per-position ones
_ACC, _DRAFTED, _DRAFTS = 0, 1, 2


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
    # [P, 3 + 2K] per prompt: accepted tokens, drafted tokens, drafts, then drafts with
    # positions 1..i accepted and drafts that proposed position i (i = 1..K); no rows when
    # the loop did not count per prompt (the standard errors are then nan)
    units: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    seeds: int = 1  # seeds pooled into these counts (`add`)

    def __post_init__(self) -> None:
        if len(self.accepted_at) != self.k:
            self.accepted_at = np.zeros(self.k)
            self.drafted_at = np.zeros(self.k)

    # ------------------------------------------------------------------ per prompt
    def open_units(self, prompts: int) -> None:
        """Per-prompt rows for a run over `prompts` prompts (kept if already that many)."""
        if self.units.shape != (prompts, 3 + 2 * self.k):
            self.units = np.zeros((prompts, 3 + 2 * self.k))

    def count_units(self, rows: list[int], accepted: np.ndarray, drafted: np.ndarray, reached: np.ndarray | None = None, accepted_at: np.ndarray | None = None) -> None:
        """One verify step of the live rows: row r is prompt rows[r], proposed drafted[r]
        tokens and had the first accepted[r] accepted; reached[r, i] / accepted_at[r, i]:
        whether the draft counts as proposing / accepting depth i + 1 (by default: it
        proposed it / accepted[r] > i)."""
        if not len(self.units):
            return
        idx = np.asarray(rows, dtype=np.int64)
        accepted, drafted = np.asarray(accepted), np.asarray(drafted)
        depth = np.arange(self.k)[None, :]  # [1, K]
        u = self.units
        np.add.at(u[:, _ACC], idx, accepted)
        np.add.at(u[:, _DRAFTED], idx, drafted)
        np.add.at(u[:, _DRAFTS], idx, drafted > 0)
        np.add.at(u[:, 3 : 3 + self.k], idx, accepted[:, None] > depth if accepted_at is None else accepted_at)
        np.add.at(u[:, 3 + self.k :], idx, drafted[:, None] > depth if reached is None else reached)

    def add(self, other: SimCounters) -> SimCounters:
        """Pool another run of the same prompts and K (another seed): counts add, and
        each prompt's row adds into its own."""
        if other.k != self.k or other.units.shape != self.units.shape:
            raise ValueError("pooled runs must share K and prompts")
        for name in ("verify_steps", "num_drafts", "drafted_tokens", "accepted_tokens", "emitted_tokens", "target_calls", "target_s", "draft_calls", "draft_s", "wall_s", "prompts", "seeds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_at = self.accepted_at + other.accepted_at
        self.drafted_at = self.drafted_at + other.drafted_at
        self.units = self.units + other.units
        if self.by_rank.shape == other.by_rank.shape:
            self.by_rank = self.by_rank + other.by_rank
        return self

    @property
    def unit_prompts(self) -> int:
        return len(self.units)

    def cumulative_se(self) -> list[float]:
        """The standard error over prompts of each `cumulative()` r_i."""
        if not len(self.units) or self.k == 0:
            return [float("nan")] * self.k
        k = self.k
        return unit_ratio_se(self.units[:, 3 : 3 + k], self.units[:, 3 + k :]).tolist()

    def thin(self) -> list[bool]:
        """Per depth: too thin to read (`metrics.uncertainty.thin`); empty without per-prompt counts."""
        if not len(self.units) or self.k == 0:
            return []
        reached = (self.units[:, 3 + self.k :] > 0).sum(axis=0)
        return thin(self.cumulative(), self.cumulative_se(), reached, self.drafted_at)

    @property
    def accept_rate_se(self) -> float:
        """The standard error over prompts of `accept_rate`."""
        if not len(self.units):
            return float("nan")
        return float(unit_ratio_se(self.units[:, _ACC], self.units[:, _DRAFTED]))

    @property
    def tau_se(self) -> float:
        """The standard error over prompts of `tau_tokens`: 1 + Σ_i A_i ÷ D_i linearised,
        each prompt's influence Σ_i (a_i − r_i·d_i) ÷ D_i (1 + A ÷ drafts under an early
        stop)."""
        if not len(self.units) or self.k == 0 or self.num_drafts == 0:
            return float("nan")
        u, k = self.units, self.k
        if self.early_stop:
            a, n = u[:, _ACC], u[:, _DRAFTS]
            return linear_se((a - a.sum() / n.sum() * n) / n.sum())
        a, d = u[:, 3 : 3 + k], u[:, 3 + k :]
        big_d = d.sum(axis=0)
        live = big_d > 0
        r = a.sum(axis=0)[live] / big_d[live]
        return linear_se(((a[:, live] - r * d[:, live]) / big_d[live]).sum(axis=1))

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
