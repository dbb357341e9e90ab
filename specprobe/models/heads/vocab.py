"""Draft vocabularies smaller than the target's (EAGLE-3 `d2t`, vLLM Medusa `token_map`):
the id map, the mapping of draft logits into the target vocabulary, the d2t/t2d sanity
checks, and α of a depth computed inside the draft vocabulary. Pure tensor functions.

vLLM maps draft id i to target id i + d2t[i] and fills every other target id with −inf;
a checkpoint without d2t leaves the offsets at zero, so draft id i is read as target id
i — the right map only when the draft vocabulary is the target's first Vd ids. The −inf
ids are what the scorer's vocabulary ceiling (`counterfactual.vocab_ceiling`: the
target's mass the head can propose at all, an upper bound on α) is measured from.
"""

from __future__ import annotations

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


def depth_accept(p: Any, draft_logits: Any, ids: Any | None, sampling: Any) -> tuple[Any, Any]:
    """α and drafter confidence of one depth, for scorers that need no more than that at
    depths ≥ 2: p [N, V] the target's sampling distribution (computed once per chunk and
    shared by every depth), draft_logits [N, Vd] the head's own (draft-vocabulary) logits,
    ids [Vd] their target ids (None: the target's ids). Works in the draft vocabulary —
    q is 0 outside it, so Σ_v min(p, q) needs p only there — with no [N, V] mapping.
    -> (alpha [N], confidence max q [N])."""
    import torch

    from specprobe.metrics.sampling import probs

    q = probs(draft_logits, sampling)  # [N, Vd], truncated as the engine samples
    pd = p if ids is None else p[:, ids.to(p.device)]  # [N, Vd]
    conf = q.amax(-1)
    alpha = torch.minimum(pd, q, out=q).sum(-1)  # q is not needed afterwards
    return alpha.clamp_(0.0, 1.0), conf
