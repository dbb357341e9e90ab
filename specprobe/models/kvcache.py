"""One KV cache per model over a batch of rows that advance at different speeds.

Rows advance by their own accepted counts, so their caches fall out of step. Instead of
per-row caches, every row shares one cache whose slots may be *holes*: left padding,
rejected drafts, and steps a row sat out. A boolean `valid[B, L]` says which slots are
real; each forward pass gets a 4-D attention mask built from it and explicit position
ids (a row's position = its count of valid slots), so a row attends exactly to its own
accepted prefix, as if it ran alone. Rolling back past a rejection is flipping slots to
invalid; trailing slots that are holes in every row are cropped off."""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Sequence
from typing import Any

import torch

from specprobe.core.delegate import Via
from specprobe.models.anatomy import output_cache
from specprobe.models.loader import cache_kwarg


def sync(device: Any) -> None:
    """Wait for queued GPU work, so timings cover it."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def crop(cache: Any, remove: int) -> None:
    """Drop the last `remove` slots of every layer (a negative crop works in 4.x and 5.x)."""
    if remove > 0:
        cache.crop(-remove)


class Stream:
    """One model's KV cache over a batch of rows whose slots may be holes (see module doc)."""

    def __init__(self, model: Any, batch: int, device: Any) -> None:
        self.model = model
        self.kw = cache_kwarg(model)
        # only the last few positions' logits are ever read: skip the LM head elsewhere
        # (at prefill that is [B, prompt, V] floats for nothing)
        self.can_keep = "logits_to_keep" in inspect.signature(type(model).forward).parameters
        self.cache: Any = None
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.valid = torch.zeros((batch, 0), dtype=torch.bool, device=device)  # [B, L]
        self.calls = 0
        self.seconds = 0.0

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Append a block ids [B, T] (valid [B, T] marks real tokens) -> logits [B, T', V]
        for the last T' = keep positions (all T when keep is 0)."""
        b, t = ids.shape
        length = self.length
        full = torch.cat([self.valid, valid], dim=1)  # [B, L+T]
        slot = torch.arange(length + t, device=self.device)
        qslot = slot[length:]  # [T]
        allowed = full[:, None, :] & (slot[None, :] <= qslot[:, None])[None]  # [B, T, L+T]
        # a hole query attends to itself: no fully masked row (sdpa would return nan and
        # poison later layers' K/V at that slot, which 0-weights cannot cancel)
        allowed |= (slot[None, :] == qslot[:, None])[None]
        mask = torch.zeros((b, 1, t, length + t), dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
        # a row's position = its count of real tokens before this one
        pos = self.valid.sum(dim=1, keepdim=True) + valid.long().cumsum(dim=1) - 1  # [B, T]
        pos = pos.clamp_(min=0)
        return self.call(ids, valid, mask, pos, keep)

    def call(self, ids: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, keep: int) -> torch.Tensor:
        """One timed forward of the model over a block ids [B, T] with an explicit 4-D mask
        and positions; the block's slots (valid [B, T]) join the cache."""
        sync(self.device)
        t0 = time.perf_counter()
        extra: dict[str, Any] = {"logits_to_keep": keep} if keep and self.can_keep else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{self.kw: self.cache}, **extra)
        logits = out.logits[:, -keep:] if keep else out.logits
        sync(self.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.cache = output_cache(out)
        self.valid = torch.cat([self.valid, valid], dim=1)
        return logits

    def invalidate_from(self, cut: torch.Tensor) -> None:
        """Row b's slots at index ≥ cut[b] become holes (rejected drafts: always a suffix)."""
        slot = torch.arange(self.length, device=self.device)
        self.valid &= slot[None, :] < cut[:, None]

    def compact(self) -> None:
        """Crop trailing slots that are holes in every row."""
        if self.cache is None or self.length == 0:
            return
        any_valid = self.valid.any(dim=0)  # [L]
        idx = torch.nonzero(any_valid)
        keep = int(idx[-1]) + 1 if idx.numel() else 0
        if keep < self.length:
            crop(self.cache, self.length - keep)
            self.valid = self.valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        if self.cache is not None:
            self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]

    def repeated(self, rows: int) -> Stream:
        """A new stream of `rows` rows, each a copy of this one's row 0 (cache and slots):
        rounds that share a prefix start from one prefill. This stream is left as it is."""
        return self.take(torch.zeros(rows, dtype=torch.long, device=self.device))

    def take(self, rows: torch.Tensor) -> Stream:
        """A new stream whose row i is a copy of this one's row rows[i] (cache and slots;
        a row may be taken many times). This stream is left as it is."""
        out = Stream(self.model, len(rows), self.device)
        idx = rows.to(self.device)
        if self.cache is not None:
            out.cache = copy.deepcopy(self.cache)
            out.cache.batch_select_indices(idx)
        out.valid = self.valid[idx].clone()
        return out


class StreamTimed:
    """calls and seconds: those of the drafter's `stream`'s forward passes."""

    stream: Stream
    calls = Via[int]("stream")
    seconds = Via[float]("stream")


def right_align(seqs: Sequence[Sequence[int]], device: Any, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids [B, T], valid [B, T], each row's tokens at the right end."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)  # [B, T]
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for r, s in enumerate(seqs):
        if s:
            ids[r, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            valid[r, width - len(s) :] = True
    return ids.to(device), valid.to(device)
