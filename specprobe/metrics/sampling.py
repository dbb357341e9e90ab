"""The sampling transform S(logits; temperature, top-k, top-p, min-p) each serving engine
applies, shared by the teacher-forced metrics and the real speculative loop, so both see
the distribution the engine samples from.

The engines agree on temperature (logits / T, greedy below a small T) and disagree on
how the three truncations compose. Each engine's package (`specprobe.engines`) says which
way its sampler composes them (`SamplingOrder`), read from its source; this module
applies the three ways:

sequential
    temperature, then the truncations one after another, each on the renormalised
    distribution the previous one left, in the engine's order. min-p drops p < min_p ·
    max p; top-k drops logits below the k-th largest (ties with it are kept, so more
    than k can survive); top-p sorts ascending, drops tokens whose ascending cumulative
    mass is ≤ 1 − top_p and always keeps the most likely one.
joint
    temperature, then all three filters on the SAME untruncated distribution (a joint
    mask): sort descending, keep the first k positions (exactly k: ties are cut by sort
    order), keep tokens whose mass before them is ≤ top_p, keep p ≥ min_p · max p.
untempered
    the truncations act on the UNTEMPERED distribution and the temperature divides the
    surviving logits last. top-k keeps exactly k (sorted; ties with the k-th cut by sort
    order); top-p takes the softmax of what top-k left, descending, and keeps the
    shortest prefix whose mass reaches top_p (the crossing token included); min-p keeps
    p ≥ min_p · max p.

So with p = [.5, .3, .2], top_k 2, top_p .6: a sequential order keeps one token (top-p
sees [.625, .375]); the joint mask keeps two (top-p sees the untruncated .5 + .3). And at
T = 2 with untempered [.64, .2, .16], top_p .5: the untempered order keeps one token
(.64 ≥ .5); a tempered one ([.49, .27, .24]) keeps two.

Repetition, frequency and presence penalties are carried for reporting only: they make p
depend on the text generated so far, which a teacher-forced estimate does not model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from specprobe.engines import DEFAULT_SEMANTICS, SEMANTICS, sampling_order
from specprobe.engines.base import JOINT, UNTEMPERED

__all__ = ["SEMANTICS", "Sampling", "log_probs", "probs", "sample", "sampler_top_confidence", "truncate_"]


@dataclass(frozen=True)
class Sampling:
    """One side's sampling settings. temperature 0 means greedy (one-hot argmax)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    semantics: str = DEFAULT_SEMANTICS  # whose transform (`engines.sampling_order`): see the module docstring
    # reported, not applied (they depend on the generated text)
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.temperature < sampling_order(self.semantics).greedy_below

    @property
    def truncates(self) -> bool:
        return (self.top_k or 0) > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

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
        if self.truncates:
            parts.append(f"({self.semantics} order)")
        return " ".join(parts)


