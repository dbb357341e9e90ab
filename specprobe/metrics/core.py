"""Per-position metrics from target and drafter logits, vectorised.

For each position: acceptance probability α = Σ_v min(p, q) = 1 − TV(p, q) (the chance
that rejection sampling accepts the drafter's token, Leviathan et al. 2023), the
acceptance of a greedy draft p(argmax q) (the drafter proposes its argmax, the lowest id
on ties as torch.argmax and the engines take it, and the target accepts it with its own
probability of it: vLLM's default greedy drafting, llama.cpp, SGLang, TensorRT-LLM),
greedy agreement 1[argmax q = argmax p], KL(p ‖ q) in nats on the untruncated tempered
softmax (T=1 when greedy, so it stays finite), target entropy, drafter confidence max q.
p and q are each side's own sampling distribution over the TARGET vocabulary, after the
engine's truncation (`metrics.sampling`: the order of top-k/top-p/min-p is the engine's).
Which implementation computes them is the dispatch table's choice (`metrics.dispatch`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from specprobe.metrics.blocked import blocked_metrics
from specprobe.metrics.dispatch import Scorer, case, pick
from specprobe.metrics.sampling import Sampling, truncate_


@dataclass(frozen=True)
class PositionMetrics:
    """Each field is a float32 tensor [N] (greedy_agree is 0/1)."""

    accept_prob: torch.Tensor
    # p(argmax q), p the target's sampling distribution (one-hot when greedy: then it is
    # greedy_agree); whatever the drafter's own sampling, its argmax is the draft
    accept_prob_greedy_draft: torch.Tensor
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
        stale = bool(self.bufs) and self.bufs[0].is_inference() and not torch.is_inference_mode_enabled()  # read-only outside inference mode
        if key != self.key or stale:
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


def _no_draft_where_broken(greedy_draft: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """NaN where KL is not a number (a side's logits NaN or +inf): such a row's argmax is
    whatever each implementation makes of NaN, so its p(argmax q) would be a finite number
    that means nothing; NaN marks the position broken, as the other metrics do."""
    bad = ~torch.isfinite(kl)
    return greedy_draft.masked_fill_(bad, float("nan")) if bool(bad.any()) else greedy_draft


def position_metrics(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    target_sampling: Sampling,
    draft_sampling: Sampling,
    top: int = 0,
) -> PositionMetrics:
    """[N, V] target and [N, V'] drafter logits -> metrics per position. `top` > 0 also
    returns each side's top-`top` tokens (for the token-level drill-down).

    Computed by the implementation the dispatch table picks (`metrics.dispatch`): on a CPU
    row by row in numba-compiled rows (`metrics.kernel`), otherwise a few rows at a time
    in torch ops (`metrics.blocked`), or by `position_metrics_fused` when asked for; equal
    to `position_metrics_reference` to float rounding."""
    scorer = pick(case(target_logits, draft_logits, target_sampling, draft_sampling)).scorer
    if scorer is Scorer.FUSED:
        return position_metrics_fused(target_logits, draft_logits, target_sampling, draft_sampling, top=top)
    return _blocked(target_logits, draft_logits, target_sampling, draft_sampling, top, scorer)


def _blocked(target_logits: torch.Tensor, draft_logits: torch.Tensor, target_sampling: Sampling, draft_sampling: Sampling, top: int = 0, scorer: Scorer | None = None) -> PositionMetrics:
    """`metrics.blocked`'s metrics (the compiled rows or the torch blocks: `scorer`, or
    as the table picks between them) as `PositionMetrics`."""
    draft_logits = align_vocab(draft_logits, target_logits.shape[-1])
    m = blocked_metrics(target_logits, draft_logits, target_sampling, draft_sampling, top=top, scorer=scorer)
    tops = {k[4:]: val for k, val in m.items() if k.startswith("top_")} or None
    return PositionMetrics(
        accept_prob=m["alpha"].clamp_(0.0, 1.0),
        accept_prob_greedy_draft=_no_draft_where_broken(m["greedy_draft"].clamp_(0.0, 1.0), m["kl"]),
        greedy_agree=m["agree"],
        kl_target_draft_nats=m["kl"].clamp_(min=0.0),
        target_entropy_nats=m["entropy"],
        draft_confidence=m["confidence"],
        top=tops,
    )


def position_metrics_reference(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    target_sampling: Sampling,
    draft_sampling: Sampling,
    top: int = 0,
) -> PositionMetrics:
    """The straightforward eager computation over the whole chunk at once, kept as the
    reference the default (`position_metrics`) and the fused scorer are tested against.

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
    # a target's −inf logits (masked ids): p = 0 there, and 0·log 0 counts 0, not NaN
    if bool(torch.isneginf(target_logits).any()):
        logp.clamp_(min=-1e4)
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

    greedy_draft = agree.clone() if ps is None else ps.gather(-1, draft_argmax[:, None]).squeeze(-1)
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
        accept_prob_greedy_draft=_no_draft_where_broken(greedy_draft.clamp_(0.0, 1.0), kl),
        greedy_agree=agree,
        kl_target_draft_nats=kl.clamp_(min=0.0),
        target_entropy_nats=entropy,
        draft_confidence=confidence,
        top=tops,
    )


