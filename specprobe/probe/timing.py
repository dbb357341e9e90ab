"""Timing on the run's device: the target's decode step, its verify pass over K + 1 tokens
and the drafter's step (a head's too), at each batch size over a KV cache as long as the
prompts' typical context, with the loop and budget of `specprobe.estimates.costs`; what to time for
a diagnose run; and the environment (device, dtype, package versions) recorded in a
result.

What a decode step costs depends on the length of the KV cache it attends to, not on
what the cache holds. So the cache is built once per model — one prefill of at most
`PREFILL_TOKENS` random tokens at batch 1 — and every batch size gets a copy of it
repeated to the context and to its rows; the verify passes and the drafter's steps run
over that copy and crop it back, so nothing is prefilled again. (A cache whose layers
are not plain append-only buffers — sliding windows, linear attention — is prefilled
for real, in chunks, once, and repeated over the rows.) A layer-skip self-draft's
layers are the target's first layers, so its cache is theirs.

The budget is kept between steps: the measurement stops once the time spent plus the
next step's estimate would pass the cap; a batch size whose first round, estimated from
the batch sizes timed before it, would end past the cap is not started; and a batch
size's cache is cut to a shorter context when its rows would not fit the memory the
scoring already used (`MEMORY_FACTOR` of its peak, what is held now included). Every
cut is written in the cost section's notes and `skipped`."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specprobe.drafters.base import TargetPass
from specprobe.estimates.costs import (
    MIN_REPEATS,
    Clock,
    batch_timings,
    budget_for,
    interleaved,
)
from specprobe.models.kvcache import Stream, crop, sync
from specprobe.settings.lengths import label

PREFILL_TOKENS = 256  # one prefill of this many tokens per model; the rest of the context repeats it
PREFILL_SHARE = 0.5  # a real (chunked) prefill may take at most this share of the cap
MEMORY_FACTOR = 1.4  # the cost step may hold up to this × the peak memory before it (weights included)
TRANSIENT = 1.15  # a forward's copies while it appends to a cache, over the cache itself
MIN_CONTEXT = 16  # a batch size whose rows fit fewer cache slots than this is not timed


def cost_block(
    target: Any,
    drafter: Any,
    given: float | None = None,
    *,
    verify_factor: float | None = None,
    k_max: int = 8,
    batch_sizes: Sequence[int] = (),
    context_tokens: int = 64,
    budget_s: float = math.inf,
    cap_s: float = math.inf,
    memory_bytes: float | str | None = None,
    clock: Clock = time.perf_counter,
    tree_tokens: Sequence[int] = (),
    tree_widths: Sequence[int] = (),
    length_contexts: Mapping[int, int] | None = None,
    length_batch: int | None = None,
) -> dict[str, Any]:
    """Time what the cost model needs at each batch size — nothing when both the cost
    ratio (`given`) and the verify factor are given — and return the raw cost entry:
    per-batch timing statistics and per-repeat ratios, context length, budget, time spent,
    how the caches were built and what was skipped. memory_bytes: what the caches may add
    (None: no limit; "auto": from the peak before it, `_Allowance`). No batch sizes: nothing is timed (a run stopped before its costs).

    A tree to estimate adds, in the same interleaved repeats and under the same budget and
    cap: the target's pass over N tokens for each N in `tree_tokens` under a tree attention
    mask (`tree_parents`), and the drafter's pass over T tokens for each T > 1 in
    `tree_widths` (the T beams of one step), as a factor of its one-token step. Empty (the
    default): nothing more is timed, as for a chain.

    length_contexts (--context-lengths: prompt length -> the context its decode steps see):
    after the batch sizes, the run's batch size (`length_batch`, else the smallest) is
    timed again over each length's own context, from the same prefill and within the same
    cap, in `raw["by_length"]`, so each length's speedup uses its own costs."""
    length_contexts = {int(k): int(v) for k, v in (length_contexts or {}).items()}
    need_draft, need_verify = given is None, verify_factor is None
    tree_n = sorted({int(n) for n in tree_tokens if int(n) >= 1})
    tree_w = sorted({int(w) for w in tree_widths if int(w) > 1}) if need_draft else []
    sizes = sorted({int(b) for b in batch_sizes})
    raw: dict[str, Any] = {
        "measured": False, "context_tokens": context_tokens, "budget_s": None if math.isinf(budget_s) else budget_s,
        "cap_s": None if math.isinf(cap_s) else cap_s, "elapsed_s": 0.0, "stopped_by_budget": False, "notes": [],
        "method": None, "prefill_tokens": None, "skipped": [],
    }
    if not sizes:
        raw["batches"] = []
        return raw
    if tree_n or tree_w:
        raw["tree"] = {"tokens": tree_n, "widths": tree_w, "branch": _branch(tree_widths), "mask": TREE_MASK}
    if not need_draft and not need_verify and not tree_n:
        raw["batches"] = [{"batch_size": b, "repeats": 0, "draft_ratios": [], "verify_ratios": []} for b in sizes]
        return raw
    import torch

    allowed = _Allowance(memory_bytes, target.device)
    raw["memory_bytes"] = allowed()
    start = clock()
    batches: list[dict[str, Any]] = []
    by_length: list[dict[str, Any]] = []
    with torch.inference_mode():
        gen = torch.Generator().manual_seed(0)
        step = drafter.step_model() if need_draft else None
        if need_draft:  # what c is taken to be where the cap (or the drafter) leaves its step untimed
            raw["draft_estimate"] = draft_estimate(target.model, drafter, step)
        longest = max([context_tokens, *length_contexts.values()])
        ctx = _Caches(target.model, step, longest, target.device, gen, clock, start + PREFILL_SHARE * cap_s)
        raw["prefill_tokens"], raw["method"] = ctx.prefilled, ctx.method()
        main = min(context_tokens, ctx.context)
        if main < context_tokens:
            raw["notes"].append(f"timed over {main} tokens of context, not {context_tokens}: a longer prefill would not fit the cap")
        per_row = ctx.bytes_per_token()
        # the jobs, each a batch size over a context: (--context-lengths) the run's batch size
        # at each length's own context — its headline costs are then the timed length's
        # nearest the prompts' typical context, not timed a second time — then every other
        # batch size at the typical context
        lb = length_batch if length_batch in sizes else sizes[0]
        jobs: list[tuple[int, int, int | None]] = [(lb, min(c, ctx.context), n) for n, c in sorted(length_contexts.items())]
        jobs += [(b, main, None) for b in sizes if not (length_contexts and b == lb)]
        tree_at = min(length_contexts, key=lambda n: (abs(length_contexts[n] - main), n)) if length_contexts else None
        prev: tuple[int, float] | None = None  # (batch size, seconds per round) of the last one timed
        for j, (b, want, at) in enumerate(jobs):
            name = f"batch size {b}" if at is None else f"context length {label(at)} (batch size {b})"
            out = batches if at is None else by_length
            spent = clock() - start
            allowance = allowed()
            length = want if allowance is None or per_row <= 0 else min(want, int(allowance / (TRANSIENT * b * per_row)))
            why = None
            if length < min(MIN_CONTEXT, want):
                why = f"{name}: not timed — {b} rows of cache would not fit the memory the scoring used"
            elif prev is not None and spent + 2 * prev[1] * b / prev[0] > cap_s:  # warm-up + one repeat, scaled from the last
                why = f"{name}: not timed — its first round, about {2 * prev[1] * b / prev[0]:.1f} s, would end past the {cap_s:.1f} s cap"
            if why is not None:
                raw["skipped"].append(why)
                raw["stopped_by_budget"] = raw["stopped_by_budget"] or "cap" in why
                out.append({"batch_size": b, "length": at, "repeats": 0, "draft_ratios": [], "verify_ratios": [], "context_tokens": None, "skipped": why})
                continue
            if length < want:
                raw["notes"].append(f"{name}: timed over {length} tokens of context, not {want}, to stay within the memory the scoring used")
            share = len(jobs) - j  # what is left of the budget, shared by the jobs still to run
            tn, tw = (tree_n, tree_w) if at is None or at == tree_at else ((), ())  # a tree's passes at the typical context only
            try:
                calls = _calls(ctx, target, drafter, b, length, k_max, need_draft, need_verify, gen, tn, tw, _branch(tree_widths))
                work = {c: _work(c) for c in calls}  # new tokens per row
                samples = interleaved(calls, clock=clock, budget_s=(budget_s - spent) / share, cap_s=(cap_s - spent) / share, stop_s=cap_s - spent, sizes=work)
            except Exception as e:  # noqa: BLE001  (out of memory at a large batch: report it, time the others)
                if not _is_oom(e):
                    raise
                raw["notes"].append(f"{name}: out of memory while timing; not measured")
                out.append({"batch_size": b, "length": at, "repeats": 0, "draft_ratios": [], "verify_ratios": [], "context_tokens": length})
                continue
            finally:
                calls = {}
                _release(target.device)
            raw["stopped_by_budget"] = raw["stopped_by_budget"] or samples.stopped_by_budget
            if samples.from_warmup:
                done = [n for n, v in samples.times.items() if v]
                why = (f"{name}: the {cap_s:.1f} s cap came during the warm-up round; "
                       + (f"its {len(done)} finished call(s) ({', '.join(done)}) stand as one repeat, first-call effects included" if done else "not measured"))
                raw["skipped"].append(why)
            entry = batch_timings(samples, k_max, b, tn, [w for w in tw if f"draftw{w}" in samples.times])
            entry["context_tokens"] = length
            if at is not None:
                entry["length"] = at
            out.append(entry)
            rounds = samples.repeats + samples.warmup_rounds
            if rounds:
                prev = (b, samples.elapsed_s / rounds)
    if length_contexts:
        raw["by_length"] = by_length
        batches = sorted([*batches, _headline_from_lengths(by_length, length_contexts, lb, main, raw["notes"])], key=lambda x: x["batch_size"])
    raw["batches"] = batches
    raw["elapsed_s"] = clock() - start
    raw["measured"] = any(x.get("repeats") for x in batches)
    if need_verify and k_max > 2:
        raw["method"] = f"{raw['method']}; verify passes timed at K = {', '.join(map(str, timed_ks(k_max)))}, the others interpolated per repeat"
    few = [str(x["batch_size"]) for x in batches if 0 < int(x.get("repeats") or 0) < MIN_REPEATS]
    if few:
        raw["notes"].append(f"batch size {', '.join(few)}: fewer than {MIN_REPEATS} repeats fit in the time the scoring took; the spread is not known")
    if need_draft and not any(x.get("draft_ratios") for x in batches) and raw["measured"]:
        raw["notes"].append("the drafter has no step that could be timed")
    if "tree" in raw:
        raw["notes"].extend(_tree_notes(batches, tree_n, tree_w))
    return raw


