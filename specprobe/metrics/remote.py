"""Acceptance from a served target's top-n logprobs: exact where the returned tokens
decide it, bounded where they do not.

An engine scoring teacher-forced (vLLM's `prompt_logprobs`) returns, per position, the
log-probability of the actual next token and of the target's n most likely tokens — not
the whole distribution p. The drafter runs here, so its logits (all of q) are known.
Per position, with L the listed tokens (top-n ∪ the actual token), m = 1 − Σ_L p the
mass not listed and p_n the n-th largest probability (every unlisted p ≤ min(p_n, m)):

    target greedy (T = 0)     argmax p is rank 1, always listed: greedy agreement,
                              p(argmax q) and α = q_s(argmax p) are all exact.
    greedy drafting, T = 1    p(argmax q): exact when argmax q ∈ L, else in
                              [0, min(p_n, m)].
    sampled drafting, T = 1   α = Σ min(p, q_s): lower end Σ_L min(p, q_s); upper end
                              adds min(m, Σ_{x∉L} min(q_s(x), p_n)).

    other T, untruncated      p_T(x) = e^(l_x/T) / Z_T from the raw logprobs l: the
                              normaliser needs the unlisted tokens, so even a listed
                              token's p_T is a range (`tempered`); the ends above then
                              take the listed ranges' low and high ends. Exact only
                              where nothing is unlisted (the whole vocabulary asked).

q_s is the drafter's sampling distribution (temperature and truncation applied here).
The target's p is the raw distribution the engine returns: vLLM computes prompt
logprobs from the logits before any sampling processor, whatever the request's
temperature or its --logprobs-mode (raw and processed give the same prompt scores), so
the temperature is applied here, and a truncating target sampler (top-k/top-p/min-p)
cannot be rebuilt from the top-n: `supported` says so.

KL(p‖q) and the target's entropy need all of p: they are not computed here (the
pipeline reports them as left out), and the fields that carry them are filled with 0
in both ends. draft_confidence (max q_s) is exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specprobe.metrics.sampling import Sampling, truncate_

# the per-position fields `Accumulator.add_sequence` reads
FIELDS = ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence", "accept_prob_greedy_draft")
# what the engine's top-n cannot give: reported as left out
LEFT_OUT = ("kl_target_draft_nats", "target_entropy_nats")


def supported(target: Sampling) -> str | None:
    """None where the target's sampling can be scored from raw top-n logprobs (exactly or
    as bounds); else why not."""
    if target.greedy:
        return None
    if target.truncates:
        return f"the target samples with top-k/top-p/min-p ({target.describe()}): the server's prompt logprobs are the raw distribution, its truncation cannot be rebuilt from the top-n"
    return None


def _spread(mass: np.ndarray, count: np.ndarray, power: float) -> np.ndarray:
    """Σ x^power over `count` tokens sharing `mass` evenly."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, count * np.power(np.where(count > 0, mass / np.maximum(count, 1), 0.0), power), 0.0)


def _packed(mass: np.ndarray, cap: np.ndarray, count: np.ndarray, power: float) -> np.ndarray:
    """Σ x^power with `mass` packed into as few tokens as each ≤ cap allows."""
    with np.errstate(divide="ignore", invalid="ignore"):
        full = np.where(cap > 0, np.minimum(np.floor(mass / np.where(cap > 0, cap, 1.0)), count), 0.0)
        rest = np.clip(mass - full * cap, 0.0, None)
        return full * np.power(cap, power) + np.power(rest, power)


