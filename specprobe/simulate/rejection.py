"""The verify step of speculative decoding: which drafted tokens the target accepts, and
the token it emits after them (Leviathan et al. 2023; docs/maths.md).

    accept draft x ~ q with probability min(1, p(x)/q(x))
    on the first rejection, emit a token from norm(max(0, p − q)) and stop
    after all drafts are accepted, emit a bonus token from p

so the emitted tokens follow the target's distribution p exactly, whatever the drafter.
p and q are each side's own sampling distribution (temperature, top-k, top-p, min-p;
one-hot argmax when greedy) from `metrics.sampling`; a greedy draft is a one-hot q, so
it is accepted with p(x). `verify_match` is llama.cpp's way with greedy drafts: sample
the target at each position and accept while the sample is the draft — the same law.
Pure functions of tensors."""

from __future__ import annotations

import torch


def leading_accepts(accept: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B] length of the leading run of True (the accepted prefix)."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def verify_greedy(drafts: torch.Tensor, drafted: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy target: p is one-hot at argmax, so p(x)/q(x) is 0 or ≥ 1 — accept x iff it is
    the target's argmax; the residual max(0, p − q) is that same one-hot.

    drafts [B, K], drafted [B], target_logits [B, K+1, V] -> (accepted [B], next token [B])."""
    k = drafts.shape[1]
    tgt = target_logits.argmax(dim=-1)  # [B, K+1]
    in_draft = torch.arange(k, device=drafts.device)[None, :] < drafted[:, None]  # [B, K]
    n = leading_accepts((drafts == tgt[:, :k]) & in_draft)  # [B]
    return n, tgt.gather(1, n[:, None]).squeeze(1)


def verify_sampled(
    drafts: torch.Tensor,
    drafted: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling. drafts [B, K] (x_i ~ q_i), drafted [B] (row b proposed the first
    drafted[b]), q [B, K, V] drafter probs, p [B, K+1, V] target probs (p_K: the bonus
    position) -> (accepted count n [B], next token [B])."""
    b, k = drafts.shape
    rows = torch.arange(b, device=drafts.device)
    px = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    qx = q.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    # accept with probability min(1, p/q): u·q ≤ p with u ~ U(0, 1]. q >= p is then a coin
    # flip, q <= p always accepts, and p(x) = 0 never does (u > 0, q(x) > 0 as x ~ q).
    u = 1.0 - torch.rand((b, k), generator=generator, device=drafts.device)  # [B, K] in (0, 1]
    in_draft = torch.arange(k, device=drafts.device)[None, :] < drafted[:, None]
    n = leading_accepts((u * qx <= px) & in_draft)  # [B]
    p_n = p[rows, n]  # [B, V] target at the first rejected position (or the bonus one)
    rejected = n < drafted  # [B]
    q_n = q[rows, n.clamp(max=k - 1)] * rejected[:, None]  # [B, V]; 0 where all were accepted
    # on rejection sample from norm(max(0, p − q)); after K accepts from p itself
    resid = (p_n - q_n).clamp_(min=0.0)
    mass = resid.sum(dim=-1, keepdim=True)
    # mass 0 only by round-off (a rejection implies p ≠ q); fall back to p then
    resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p_n)
    nxt = torch.multinomial(resid, 1, generator=generator).squeeze(1)
    return n, nxt


def verify_match(drafts: torch.Tensor, drafted: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample and compare (llama.cpp's `common_sampler_sample_and_accept_n`): y_j ~ p_j at
    every position, drafts accepted while y_j = d_j; the first y_j that differs, or the
    bonus y_m after all m were accepted, is the next token. Every emitted token is a
    target sample, so the output follows p whatever the drafts; a draft x is accepted
    with p(x). The samples past the first mismatch are drawn and never read: llama.cpp
    stops there, and drawing them all at once changes no emitted token's law.

    drafts [B, K], drafted [B], p [B, K+1, V] target probs -> (accepted n [B], next token [B])."""
    b, k = drafts.shape
    y = torch.multinomial(p.reshape(b * (k + 1), -1), 1, generator=generator).view(b, k + 1)  # [B, K+1]
    in_draft = torch.arange(k, device=drafts.device)[None, :] < drafted[:, None]
    n = leading_accepts((y[:, :k] == drafts) & in_draft)  # [B]
    return n, y.gather(1, n[:, None]).squeeze(1)


def verify_thresholds(
    drafts: torch.Tensor,
    drafted: torch.Tensor,
    p: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's `tree_speculative_sampling_target_only` on a chain of greedy drafts: draft x
    is accepted when a uniform coin u ≤ p(x) ÷ threshold_acc or p(x) ≥ threshold_single;
    on the first rejection the next token is drawn from p with x taken out (the kernel
    sets the draft's probability to the target's and samples relu(p − that)), after all
    m accepts from the bonus position's p. At (1, 1) this is the one-hot rejection sampler
    exactly; below, drafts the target would not sample are kept (lossy).

    drafts [B, K], drafted [B], p [B, K+1, V] target probs -> (accepted n [B], next token [B])."""
    b, k = drafts.shape
    rows = torch.arange(b, device=drafts.device)
    px = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    u = 1.0 - torch.rand((b, k), generator=generator, device=drafts.device)  # (0, 1]: p(x) = 0 never passes the coin
    keep = (u <= px / max(threshold_acc, 1e-9)) | (px >= threshold_single)
    in_draft = torch.arange(k, device=drafts.device)[None, :] < drafted[:, None]
    n = leading_accepts(keep & in_draft)  # [B]
    resid = p[rows, n].clone()  # [B, V]
    rejected = n < drafted
    x = drafts[rows, n.clamp(max=k - 1)]
    resid[rows[rejected], x[rejected]] = 0.0
    mass = resid.sum(dim=-1, keepdim=True)
    resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p[rows, n])
    return n, torch.multinomial(resid, 1, generator=generator).squeeze(1)

