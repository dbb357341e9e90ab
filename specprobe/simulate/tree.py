"""The real tree draft → verify loop (`--tree`): what SGLang's EAGLE/STANDALONE workers
and TensorRT-LLM's dynamic trees run, on the same prompts as the chain loop.

Each round, for every live row of a batch:

    draft     the drafter runs on the candidate paths themselves: EAGLE-2's selection
              from real drafter forwards, beams batched under a tree mask
              (`models.tree_draft.draft`, whose module doc says how each drafter kind
              drafts; diagnose runs the same rounds at every start of a reference).
    verify    ONE target forward over [the tokens it has not seen, the N − 1 nodes] with
              the tree mask, position ids root + depth; from the root: greedy target —
              the child that is the target's argmax; sampled — SGLang's target-only tree
              sampling (`tree_speculative_sampling_target_only`): one uniform coin u per
              accepted node, its children tried in index order (the parent's rank
              order, as SGLang links siblings), child c accepted when u ≤ P ÷ θ_acc
              (P the accumulated target probability of the children tried so far, θ_acc
              clamped at 1e-9) or p(c) ≥ θ_single; on no match the next token is drawn
              from the target's distribution with the tried children taken out
              (renormalised). At the thresholds (1, 1) every emitted token is an exact
              target sample; below (--accept-threshold-single/-acc) drafts the target
              would not sample are kept (lossy). A greedy target ignores the thresholds,
              as SGLang's greedy verify does.
    keep      the target's cache keeps the accepted path's slots (no re-feed: a slot's K/V
              under the tree mask is that of a plain forward of its path) and the rest of
              the tree becomes holes (`models.kvcache`: never attended to); the drafter's
              cache likewise keeps the fed slots of the accepted path, and the verified
              tokens it has not seen are fed next round; a head drops every tree entry and
              catches up from the target's states on the accepted path, as the chain
              does. Trailing holes are cropped each round, and once holes fill a quarter
              of a cache it is packed to its real slots (`tree_attention.squeeze`).
    count     the chain's counters (depth d accepted, depth d verified) plus the rank of
              the accepted child at each depth among its parent's candidates.

Rows are batched: every row has its own tree, its own mask rows and position ids. Near
the end of its budget a row's tree is cut to depth remaining − 1 (as the chain drafts at
most remaining − 1). topk = 1, tokens = S + 1 is the chain loop exactly: the same
forwards, masks, coins and samples."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import numpy as np
import torch

from specprobe.estimates.tree import TreeShape
from specprobe.metrics.core import finite
from specprobe.metrics.sampling import Sampling, probs
from specprobe.models import tree_attention as ta
from specprobe.models.kvcache import Stream
from specprobe.models.tree_draft import (
    Block,
    HeadTree,
    LMTree,
    Tree,
    TreeSource,
    block,
    draft,
    layout,
    open_tree_source,
    top,
)
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.draft_source import Proposal
from specprobe.simulate.loop import Batch, _batches, emit

# the round's drafting and verify block live in `models.tree_draft` (diagnose runs them too)
__all__ = ["Block", "HeadTree", "LMTree", "Tree", "TreeSource", "block", "draft", "layout", "open_tree_source", "speculate_tree", "ta", "top", "walk"]

Advance = Callable[[int], Any]


def walk(tree: Tree, blk: Block, logits: torch.Tensor, sampling: Sampling, steps: int, gen: torch.Generator,
         thresholds: tuple[float, float] = (1.0, 1.0)) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """Verification from the root -> (per row the accepted nodes, root to leaf; the next
    token). logits [B, 1+W, V]: column 0 at the root, column 1 + c at tree column c.
    thresholds: SGLang's (threshold_single, threshold_acc) for a sampled target."""
    single, per = float(thresholds[0]), max(float(thresholds[1]), 1e-9)
    b = logits.shape[0]
    children: list[dict[int, list[int]]] = []
    for r, ns in enumerate(blk.nodes):
        col = {j: c for c, j in enumerate(ns)}
        kids: dict[int, list[int]] = {-1: []}
        for c, j in enumerate(ns):
            kids.setdefault(col.get(int(tree.parent[r, j]), -1), []).append(c)
            kids.setdefault(c, [])
        children.append(kids)
    paths: list[list[int]] = [[] for _ in range(b)]
    if sampling.greedy:
        best = logits.argmax(dim=-1).tolist()  # [B, 1+W]
        nxt = []
        for r in range(b):
            cur = -1
            while True:
                want = best[r][cur + 1]
                hit = next((c for c in children[r][cur] if int(tree.tok[r, blk.nodes[r][c]]) == want), None)
                if hit is None:
                    break
                paths[r].append(blk.nodes[r][hit])
                cur = hit
            nxt.append(want)
        return paths, nxt
    p = probs(logits, sampling)  # [B, 1+W, V]
    # one coin per depth, in (0, 1]: the kernel draws one per node and reads the accepted
    # node's, so each depth's coin is a fresh one (the same law)
    u = (1.0 - torch.rand((b, steps), generator=gen, device=logits.device)).tolist()
    tok = [[int(tree.tok[r, j]) for j in ns] for r, ns in enumerate(blk.nodes)]
    rows_cur, tried = [], []
    for r in range(b):
        cur, depth, out = -1, 0, []
        while True:
            acc, hit = 0.0, None
            gone: list[int] = []
            for c in children[r][cur]:
                pc = float(p[r, cur + 1, tok[r][c]])
                acc += pc
                if u[r][min(depth, steps - 1)] <= acc / per or pc >= single:
                    hit = c
                    break
                gone.append(tok[r][c])
            if hit is None:
                tried.append(gone)
                break
            out.append(blk.nodes[r][hit])
            cur, depth = hit, depth + 1
        paths[r] = out
        rows_cur.append(cur + 1)
    rows = torch.arange(b, device=p.device)
    p_n = p[rows, torch.tensor(rows_cur, device=p.device)]  # [B, V] at the last accepted node
    resid = p_n.clone()
    for r, gone in enumerate(tried):
        if gone:
            resid[r, gone] = 0.0
    mass = resid.sum(dim=-1, keepdim=True)
    resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p_n)
    return paths, torch.multinomial(resid, 1, generator=gen).squeeze(1).tolist()



