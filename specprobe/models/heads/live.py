"""A head drafter inside the real draft → verify loop (`specprobe simulate`): its KV cache
over a batch of rows that advance at their own pace, and what it reads from each verify
pass of the target.

Every round, for each live row:

    catch up   the head reads the target's states at the positions the last verify pass
               accepted (the prompt, after the prefill) together with the token that
               followed each — the same "first-use" entries the teacher-forced scorer
               builds from the reference (EAGLE-3: fc of its aux layers' residual streams,
               hidden_states[k]; EAGLE-1/2 and MTP: the final post-norm state). Its output
               at the last of them drafts depth 1.
    chain      depth d+1 feeds the head its own output of depth d and the token it just
               drafted (EAGLE, MTP: layer j mod n at step j). Medusa's heads are
               independent: head d−1 reads the final state at the last accepted position,
               so a Medusa checkpoint drafts at most as many tokens as it has heads.
    roll back  after verify, every chain entry is dropped — accepted drafts included:
               they come back next round as first-use entries computed from the target's
               own states, as vLLM's and SGLang's EAGLE workers do. The head's cache thus
               always holds exactly the verified tokens (no recomputation of the prefix).

A head cannot draft before the target's first pass: round 1 (the prefill) proposes
nothing, as in the engines, where the drafter's first proposal follows the prefill.

Slots and holes work as in `models.kvcache`: one cache for the batch, a `valid[B, L]`
mask, a row's position = its count of valid slots, which equals the target position of
that slot since the head holds one entry per verified target position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from specprobe.core.delegate import Via
from specprobe.core.errors import ConfigError
from specprobe.models.anatomy import capture_last_hidden, capture_layers
from specprobe.models.kvcache import sync


class KVList(list):  # type: ignore[type-arg]
    """One attention module's keys/values [B, heads, L, D], in both protocols head layers
    use: the list `layers.Attention` appends (kept as ONE entry, so it can be cropped and
    row-selected) and transformers' `cache.update()` (MTP blocks are the target's own
    decoder layers).

    The entry is a view of the live part [:, :, :L] of a preallocated buffer whose
    capacity doubles when an append does not fit, so L single-token appends copy O(L)
    slots in all, not O(L²) as a `torch.cat` per append would; `crop` only moves L. A view
    handed out before a crop sees later appends overwrite its cropped tail: the callers
    use each view within the forward that asked for it."""

    MIN_CAPACITY = 16

    def __init__(self) -> None:
        super().__init__()
        self._k: torch.Tensor | None = None  # [B, heads, capacity, D]
        self._v: torch.Tensor | None = None
        self._len = 0
        self.allocations = 0  # buffers allocated so far (geometric growth: O(log L) of them)

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else int(self._k.shape[2])

    def append(self, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        k, v = kv  # [B, heads, T, D]
        end = self._len + int(k.shape[2])
        if self._k is None or self._v is None or end > self.capacity:
            cap = max(end, 2 * self.capacity, self.MIN_CAPACITY)
            self._k, self._v = self._grown(self._k, k, cap), self._grown(self._v, v, cap)
            self.allocations += 1
        self._k[:, :, self._len : end] = k
        self._v[:, :, self._len : end] = v
        self._len = end
        self._publish()

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int | None = None, *args: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.append((key, value))
        return self[0]  # type: ignore[no-any-return]

    def crop(self, keep: int) -> None:
        """Keep the first `keep` slots (clamped to [0, L])."""
        if self._k is not None:
            self._len = min(max(keep, 0), self._len)
            self._publish()

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows (indices or a bool mask over B), at the same capacity."""
        if self._k is not None and self._v is not None:
            self._k, self._v = self._k[rows], self._v[rows]  # copies ≤ 2·max(L, MIN_CAPACITY) slots a row
            self.allocations += 1
            self._publish()

    def _grown(self, old: torch.Tensor | None, new: torch.Tensor, cap: int) -> torch.Tensor:
        """A buffer [B, heads, cap, D] like `new`, holding old's live part."""
        buf = new.new_empty((new.shape[0], new.shape[1], cap, new.shape[3]))
        if old is not None and self._len:
            buf[:, :, : self._len] = old[:, :, : self._len]
        return buf

    def _publish(self) -> None:
        assert self._k is not None and self._v is not None
        entry = (self._k[:, :, : self._len], self._v[:, :, : self._len])
        if self:
            super().__setitem__(0, entry)
        else:
            super().append(entry)


