"""The sampling transform S(logits; temperature, top-k, top-p, min-p) each serving engine
applies, shared by the teacher-forced metrics and the real speculative loop, so both see
the distribution the engine samples from.

The engines agree on temperature (logits / T, greedy below a small T) and disagree on
how the three truncations compose. Read from each engine's sampler:

vllm (V1 `Sampler.sample`, `MinPLogitsProcessor`, `apply_top_k_top_p`)
    temperature → min-p → top-k → top-p, each on the distribution the previous step left
    (renormalised). min-p drops p < min_p · max p; top-k drops logits below the k-th
    largest (ties with it are kept, so more than k can survive); top-p sorts ascending,
    drops tokens whose ascending cumulative mass is ≤ 1 − top_p and always keeps the most
    likely one. Greedy when T < 1e-5.
transformers (`generate`'s warper list: `TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`, min_tokens_to_keep = 1)
    temperature → top-k → top-p → min-p, each on the renormalised distribution, with the
    same top-k and top-p tests as vLLM. Greedy only when do_sample is off (T = 0 here).
sglang (`top_k_top_p_min_p_sampling_from_probs_torch`, and flashinfer's
`top_k_top_p_sampling_from_probs(filter_apply_order="joint")`, its default CUDA path)
    temperature, then all three filters on the SAME untruncated distribution (a joint
    mask): sort descending, keep the first k positions (exactly k: ties are cut by sort
    order), keep tokens whose mass before them is ≤ top_p, keep p ≥ min_p · max p.
    Greedy when T < 1e-6. (With min-p set, SGLang's flashinfer path renormalises after
    top-k before top-p; the torch path modelled here does not. They differ only when
    top-k, top-p and min-p are all set.)
llama.cpp (`common_params_sampling.samplers`, built into a chain by
`common_sampler_init`; the samplers in src/llama-sampler.cpp)
    penalties → dry → top-n-sigma → top-k → typical-p → top-p → min-p → xtc →
    temperature → dist: the truncations act on the UNTEMPERED distribution and the
    temperature divides the surviving logits last. top-k keeps exactly k (sorted;
    ties with the k-th cut by sort order); top-p takes the softmax of what top-k left,
    descending, and keeps the shortest prefix whose mass reaches top_p (the crossing
    token included); min-p keeps logits ≥ max + log(min_p), i.e. p ≥ min_p · max p.
    Greedy when T ≤ 0. (Typical-p, XTC, DRY and top-n-sigma are off by default and not
    modelled; llama.cpp's own defaults top_k 40, top_p 0.95, min_p 0.05, T 0.8 apply
    only where neither the request nor a flag sets them.)

So with p = [.5, .3, .2], top_k 2, top_p .6: vLLM and transformers keep one token (top-p
sees [.625, .375]); SGLang keeps two (top-p sees the untruncated .5 + .3). And at T = 2
with untempered [.64, .2, .16], top_p .5: llama.cpp keeps one token (.64 ≥ .5); vLLM
tempers first ([.49, .27, .24]) and keeps two.

Repetition, frequency and presence penalties are carried for reporting only: they make p
depend on the text generated so far, which a teacher-forced estimate does not model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch

Semantics = Literal["vllm", "sglang", "transformers", "llama.cpp"]
SEMANTICS: tuple[str, ...] = get_args(Semantics)
# Temperatures below these sample greedily (vLLM _SAMPLING_EPS 1e-5, SGLang 1e-6;
# transformers has no such threshold: a temperature of 0 needs do_sample=False;
# llama.cpp's temperature sampler takes the argmax at T ≤ 0 only).
_GREEDY_BELOW = {"vllm": 1e-5, "sglang": 1e-6, "transformers": 0.0, "llama.cpp": 0.0}


@dataclass(frozen=True)
class Sampling:
    """One side's sampling settings. temperature 0 means greedy (one-hot argmax)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    semantics: Semantics = "vllm"  # whose transform: see the module docstring
    # reported, not applied (they depend on the generated text)
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.temperature < _GREEDY_BELOW.get(self.semantics, 0.0)

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
    """Drop tokens below the k-th largest; ties with it stay (vLLM, transformers)."""
    kth = torch.topk(p, k, dim=-1).values[..., -1:]  # [N, 1]
    p.masked_fill_(p < kth, 0.0)


def _top_p_(p: torch.Tensor, top_p: float) -> None:
    """vLLM's and transformers' top-p on the renormalised distribution: sort ascending,
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


def _llama_cpp_(p: torch.Tensor, s: Sampling, k: int) -> None:
    """llama.cpp: top-k, top-p and min-p on the untempered distribution, in that order.
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
    if s.semantics == "sglang":
        _joint_(probs, s)
    elif s.semantics == "llama.cpp":
        _llama_cpp_(probs, s, k)
    elif s.semantics == "transformers":
        if k:
            _top_k_(probs, k)
        if s.top_p < 1.0:
            _top_p_(probs, s.top_p)
        if s.min_p > 0.0:
            _min_p_(probs, s.min_p)
    else:  # vllm
        if s.min_p > 0.0:
            _min_p_(probs, s.min_p)
        if k:
            _top_k_(probs, k)
        if s.top_p < 1.0:
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


# llama.cpp's draft sampler keeps the drafter's 10 best tokens (LLAMA_DRAFT_TOP_K in its
# common/speculative.cpp) at temperature 1
LLAMA_CPP_DRAFT_TOP_K = 10


def llama_cpp_confidence(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] drafter logits -> [N] the probability llama.cpp's draft sampler gives its
    top token: softmax over the drafter's 10 best logits at temperature 1. Drafting stops
    before a token whose probability is below --spec-draft-p-min."""
    top = torch.topk(logits.float(), min(LLAMA_CPP_DRAFT_TOP_K, logits.shape[-1]), dim=-1).values  # [N, 10]
    return torch.softmax(top, dim=-1)[:, 0]