def _headline_from_lengths(by_length: Sequence[dict[str, Any]], contexts: Mapping[int, int], batch: int, main: int, notes: list[str]) -> dict[str, Any]:
    """The run's batch size's entry in a --context-lengths run: the timed length whose
    context is nearest the prompts' typical one (any length, when none was timed)."""
    pool = [x for x in by_length if x.get("repeats")] or list(by_length)
    e = min(pool, key=lambda x: (abs(contexts[int(x["length"])] - main), int(x["length"])))
    out = {k: v for k, v in e.items() if k != "length"}
    out["from_length"] = int(e["length"])
    if e.get("repeats"):
        notes.append(f"batch size {batch}: the headline costs are context length {label(int(e['length']))}'s ({e.get('context_tokens')} tokens), the timed length nearest the prompts' typical {main}")
    return out


# ----------------------------------------------------------------------------- c where its step is not timed
def step_params(model: Any) -> int:
    """Parameters one decode step reads: every weight but the input embedding table (a
    lookup reads one row of it) — unless it is tied to the LM head, which reads it all."""
    # a layer held quantized counts the weights it stands for
    from specprobe.precision.qlinear import logical_params

    total = logical_params(model)
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (out is None or emb.weight is not out.weight):
        total -= int(emb.weight.numel())
    return total


