"""Real speculative decoding: the draft→verify loop that measures what `diagnose` estimates.

The drafter proposes up to K tokens autoregressively with its own KV cache; the target
scores them all in one forward pass with its own KV cache; tokens are accepted by
rejection sampling exactly as the engines do it (Leviathan et al. 2023; docs/maths.md):

    accept draft x ~ q with probability min(1, p(x)/q(x))
    on the first rejection, emit a token from norm(max(0, p − q)) and stop
    after all drafts are accepted, emit a bonus token from p

so the emitted tokens follow the target's distribution exactly, whatever the drafter.
p and q are each side's own sampling distribution (temperature, top-k, top-p, min-p;
one-hot argmax when greedy) from `metrics.sampling`, the transform `diagnose` uses.

Batching. Rows advance by their own accepted counts, so their caches fall out of step.
Instead of per-row caches, every row shares one cache whose slots may be *holes*: left
padding, rejected drafts, and steps a row sat out. A boolean `valid[B, L]` says which
slots are real; each forward pass gets a 4-D attention mask built from it and explicit
position ids (a row's position = its count of valid slots), so a row attends exactly to
its own accepted prefix, as if it ran alone. Rolling back past a rejection is flipping
slots to invalid; trailing slots that are holes in every row are cropped off.

Counting follows vLLM (`v1/spec_decode/metrics.py`): one *draft* is one verify step of
one row that proposed ≥ 1 token; the cumulative per-position rate at position i is
drafts whose first i tokens were all accepted ÷ drafts that proposed position i; the
conditional rate is that ÷ the previous; τ (mean acceptance length) includes the bonus
token. Like transformers' assisted generation, a row drafts at most
`remaining − 1` tokens near the end of its budget, so it never overshoots it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specprobe.metrics.core import align_vocab
from specprobe.metrics.sampling import Sampling, probs
from specprobe.options import SimulateConfig, parse_ks, validate  # noqa: F401  (re-exported)

Advance = Callable[[int], Any]


# ----------------------------------------------------------------------------- rejection sampling
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


# ----------------------------------------------------------------------------- batched KV cache with holes
def _sync(device: Any) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _crop(cache: Any, remove: int) -> None:
    """Drop the last `remove` slots of every layer (a negative crop works in 4.x and 5.x)."""
    if remove > 0:
        cache.crop(-remove)


class Stream:
    """One model's KV cache over a batch of rows whose slots may be holes (see module doc)."""

    def __init__(self, model: Any, batch: int, device: Any) -> None:
        from specprobe.models.loader import cache_kwarg

        self.model = model
        self.kw = cache_kwarg(model)
        import inspect

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
        from specprobe.models.loader import output_cache

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
        _sync(self.device)
        t0 = time.perf_counter()
        extra = {"logits_to_keep": keep} if keep and self.can_keep else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{self.kw: self.cache}, **extra)
        logits = out.logits[:, -keep:] if keep else out.logits
        _sync(self.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.cache = output_cache(out)
        self.valid = full
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
            _crop(self.cache, self.length - keep)
            self.valid = self.valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        if self.cache is not None:
            self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]


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