def tempered(logprobs: np.ndarray, listed: np.ndarray, floor: np.ndarray, vocab: int, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The listed tokens' probabilities at `temperature` from raw (T = 1) logprobs, as
    ranges, since the normaliser needs the unlisted ones too: p_T(x) = e^(l_x/T) / (A + S)
    with A = Σ_listed e^(l/T) and S = Σ_unlisted p^(1/T), where the unlisted raw mass m
    and each unlisted p ≤ c = min(p_n, m) are known. x^(1/T) is convex for T < 1 (S is
    largest with the mass packed into as few tokens as c allows, smallest spread evenly
    over the vocab − listed tokens) and concave for T > 1 (the other way round).
    -> (listed low [N, m], listed high [N, m], the most one unlisted token can have [N],
    the most all unlisted tokens can have [N])."""
    inv = 1.0 / temperature
    p = np.where(listed, np.exp(logprobs), 0.0)
    missing = np.clip(1.0 - p.sum(-1), 0.0, 1.0)
    cap = np.minimum(np.exp(floor), missing)  # raw: the most an unlisted token can have
    everything = np.isneginf(floor)  # the whole vocabulary was returned: nothing unlisted
    count = np.where(everything, 0, np.clip(vocab - listed.sum(-1), 0, None)).astype(np.float64)
    missing = np.where(everything, 0.0, missing)
    cap = np.where(everything, 0.0, cap)
    e = np.where(listed, np.exp(np.where(listed, logprobs, 0.0) * inv), 0.0)  # e^(l/T), ≤ 1
    a = e.sum(-1)
    spread, packed = _spread(missing, count, inv), _packed(missing, cap, count, inv)
    s_lo, s_hi = (spread, packed) if temperature < 1 else (packed, spread)
    s_lo, s_hi = np.minimum(s_lo, s_hi), np.maximum(s_lo, s_hi)
    lo, hi = e / (a + s_hi)[:, None], e / (a + s_lo)[:, None]
    one = np.power(cap, inv)
    top_unlisted = np.where(count > 0, one / (a + np.maximum(one, s_lo)), 0.0)
    all_unlisted = s_hi / (a + s_hi)
    return lo, hi, top_unlisted, all_unlisted


@dataclass
class TopN:
    """One sequence's listed target logprobs, one row per scored position.

    ids [N, m] and logprobs [N, m] (padded with id −1, logprob −inf): the top-n and the
    actual token; floor [N] the n-th largest logprob (−inf where the whole vocabulary
    was returned, so nothing is unlisted); top1 [N] the target's argmax (rank 1)."""

    ids: np.ndarray
    logprobs: np.ndarray
    floor: np.ndarray
    top1: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[int, tuple[float, int]]], n: int) -> TopN:
        """rows: per position {token id: (logprob, rank)} as the engine returned it (the
        top-n and the actual token); n: how many it was asked for (−1: all of them)."""
        m = max((len(r) for r in rows), default=1)
        ids = np.full((len(rows), m), -1, dtype=np.int64)
        lp = np.full((len(rows), m), -np.inf)
        floor = np.full(len(rows), -np.inf)
        top1 = np.zeros(len(rows), dtype=np.int64)
        for i, r in enumerate(rows):
            items = sorted(r.items(), key=lambda kv: (kv[1][1], kv[0]))  # by rank
            for j, (t, (v, _)) in enumerate(items):
                ids[i, j], lp[i, j] = t, v
            top1[i] = items[0][0]
            ranked = [v for _, (v, rank) in items if n < 0 or rank <= n]
            if n >= 0 and ranked:
                floor[i] = min(ranked)
        return cls(ids, lp, floor, top1)


@dataclass
class Bounded:
    """Per-position values at both ends (`low`, `high`: field -> [N]) and which positions
    are exact (low == high for the acceptance the drafting reads: p(argmax q) when
    greedy, α when sampled)."""

    low: dict[str, np.ndarray]
    high: dict[str, np.ndarray]
    exact: np.ndarray  # [N] bool