def draft_estimate(target_model: Any, drafter: Any, step: Any) -> dict[str, Any] | None:
    """The drafter/target cost ratio estimated from the weights each step reads (a decode
    step at small batch is bound by reading its weights): a layer-skip self-draft's first
    layers and the LM head, an independent drafter's weights, a head's own parameters
    (and the LM head it shares), each ÷ the target's. None where neither can be counted."""
    try:
        theirs = step_params(target_model)
        if step is not None:
            mine = step_params(step)
            shared = _shared_layers(target_model, step)
            if shared:
                from specprobe.models.anatomy import decoder_layers

                how = f"the weights its step reads: the target's first {shared} of {len(decoder_layers(target_model)[0])} layers and its LM head"
            else:
                how = f"the weights each step reads: {mine / 1e6:.1f} M drafter ÷ {theirs / 1e6:.1f} M target parameters (input embeddings aside)"
        else:
            own = getattr(drafter, "params", None)
            if own is None:
                return None
            head = target_model.get_output_embeddings()
            lm = int(head.weight.numel()) if head is not None else 0
            mine = int(own()) + lm
            how = f"the weights a head step reads: its {int(own()) / 1e6:.1f} M parameters and the target's LM head, ÷ the target's {theirs / 1e6:.1f} M"
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    if theirs <= 0 or mine <= 0:
        return None
    return {"cost_ratio": mine / theirs, "how": how}


