"""Draft vocabularies smaller than the target's (EAGLE-3 `d2t`, vLLM Medusa `token_map`):
the id map, the mapping of draft logits into the target vocabulary, the d2t/t2d sanity
checks, and a head's per-position metrics computed inside its draft vocabulary (the
scorer's head path: `target_side` once per chunk, `depth_scores` per depth). Pure tensor
functions.

vLLM maps draft id i to target id i + d2t[i] and fills every other target id with −inf;
a checkpoint without d2t leaves the offsets at zero, so draft id i is read as target id
i — the right map only when the draft vocabulary is the target's first Vd ids. The −inf
ids are what the scorer's vocabulary ceiling (`counterfactual.vocab_ceiling`: the
target's mass the head can propose at all, an upper bound on α) is measured from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


def target_ids(d2t: Any | None, draft_vocab: int) -> Any:
    """[Vd] target id of each draft id, exactly as vLLM computes it (offsets 0 when d2t is absent)."""
    import torch

    base = torch.arange(draft_vocab, dtype=torch.long)
    return base if d2t is None else base + d2t.to(torch.long).cpu()


def vocab_mask(ids: Any, vocab: int) -> Any:
    """[V] bool: target ids the draft vocabulary can produce (ids out of range dropped)."""
    import torch

    mask = torch.zeros(vocab, dtype=torch.bool)
    ok = ids[(ids >= 0) & (ids < vocab)]
    mask[ok] = True
    return mask


def map_logits(logits: Any, ids: Any, vocab: int) -> Any:
    """[N, Vd] draft logits -> [N, V] target-vocabulary logits, −inf where no draft id
    lands. Draft ids mapped outside [0, V) are dropped (an engine would fault on them)."""
    import torch

    if ids.shape[0] == vocab and bool((ids == torch.arange(vocab, device=ids.device)).all()):
        return logits
    ok = (ids >= 0) & (ids < vocab)
    out = logits.new_full((logits.shape[0], vocab), float("-inf"))
    out[:, ids[ok].to(logits.device)] = logits[:, ok.to(logits.device)]
    return out


def d2t_problems(d2t: Any, t2d: Any | None, vocab: int) -> dict[str, Any]:
    """Validity of a d2t (and t2d) pair for a target of `vocab` ids.

    -> invalid: [Vd] bool, entries out of range, not strictly increasing, or whose target
    id t2d does not mark; all_zero: offsets all 0; t2d_count: t2d.sum() (None without
    t2d); t2d_extra: target ids t2d marks that no draft id maps to."""
    import torch

    ids = target_ids(d2t, int(d2t.shape[0]))
    out_of_range = (ids < 0) | (ids >= vocab)
    not_increasing = torch.zeros_like(out_of_range)
    not_increasing[1:] = ids[1:] <= ids[:-1]
    invalid = out_of_range | not_increasing
    res: dict[str, Any] = {"ids": ids, "out_of_range": out_of_range, "not_increasing": not_increasing, "all_zero": bool((d2t == 0).all())}
    if t2d is not None:
        t2d = t2d.to(torch.bool).cpu()
        unmarked = torch.zeros_like(out_of_range)
        inside = ~out_of_range & (ids < t2d.shape[0])
        unmarked[inside] = ~t2d[ids[inside]]
        invalid = invalid | unmarked
        mapped = vocab_mask(ids, int(t2d.shape[0]))
        res.update(unmarked=unmarked, t2d_count=int(t2d.sum()), t2d_len=int(t2d.shape[0]), t2d_extra=int((t2d & ~mapped).sum()))
    res["invalid"] = invalid
    return res


# ----------------------------------------------------------------------------- scoring a head
# Teacher-forced scoring of a head, chunk by chunk: the target's side is computed once per
# chunk and shared by every depth (all depths of a chunk predict the same tokens), each
# depth is scored in the head's own draft vocabulary — gathering the target's
# probabilities at the draft ids instead of writing the draft logits into an [N, V]
# buffer of −inf — and every op writes into a reused buffer: on a CPU each fresh [N, V]
# tensor costs its page faults, and each op a thread hand-off.
@dataclass(frozen=True)
class ScoringVocab:
    """A head's draft vocabulary as the scorer reads it. ids None: draft id = target id."""

    vocab: int  # V, the target's
    ids: Any = None  # [Vs] target id of each kept draft column: unique, inside [0, V)
    keep: Any = None  # [Vs] the draft columns kept (None: all, in order)
    inv: Any = None  # [V] kept draft column of each target id, −1 where none