UNSUPPORTED_HINT = "use diagnose for this head, or a checkpoint with one MTP layer"


def unsupported_layout(layout: Any) -> str | None:
    """Why a head, as its files describe it (`HeadLayout`), cannot run in the live loop
    (None: it can)."""
    if layout.kind == "mtp" and len(layout.details.get("prefixes") or [1]) > 1:
        n = len(layout.details["prefixes"])
        return f"simulate runs MTP heads with one layer; {layout.path.name} has {n} (diagnose scores all of them)"
    return None


def unsupported(drafter: Any) -> str | None:
    """Why this built head cannot run in the live loop (None: it can)."""
    return unsupported_layout(drafter.layout)


def refuse_unsupported(info: Any) -> None:
    """A drafter's ModelInfo, read from configs and headers before any weight loads: a
    one-line error when it is a head the live loop cannot run (simulate checks it before
    the target loads, which takes minutes for a big one)."""
    layout = (getattr(info, "extra", None) or {}).get("head")
    why = unsupported_layout(layout) if layout is not None else None
    if why:
        raise ConfigError(why, UNSUPPORTED_HINT)


def draft_limit(drafter: Any) -> int | None:
    """The deepest draft a head can make: Medusa's number of heads; None for chained heads."""
    return int(drafter.layout.details["num_heads"]) if drafter.kind == "medusa" else None