# ----------------------------------------------------------------------------- a tree's passes
TREE_MASK = (
    "tree-shaped 4D attention mask (each tree token attends to the context, its ancestors and itself; positions by depth), "
    "passed to the model as the simulate loop passes its masks; the drafter's T beams of one step attend to the context and themselves"
)


def _branch(widths: Sequence[int]) -> int:
    """The branching of the timed tree: the widest topk asked for (a dense attention pass
    costs the same whatever the tree's shape; only its token count matters)."""
    return max((int(w) for w in widths), default=2) if widths else 2


def tree_parents(tokens: int, branch: int) -> list[int]:
    """Each tree token's parent (−1: the root), heap order: token i's parent is
    (i − 1) // branch — the first N tokens of a full `branch`-ary tree, the shape of
    SGLang's verified tree at topk = branch (the root, then its best children)."""
    return [-1] + [(i - 1) // max(1, branch) for i in range(1, tokens)]


def tree_attention(parents: Sequence[int]) -> tuple[Any, Any]:
    """-> (allowed [N, N] bool: token i sees token j when j is i or an ancestor of i,
    depth [N] long). A parent of −1 makes a root (several roots: siblings of one step)."""
    import torch

    n = len(parents)
    allowed = torch.zeros((n, n), dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            allowed[i] = allowed[p]
            depth[i] = depth[p] + 1
        allowed[i, i] = True
    return allowed, depth


def _work(name: str) -> float:
    """A timed call's new tokens per row (its size, for the estimate of one not run yet)."""
    for prefix, extra in (("verify", 1.0), ("tree", 0.0), ("draftw", 0.0)):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return float(name[len(prefix) :]) + extra
    return 1.0


def _tree_notes(batches: Sequence[dict[str, Any]], tokens: Sequence[int], widths: Sequence[int]) -> list[str]:
    """What the tree timing measured at each batch size, and what the cap left out."""
    notes = []
    for x in batches:
        if not x.get("repeats"):
            continue
        got_n = [v["tokens"] for v in x.get("tree_verify") or [] if v.get("ratios")]
        got_w = [v["width"] for v in x.get("draft_width") or [] if v.get("ratios")]
        miss_n = [n for n in tokens if n not in got_n]
        miss_w = [w for w in widths if w not in got_w]
        line = f"batch size {x['batch_size']}: tree verify timed at N = {', '.join(map(str, got_n)) or 'none'} tokens"
        if widths:
            line += f", the drafter over T = {', '.join(map(str, got_w)) or 'none'} beams"
        if miss_n or miss_w:
            line += "; not timed (the cap, or no step to time): " + ", ".join([*(f"N = {n}" for n in miss_n), *(f"T = {w}" for w in miss_w)]) + " — interpolated from the timed ones (the chain's verify factors where none)"
        notes.append(line)
    return notes


def _is_oom(e: Exception) -> bool:
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _calls(
    ctx: _Caches, target: Any, drafter: Any, batch: int, length: int, k_max: int, need_draft: bool, need_verify: bool, gen: Any,
    tree_tokens: Sequence[int] = (), tree_widths: Sequence[int] = (), branch: int = 2,
) -> dict[str, Callable[[], object]]:
    """The timed functions at one batch size, over copies of the prefilled caches, in the
    order they run: the decode step, the drafter's step and its T-beam passes, the verify
    passes, the tree passes (smallest first, so the cap cuts the largest)."""
    room = max(k_max + 1 if need_verify else 1, max(tree_tokens, default=1))  # the longest timed pass's new tokens
    t = _Decoder.over(ctx.target_copy(batch, length, room), target.model, batch, length, target.device, gen)
    calls: dict[str, Callable[[], object]] = {"target": t.call(1)}
    if need_draft:
        if ctx.draft is not None:
            d = _Decoder.over(ctx.draft_copy(batch, length, max((1, *tree_widths)), t.stream.cache), ctx.draft.model, batch, length, target.device, gen)
            calls["draft"] = d.call(1)
            for w in tree_widths:
                calls[f"draftw{w}"] = d.tree_call([-1] * w)
        else:
            head = _head_step(target, drafter, batch, gen)
            if head is not None:
                calls["draft"] = head
                for w in tree_widths:  # a head's T beams: T rows of its step
                    wide = _head_step(target, drafter, batch * w, gen)
                    if wide is not None:
                        calls[f"draftw{w}"] = wide
    if need_verify:
        for k in timed_ks(k_max):
            calls[f"verify{k}"] = t.call(k + 1)
    for n in tree_tokens:
        calls[f"tree{n}"] = t.tree_call(tree_parents(n, branch))
    return calls


def timed_ks(k_max: int) -> list[int]:
    """The K whose verify pass is timed: 1, 2, 4, … and k_max (the others are interpolated, `costs.fill_verify`)."""
    ks, k = [], 1
    while k < k_max:
        ks.append(k)
        k *= 2
    return [*ks, k_max]


# ----------------------------------------------------------------------------- the caches, built once
class _Prefilled:
    """One model's KV cache over one row, prefilled once: `tokens` real positions (all of
    the context when `tiled` is False)."""

    def __init__(self, model: Any, context: int, device: Any, gen: Any, clock: Clock, deadline: float) -> None:
        import torch

        self.model = model
        vocab = int(model.get_output_embeddings().weight.shape[0])
        stream = Stream(model, 1, device)
        first = min(context, PREFILL_TOKENS)
        ids = torch.randint(0, vocab, (1, first), generator=gen).to(device)  # [1, P]
        stream.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)
        self.tiled = _plain(stream.cache)
        if not self.tiled:  # a real prefill to the context, chunk by chunk, while the next chunk fits
            last = stream.seconds
            while stream.length < context and clock() + last <= deadline:
                n = min(PREFILL_TOKENS, context - stream.length)
                ids = torch.randint(0, vocab, (1, n), generator=gen).to(device)  # [1, n]
                before = stream.seconds
                stream.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)
                last = stream.seconds - before
        self.cache, self.tokens, self.calls = stream.cache, stream.length, stream.calls
        self.context = context if self.tiled else self.tokens

    def copy(self, batch: int, length: int, room: int, layers: int | None = None) -> Any:
        """A cache of `batch` rows over `length` positions (its first `layers` layers),
        with `room` slots for the timed passes' new tokens."""
        if not self.tiled:
            c = copy.deepcopy(self.cache)
            if length < self.tokens:
                crop(c, self.tokens - length)
            c.batch_repeat_interleave(batch)
            return c
        from transformers import DynamicCache

        c = DynamicCache()
        n = len(self.cache.layers) if layers is None else layers
        c.layers = [_InPlaceLayer(layer.keys, layer.values, batch, length, room) for layer in self.cache.layers[:n]]
        return c