# ----------------------------------------------------------------------------- fused path
# One compiled function per chunk: log-softmax of both sides, KL, entropy, α, confidence
# and argmax agreement in as few passes over the [N, V] logits as the compiler manages
# (torch.compile / Inductor fuses the elementwise work into the reductions). Covered:
# untruncated sampling (any temperature, either side greedy); truncation (top-k/p, min-p)
# takes the eager path. Any compile error falls back to eager for the rest of the process.
# Used when SPECPROBE_FUSED=1 (`metrics.dispatch` says why not by default).
_FUSED: dict[str, Any] = {"fn": None, "broken": None}


def _fused_body(tl: torch.Tensor, dl: torch.Tensor, t_temp: float, d_temp: float, t_greedy: bool, d_greedy: bool, top: int) -> tuple[torch.Tensor, ...]:
    a = tl.float() / t_temp  # [N, V] tempered target logits
    b = dl.float() / d_temp  # [N, V]
    la = a - a.amax(-1, keepdim=True)
    lb = b - b.amax(-1, keepdim=True)
    za = la.exp().sum(-1, keepdim=True)
    zb = lb.exp().sum(-1, keepdim=True)
    logp = la - za.log()
    logq = (lb - zb.log()).clamp(min=-1e4)  # ids the drafter lacks: finite penalty
    p = logp.exp()
    q = (lb - zb.log()).exp()
    plogp = (p * logp.clamp(min=-1e4)).sum(-1)  # a −inf target logit: p = 0, 0·log 0 = 0
    kl = plogp - (p * logq).sum(-1)
    ta, da = tl.argmax(-1), dl.argmax(-1)
    agree = (ta == da).float()
    if t_greedy and d_greedy:
        alpha = agree
    elif t_greedy:
        alpha = q.gather(-1, ta[:, None]).squeeze(-1)
    elif d_greedy:
        alpha = p.gather(-1, da[:, None]).squeeze(-1)
    else:
        alpha = torch.minimum(p, q).sum(-1)
    conf = torch.ones_like(kl) if d_greedy else 1.0 / zb.squeeze(-1)  # max q = e^0 / Z
    greedy_draft = agree if t_greedy else p.gather(-1, da[:, None]).squeeze(-1)
    if top:
        tp, ti = torch.topk(p, top, dim=-1)
        dp, di = torch.topk(q, top, dim=-1)
        return alpha, agree, kl, -plogp, conf, ti, tp, di, dp, p.gather(-1, di), q.gather(-1, ti), greedy_draft
    return alpha, agree, kl, -plogp, conf, greedy_draft


def fused_available() -> bool:
    return _FUSED["broken"] is None


def position_metrics_fused(target_logits: torch.Tensor, draft_logits: torch.Tensor, target_sampling: Sampling, draft_sampling: Sampling, top: int = 0) -> PositionMetrics:
    """`position_metrics` through one compiled function (same results to ~1e-6);
    truncating sampling, or a compiler that fails, uses the eager path (the compiled rows
    or the torch blocks)."""
    fn = _FUSED["fn"]
    if _FUSED["broken"] is not None or (not target_sampling.greedy and target_sampling.truncates) or (not draft_sampling.greedy and draft_sampling.truncates):
        return _blocked(target_logits, draft_logits, target_sampling, draft_sampling, top=top)
    if fn is None:
        fn = _FUSED["fn"] = torch.compile(_fused_body, dynamic=True)
    draft_logits = align_vocab(draft_logits, target_logits.shape[-1])
    tt = 1.0 if target_sampling.greedy else float(target_sampling.temperature)
    dt = 1.0 if draft_sampling.greedy else float(draft_sampling.temperature)
    try:
        out = fn(target_logits, draft_logits, tt, dt, target_sampling.greedy, draft_sampling.greedy, int(top))
    except Exception as e:  # any compiler/toolchain failure: eager from now on
        _FUSED["broken"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        return _blocked(target_logits, draft_logits, target_sampling, draft_sampling, top=top)
    alpha, agree, kl, ent, conf = out[:5]
    tops = dict(zip(("target_ids", "target_probs", "draft_ids", "draft_probs", "target_probs_at_draft", "draft_probs_at_target"), out[5:-1], strict=True)) if top else None
    return PositionMetrics(alpha.clamp(0.0, 1.0), _no_draft_where_broken(out[-1].clamp(0.0, 1.0), kl), agree, kl.clamp(min=0.0), ent, conf, top=tops)


def finite(logits: torch.Tensor) -> torch.Tensor:
    """NaN → 0 and ±inf → the largest finite values, as transformers' generate does with
    remove_invalid_values: a model whose logits are not numbers still runs to the end
    (the estimate names those positions, rule SP107) instead of failing to sample."""
    # −inf alone is a token the model rules out (a head's unmapped ids): left as it is
    return torch.nan_to_num(logits, nan=0.0) if bool((logits.isnan() | logits.isposinf()).any()) else logits