def scoring_vocab(ids: Any | None, vocab: int) -> ScoringVocab:
    """The scorer's view of a draft vocabulary: ids mapped outside the target vocabulary are
    dropped and, where several draft ids land on one target id, the last one is kept — what
    `map_logits` leaves in the [N, V] buffer."""
    import torch

    if ids is None:
        return ScoringVocab(vocab)
    ids = ids.to(torch.long).cpu()
    ok = (ids >= 0) & (ids < vocab)
    col = torch.full((vocab,), -1, dtype=torch.long)
    col[ids[ok]] = torch.arange(ids.shape[0])[ok]  # last write wins, as index_put on CPU
    keep = torch.sort(col[col >= 0]).values  # [Vs] kept draft columns, in draft order
    if keep.shape[0] == ids.shape[0]:
        if ids.shape[0] == vocab and bool((ids == torch.arange(vocab)).all()):
            return ScoringVocab(vocab)
        kept, ids_kept = None, ids
    else:
        kept, ids_kept = keep, ids[keep]
    inv = torch.full((vocab,), -1, dtype=torch.long)
    inv[ids_kept] = torch.arange(ids_kept.shape[0])
    return ScoringVocab(vocab, ids_kept, kept, inv)


_SCRATCH = threading.local()


def _scratch(tag: str, n: int, width: int, device: Any) -> Any:
    """A reused float32 buffer [n, width] (a row view of one that only grows)."""
    import torch

    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (tag, width, str(device))
    b = bufs.get(key)
    if b is None or b.shape[0] < n:
        b = bufs[key] = torch.empty((n, width), dtype=torch.float32, device=device)
    return b[:n]


def _tempered(logits: Any, s: Any, tag: str) -> Any:
    """logits / T as float32 (T = 1 when greedy), in a reused buffer unless nothing changes."""
    import torch

    c = 1.0 if s.greedy else 1.0 / float(s.temperature)
    if c == 1.0 and logits.dtype == torch.float32:
        return logits
    return torch.mul(logits, c, out=_scratch(tag, logits.shape[0], logits.shape[1], logits.device))


def _log_softmax(x: Any, tag: str) -> Any:
    import torch

    return torch.ops.aten._log_softmax.out(x, -1, False, out=_scratch(tag, x.shape[0], x.shape[1], x.device))


@dataclass
class TargetSide:
    """The target's side of one chunk, shared by every depth. 'Draft vocabulary' below is
    the kept draft columns (`ScoringVocab`), the whole target vocabulary when ids is None."""

    entropy: Any  # [N] of the untruncated tempered target distribution (T = 1 when greedy)
    xd: Any  # [N, Vs] untruncated tempered target log-probabilities at the draft ids
    top_logp: Any  # [N, 1] their largest value over the whole vocabulary (greedy agreement)
    pt: Any  # [N, Vs] p̃: the untruncated target renormalised over the draft vocabulary
    pt_log_pt: Any  # [N] Σ p̃ log p̃
    pd: Any  # [N, Vs] the target's sampling distribution at the draft ids; None when greedy
    col: Any  # [N] draft column of the target's argmax (−1: outside), greedy target only
    ids: Any  # [Vs] target ids, or None
    inv: Any  # [V] or None
    pu: Any = None  # [N, V] untruncated target distribution, only when top-k is asked for
    top: dict[str, Any] | None = None


def target_side(tl: Any, s: Any, sv: ScoringVocab, top: int = 0) -> TargetSide:
    """tl [N, V] the target's logits, s its sampling -> everything a depth compares with."""
    import torch

    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.metrics.sampling import truncate_

    ids = None if sv.ids is None else sv.ids.to(tl.device)
    inv = None if sv.inv is None else sv.inv.to(tl.device)
    logp = _log_softmax(_tempered(tl, s, "tx"), "tlogp")  # [N, V] untruncated
    p = torch.exp(logp, out=_scratch("tp", logp.shape[0], logp.shape[1], tl.device))  # [N, V]
    entropy = -torch.linalg.vecdot(p, logp)
    ta: Any = None
    if s.greedy:
        mx, ta = logp.max(-1, keepdim=True)
    else:
        mx = logp.amax(-1, keepdim=True)
    truncating = not s.greedy and s.truncates
    pu = tops = None
    if top:
        pu = p.clone() if truncating else p
        tp, ti = torch.topk(pu, top, dim=-1)
        tops = {"target_ids": ti, "target_probs": tp}
    pd: Any = None
    if ids is None:
        xd, pt, pt_log_pt = logp, p, -entropy
        if truncating:
            pd = truncate_(p.clone(), s)
        elif not s.greedy:
            pd = p
    else:
        xd = logp.index_select(1, ids)  # [N, Vs]
        ped = p.index_select(1, ids)  # [N, Vs]
        zd = ped.sum(-1, keepdim=True)  # the target's mass on the draft vocabulary
        if truncating:  # truncation needs the whole distribution
            pd = truncate_(p, s).index_select(1, ids)
        elif not s.greedy:
            pd = ped
        pt = ped / zd if pd is ped else ped.div_(zd)
        pt_log_pt = torch.linalg.vecdot(pt, xd) - zd.log().squeeze(-1)  # Σ p̃ (log p − log zd)
    col = None
    if ta is not None:
        col = ta.squeeze(-1) if inv is None else inv[ta.squeeze(-1)]
    return TargetSide(entropy, xd, mx, pt, pt_log_pt, pd, col, ids, inv, pu, tops)


