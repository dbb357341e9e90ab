"""Per-position metrics from target and drafter logits (design.md §2), vectorised.

For each position: acceptance probability α = Σ_v min(p, q) = 1 − TV(p, q), greedy
agreement 1[argmax q = argmax p], KL(p ‖ q) in nats on the untruncated tempered softmax
(T=1 when greedy, so it stays finite), target entropy, drafter confidence max q.
p and q are each side's own sampling distribution over the TARGET vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specprobe.metrics.sampling import Sampling, log_probs, truncate_


@dataclass(frozen=True)
class PositionMetrics:
    """Each field is a float32 tensor [N] (greedy_agree is 0/1)."""

    accept_prob: torch.Tensor
    greedy_agree: torch.Tensor
    kl_target_draft_nats: torch.Tensor
    target_entropy_nats: torch.Tensor
    draft_confidence: torch.Tensor


def align_vocab(draft_logits: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """Index the drafter's logits by target ids, as engines do: drop extra (padding) rows,
    give missing ids -inf (probability 0)."""
    v = draft_logits.shape[-1]
    if v == target_vocab:
        return draft_logits
    if v > target_vocab:
        return draft_logits[..., :target_vocab]
    pad = draft_logits.new_full((*draft_logits.shape[:-1], target_vocab - v), float("-inf"))
    return torch.cat([draft_logits, pad], dim=-1)


def position_metrics(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    target_sampling: Sampling,
    draft_sampling: Sampling,
) -> PositionMetrics:
    """[N, V] target and [N, V'] drafter logits -> metrics per position.

    Written to touch each [N, V] buffer as few times as possible: log-softmax once per
    side, the exp done in place, the sums fused where torch allows."""
    padded = draft_logits.shape[-1] < target_logits.shape[-1]
    draft_logits = align_vocab(draft_logits, target_logits.shape[-1])
    logp = log_probs(target_logits, target_sampling)  # [N, V]
    logq = log_probs(draft_logits, draft_sampling)  # [N, V]
    p = logp.exp()
    # KL(p‖q) = Σ p (log p − log q); entropy H = −Σ p log p. Both sums are row-wise dot
    # products: bmm does them without an [N, V] temporary. q holds -inf only for ids the
    # drafter lacks: clamp those so they cost a large but finite penalty, not inf/nan.
    logq_c = logq.clamp(min=-1e4) if padded else logq
    p3 = p.unsqueeze(1)  # [N, 1, V]
    plogp = torch.bmm(p3, logp.unsqueeze(2)).view(-1)  # [N]
    kl = plogp - torch.bmm(p3, logq_c.unsqueeze(2)).view(-1)
    entropy = -plogp
    target_argmax = target_logits.argmax(-1)
    draft_argmax = draft_logits.argmax(-1)
    agree = (target_argmax == draft_argmax).float()

    # Acceptance uses each side's actual sampling distribution.
    if target_sampling.greedy:
        ps = None
    elif target_sampling.truncates:
        ps = truncate_(p.clone(), target_sampling)
    else:
        ps = p
    if draft_sampling.greedy:
        qs = None
        confidence = torch.ones_like(kl)
    else:
        q = logq.exp_()  # logq no longer needed: reuse its buffer
        qs = truncate_(q, draft_sampling) if draft_sampling.truncates else q
        confidence = qs.amax(-1)

    if ps is None and qs is None:
        alpha = agree
    elif ps is None:
        assert qs is not None
        alpha = qs.gather(-1, target_argmax[:, None]).squeeze(-1)
    elif qs is None:
        alpha = ps.gather(-1, draft_argmax[:, None]).squeeze(-1)
    else:
        alpha = torch.minimum(ps, qs).sum(-1)
    return PositionMetrics(
        accept_prob=alpha.clamp_(0.0, 1.0),
        greedy_agree=agree,
        kl_target_draft_nats=kl.clamp_(min=0.0),
        target_entropy_nats=entropy,
        draft_confidence=confidence,
    )
