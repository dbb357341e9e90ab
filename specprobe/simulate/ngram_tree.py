"""The real loop with SGLang's NGRAM drafter (`drafters.sglang_ngram`): each round every
live row's slot builds its tree from the server's trie, and ONE target forward verifies
all of it under a tree attention mask (`models.tree_attention`), as SGLang's NGRAM worker
does.

Each round, for every live row of a batch:

    draft    round 1 is the prompt's pass (no tree: SGLang drafts only in decode
             batches); after it, the slot inserts what the last verify step left into
             the trie and builds the tree from the last max_match_window_size tokens:
             num_draft_tokens − 1 nodes below the root, padded with token 0 under the
             root, so every step verifies the same number of tokens, a match or not.
    verify   the target over [the tokens it has not seen, every tree node], position ids
             root + depth; greedy: from the root the first child (index order) that is
             the target's argmax, and on down; sampled: SGLang's target-only tree
             sampling (`simulate.tree.walk`: one coin per depth against the summed
             target probabilities of the children tried so far, the padding's token-0
             duplicates each adding p(0) as SGLang's kernel adds them).
    keep     the target's cache keeps the accepted path's slots; the rest of the tree
             becomes holes, squeezed out once they fill a quarter.
    count    vLLM's counters at K = num_draft_tokens − 1: a draft is a step whose tree
             has a real (not padding) node, drafted tokens the real nodes, accepted the
             path's length.

Greedy output is plain greedy decoding's token for token: every emitted token is the
target's argmax after the tokens before it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from specprobe.drafters.ngram import NgramDrafter, Slot
from specprobe.drafters.sglang_ngram import NgramTree
from specprobe.metrics.core import finite
from specprobe.metrics.sampling import Sampling
from specprobe.models import tree_attention as ta
from specprobe.models.kvcache import Stream
from specprobe.models.tree_draft import Tree, block
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.draft_source import Proposal
from specprobe.simulate.loop import Batch, _batches, _emit, emit
from specprobe.simulate.ngram_source import SlotRows
from specprobe.simulate.tree import walk

Advance = Callable[[int], Any]


class NgramTreeSource(SlotRows):
    """The rows' SGLang NGRAM slots over one batch (see module doc)."""

    max_depth = None

    per_row = ("prompts", "history", "slots", "started", "trees")

    def __init__(self, drafter: NgramDrafter, prompts: Sequence[Sequence[int]]) -> None:
        self.drafter = drafter
        self.width = drafter.max_draft()
        self.prompts = [list(p) for p in prompts]
        self.history = [list(p) for p in prompts]
        self.slots: list[Slot] = [drafter.slot() for _ in prompts]
        self.started = [False] * len(prompts)
        self.trees: list[NgramTree | None] = [None] * len(prompts)
        self.calls = 0
        self.seconds = 0.0

    def draft(self) -> tuple[Tree, np.ndarray]:
        """Each row's padded tree (none on the prompt's round) -> (the tree, verified [B, M])."""
        b, m = len(self.slots), self.width
        tok = np.zeros((b, m), dtype=np.int64)
        parent = np.full((b, m), -1, dtype=np.int64)
        depth = np.ones((b, m), dtype=np.int64)
        rank = np.zeros((b, m), dtype=np.int64)
        verified = np.zeros((b, m), dtype=bool)
        any_row = False
        for r in range(b):
            self.trees[r] = None
            if not self.started[r]:
                continue
            d = self.slots[r].propose(self.history[r], m)
            self.seconds += d.seconds
            any_row = True
            tree = d.tree
            assert tree is not None
            self.trees[r] = tree
            dep, seen = tree.depths(), [0] * len(tree.tokens)
            for i in range(1, len(tree.tokens)):  # node i of SGLang's tree is column i − 1
                p = tree.parents[i]
                tok[r, i - 1], parent[r, i - 1], depth[r, i - 1] = tree.tokens[i], p - 1, dep[i]
                rank[r, i - 1] = seen[p]
                seen[p] += 1
            verified[r] = True
        self.calls += int(any_row)
        score = np.where(verified, 0.0, -np.inf)
        return Tree(depth, rank, tok, parent, score), verified

    def accept(self, emitted: list[list[int]]) -> None:
        """Row r's emitted tokens (the path and the next token, cut at EOS/budget)."""
        for r, out in enumerate(emitted):
            self.history[r].extend(out)
            if not self.started[r]:
                self.started[r] = True
                self.slots[r].begin(self.prompts[r])