# ----------------------------------------------------------------------------- counters
@dataclass
class SimCounters:
    """Mergeable counts of one run (one K, or plain decoding when k = 0)."""

    k: int
    threshold: float | None = None
    verify_steps: int = 0  # row-level verify steps (incl. steps that drafted nothing)
    num_drafts: int = 0  # row-level verify steps that proposed ≥ 1 token
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0  # tokens appended to outputs (after EOS truncation)
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] drafts with positions 1..i accepted
    drafted_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] drafts that proposed position i
    target_calls: int = 0
    target_s: float = 0.0
    draft_calls: int = 0
    draft_s: float = 0.0
    wall_s: float = 0.0
    prompts: int = 0

    def __post_init__(self) -> None:
        if len(self.accepted_at) != self.k:
            self.accepted_at = np.zeros(self.k)
            self.drafted_at = np.zeros(self.k)

    def cumulative(self) -> list[float]:
        """vLLM's per-position rate r_i (depth from 1); nan where nothing was drafted."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return [float(a / d) if d > 0 else float("nan") for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    def conditional(self) -> list[float]:
        out, prev = [], 1.0
        for r in self.cumulative():
            out.append(float(r / prev) if prev > 0 and not math.isnan(prev) and not math.isnan(r) else float("nan"))
            prev = r
        return out

    @property
    def tau_tokens(self) -> float:
        """1 + Σ_i r_i: expected tokens per full-length verify step, bonus token included
        (equals vLLM's 1 + accepted/drafts when every draft is K long)."""
        if self.k == 0:
            return 1.0
        if self.num_drafts == 0:
            return float("nan")
        return 1.0 + float(np.nansum(self.cumulative()))

    @property
    def tokens_per_verify(self) -> float:
        """Emitted tokens ÷ row verify steps, end-of-budget steps included: what assisted
        generation's generated tokens ÷ target forward calls measures."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else float("nan")

    @property
    def accept_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.emitted_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def mean_k(self) -> float:
        return self.drafted_tokens / self.num_drafts if self.num_drafts else float("nan")


@dataclass
class SimRun:
    """Outputs (emitted token ids per prompt, in input order) and the counters."""

    counters: SimCounters
    outputs: list[list[int]] = field(default_factory=list)


# ----------------------------------------------------------------------------- the loop
def _batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    # similar lengths together: less left padding
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _draw(q: torch.Tensor, s: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    if s.greedy:
        return q.argmax(dim=-1)
    return torch.multinomial(q, 1, generator=generator).squeeze(1)


def _emit(tokens: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at the budget; -> (tokens, finished)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    tokens = tokens[:budget]
    return tokens, len(tokens) >= budget


def speculate(
    target_model: Any,
    draft_model: Any | None,
    prompts: Sequence[Sequence[int]],
    *,
    k: int,
    target_sampling: Sampling,
    draft_sampling: Sampling | None = None,
    max_new_tokens: int = 64,
    eos_ids: Iterable[int] = (),
    seed: int = 0,
    batch_size: int = 8,
    threshold: float | None = None,
    run: SimRun | None = None,
    advance: Advance | None = None,
) -> SimRun:
    """Speculative decoding of every prompt (token id lists) -> SimRun.

    k = 0 (or no drafter) is plain autoregressive decoding with the same machinery: the
    baseline. `threshold` stops a row's drafting at the first depth whose drafter
    confidence max q is below it (adaptive K; max q is 1 for a greedy drafter, as in the
    estimate). `run` is filled as it goes, so a caller that catches KeyboardInterrupt
    keeps what was measured."""
    if draft_model is None:
        k = 0
    draft_sampling = draft_sampling or target_sampling
    eos = frozenset(int(e) for e in eos_ids)
    run = run or SimRun(SimCounters(k, threshold))
    run.outputs = [[] for _ in prompts]
    c = run.counters
    device = next(target_model.parameters()).device
    with torch.inference_mode():
        for bi, idx in enumerate(_batches(prompts, batch_size)):
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + bi)
            t0 = time.perf_counter()
            try:
                _speculate_batch(target_model, draft_model, [prompts[i] for i in idx], idx, run, k, target_sampling, draft_sampling, max_new_tokens, eos, gen, threshold, device)
            finally:
                c.wall_s += time.perf_counter() - t0
            c.prompts += len(idx)
            if advance:
                advance(len(idx))
    return run


def _speculate_batch(
    target_model: Any,
    draft_model: Any | None,
    prompts: list[Sequence[int]],
    index: list[int],
    run: SimRun,
    k: int,
    tsamp: Sampling,
    dsamp: Sampling,
    max_new: int,
    eos: frozenset[int],
    gen: torch.Generator,
    threshold: float | None,
    device: Any,
) -> None:
    c = run.counters
    b = len(prompts)
    tgt = Stream(target_model, b, device)
    dft = Stream(draft_model, b, device) if k > 0 else None
    rows = list(index)  # live rows -> prompt index
    t_todo: list[list[int]] = [list(p) for p in prompts]  # tokens not yet in the target's cache
    d_todo: list[list[int]] = [list(p) for p in prompts]  # … not yet in the drafter's cache
    remaining = [max_new] * b
    ar = torch.arange(max(k, 1), device=device)
    vocab = int(target_model.get_output_embeddings().weight.shape[0])
    try:
        while rows:
            nb = len(rows)
            kb = torch.tensor([max(0, min(k, r - 1)) for r in remaining], device=device)  # [B] draft length cap
            drafts = torch.zeros((nb, max(k, 1)), dtype=torch.long, device=device)  # [B, K]
            drafted = torch.zeros(nb, dtype=torch.long, device=device)  # [B]
            fed = torch.zeros(nb, dtype=torch.long, device=device)  # drafts written to the drafter cache
            qs: list[torch.Tensor] = []
            ran_drafter = False
            d_cut0 = 0
            # ---- draft: up to K autoregressive drafter steps, the first one also catching
            # the drafter up on last round's tokens (1–2 per row; the prompt in round 1)
            if dft is not None and bool((kb > 0).any()):
                ran_drafter = True
                ids, valid = right_align(d_todo, device)
                d_cut0 = dft.length + ids.shape[1]  # slot of the first draft fed back
                live = kb > 0  # [B]
                for j in range(k):
                    logits = dft.forward(ids, valid, keep=1)[:, -1]  # [B, V']
                    q = probs(align_vocab(logits, vocab), dsamp)  # [B, V] over the target's ids
                    if threshold is not None:
                        live &= q.amax(dim=-1) >= threshold  # stop at the first unconfident depth
                    live &= j < kb
                    x = _draw(q, dsamp, gen)  # [B]
                    drafts[:, j] = x
                    qs.append(q)
                    drafted += live.long()
                    feed = live & (j + 1 < kb)  # rows that need depth j+2
                    if j + 1 >= k or not bool(feed.any()):
                        break
                    ids, valid = x[:, None], feed[:, None]
                    fed += feed.long()
                for _ in range(len(qs), k):  # rows never reach these; keep shapes [B, K, V]
                    qs.append(qs[-1])
            # ---- verify: the target scores [todo, d_1..d_n] in one pass
            dl = drafted.tolist()
            blocks = [t_todo[r] + drafts[r, : dl[r]].tolist() for r in range(nb)]
            ids, valid = right_align(blocks, device)
            width = ids.shape[1]
            last = min(k + 1, width)
            logits = tgt.forward(ids, valid, keep=last)  # [B, K+1, V]: the last K+1 columns
            # p_0 (after the last todo token) … p_n (bonus) sit in the last n+1 columns
            col = (last - 1 - drafted[:, None] + torch.arange(k + 1, device=device)[None, :]).clamp_(max=last - 1)  # [B, K+1]
            tl = logits.gather(1, col[..., None].expand(-1, -1, logits.shape[-1]))  # [B, K+1, V]
            if k == 0:
                n = torch.zeros(nb, dtype=torch.long, device=device)
                nxt = _draw(probs(tl[:, 0], tsamp), tsamp, gen)
            elif tsamp.greedy:
                n, nxt = verify_greedy(drafts, drafted, tl)
            else:
                q_all = torch.stack(qs, dim=1) if qs else tl.new_zeros((nb, k, tl.shape[-1]), dtype=torch.float32)  # [B, K, V]
                n, nxt = verify_sampled(drafts, drafted, q_all, probs(tl, tsamp), gen)
            # ---- roll back: rejected drafts become holes in both caches
            tgt.invalidate_from(tgt.length - (drafted - n))
            if ran_drafter and dft is not None:
                dft.invalidate_from(d_cut0 + n)
            # ---- count (vLLM conventions) and emit
            nl, xl, fl = n.tolist(), nxt.tolist(), fed.tolist()
            c.verify_steps += nb
            c.num_drafts += int((drafted > 0).sum())
            c.drafted_tokens += int(drafted.sum())
            c.accepted_tokens += int(n.sum())
            if k > 0:
                c.accepted_at += (n[:, None] > ar[None, :k]).sum(0).cpu().numpy()
                c.drafted_at += (drafted[:, None] > ar[None, :k]).sum(0).cpu().numpy()
            keep: list[int] = []
            for r in range(nb):
                new = drafts[r, : nl[r]].tolist() + [xl[r]]
                out, done = _emit(new, remaining[r], eos)
                run.outputs[rows[r]].extend(out)
                c.emitted_tokens += len(out)
                remaining[r] -= len(out)
                t_todo[r] = [xl[r]]
                if ran_drafter:
                    # the drafter saw d_1..d_fed; a last accepted draft it never saw comes first
                    d_todo[r] = ([int(drafts[r, nl[r] - 1])] if nl[r] > fl[r] else []) + [xl[r]]
                else:
                    d_todo[r] = d_todo[r] + new
                if not done:
                    keep.append(r)
            if len(keep) < nb:
                sel = torch.tensor(keep, dtype=torch.long, device=device)
                tgt.select(sel)
                if dft is not None:
                    dft.select(sel)
                rows = [rows[r] for r in keep]
                t_todo = [t_todo[r] for r in keep]
                d_todo = [d_todo[r] for r in keep]
                remaining = [remaining[r] for r in keep]
            tgt.compact()
            if dft is not None:
                dft.compact()
    finally:
        c.target_calls += tgt.calls
        c.target_s += tgt.seconds
        if dft is not None:
            c.draft_calls += dft.calls
            c.draft_s += dft.seconds


# ----------------------------------------------------------------------------- the pipeline
def eos_ids(target: Any) -> set[int]:
    """EOS ids from the target's tokenizer and generation config."""
    ids: set[int] = set()
    for src in (getattr(target.info.generation_config, "eos_token_id", None), target.tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return ids


def _measured_row(c: SimCounters, baseline_tps: float, estimate: dict[int, float]) -> dict[str, Any]:
    est = estimate.get(c.k, float("nan"))
    tau = c.tau_tokens
    return {
        "k": c.k,
        "tau_tokens": tau,
        "tokens_per_verify": c.tokens_per_verify,
        "accept_rate": c.accept_rate,
        "speedup": c.tokens_per_s / baseline_tps if baseline_tps and baseline_tps > 0 else float("nan"),
        "tokens_per_s": c.tokens_per_s,
        "num_drafts": c.num_drafts,
        "draft_ms_per_step": 1e3 * c.draft_s / c.draft_calls if c.draft_calls else float("nan"),
        "target_ms_per_step": 1e3 * c.target_s / c.target_calls if c.target_calls else float("nan"),
        "tau_estimate": est,
        "tau_gap": est - tau,
        "emitted_tokens": c.emitted_tokens,
        "wall_s": c.wall_s,
        "prompts": c.prompts,
    }


def measured_section(runs: list[SimCounters], baseline: SimCounters | None, adaptive: SimCounters | None, estimate: dict[int, float]) -> dict[str, Any]:
    """The result's "measured" block (depth indexed from 1; τ includes the bonus token)."""
    base_tps = baseline.tokens_per_s if baseline is not None else float("nan")
    k_rows = [_measured_row(c, base_tps, estimate) for c in runs if c.num_drafts]
    deepest = max((c for c in runs if c.num_drafts), key=lambda c: c.k, default=None)
    depth = None
    if deepest is not None:
        depth = {
            "k": deepest.k,
            "depth": list(range(1, deepest.k + 1)),
            "cumulative": deepest.cumulative(),
            "conditional": deepest.conditional(),
            "accepted_per_position": [int(x) for x in deepest.accepted_at],
            "drafted_per_position": [int(x) for x in deepest.drafted_at],
            "num_drafts": deepest.num_drafts,
            "source": "measured",
        }
    adapt = None
    if adaptive is not None and adaptive.verify_steps:
        adapt = {
            "threshold": adaptive.threshold,
            "k_max": adaptive.k,
            "tokens_per_verify": adaptive.tokens_per_verify,
            "mean_k": adaptive.mean_k,
            "accept_rate": adaptive.accept_rate,
            "tokens_per_s": adaptive.tokens_per_s,
            "speedup": adaptive.tokens_per_s / base_tps if base_tps and base_tps > 0 else float("nan"),
            "num_drafts": adaptive.num_drafts,
        }
    return {
        "k_table": k_rows,
        "depth": depth,
        "baseline_tokens_per_s": base_tps,
        "baseline_wall_s": baseline.wall_s if baseline is not None else None,
        "baseline_target_ms_per_step": 1e3 * baseline.target_s / baseline.target_calls if baseline is not None and baseline.target_calls else None,
        "adaptive": adapt,
        "note": "measured by real speculative decoding (draft→verify with rejection sampling) over the same prompts; τ includes the bonus token",
    }


def measured_metrics(section: dict[str, Any]) -> dict[str, Any]:
    """Catalogue metrics (source=simulate) from the measured block. Calibration compares
    estimate and measurement at the deepest K measured, where they drift apart first."""
    rows = section["k_table"]
    if not rows:
        return {}
    cal = max(rows, key=lambda r: r["k"])
    best = max(rows, key=lambda r: (r["speedup"] if r["speedup"] == r["speedup"] else -1.0, -r["k"]))
    tau_m, tau_e = cal["tau_tokens"], cal["tau_estimate"]
    gap = (tau_e - tau_m) / tau_m if tau_m and tau_m == tau_m and tau_e == tau_e else float("nan")
    adapt = section.get("adaptive") or {}
    return {
        "calibration_k": cal["k"],
        "tau_measured_tokens": tau_m,
        "tau_estimated_tokens": tau_e,
        "tau_gap_rel": gap,
        "tau_gap_rel_abs": abs(gap) if gap == gap else float("nan"),
        "accept_rate_measured": cal["accept_rate"],
        "num_drafts_measured": cal["num_drafts"],
        "speedup_measured": best["speedup"],
        "best_k_measured": best["k"],
        "tokens_per_s_measured": best["tokens_per_s"],
        "speedup_adaptive_measured": adapt.get("speedup", float("nan")),
    }


def run_simulate(cfg: SimulateConfig, progress: Any = None, table: Any = None, pair: Any = None) -> dict[str, Any]:
    """Estimate (diagnose, teacher-forced) + measurement (this loop) on the same prompts ->
    a result dict with "command": "simulate" and a "measured" block. Ctrl-C during the
    measurement keeps what was measured so far (result["interrupted"] = True)."""
    import dataclasses

    from specprobe.diagnose import (
        _clean,
        _verdict_block,
        encode_prompt,
        evaluate_rules,
        load_pair,
        load_prompt_set,
        run_diagnose,
    )
    from specprobe.progress import Progress
    from specprobe.rules import load_table

    progress = progress or Progress()
    validate(cfg)
    dcfg = dataclasses.replace(cfg.diagnose, k_max=max(cfg.diagnose.k_max, max(cfg.ks)))
    from pathlib import Path

    table = table or load_table([Path(p) for p in dcfg.rules])
    pair = pair or load_pair(dcfg, progress)
    result = run_diagnose(dcfg, progress, table=table, pair=pair)
    result["command"] = "simulate"
    result["config"] = {**result["config"], "k": list(cfg.ks), "adaptive_threshold": cfg.adaptive_threshold}
    result["measured"] = None
    if result.get("stopped") or result.get("interrupted"):
        return result  # nothing meaningful (or nothing asked for, after Ctrl-C) to measure

    target, drafter = pair.target, pair.drafter
    step = drafter.step_model()
    if step is None:
        from specprobe.errors import ConfigError

        raise ConfigError(f"drafter {cfg.diagnose.drafter} has no autoregressive step model to run a real draft loop with", "simulate supports self, self:layers=N and independent causal LMs")
    prompts = list(load_prompt_set(dcfg).prompts)
    encoded = [encode_prompt(target.tokenizer, p) for p in prompts]
    eos = eos_ids(target)
    estimate = {int(r["k"]): float(r["tau_tokens"]) for r in result.get("k_table") or [] if r.get("tau_tokens") is not None}
    kw = {"target_sampling": pair.sampling.target, "draft_sampling": pair.sampling.draft, "max_new_tokens": dcfg.max_new_tokens, "eos_ids": eos, "seed": dcfg.seed, "batch_size": dcfg.batch_size}
    runs: list[SimCounters] = []
    baseline: SimCounters | None = None
    adaptive: SimCounters | None = None
    interrupted = False
    n = len(encoded)
    try:
        if cfg.baseline:
            run = SimRun(SimCounters(0))
            baseline = run.counters
            with progress.task(f"plain target decoding (baseline, {n} prompts)", n) as advance:
                speculate(target.model, None, encoded, k=0, run=run, advance=advance, **kw)
        for k in cfg.ks:
            run = SimRun(SimCounters(k))
            runs.append(run.counters)
            with progress.task(f"speculative decoding K={k} ({n} prompts)", n) as advance:
                speculate(target.model, step, encoded, k=k, run=run, advance=advance, **kw)
        if cfg.adaptive_threshold is not None:
            run = SimRun(SimCounters(max(cfg.ks), cfg.adaptive_threshold))
            adaptive = run.counters
            with progress.task(f"adaptive K≤{max(cfg.ks)}, confidence ≥ {cfg.adaptive_threshold:g} ({n} prompts)", n) as advance:
                speculate(target.model, step, encoded, k=max(cfg.ks), threshold=cfg.adaptive_threshold, run=run, advance=advance, **kw)
    except KeyboardInterrupt:
        interrupted = True
    section = measured_section(runs, baseline, adaptive, estimate)
    section["interrupted"] = interrupted
    result["measured"] = section
    result["interrupted"] = interrupted
    metrics = dict(result.get("metrics") or {})
    metrics.update(measured_metrics(section))
    result["metrics"] = metrics
    findings, evals = evaluate_rules(table, metrics, drafter.kind, (result.get("alignment") or {}).get("evidence"), families=("0", "1", "2", "3", "6"))
    result.update(_verdict_block(findings, evals))
    return _clean(result)