class LiveHead:
    """A head drafter over a batch (see module doc). `watch` wraps the target's verify
    forward, `queue` marks what it accepted, `catch_up` and `step` draft depth 1 and
    d > 1, `invalidate_from`/`compact`/`select` roll back and drop rows."""

    def __init__(self, drafter: Any, batch: int, device: Any) -> None:
        why = unsupported(drafter)
        if why:
            raise ConfigError(why, UNSUPPORTED_HINT)
        drafter.ensure_built()
        self.d = drafter
        self.kind = drafter.kind
        self.device = device
        self.dtype = drafter.target.dtype if isinstance(drafter.target.dtype, torch.dtype) else next(drafter.target.model.parameters()).dtype
        self.valid = torch.zeros((batch, 0), dtype=torch.bool, device=device)  # [B, L]
        n_kv = {"eagle3": 1, "eagle": len(getattr(drafter, "layers", [])), "mtp": 1}.get(self.kind, 0)
        self.kvs = [KVList() for _ in range(n_kv)]
        self.max_depth = draft_limit(drafter)
        self.hidden: torch.Tensor | None = None  # [B, H'] the chain's state (Medusa: the target's last state)
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # catch-up queued by verify
        self._seen: tuple[torch.Tensor, torch.Tensor] | None = None  # the last verify pass: ids [B, T], features [B, T, F]
        self.calls = 0
        self.seconds = 0.0

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])

    @property
    def has_pending(self) -> bool:
        return self.pending is not None

    # ------------------------------------------------------------------------- the target's side
    def watch(self, ids: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run the target's verify forward over ids [B, T] and keep the states the head
        reads at every position (hooks: transformers' hidden_states[k] and the decoder's
        post-norm last_hidden_state, as the scorer captures them) -> forward's result."""
        model = self.d.target.model
        layers = self.d.target_layers_needed()
        with capture_layers(model, layers) as cap, capture_last_hidden(model) as box:
            out = forward()
        self._seen = (ids, self.features(ids, cap, box["h"]))
        return out

    def features(self, ids: torch.Tensor, layer_hidden: dict[int, torch.Tensor], last_hidden: torch.Tensor) -> torch.Tensor:
        """The states the head reads at every position of a target pass over ids [B, T]
        (its captured layers, its post-norm last hidden state) -> [B, T, F]."""
        if self.kind == "eagle3":
            emb = self.d.target.model.get_input_embeddings()
            return torch.cat([layer_hidden[k] if k >= 1 else emb(ids) for k in self.d.aux], dim=-1)  # [B, T, n·Ht]
        return last_hidden  # [B, T, H] final, post-norm

    def queue(self, start: torch.Tensor, count: torch.Tensor, nxt: torch.Tensor) -> None:
        """The last verify pass accepted `count[b]` positions of row b from column
        `start[b]` on, and picked `nxt[b]` after them: queue those positions' states and
        the token that followed each, right-aligned, for the next catch-up."""
        assert self._seen is not None, "queue() follows watch()"
        ids, feats = self._seen
        self._seen = None
        t, w = ids.shape[1], int(count.max())
        col = torch.arange(w, device=ids.device)[None, :]  # [1, W]
        lead = (w - count)[:, None]  # [B, 1] holes on the left
        src = (start[:, None] + col - lead).clamp(0, t - 1)  # [B, W] block column of each slot
        valid = col >= lead  # [B, W]
        f = feats.gather(1, src[..., None].expand(-1, -1, feats.shape[-1]))  # [B, W, F]
        nt = ids.gather(1, (src + 1).clamp(max=t - 1))  # [B, W] the token after each slot
        nt[:, -1] = nxt  # after the last accepted position: the token verify picked
        if self.pending is not None:  # a round that drafted nothing: both blocks, in order
            pf, pt, pv = self.pending
            f, nt, valid = torch.cat([pf, f], 1), torch.cat([pt, nt], 1), torch.cat([pv, valid], 1)
        self.pending = (f, nt, valid)

    # ------------------------------------------------------------------------- the head's side
    def catch_up(self) -> torch.Tensor:
        """First-use entries for the queued positions -> logits [B, V] of depth 1 (target ids)."""
        assert self.pending is not None
        feats, toks, valid = self.pending
        self.pending = None
        t0 = self._start()
        if self.kind == "medusa":
            self.hidden = feats[:, -1]  # [B, H] every row's last slot is valid (right-aligned)
            logits = self._medusa(1)
        else:
            mask, pos = self._attend(valid)
            hidden, out = self._forward(self._embed(toks, pos, first=True), feats, pos, mask, first=True)
            self.hidden = hidden[:, -1]
            logits = self.d.logits(out[:, -1], 1)
        self._stop(t0)
        return logits  # type: ignore[no-any-return]

    def step(self, tokens: torch.Tensor, feed: torch.Tensor, depth: int) -> torch.Tensor:
        """Depth `depth` >= 2: the token drafted at depth−1 (tokens [B]) fed where feed [B]
        (other rows sit out as holes) -> logits [B, V]."""
        assert self.hidden is not None
        t0 = self._start()
        if self.kind == "medusa":
            logits = self._medusa(depth)
        else:
            mask, pos = self._attend(feed[:, None])
            h, out = self._forward(self._embed(tokens[:, None], pos, first=False), self.hidden[:, None], pos, mask, first=False, depth=depth)
            self.hidden = torch.where(feed[:, None], h[:, -1], self.hidden)
            logits = self.d.logits(out[:, -1], depth)
        self._stop(t0)
        return logits  # type: ignore[no-any-return]

    def _medusa(self, depth: int) -> torch.Tensor:
        return self.d.logits(self.d._block(depth - 1, self.hidden), depth)  # type: ignore[no-any-return]

    def _embed(self, toks: torch.Tensor, pos: torch.Tensor, first: bool) -> torch.Tensor:
        if self.kind == "mtp":
            e = self.d._embed(toks).to(self.dtype)
            if first and self.d.style in ("deepseek", "mimo"):
                e = e.masked_fill((pos == 0)[..., None], 0.0)  # vLLM masks the embedding at position 0
            return e  # type: ignore[no-any-return]
        return self.d.embed(toks).to(self.dtype)  # type: ignore[no-any-return]

    def _forward(self, e: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, *, first: bool, depth: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the head over new slots -> (the chain's next hidden, the LM head's input)."""
        d = self.d
        if self.kind == "eagle3":
            h0 = d.head.fc(hidden.to(d.head.fc.weight.dtype)) if first else hidden  # [B, T, H]
            return d.head.step_at(e, h0, pos, mask, self.kvs[0])  # type: ignore[no-any-return]
        if self.kind == "eagle":
            x = d.step_at(e, hidden.to(self.dtype), pos, mask, self.kvs)
            return x, x
        # MTP, one layer (`unsupported` refuses more): step j uses layer j mod 1 = 0
        return d.step_at(0, e, hidden.to(self.dtype), pos, mask, self.kvs[0])  # type: ignore[no-any-return]

    def _attend(self, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new slots (valid [B, T]) -> additive mask [B, 1, T, L+T], position ids [B, T]."""
        b, t = valid.shape
        length = self.length
        full = torch.cat([self.valid, valid], dim=1)  # [B, L+T]
        slot = torch.arange(length + t, device=self.device)
        qslot = slot[length:]
        allowed = full[:, None, :] & (slot[None, :] <= qslot[:, None])[None]  # [B, T, L+T]
        allowed |= (slot[None, :] == qslot[:, None])[None]  # a hole attends to itself (no all-masked row)
        mask = torch.zeros((b, 1, t, length + t), dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
        pos = (self.valid.sum(dim=1, keepdim=True) + valid.long().cumsum(dim=1) - 1).clamp_(min=0)  # [B, T]
        self.valid = full
        return mask, pos

    # ------------------------------------------------------------------------- roll back
    def invalidate_from(self, cut: int) -> None:
        """Slots from `cut` on (this round's chain entries) become holes in every row."""
        self.valid[:, cut:] = False

    def compact(self) -> None:
        """Crop trailing slots that are holes in every row."""
        if self.length == 0:
            return
        idx = torch.nonzero(self.valid.any(dim=0))
        keep = int(idx[-1]) + 1 if idx.numel() else 0
        if keep < self.length:
            for kv in self.kvs:
                kv.crop(keep)
            self.valid = self.valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        for kv in self.kvs:
            kv.select(rows)
        self.valid = self.valid[rows]
        if self.hidden is not None:
            self.hidden = self.hidden[rows]
        if self.pending is not None:
            self.pending = tuple(x[rows] for x in self.pending)  # type: ignore[assignment]

    def repeated(self, rows: int) -> LiveHead:
        """A new head of `rows` rows, each a copy of this one's row 0 (its cache, slots and
        state; nothing queued): rounds that share a prefix start from one catch-up."""
        return self.take(torch.zeros(rows, dtype=torch.long, device=self.device))

    def take(self, rows: torch.Tensor) -> LiveHead:
        """A new head whose row i is a copy of this one's row rows[i] (cache, slots and
        state; nothing queued; a row may be taken many times)."""
        out = LiveHead(self.d, len(rows), self.device)
        idx = rows.to(self.device)
        for mine, theirs in zip(self.kvs, out.kvs, strict=True):
            if mine._k is not None and mine._v is not None:
                theirs._k, theirs._v, theirs._len = mine._k[idx], mine._v[idx], mine._len
                theirs._publish()
        out.valid = self.valid[idx].clone()
        out.hidden = None if self.hidden is None else self.hidden[idx]
        return out

    # ------------------------------------------------------------------------- timing
    def _start(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def _stop(self, t0: float) -> None:
        sync(self.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1


class HeadTimed:
    """max_depth, calls and seconds: those of the drafter's live `head`."""

    head: LiveHead
    max_depth = Via[int | None]("head")
    calls = Via[int]("head")
    seconds = Via[float]("head")