def _repeated(x: Any, batch: int, length: int, room: int) -> Any:
    """[1, H, P, D] prefilled -> [batch, H, length + room, D] whose first `length` slots
    are the P positions over and over, written in place."""
    import torch

    out = torch.empty((batch, x.shape[1], length + room, *x.shape[3:]), dtype=x.dtype, device=x.device)
    p = int(x.shape[2])
    for s0 in range(0, length, p):
        n = min(p, length - s0)
        out[:, :, s0 : s0 + n] = x[:, :, :n]
    return out


def _live_part(buf: str) -> property:
    """An in-place layer's keys or values: the filled part of its buffer `buf` (None
    before the buffer exists); set only to None (what DynamicLayer's own reset does)."""

    def get(self: Any) -> Any:
        return getattr(self, buf)[:, :, : self.n] if hasattr(self, buf) else None

    def put(self: Any, value: Any) -> None:
        if value is not None:
            raise NotImplementedError("the timed cache is written in place")

    return property(get, put)


def _in_place_layer() -> type:
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):  # type: ignore[misc]
        """A cache layer over a buffer allocated once with `room` free slots: a forward
        writes its new keys and values in place (as an engine's preallocated KV cache
        does) and a crop only moves the length back, so a timed pass allocates no copy of
        the cache and the memory held is the buffer's."""

        def __init__(self, keys: Any, values: Any, batch: int, length: int, room: int) -> None:
            super().__init__()
            self.kbuf, self.vbuf = _repeated(keys, batch, length, room), _repeated(values, batch, length, room)  # [B, H, L + room, D]
            self.n, self.is_initialized, self.device = length, True, keys.device

        keys = _live_part("kbuf")
        values = _live_part("vbuf")

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            t = int(key_states.shape[-2])
            if self.n + t > self.kbuf.shape[2]:
                raise ValueError(f"timed cache full: {self.n} + {t} slots > {self.kbuf.shape[2]}")
            self.kbuf[:, :, self.n : self.n + t] = key_states
            self.vbuf[:, :, self.n : self.n + t] = value_states
            self.n += t
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative count")
            self.n = max(0, self.n + tokens_to_remove)

    return InPlaceLayer