# ----------------------------------------------------------------------------- the loop
def speculate_tree(
    target_model: Any,
    draft_model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    shape: TreeShape,
    target_sampling: Sampling,
    max_new_tokens: int = 64,
    eos_ids: Iterable[int] = (),
    seed: int = 0,
    batch_size: int = 8,
    run: SimRun | None = None,
    advance: Advance | None = None,
    thresholds: tuple[float, float] = (1.0, 1.0),
) -> SimRun:
    """Tree speculative decoding of every prompt -> SimRun (counters at k = steps, with the
    per-rank counts). The same batches, seeds and emission as `loop.speculate`.
    thresholds: SGLang's (threshold_single, threshold_acc) of the sampled verification."""
    device = next(target_model.parameters()).device
    vocab = int(target_model.get_output_embeddings().weight.shape[0])
    eos = frozenset(int(e) for e in eos_ids)
    run = run or SimRun(SimCounters(shape.steps))
    c = run.counters
    c.tree = shape
    if c.by_rank.shape != (shape.steps, shape.topk):
        c.by_rank = np.zeros((shape.steps, shape.topk))
    run.outputs = [[] for _ in prompts]
    c.open_units(len(prompts))
    with torch.inference_mode():
        for bi, idx in enumerate(_batches(prompts, batch_size)):
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + bi)
            t0 = time.perf_counter()
            batch = Batch(
                target=Stream(target_model, len(idx), device),
                source=cast(Any, open_tree_source(draft_model, [prompts[i] for i in idx], device)),
                rows=list(idx),
                todo=[list(prompts[i]) for i in idx],
                remaining=[max_new_tokens] * len(idx),
                gen=gen,
            )
            try:
                _decode(batch, shape, target_sampling, vocab, eos, run, thresholds)
            finally:
                c.wall_s += time.perf_counter() - t0
                c.target_calls += batch.target.calls
                c.target_s += batch.target.seconds
                c.draft_calls += batch.source.calls
                c.draft_s += batch.source.seconds
            c.prompts += len(idx)
            if advance:
                advance(len(idx))
    return run


