"""The counters of speculative decoding and the rates read off them — one definition of
each, named after the engine it matches, shared by `simulate` (its own draft→verify loop)
and `monitor` (the serving engine's metrics). Pure functions over plain numbers.

Counters (vLLM V1 `spec_decode` names; SGLang and llama.cpp expose the same quantities):
  num_drafts                       verify steps of one request that proposed ≥ 1 token
  num_draft_tokens                 tokens proposed
  num_accepted_tokens              proposed tokens accepted (the bonus token not included)
  num_accepted_tokens_per_pos[i]   drafts whose first i+1 proposed tokens were all accepted
and, where a draft can be shorter than K (adaptive K, the end of a request's budget):
  num_drafted_tokens_per_pos[i]    drafts that proposed position i+1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAN = float("nan")


def _div(a: float, b: float) -> float:
    return a / b if b and b > 0 and not math.isnan(b) else NAN


def acceptance_rate(num_accepted_tokens: float, num_draft_tokens: float) -> float:
    """vLLM's draft acceptance rate: accepted ÷ proposed tokens."""
    return _div(num_accepted_tokens, num_draft_tokens)


def mean_acceptance_length(num_accepted_tokens: float, num_drafts: float) -> float:
    """vLLM's and SGLang's mean acceptance length: 1 + accepted ÷ drafts — tokens a verify
    step yields, the bonus token included."""
    per = _div(num_accepted_tokens, num_drafts)
    return 1.0 + per if not math.isnan(per) else NAN


def per_position_rate_vllm(accepted_per_pos: Sequence[float], num_drafts: float) -> list[float]:
    """vLLM's "per-position acceptance rate": num_accepted_tokens_per_pos[i] ÷ num_drafts
    (every draft counts in every position's denominator)."""
    return [_div(a, num_drafts) for a in accepted_per_pos]


def per_position_rate_of_proposed(accepted_per_pos: Sequence[float], drafted_per_pos: Sequence[float]) -> list[float]:
    """Accepted at position i ÷ drafts that proposed position i: equal to vLLM's rate when
    every draft is K long, and the unbiased one when some drafts are shorter (adaptive K,
    the end of a budget), since a position never proposed cannot be accepted. The rate
    r_i that the teacher-forced estimate predicts."""
    return [_div(a, d) for a, d in zip(accepted_per_pos, drafted_per_pos, strict=True)]


def conditional_rates(cumulative: Sequence[float]) -> list[float]:
    """a_1 = r_1, a_i = r_i ÷ r_{i−1}: acceptance at depth i given depth i−1 was accepted."""
    out, prev = [], 1.0
    for r in cumulative:
        out.append(_div(r, prev) if not math.isnan(r) else NAN)
        prev = r
    return out


def expected_length(cumulative: Sequence[float]) -> float:
    """1 + Σ_i r_i: tokens a full-length verify step yields in expectation (bonus included);
    equals mean_acceptance_length when every draft is K long."""
    return 1.0 + sum(r for r in cumulative if not math.isnan(r))