_LAYER: type | None = None


def _InPlaceLayer(keys: Any, values: Any, batch: int, length: int, room: int) -> Any:  # noqa: N802  (a class made on first use: transformers imports late)
    global _LAYER
    if _LAYER is None:
        _LAYER = _in_place_layer()
    return _LAYER(keys, values, batch, length, room)


def _plain(cache: Any) -> bool:
    """Every layer an append-only key/value buffer (a repeated copy of it is a cache of that length)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers before 5: prefill for real
        return False
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(x) is DynamicLayer and getattr(x, "keys", None) is not None for x in layers)


class _Caches:
    """The target's prefilled cache and the drafter's (None for a head drafter): a
    layer-skip view shares the target's first layers, so it is not prefilled."""

    def __init__(self, target_model: Any, step: Any, context: int, device: Any, gen: Any, clock: Clock, deadline: float) -> None:
        self.target = _Prefilled(target_model, context, device, gen, clock, deadline)
        self.context = self.target.context
        self.shared = _shared_layers(target_model, step) if step is not None and self.target.tiled else 0
        own = None if step is None or self.shared else _Prefilled(step, self.context, device, gen, clock, deadline)
        if own is not None and not own.tiled and own.tokens < self.context:
            self.context = own.tokens
        self.draft: _Prefilled | _SharedDraft | None = _SharedDraft(step) if self.shared else own

    @property
    def prefilled(self) -> int:
        return self.target.tokens

    def method(self) -> str:
        how = "repeated from one prefill of" if self.target.tiled else "from one chunked prefill of"
        draft = ""
        if self.shared:
            draft = f"; the layer-skip drafter reads the target's first {self.shared} cache layers"
        elif isinstance(self.draft, _Prefilled):
            draft = f"; the drafter's cache likewise from its own prefill of {self.draft.tokens} tokens"
        return (f"KV cache of {self.context} tokens per row {how} {self.target.tokens} tokens at batch 1, copied to each batch size{draft}; "
                f"warm-up, then interleaved repeats of the decode step, the drafter's step and the verify passes (median of per-repeat ratios)")

    def bytes_per_token(self) -> float:
        """Cache bytes one row adds per position, the drafter's own included."""
        total = _cache_bytes(self.target.cache) / max(1, self.target.tokens)
        if isinstance(self.draft, _Prefilled):
            total += _cache_bytes(self.draft.cache) / max(1, self.draft.tokens)
        return total

    def target_copy(self, batch: int, length: int, room: int) -> Any:
        return self.target.copy(batch, length, room)

    def draft_copy(self, batch: int, length: int, room: int, target_cache: Any) -> Any:
        if isinstance(self.draft, _SharedDraft):
            from transformers import DynamicCache

            c = DynamicCache()
            c.layers = list(target_cache.layers[: self.shared])  # the same layer objects: every call crops back
            return c
        assert self.draft is not None
        return self.draft.copy(batch, length, room)


class _SharedDraft:
    def __init__(self, model: Any) -> None:
        self.model = model


def _shared_layers(target_model: Any, step: Any) -> int:
    """How many of the step model's decoder layers are the target's own (a layer-skip view), else 0."""
    from specprobe.models.anatomy import decoder_layers

    try:
        mine, _ = decoder_layers(step)
        theirs, _ = decoder_layers(target_model)
    except Exception:  # noqa: BLE001  (an architecture the anatomy does not know: its own cache)
        return 0
    if len(mine) >= len(theirs) or any(a is not b for a, b in zip(mine, theirs, strict=False)):
        return 0
    return len(mine)


def _cache_bytes(cache: Any) -> int:
    layers = getattr(cache, "layers", None)
    if layers is None:
        return 0
    return sum(int(t.numel()) * int(t.element_size()) for x in layers for t in (getattr(x, "keys", None), getattr(x, "values", None)) if t is not None)