def log_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Untruncated tempered log-softmax (T=1 for greedy), float32. [N, V] -> [N, V].
    KL and entropy use this so they stay finite under truncation."""
    x = logits.float()
    if not s.greedy and s.temperature != 1.0:
        x = x / s.temperature
    return torch.log_softmax(x, dim=-1)


# ----------------------------------------------------------------------------- filters
# Each works in place on probabilities [N, V] (zeros = already dropped) and drops tokens
# by zeroing them; none renormalises except where the engine's next step would see a
# renormalised distribution. Probabilities are a monotone image of the logits, so
# "logit below the k-th logit" is "probability below the k-th probability".


def _min_p_(p: torch.Tensor, min_p: float) -> None:
    cut = p.amax(dim=-1, keepdim=True).mul_(min_p)  # [N, 1]
    p.masked_fill_(p < cut, 0.0)


def _top_k_(p: torch.Tensor, k: int) -> None:
    """Drop tokens below the k-th largest; ties with it stay (the sequential orders)."""
    kth = torch.topk(p, k, dim=-1).values[..., -1:]  # [N, 1]
    p.masked_fill_(p < kth, 0.0)


def _top_p_(p: torch.Tensor, top_p: float) -> None:
    """The sequential orders' top-p on the renormalised distribution: sort ascending,
    drop tokens whose cumulative mass is ≤ 1 − top_p, always keep the most likely."""
    sorted_p, idx = torch.sort(p, dim=-1, descending=False)  # [N, V]
    sorted_p.div_(sorted_p.sum(dim=-1, keepdim=True))
    drop = sorted_p.cumsum_(dim=-1) <= 1.0 - top_p
    drop[..., -1] = False
    p.masked_fill_(drop.scatter(-1, idx, drop), 0.0)


def _joint_(p: torch.Tensor, s: Sampling) -> None:
    """SGLang: top-k, top-p and min-p masks all computed on the untruncated p."""
    sorted_p, idx = torch.sort(p, dim=-1, descending=True)  # [N, V]
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if s.top_k and s.top_k < p.shape[-1]:
        drop[..., s.top_k :] = True
    if s.top_p < 1.0:
        before = sorted_p.cumsum(dim=-1).sub_(sorted_p)  # mass ahead of each token
        drop |= before > s.top_p
    if s.min_p > 0.0:
        drop |= sorted_p < sorted_p[..., :1] * s.min_p
    p.masked_fill_(drop.scatter(-1, idx, drop), 0.0)


def _untempered_(p: torch.Tensor, s: Sampling, k: int) -> None:
    """The untempered order: top-k, top-p and min-p on the untempered distribution, in that order.
    p holds the tempered probabilities; u ∝ p^T is the untempered one (the same order of
    tokens, so top-k is unchanged, but top-p's mass and min-p's ratio are read on u)."""
    u = p if s.temperature == 1.0 else p.pow(s.temperature)
    sorted_u, idx = torch.sort(u, dim=-1, descending=True, stable=True)  # [N, V]
    drop = torch.zeros_like(sorted_u, dtype=torch.bool)
    if k:
        drop[..., k:] = True
    if s.top_p < 1.0:
        kept = sorted_u.masked_fill(drop, 0.0)
        kept.div_(kept.sum(dim=-1, keepdim=True))  # the softmax of what top-k left
        before = kept.cumsum(dim=-1).sub_(kept)  # mass ahead of each token
        drop |= before >= s.top_p
    if s.min_p > 0.0:
        drop |= sorted_u < sorted_u[..., :1] * s.min_p
    p.masked_fill_(drop.scatter(-1, idx, drop), 0.0)


def truncate_(probs: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The engine's top-k / top-p / min-p on untruncated tempered probabilities [N, V],
    in place, renormalised. Allocates nothing when nothing truncates."""
    if not s.truncates:
        return probs
    v = probs.shape[-1]
    k = s.top_k if s.top_k and s.top_k < v else 0
    order = sampling_order(s.semantics)
    if order.truncation == JOINT:
        _joint_(probs, s)
    elif order.truncation == UNTEMPERED:
        _untempered_(probs, s, k)
    else:
        for step in order.steps:
            if step == "min_p" and s.min_p > 0.0:
                _min_p_(probs, s.min_p)
            elif step == "top_k" and k:
                _top_k_(probs, k)
            elif step == "top_p" and s.top_p < 1.0:
                _top_p_(probs, s.top_p)
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


# Floor on log q: ids the drafter gives probability 0 (−inf logits) cost a large, finite
# penalty instead of an infinite KL.
LOGQ_FLOOR = -1e4


def sampler_top_confidence(logits: torch.Tensor, n: int) -> torch.Tensor:
    """[N, V] drafter logits -> [N] the probability an engine's draft sampler gives its
    top token when it keeps the drafter's `n` best tokens at temperature 1
    (`Engine.confidence_top_n`): an early stop compares it with its threshold."""
    top = torch.topk(logits.float(), min(n, logits.shape[-1]), dim=-1).values  # [N, n]
    return torch.softmax(top, dim=-1)[:, 0]
