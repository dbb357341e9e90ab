"""Per-position metrics from target and drafter logits, vectorised.

For each position: acceptance probability α = Σ_v min(p, q) = 1 − TV(p, q) (the chance
that rejection sampling accepts the drafter's token, Leviathan et al. 2023), greedy
agreement 1[argmax q = argmax p], KL(p ‖ q) in nats on the untruncated tempered softmax
(T=1 when greedy, so it stays finite), target entropy, drafter confidence max q.
p and q are each side's own sampling distribution over the TARGET vocabulary, after the
engine's truncation (`metrics.sampling`: the order of top-k/top-p/min-p is the engine's)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from specprobe.metrics.sampling import Sampling, truncate_


@dataclass(frozen=True)
class PositionMetrics:
    """Each field is a float32 tensor [N] (greedy_agree is 0/1)."""

    accept_prob: torch.Tensor
    greedy_agree: torch.Tensor
    kl_target_draft_nats: torch.Tensor
    target_entropy_nats: torch.Tensor
    draft_confidence: torch.Tensor
    # top-k of each side's untruncated tempered softmax, when asked (`top`): ids and
    # probabilities [N, k] of each side, and the other side's probability of those ids
    top: dict[str, torch.Tensor] | None = None


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


class _Workspace:
    """Reusable [N, V] float32 scratch buffers. On a CPU, allocating a fresh 50 MB tensor
    per op (and faulting its pages in) costs more than the arithmetic; reusing four
    buffers across chunks keeps the metrics a small fraction of the forward passes."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.bufs: list[torch.Tensor] = []

    def get(self, shape: tuple[int, int], device: torch.device) -> list[torch.Tensor]:
        key = (shape, device)
        if key != self.key:
            self.bufs = [torch.empty(shape, dtype=torch.float32, device=device) for _ in range(4)]
            self.key = key
        return self.bufs


_WS = threading.local()


def _workspace() -> _Workspace:
    ws = getattr(_WS, "ws", None)
    if ws is None:
        ws = _WS.ws = _Workspace()
    return ws


def _log_softmax_into(logits: torch.Tensor, s: Sampling, logp: torch.Tensor, p: torch.Tensor) -> None:
    """logp <- untruncated tempered log-softmax, p <- its exp; in place, no [N, V] allocations."""
    logp.copy_(logits)
    if not s.greedy and s.temperature != 1.0:
        logp.div_(s.temperature)
    logp.sub_(logp.amax(dim=-1, keepdim=True))
    torch.exp(logp, out=p)
    z = p.sum(dim=-1, keepdim=True)
    p.div_(z)
    logp.sub_(z.log_())


def position_metrics(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    target_sampling: Sampling,
    draft_sampling: Sampling,
    top: int = 0,
) -> PositionMetrics:
    """[N, V] target and [N, V'] drafter logits -> metrics per position.

    Written to touch each [N, V] buffer as few times as possible and to allocate none:
    log-softmax and exp land in reused buffers, the two sums over p are row-wise dot
    products (bmm), and min(p, q) is written over a buffer no longer needed. `top` > 0
    also returns each side's top-`top` tokens (a topk on p and q while they are at hand,
    for the token-level drill-down)."""
    # a smaller vocabulary, or a head's draft vocabulary mapped into the target's (−inf
    # on the ids it cannot propose): either way some q are exactly 0
    padded = draft_logits.shape[-1] < target_logits.shape[-1] or bool(torch.isneginf(draft_logits).any())
    draft_logits = align_vocab(draft_logits, target_logits.shape[-1])
    n, v = target_logits.shape
    logp, p, logq, q = _workspace().get((n, v), target_logits.device)
    _log_softmax_into(target_logits, target_sampling, logp, p)
    _log_softmax_into(draft_logits, draft_sampling, logq, q)
    # KL(p‖q) = Σ p (log p − log q); entropy H = −Σ p log p. q holds -inf only for ids
    # the drafter lacks: clamp those so they cost a large but finite penalty, not inf/nan.
    if padded:
        logq.clamp_(min=-1e4)
    tops = None
    if top:
        tp, ti = torch.topk(p, top, dim=-1)  # [N, k]
        dp, di = torch.topk(q, top, dim=-1)  # [N, k]
        tops = {"target_ids": ti, "target_probs": tp, "draft_ids": di, "draft_probs": dp, "target_probs_at_draft": p.gather(-1, di), "draft_probs_at_target": q.gather(-1, ti)}
    p3 = p.unsqueeze(1)  # [N, 1, V]
    plogp = torch.bmm(p3, logp.unsqueeze(2)).view(-1)  # [N]
    kl = plogp - torch.bmm(p3, logq.unsqueeze(2)).view(-1)
    entropy = -plogp
    target_argmax = target_logits.argmax(-1)
    draft_argmax = draft_logits.argmax(-1)
    agree = (target_argmax == draft_argmax).float()

    # Acceptance uses each side's actual sampling distribution (truncated when configured).
    # KL and entropy are done with p, so it is truncated in place (no [N, V] copy).
    ps = None if target_sampling.greedy else truncate_(p, target_sampling)
    if draft_sampling.greedy:
        qs = None
        confidence = torch.ones_like(kl)
    else:
        qs = truncate_(q, draft_sampling)
        confidence = qs.amax(-1)

    if ps is None and qs is None:
        alpha = agree
    elif ps is None:
        assert qs is not None
        alpha = qs.gather(-1, target_argmax[:, None]).squeeze(-1)
    elif qs is None:
        alpha = ps.gather(-1, draft_argmax[:, None]).squeeze(-1)
    else:
        alpha = torch.minimum(ps, qs, out=logp).sum(-1)  # logp is no longer needed
    return PositionMetrics(
        accept_prob=alpha.clamp_(0.0, 1.0),
        greedy_agree=agree,
        kl_target_draft_nats=kl.clamp_(min=0.0),
        target_entropy_nats=entropy,
        draft_confidence=confidence,
        top=tops,
    )