class _Decoder:
    """One model's KV cache over `batch` rows of `context` tokens; `call(n)` is a function
    that runs one forward pass over n new tokens per row (logits for those n only, as the
    simulate loop asks for them) and crops the cache back, so every call sees the same
    context. Uses the simulate loop's own stream, so the timed pass is the one `simulate`
    runs. `_Decoder(model, …)` prefills its own cache (once); `_Decoder.over(cache, …)`
    runs over a copy made from the one prefill."""

    def __init__(self, model: Any, batch: int, context: int, device: Any, gen: Any, cache: Any = None) -> None:
        import torch

        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.stream = Stream(model, batch, device)
        self.context, self.batch, self.gen, self.device = context, batch, gen, device
        if cache is None:
            ids = torch.randint(0, self.vocab, (batch, context), generator=gen).to(device)  # [B, L]
            self.stream.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)
        else:
            self.stream.cache = cache
            self.stream.valid = torch.ones((batch, context), dtype=torch.bool, device=device)  # [B, L]

    @classmethod
    def over(cls, cache: Any, model: Any, batch: int, context: int, device: Any, gen: Any) -> _Decoder:
        return cls(model, batch, context, device, gen, cache=cache)

    def call(self, n: int) -> Callable[[], object]:
        import torch

        ids = torch.randint(0, self.vocab, (self.batch, n), generator=self.gen).to(self.device)  # [B, n]
        valid = torch.ones_like(ids, dtype=torch.bool)
        s = self.stream

        def run() -> object:
            s.forward(ids, valid, keep=n)  # synchronises a GPU before returning
            crop(s.cache, n)
            s.valid = s.valid[:, : self.context]
            return None

        return run

    def tree_logits(self, ids: Any, parents: Sequence[int]) -> Any:
        """One pass over a tree's tokens ids [B, N] after the context, each attending to
        the context, its ancestors and itself (`tree_attention`) at position context +
        depth -> logits [B, N, V]; the cache keeps the N slots (the caller crops)."""
        import torch

        from specprobe.models.anatomy import output_cache

        s = self.stream
        b, n = int(ids.shape[0]), len(parents)
        allowed, depth = tree_attention(parents)
        full = torch.cat([torch.ones((n, s.length), dtype=torch.bool), allowed], dim=1).to(self.device)  # [N, L + N]
        mask = torch.zeros((b, 1, n, s.length + n), dtype=s.dtype, device=self.device)
        mask.masked_fill_(~full[None, None], torch.finfo(s.dtype).min)
        pos = (s.length + depth).to(self.device)[None].expand(b, n)  # [B, N]
        extra = {"logits_to_keep": n} if s.can_keep else {}
        out = s.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{s.kw: s.cache}, **extra)
        s.cache = output_cache(out)
        return out.logits[:, -n:]

    def tree_call(self, parents: Sequence[int]) -> Callable[[], object]:
        """A function that runs `tree_logits` over random tokens and crops the cache back."""
        import torch

        n = len(parents)
        ids = torch.randint(0, self.vocab, (self.batch, n), generator=self.gen).to(self.device)  # [B, N]

        def run() -> object:
            self.tree_logits(ids, parents)
            sync(self.device)
            crop(self.stream.cache, n)
            return None

        return run


def _head_step(target: Any, drafter: Any, batch: int, gen: Any) -> Callable[[], object] | None:
    """A head drafter's step: its features and depth-1 logits for one new position over
    the target's hidden states (what an engine runs per drafted token); None when this
    drafter cannot run on a bare two-position pass."""
    import torch


    dev = target.device
    h = int(target.config.hidden_size)
    dtype = next(target.model.parameters()).dtype
    ids = torch.randint(0, int(target.vocab_size), (batch, 2), generator=gen).to(dev)  # [B, 2]
    hid = torch.randn((batch, 2, h), generator=gen).to(device=dev, dtype=dtype)  # [B, 2, H]
    tp = TargetPass(ids, torch.ones_like(ids), hid, {layer: hid for layer in drafter.target_layers_needed()})

    def run() -> object:
        feats = drafter.hidden(tp)
        drafter.logits(feats[1][:, -1], 1)  # [B, V]
        sync(dev)
        return None

    try:
        run()
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError, NotImplementedError):
        return None
    return run


TREE_TOKENS = (2, 4, 8, 16, 32, 64)  # the tree verify passes timed for a run with a tree (plus its own N)
TREE_WIDTHS = (1, 2, 4, 8)  # the drafter's beam widths timed (plus its own topk; w_1 = 1 is not timed)