def speculate_ngram_tree(
    target_model: Any,
    drafter: NgramDrafter,
    prompts: Sequence[Sequence[int]],
    *,
    target_sampling: Sampling,
    max_new_tokens: int = 64,
    eos_ids: Iterable[int] = (),
    seed: int = 0,
    batch_size: int = 8,
    run: SimRun | None = None,
    advance: Advance | None = None,
) -> SimRun:
    """SGLang's NGRAM speculative decoding of every prompt -> SimRun (counters at K =
    num_draft_tokens − 1). The same batches, seeds and emission as `loop.speculate`."""
    device = next(target_model.parameters()).device
    eos = frozenset(int(e) for e in eos_ids)
    k = drafter.max_draft()
    run = run or SimRun(SimCounters(k))
    c = run.counters
    run.outputs = [[] for _ in prompts]
    c.open_units(len(prompts))
    with torch.inference_mode():
        for bi, idx in enumerate(_batches(prompts, batch_size)):
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + bi)
            t0 = time.perf_counter()
            src = NgramTreeSource(drafter, [prompts[i] for i in idx])
            batch = Batch(target=Stream(target_model, len(idx), device), source=src, rows=list(idx), todo=[list(prompts[i]) for i in idx], remaining=[max_new_tokens] * len(idx), gen=gen)  # type: ignore[arg-type]
            try:
                _decode(batch, src, k, target_sampling, eos, run)
            finally:
                c.wall_s += time.perf_counter() - t0
                c.target_calls += batch.target.calls
                c.target_s += batch.target.seconds
                c.draft_calls += src.calls
                c.draft_s += src.seconds
            c.prompts += len(idx)
            if advance:
                advance(len(idx))
    return run


def _decode(batch: Batch, src: NgramTreeSource, k: int, sampling: Sampling, eos: frozenset[int], run: SimRun) -> None:
    while batch.rows:
        tree, verified = src.draft()
        trees_before = list(src.trees)
        blk = block(batch.target, batch.todo, tree, verified)
        w = blk.ids.shape[1] - blk.unseen
        logits = finite(ta.forward(batch.target, blk.ids, blk.valid, blk.allowed, blk.pos, keep=w + 1))
        paths, nxt = walk(tree, blk, logits, sampling, max(k, 1), batch.gen)
        tgt = batch.target
        start = tgt.length - w
        keep = torch.zeros((len(paths), w), dtype=torch.bool, device=tgt.device)
        for r, pth in enumerate(paths):
            colof = {j: col for col, j in enumerate(blk.nodes[r])}
            pc = [colof[j] for j in pth]
            if pc:
                keep[r, torch.tensor(pc)] = True
        tgt.valid[:, start:] &= keep
        prop = Proposal.nothing(len(paths), max(k, 1), tgt.device)
        emitted = []
        for r, pth in enumerate(paths):
            toks = [int(tree.tok[r, j]) for j in pth]
            if toks:
                prop.tokens[r, : len(toks)] = torch.tensor(toks)
            emitted.append(_emit([*toks, int(nxt[r])], batch.remaining[r], eos)[0])
        # accepted: the path's tokens that are emitted (a path past EOS or the budget is cut)
        _count(run.counters, trees_before, [min(len(p), len(e)) for p, e in zip(paths, emitted, strict=True)], batch.rows)
        src.accept(emitted)
        n = torch.tensor([len(p) for p in paths], dtype=torch.long, device=tgt.device)
        emit(batch, run, prop, n, torch.tensor(nxt, dtype=torch.long, device=tgt.device), eos)
        ta.squeeze(batch.target)


def _count(c: SimCounters, trees: list[NgramTree | None], accepted: list[int], rows: list[int] | None = None) -> None:
    """vLLM's counters (module doc); depth d drafted: a tree with a real node at depth d.
    rows: each row's prompt, for the per-prompt counts."""
    c.verify_steps += len(accepted)
    if rows is not None and c.k:
        real = [t is not None and t.real > 0 for t in trees]
        drafted = np.asarray([t.real if t is not None and r else 0 for t, r in zip(trees, real, strict=True)])
        deep = np.asarray([max(t.depths()[1 : t.real + 1]) if t is not None and r else 0 for t, r in zip(trees, real, strict=True)])
        depth = np.arange(c.k)[None, :]
        got = np.asarray([n if r else 0 for n, r in zip(accepted, real, strict=True)])[:, None] > depth  # real drafts only, as below
        c.count_units(rows, np.asarray(accepted), drafted, deep[:, None] > depth, got)
    for tree, n in zip(trees, accepted, strict=True):
        c.accepted_tokens += n  # a padding node the target's token matched included
        if tree is None or not tree.real:
            continue
        for d in range(min(n, c.k)):
            c.accepted_at[d] += 1
        c.num_drafts += 1
        c.drafted_tokens += tree.real
        deepest = max(tree.depths()[1 : tree.real + 1])
        for d in range(min(deepest, c.k)):
            c.drafted_at[d] += 1
