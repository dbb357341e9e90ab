"""The sampling transform S(logits; temperature, top_k, top_p, min_p), shared by the
teacher-forced metrics and the real speculative loop, so both see the same distributions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """One side's sampling settings. temperature 0 means greedy (one-hot argmax)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def truncates(self) -> bool:
        return (self.top_k or 0) > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min_p={self.min_p:g}")
        return " ".join(parts)


def log_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Untruncated tempered log-softmax (T=1 for greedy), float32. [N, V] -> [N, V].
    KL and entropy use this so they stay finite under truncation."""
    x = logits.float()
    if not s.greedy and s.temperature != 1.0:
        x = x / s.temperature
    return torch.log_softmax(x, dim=-1)


def truncate_(probs: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Apply top-k, top-p, min-p in place to probabilities [N, V] and renormalise."""
    if not s.truncates:
        return probs
    if s.min_p > 0.0:
        cut = probs.amax(dim=-1, keepdim=True) * s.min_p
        probs.masked_fill_(probs < cut, 0.0)
    if s.top_k and s.top_k < probs.shape[-1]:
        kth = torch.topk(probs, s.top_k, dim=-1).values[..., -1:]
        probs.masked_fill_(probs < kth, 0.0)
    if s.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        before = sorted_p.cumsum(dim=-1) - sorted_p
        drop_sorted = before >= s.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
        probs.masked_fill_(drop, 0.0)
    probs.div_(probs.sum(dim=-1, keepdim=True))
    return probs


def probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The distribution a side actually samples from: one-hot argmax when greedy."""
    if s.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return out
    return truncate_(log_probs(logits, s).exp_(), s)


def sample(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from probabilities [N, V] -> [N]."""
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)