@dataclass
class DepthScores:
    """One depth's metrics [N]; kl, agree and top only for a depth scored in full."""

    alpha: Any
    confidence: Any
    kl: Any = None
    agree: Any = None
    top: dict[str, Any] | None = None


def depth_scores(ts: TargetSide, dl: Any, s: Any, full: bool, top: int = 0) -> DepthScores:
    """dl [N, Vs] the head's logits over the draft vocabulary (kept columns), s the drafter's
    sampling. Always α and max q; `full` adds KL over the draft vocabulary (KL(p̃ ‖ q): the
    target renormalised over the draft ids, so ids the head cannot propose do not count),
    greedy agreement (a tie at the target's top counts as agreement) and top-`top`."""
    import torch

    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.metrics.sampling import truncate_

    n, w = dl.shape
    y = _tempered(dl, s, "dy")  # [N, Vs]
    out = DepthScores(alpha=None, confidence=None)
    da: Any = None  # [N, 1] the drafter's argmax, where needed
    q: Any = None  # [N, Vs] the drafter's distribution, untruncated until truncated below
    if full:
        logq = _log_softmax(y, "dlogq")  # [N, Vs]
        mq, da = logq.max(-1, keepdim=True)
        agree = (ts.col == da.squeeze(-1)) if ts.col is not None else (ts.xd.gather(-1, da) >= ts.top_logp).squeeze(-1)
        out.agree = agree.float()
        q = torch.exp(logq, out=_scratch("dq", n, w, dl.device))
        # KL(p̃ ‖ q) = Σ p̃ log p̃ − Σ p̃ log q; a −inf draft logit costs a finite 1e4 nats
        out.kl = ts.pt_log_pt - torch.linalg.vecdot(ts.pt, logq.clamp_(min=-1e4))
        if top:
            dp, dcol = torch.topk(q, top, dim=-1)
            di = dcol if ts.ids is None else ts.ids[dcol]
            tcol = ts.top["target_ids"] if ts.inv is None else ts.inv[ts.top["target_ids"]]  # type: ignore[index]
            at_t = q.gather(-1, tcol.clamp(min=0)).masked_fill_(tcol < 0, 0.0)
            out.top = {**(ts.top or {}), "draft_ids": di, "draft_probs": dp, "target_probs_at_draft": ts.pu.gather(-1, di), "draft_probs_at_target": at_t}
        out.confidence = mq.squeeze(-1).exp()  # max q, untruncated (truncation below)
    elif s.greedy:
        da = y.max(-1, keepdim=True)[1]
    else:
        q = torch.ops.aten._softmax.out(y, -1, False, out=_scratch("dq", n, w, dl.device))
    if s.greedy:
        out.confidence = torch.ones(n, device=dl.device)
        if ts.pd is None:  # both greedy: α = 1 when the argmaxes meet
            out.alpha = (ts.col == da.squeeze(-1)).float()
        else:
            out.alpha = ts.pd.gather(-1, da).squeeze(-1)
        return out
    if s.truncates:
        q = truncate_(q, s)
        out.confidence = q.amax(-1)
    elif not full:
        out.confidence = q.amax(-1)
    if ts.pd is None:  # greedy target: α = q at its argmax (0 outside the draft vocabulary)
        c = ts.col.clamp(min=0)[:, None]
        out.alpha = q.gather(-1, c).squeeze(-1).masked_fill_(ts.col < 0, 0.0)
    else:
        out.alpha = torch.minimum(ts.pd, q, out=q).sum(-1)
    out.alpha = out.alpha.clamp_(0.0, 1.0)
    return out


def cat_scores(parts: list[DepthScores]) -> DepthScores:
    """One depth's scores of consecutive row blocks -> the chunk's."""
    import torch

    def cat(xs: list[Any]) -> Any:
        return None if xs[0] is None else torch.cat(xs)

    top = None
    if parts[0].top is not None:
        top = {k: torch.cat([p.top[k] for p in parts]) for k in parts[0].top}  # type: ignore[index]
    return DepthScores(cat([p.alpha for p in parts]), cat([p.confidence for p in parts]), cat([p.kl for p in parts]), cat([p.agree for p in parts]), top)
