"""Tree attention through transformers' 4-D attention masks.

A draft tree is verified (and drafted) in one forward pass: every node is a slot of the
block, and node j attends to the cache's real slots before the round (the verified
prefix), to its ancestors' slots and to itself — never to a sibling or a cousin. Its
position id is the root's position plus its depth, so its keys, values and logits are
those of a plain forward of its root-to-node path (`tests/test_tree_loop.py` checks it).
The mask is the additive float kind transformers passes through untouched: shape
[B, 1, q_len, kv_len], 0 where allowed and the dtype's most negative value elsewhere.

The slots of a `models.kvcache.Stream` may be holes (`valid[B, L]` false); a hole query
attends to itself only, so no row of the mask is fully masked."""

from __future__ import annotations

import torch

from specprobe.models.kvcache import Stream


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """allowed [B, Q, KV] bool -> the additive mask [B, 1, Q, KV] (0 / dtype min)."""
    mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


def block_allowed(prefix: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """The attention of a block of W new slots appended after L cached ones: prefix
    [B, W, L] (which cached slots each query sees), ancestors [B, W, W] (which earlier
    block slots each query sees) -> allowed [B, W, L+W], every query seeing itself."""
    w = ancestors.shape[-1]
    own = torch.eye(w, dtype=torch.bool, device=ancestors.device)[None]
    return torch.cat([prefix, ancestors | own], dim=2)


def forward(stream: Stream, ids: torch.Tensor, valid: torch.Tensor, allowed: torch.Tensor, pos: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """Append a block ids [B, W] (valid [B, W]: real slots; the others become holes) to the
    stream's cache, attending as `allowed` [B, W, L+W] says, at position ids pos [B, W]
    -> logits [B, keep, V] for the last `keep` slots (all W when 0). What
    `Stream.forward` does for a causal block, with the mask and positions given."""
    return stream.call(ids, valid, additive(allowed, stream.dtype), pos.clamp(min=0), keep)


def ancestor_matrix(parent_col: torch.Tensor) -> torch.Tensor:
    """parent_col [B, W]: each block slot's parent slot in the block (−1: none, i.e. it
    hangs off the prefix; parents come first) -> [B, W, W] slot i sees slot j when j is a
    proper ancestor of i."""
    b, w = parent_col.shape
    anc = torch.zeros((b, w, w), dtype=torch.bool, device=parent_col.device)
    rows = torch.arange(b, device=parent_col.device)
    for i in range(w):
        par = parent_col[:, i]
        has = par >= 0
        if bool(has.any()):
            p = par.clamp(min=0)
            anc[rows, i] = torch.where(has[:, None], anc[rows, p], anc[rows, i])
            anc[rows[has], i, p[has]] = True
    return anc


def squeeze(stream: Stream, keep_share: float = 0.75) -> bool:
    """Take the holes out of a stream's cache: each row's real slots, in order, packed to
    the right (holes only on the left), when they fill less than `keep_share` of it. A
    tree round leaves the rejected nodes as holes between accepted slots; packing keeps the
    cache at the verified tokens instead of growing by the whole tree every round.
    Positions are explicit and masks come from `valid`, so no logit changes. Only plain
    per-layer key/value tensors [B, heads, L, D] are packed (not sliding-window or
    recurrent layers) -> whether it packed."""
    cache, valid = stream.cache, stream.valid
    layers = getattr(cache, "layers", None)
    if cache is None or not layers or stream.length == 0:
        return False
    if any(getattr(x, "is_sliding", False) or not isinstance(getattr(x, "keys", None), torch.Tensor) or x.keys.dim() != 4 or x.keys.shape[2] != stream.length for x in layers):
        return False
    width = int(valid.sum(dim=1).max())
    if width >= keep_share * stream.length:
        return False
    idx = torch.argsort(valid.to(torch.int8), dim=1, stable=True)[:, -max(width, 1) :]  # [B, L'] holes first, then real slots in order
    for layer in layers:
        h, d = layer.keys.shape[1], layer.keys.shape[3]
        g = idx[:, None, :, None].expand(-1, h, -1, d)
        layer.keys = layer.keys.gather(2, g)
        layer.values = layer.values.gather(2, idx[:, None, :, None].expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
    stream.valid = valid.gather(1, idx)
    return True