def tree_grid(tree: Any) -> tuple[list[int], list[int]]:
    """The token counts and widths to time for a run's tree (None: a chain, nothing):
    `TREE_TOKENS` and `TREE_WIDTHS` with the tree's own N (`tokens`) and T (`topk`)
    added, so a recommendation over tree shapes reads measured or interpolated costs."""
    if tree is None:
        return [], []
    get = (lambda k: tree.get(k)) if isinstance(tree, dict) else (lambda k: getattr(tree, k, None))  # noqa: E731
    n, t = get("tokens"), get("topk")
    tokens = sorted({*TREE_TOKENS, *([int(n)] if n else [])})
    widths = sorted({*TREE_WIDTHS, *([int(t)] if t else [])})
    return tokens, widths


def timing_settings(
    cfg: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], scoring_s: float | None,
    tree_tokens: Sequence[int] | None = None, tree_widths: Sequence[int] | None = None,
) -> dict[str, Any]:
    """`cost_block`'s keyword arguments for a diagnose run: its verify factor, K range and
    batch sizes, the context its prompts reach, and a budget from its scoring time; for a
    run with a tree (`cfg.tree`, or the grid given here) the tree passes to time too."""
    budget, cap = budget_for(scoring_s)
    own_n, own_w = tree_grid(getattr(cfg, "tree", None))
    return {
        "tree_tokens": list(own_n if tree_tokens is None else tree_tokens),
        "tree_widths": list(own_w if tree_widths is None else tree_widths),
        "verify_factor": cfg.verify_factor,
        "k_max": cfg.k_max,
        "batch_sizes": cfg.cost_batch_sizes(),
        "context_tokens": context_length([len(e) for e in encoded], [len(c) for c in conts]),
        "length_contexts": length_contexts(getattr(cfg, "context_lengths", None) or [], [len(e) for e in encoded], [len(c) for c in conts]),
        "length_batch": getattr(cfg, "batch_size", None),
        "budget_s": budget,
        "cap_s": cap,
        "memory_bytes": "auto",
    }


def memory_use(device: Any) -> tuple[float, float] | None:
    """(peak so far, held now) in bytes: on a GPU its allocator's figures, on a CPU the
    process's peak and current resident set; None where neither is known."""
    if str(device).startswith("cuda"):
        import torch

        dev = torch.device(device)
        return float(torch.cuda.max_memory_allocated(dev)), float(torch.cuda.memory_allocated(dev))
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[1]) * resource.getpagesize()
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return float(peak), float(now)


class _Allowance:
    """Bytes the next batch size's caches may add: a fixed number, or (auto)
    `MEMORY_FACTOR` × the peak before the cost step (the references and the scoring) less
    what the process holds when that batch size starts (what earlier ones left included)."""

    def __init__(self, memory_bytes: float | str | None, device: Any) -> None:
        self.device, self.fixed, self.peak = device, None, None
        if memory_bytes == "auto":
            use = memory_use(device)
            self.peak = None if use is None else use[0]
        elif memory_bytes is not None:
            self.fixed = float(memory_bytes)

    def __call__(self) -> float | None:
        if self.fixed is not None or self.peak is None:
            return self.fixed
        use = memory_use(self.device)
        return None if use is None else max(0.0, MEMORY_FACTOR * self.peak - use[1])


def _release(device: Any) -> None:
    """Hand a batch size's caches back (to the GPU's pool, or the C heap back to the OS)."""
    import gc

    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def length_contexts(lengths: Sequence[int], prompt_lengths: Sequence[int], continuation_lengths: Sequence[int]) -> dict[int, int]:
    """--context-lengths: each length -> the context its decode steps see (`context_length`
    over the prompts built to it: each prompt goes to the nearest length)."""
    if not lengths:
        return {}
    groups: dict[int, tuple[list[int], list[int]]] = {int(n): ([], []) for n in lengths}
    for p, c in zip(prompt_lengths, continuation_lengths, strict=False):
        n = min(groups, key=lambda m: abs(m - p))
        groups[n][0].append(p)
        groups[n][1].append(c)
    return {n: context_length(ps, cs) if any(cs) else n for n, (ps, cs) in groups.items()}


def context_length(prompt_lengths: Sequence[int], continuation_lengths: Sequence[int]) -> int:
    """The context a decode step sees on these prompts: the median of prompt length + half
    its continuation (the mean cache length over the generation); 64 when none."""
    import statistics

    xs = [p + c / 2 for p, c in zip(prompt_lengths, continuation_lengths, strict=False) if c]
    return max(1, int(round(statistics.median(xs)))) if xs else 64