def draft_probs(draft_logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """[N, V] the drafter's sampling distribution (one-hot argmax when greedy)."""
    logits = draft_logits.float()
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    q = torch.softmax(logits / s.temperature, dim=-1)
    return truncate_(q, s)


def bounded_metrics(top: TopN, draft_logits: torch.Tensor, target: Sampling, draft: Sampling, greedy_drafting: bool | None = None, vocab: int | None = None) -> Bounded:
    """The acceptance fields at both ends for N positions: `top` the target's listed
    logprobs, draft_logits [N, V] the drafter's logits predicting the same tokens.
    greedy_drafting: whether the engine drafts the argmax (then `exact` is about
    p(argmax q), else about α); None: when the draft sampling is greedy. vocab: the
    target's vocabulary size, for a target temperature other than 0 and 1 (default: the
    drafter's logits' width; a larger value only widens the ranges)."""
    greedy_drafting = draft.greedy if greedy_drafting is None else greedy_drafting
    why = supported(target)
    if why is not None:
        raise ValueError(why)
    n = top.ids.shape[0]
    qs = draft_probs(draft_logits, draft)  # [N, V]
    da = draft_logits.float().argmax(-1).cpu().numpy()  # [N] the greedy draft (raw logits)
    agree = (da == top.top1).astype(np.float64)
    confidence = np.ones(n) if draft.greedy else qs.amax(-1).double().cpu().numpy()
    zeros = np.zeros(n)
    if target.greedy:  # p is one-hot on rank 1: everything is exact
        alpha = agree if draft.greedy else qs.gather(-1, torch.as_tensor(top.top1)[:, None].to(qs.device)).squeeze(-1).double().cpu().numpy()
        vals = {"accept_prob": alpha, "greedy_agree": agree, "kl_target_draft_nats": zeros, "target_entropy_nats": zeros, "draft_confidence": confidence, "accept_prob_greedy_draft": agree}
        return Bounded(vals, dict(vals), np.ones(n, dtype=bool))
    listed = top.ids >= 0  # [N, m]
    if abs(target.temperature - 1.0) > 1e-9:  # p at T from raw logprobs: ranges (module docstring)
        p_lo, p_hi, cap, missing = tempered(top.logprobs, listed, top.floor, max(vocab or 0, draft_logits.shape[-1]), target.temperature)
    else:
        p_lo = p_hi = np.where(listed, np.exp(top.logprobs), 0.0)  # [N, m]
        missing = np.clip(1.0 - p_lo.sum(-1), 0.0, 1.0)  # [N]
        cap = np.minimum(np.exp(top.floor), missing)  # [N] the most an unlisted token can have
    # p(argmax q)
    hit = (top.ids == da[:, None]) & listed  # [N, m]
    in_list = hit.any(-1)
    g_low = np.where(in_list, (p_lo * hit).sum(-1), 0.0)
    g_high = np.where(in_list, (p_hi * hit).sum(-1), cap)
    g_exact = (in_list & (g_high - g_low <= 0)) | (~in_list & (cap <= 0))
    if draft.greedy:
        a_low, a_high = g_low, g_high
        exact = g_exact
    else:
        idx = torch.as_tensor(np.where(listed, top.ids, 0)).to(qs.device)
        q_listed = qs.gather(-1, idx).double().cpu().numpy() * listed  # [N, m]
        a_low = np.minimum(p_lo, q_listed).sum(-1)
        a_listed_high = np.minimum(p_hi, q_listed).sum(-1)
        capt = torch.as_tensor(cap, dtype=qs.dtype, device=qs.device)[:, None]
        q_rest = torch.minimum(qs, capt).sum(-1).double().cpu().numpy() - np.minimum(q_listed, cap[:, None]).sum(-1)
        a_high = a_listed_high + np.minimum(missing, np.clip(q_rest, 0.0, None))
        exact = g_exact if greedy_drafting else a_high - a_low <= 0
    low = {"accept_prob": np.clip(a_low, 0, 1), "greedy_agree": agree, "kl_target_draft_nats": zeros, "target_entropy_nats": zeros, "draft_confidence": confidence, "accept_prob_greedy_draft": np.clip(g_low, 0, 1)}
    high = {**low, "accept_prob": np.clip(a_high, 0, 1), "accept_prob_greedy_draft": np.clip(g_high, 0, 1)}
    return Bounded(low, high, np.asarray(exact, dtype=bool))