def _decode(batch: Batch, shape: TreeShape, sampling: Sampling, vocab: int, eos: frozenset[int], run: SimRun, thresholds: tuple[float, float] = (1.0, 1.0)) -> None:
    src = cast(TreeSource, batch.source)  # a tree source in the chain's batch (`emit` and `_retire` need only compact/select)
    while batch.rows:
        depth = shape.steps if src.max_depth is None else min(shape.steps, src.max_depth)
        cap = np.asarray([max(0, min(depth, r - 1)) for r in batch.remaining], dtype=np.int64)
        tree, verified = draft(src, shape, cap, vocab)
        blk = block(batch.target, batch.todo, tree, verified)
        w = blk.ids.shape[1] - blk.unseen
        logits = finite(src.watch(blk.ids, blk.valid, partial(ta.forward, batch.target, blk.ids, blk.valid, blk.allowed, blk.pos, keep=w + 1)))
        paths, nxt = walk(tree, blk, logits, sampling, shape.steps, batch.gen, thresholds)
        # the target keeps the accepted path: the other tree slots become holes
        tgt = batch.target
        start = tgt.length - w
        keep = torch.zeros((len(paths), w), dtype=torch.bool, device=tgt.device)
        cols: list[list[int]] = []
        uvalid = blk.valid[:, : blk.unseen].tolist()
        for r, pth in enumerate(paths):
            colof = {j: c for c, j in enumerate(blk.nodes[r])}
            pc = [colof[j] for j in pth]
            if pc:
                keep[r, torch.tensor(pc)] = True
            cols.append([u for u in range(blk.unseen) if uvalid[r][u]] + [blk.unseen + x for x in pc])
        tgt.valid[:, start:] &= keep
        src.accept(tree, paths, nxt, cols)
        _count(run.counters, tree, verified, paths, shape, cap, batch.rows)
        prop = Proposal.nothing(len(paths), shape.steps, tgt.device)
        for r, pth in enumerate(paths):
            if pth:
                prop.tokens[r, : len(pth)] = torch.tensor([int(tree.tok[r, j]) for j in pth])
        n = torch.tensor([len(p) for p in paths], dtype=torch.long, device=tgt.device)
        emit(batch, run, prop, n, torch.tensor(nxt, dtype=torch.long, device=tgt.device), eos)
        ta.squeeze(batch.target)  # the rejected nodes' holes out of the caches
        if isinstance(src, LMTree):
            ta.squeeze(src.stream)


def _count(c: SimCounters, tree: Tree, verified: np.ndarray, paths: list[list[int]], shape: TreeShape, cap: np.ndarray, rows: list[int] | None = None) -> None:
    """The chain's counters and the rank of each accepted node. A draft: a row's verify
    step with ≥ 1 node; drafted tokens: the nodes verified; depth d drafted: a draft whose
    tree could reach depth d (not cut by the budget), so r_d = accepted at d ÷ those is
    the probability that a round accepts depth d, which the estimate sums to τ (a depth
    the N − 1 best scores left out counts as not accepted), and topk = 1 counts as the
    chain does."""
    drafted = verified.sum(axis=1)
    c.verify_steps += len(paths)
    c.num_drafts += int((drafted > 0).sum())
    c.drafted_tokens += int(drafted.sum())
    c.accepted_tokens += sum(len(p) for p in paths)
    for d in range(shape.steps):
        c.drafted_at[d] += int(((drafted > 0) & (cap > d)).sum())
    for p in paths:
        for d, j in enumerate(p):
            c.accepted_at[d] += 1
            c.by_rank[d, int(tree.rank[j])] += 1
    if rows is not None:  # each row's prompt, for the standard errors
        reached = (drafted[:, None] > 0) & (cap[:, None] > np.arange(shape.steps)[None, :])
        c.count_units(rows, np.asarray([len(p) for p in paths]), drafted, reached)
