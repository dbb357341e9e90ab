"""The run's own tree with the drafter on every candidate path: at each start position of
each reference, one real tree round — the drafter drafts the tree the engine would build
from that context (`models.tree_draft.draft`, the loop's own drafting) and one target
pass under the tree mask gives every node's target distribution — then the probability
that each node is on the accepted path, and renewal over rounds as for chains.

Teacher-forced as the chain is: the round starting at t sees the prompt and the
reference's first t tokens (the root is the last of them). Unlike the grid's estimate
(`metrics.tree`), which gives every node at depth d the candidates of the reference's
depth-d context, here a node's children are the drafter's top candidates after that
node's own path, and a node's acceptance is the target's probability of its token after
its own path:

    greedy target    P(node on the accepted path) = Π over its path of 1[token = the
                     target's argmax after the path above it];
    sampled target   Π p(token | path above it) — SGLang's target-only tree sampling (and
                     TensorRT-LLM's sample-and-compare) accepts child c with probability
                     p(c), whichever siblings came first; with SGLang's thresholds below 1
                     a child's factor depends on its elder siblings' p, every one of which
                     is in the target pass (`estimates.tree.sibling_accept`).

A round at t drafts at most n − 1 − t deep (the chain's rule), so the tail of a reference
drafts shallower trees, as the loop's budget cuts them.

Forwards. References of similar length share their forwards (a group: GROUP_TOKENS of
padded prefill at most): one target prefill over the group's references — none in
diagnose, whose rounds start from each scoring batch's own target pass (its KV cache and
states: `from_pass`) — and one drafter prefill (a layer-skip self-draft's is the target's
first layers' cache, copied; a head catches up on the target's states), then per chunk of
`ROWS` start positions, from any of the group's references, S drafter forwards (the
depth-1 step over one token a row, then T beams a row per later step; a static tree: one
row per depth of its parents) and ONE target forward over each row's root and its N − 1
verified nodes. R rounds cost R·(1 + (S − 1)·T) drafter tokens and R·N target tokens in
about ⌈R / ROWS⌉·(S + 1) forwards (fewer, larger forwards run faster on a CPU): a tree
of N tokens costs about N target tokens per round drafted, against one per scored token
for the chain's estimate — hence diagnose's default stride (`probe.tree.paths_stride`).
Long references get fewer rows per chunk, so the copies of their caches stay within
COPY_BYTES. A greedy target needs no tree pass where the references are its own text: a
node along the reference is accepted when its token is the target's argmax there (read
off the prefill, or the scoring's logits), and a node below a rejected one never is; only
a chunk in which an accepted node leaves the reference (the target's argmax is not the
reference's token, as with a dataset's responses) gets the target pass.

Which drafters: causal LMs (independent, layer-skip self-drafts) read their own KV cache
and EAGLE-1/3 and MTP heads chain on their own outputs, as the loop runs them (Medusa's
heads read the root's state alone, so every depth-d node has head d's candidates). An
n-gram drafter drafts no tree."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specprobe.drafters.base import TargetPass
from specprobe.estimates.tree import EXACT, Nodes, TreeShape, relaxed, sibling_accept
from specprobe.metrics.core import finite
from specprobe.metrics.sampling import Sampling, probs
from specprobe.models import tree_attention as ta
from specprobe.models.heads.chain import HeadDrafter
from specprobe.models.heads.live import LiveHead, unsupported
from specprobe.models.kvcache import Stream, right_align
from specprobe.models.tree_draft import HeadTree, LMTree, Tree, block, draft

# Start positions per batch of tree rounds: each row holds a copy of the reference's caches,
# so a long reference gets fewer rows, within COPY_BYTES of copies for the batch.
ROWS = 64
COPY_BYTES = 1 << 29
# References of similar length prefill together and share their rounds' forwards: a group
# holds at most GROUP_TOKENS of padded prefill, and (a greedy target, whose verdicts along
# the reference are read off the prefill's logits) at most LOGIT_BYTES of those logits.
GROUP_TOKENS = 4096
LOGIT_BYTES = 1 << 28


@dataclass
class PathRef:
    """One reference to draft on: prompt + continuation, the prompt's length p, the
    continuation's n, and the start positions of its rounds."""

    seq: list[int]
    p: int
    n: int
    at: np.ndarray


@dataclass
class _Pass:
    """The target over a group of references, as their rounds start from it: its KV cache
    (a `Stream`), the tokens it saw ids [G, L] and which are real, valid [G, L] (row g's
    token j at slot off[g] + j), each reference's target argmax along it (a greedy target
    reading its verdicts off the pass) and, for a head, its states at every position."""

    stream: Stream
    ids: torch.Tensor
    valid: torch.Tensor
    off: np.ndarray
    best: list[np.ndarray]
    feats: torch.Tensor | None
    # where the pass saw every token of the references (the scoring's): the target's
    # logits at (rows [B], slots [B]) -> [B, V], and a layer-skip self-draft's depth-1
    # logits there -> [B, V'] — the root's own forwards are then not repeated
    target_root: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    draft_root: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def cache_bytes(x: Any) -> int:
    """The bytes of a `Stream`'s KV cache or a `LiveHead`'s key/value buffers (one row)."""
    if isinstance(x, LiveHead):
        return sum(int(kv._k.nbytes + kv._v.nbytes) for kv in x.kvs if kv._k is not None and kv._v is not None)
    layers = getattr(getattr(x, "cache", None), "layers", None) or []
    return sum(int(t.nbytes) for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))


def why_not(drafter: Any) -> str | None:
    """Why this drafter's tree cannot be drafted on its candidate paths (None: it can)."""
    if getattr(drafter, "kind", None) == "ngram":
        return "an n-gram drafter drafts no tree"
    if isinstance(drafter, HeadDrafter):
        return unsupported(drafter)
    if not hasattr(drafter, "step_model") or drafter.step_model() is None:
        return f"drafter {getattr(drafter, 'name', drafter)} has no step model to draft with"
    return None


class PathRounds:
    """The rounds of one reference: every start's tree (`Tree` rows) and its nodes'
    probabilities of being on the accepted path, filled chunk by chunk."""

    def __init__(self, target_model: Any, drafter: Any, shape: TreeShape, sampling: Sampling, rows: int = ROWS, read_greedy: bool = True,
                 thresholds: tuple[float, float] = EXACT) -> None:  # fmt: skip
        self.target_model = target_model
        self.thresholds = thresholds  # SGLang's (single, acc); a greedy target ignores them, as SGLang's greedy verify does
        self.drafter = drafter
        self.shape = shape
        self.sampling = sampling
        self.rows = rows
        self.read_greedy = read_greedy  # a greedy target's verdicts read off the reference where they can be
        self.head = isinstance(drafter, HeadDrafter)
        self.step = None if self.head else drafter.step_model()
        self.device = next(target_model.parameters()).device
        self.vocab = int(target_model.get_output_embeddings().weight.shape[0])
        self.target_calls = 0
        self.draft_calls = 0

    def reference(self, prompt: Sequence[int], cont: Sequence[int], starts: np.ndarray | None = None) -> tuple[Tree, np.ndarray, np.ndarray] | None:
        """One reference -> (the rounds' trees, [R, M] the nodes verified, [R, M] each
        node's probability of being on the accepted path) for the rounds starting at
        `starts` (default: all n of them, 0..n − 1, in order), or None when it is too
        short to draft (n < 2)."""
        return self.references([(prompt, cont, starts)])[0]

    def references(self, items: Sequence[tuple[Sequence[int], Sequence[int], np.ndarray | None]], done: Any = None) -> list[tuple[Tree, np.ndarray, np.ndarray] | None]:
        """Several references (prompt, continuation, starts) -> `reference`'s answer for
        each, in order. References of similar length share their prefills and their
        rounds' forwards (`groups`); `done(k)` is told as each group of k finishes."""
        refs: list[PathRef | None] = []
        for prompt, cont, starts in items:
            p, n = len(prompt), len(cont)
            if n < 2 or p < 1:
                refs.append(None)
                continue
            at = np.arange(n) if starts is None else np.asarray(starts, dtype=np.int64)
            if len(at) == 0 or at.min() < 0 or at.max() >= n:
                raise ValueError(f"start positions must lie in 0..{n - 1}")
            refs.append(PathRef([int(x) for x in prompt] + [int(x) for x in cont], p, n, at))
        out: list[tuple[Tree, np.ndarray, np.ndarray] | None] = [None] * len(items)
        for group in self.groups(refs):
            for i, got in zip(group, self._group([r for r in (refs[i] for i in group) if r is not None]), strict=True):
                out[i] = got
            if done is not None:
                done(len(group))
        return out

    def groups(self, refs: Sequence[PathRef | None]) -> list[list[int]]:
        """The references' indices in groups that prefill together: by length, each group
        within GROUP_TOKENS of padded prefill and (a greedy target reading its verdicts off
        the prefill) LOGIT_BYTES of kept logits."""
        order = sorted((i for i, r in enumerate(refs) if r is not None), key=lambda i: len(refs[i].seq))  # type: ignore[union-attr]
        keep_logits = self.sampling.greedy and self.read_greedy
        out: list[list[int]] = []
        for i in order:
            r = refs[i]
            assert r is not None
            if out:
                g = [refs[j] for j in out[-1]] + [r]
                width = max(len(x.seq) - 1 for x in g if x is not None)
                logits = len(g) * max(x.n for x in g if x is not None) * self.vocab * 4 if keep_logits else 0
                if len(g) * width <= GROUP_TOKENS and logits <= LOGIT_BYTES:
                    out[-1].append(i)
                    continue
            out.append([i])
        return out

    def _group(self, refs: list[PathRef]) -> list[tuple[Tree, np.ndarray, np.ndarray]]:
        """One group's prefill, then its rounds."""
        return self._rounds(refs, self._prefill(refs))

    def from_pass(self, refs: list[PathRef], ids: torch.Tensor, mask: torch.Tensor, cache: Any, layer_hidden: dict[int, torch.Tensor], last_hidden: torch.Tensor,
                  best: list[np.ndarray], head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[tuple[Tree, np.ndarray, np.ndarray]]:  # fmt: skip
        """The rounds of references the target has just been run over (the scoring's pass:
        ids [G, L] prompt + continuation at the left of each row, mask [G, L], its KV cache,
        its states; `best`: each reference's target argmax along it, for a greedy target)
        — no prefill of the target's own. With the target's `head` (its LM head and
        post-head transform), each round's root is not fed again: its target logits come
        from the pass's states (and a layer-skip self-draft's depth-1 logits likewise)."""
        stream = Stream(self.target_model, len(refs), self.device)
        stream.cache = cache
        stream.valid = mask.bool().clone()
        feats = LiveHead(self.drafter, len(refs), self.device).features(ids, layer_hidden, last_hidden) if self.head else None
        ps = _Pass(stream, ids, stream.valid, np.zeros(len(refs), dtype=np.int64), best, feats)
        if head is not None:
            ps.target_root = lambda rows, slot: head(last_hidden[rows, slot])
            if self._shares_prefill(stream):
                hid = self.drafter.hidden(TargetPass(ids, mask, last_hidden, layer_hidden))[1]  # [G, L, H] its last layer, normed
                ps.draft_root = lambda rows, slot: self.drafter.logits(hid[rows, slot], 1)
        return self._rounds(refs, ps)

    def _prefill(self, refs: list[PathRef]) -> _Pass:
        """The target over a group's references, right-aligned (holes on the left: row g's
        token j sits at slot off[g] + j)."""
        ids, ones = right_align([r.seq[:-1] for r in refs], self.device)
        width = ids.shape[1]
        off = np.asarray([width - (len(r.seq) - 1) for r in refs], dtype=np.int64)
        target = Stream(self.target_model, len(refs), self.device)
        # the target's argmax after every prefix of each reference (its last n positions): a
        # greedy target's verdict on every node along the reference, without a tree pass
        keep_logits = self.sampling.greedy and self.read_greedy
        best: list[np.ndarray] = []

        def prefill() -> torch.Tensor:
            keep = max(r.n for r in refs) if keep_logits else 1
            logits = target.forward(ids, ones, keep=keep)
            if keep_logits:
                top = logits.argmax(dim=-1).cpu().numpy()
                best.extend(top[g, keep - r.n :] for g, r in enumerate(refs))
            return logits

        feats = None
        if self.head:
            probe = LiveHead(self.drafter, len(refs), self.device)
            probe.watch(ids, prefill)  # the target's states at every position
            assert probe._seen is not None
            feats = probe._seen[1]  # [G, L, F]
        else:
            prefill()
        self.target_calls += target.calls
        return _Pass(target, ids, ones, off, best, feats)

    def _rounds(self, refs: list[PathRef], ps: _Pass) -> list[tuple[Tree, np.ndarray, np.ndarray]]:
        """A group's rounds from its target pass, in chunks of start positions."""
        target, ids = ps.stream, ps.ids
        base_head: LiveHead | None = None
        base_lm: Stream | None = None
        if self.head:
            assert ps.feats is not None
            base_head = LiveHead(self.drafter, len(refs), self.device)
            self._feats = ps.feats
            if ids.shape[1] > 1:  # slot j: (state at j, token j + 1), as the loop's catch-up feeds them; a hole's state is no slot
                base_head.pending = (ps.feats[:, :-1], ids[:, 1:], ps.valid[:, :-1] & ps.valid[:, 1:])
                base_head.catch_up()
        else:
            base_lm = self._shared_prefill(target) or Stream(self.step, len(refs), self.device)
            if base_lm.length == 0:
                base_lm.forward(ids, ps.valid, keep=1)
        depth_cap = self.shape.steps
        if base_head is not None and base_head.max_depth is not None:  # Medusa: one depth per head
            depth_cap = min(depth_cap, base_head.max_depth)
        per_row = (cache_bytes(target) + cache_bytes(base_head if base_head is not None else base_lm)) // len(refs)
        rows = max(1, min(self.rows, COPY_BYTES // max(per_row, 1)))
        g_all = np.concatenate([np.full(len(r.at), g, dtype=np.int64) for g, r in enumerate(refs)])
        t_all = np.concatenate([r.at for r in refs])
        got: list[tuple[Tree, np.ndarray, np.ndarray]] = []
        for lo in range(0, len(t_all), rows):
            g, t = g_all[lo : lo + rows], t_all[lo : lo + rows]
            n = np.asarray([refs[x].n for x in g])
            p = np.asarray([refs[x].p for x in g])
            cap = np.minimum(depth_cap, n - 1 - t).astype(np.int64)
            if self.head:
                cap = np.where(p + t - 2 >= 0, cap, 0)  # a head needs the target's state before the root
            got.append(self._chunk(refs, g, t, cap, ps, base_lm, base_head))
        self._feats = None
        tok = np.concatenate([x[0].tok for x in got])
        parent = np.concatenate([x[0].parent for x in got])
        score = np.concatenate([x[0].score for x in got])
        ver = np.concatenate([x[1] for x in got])
        prob = np.concatenate([x[2] for x in got])
        depth, rank = got[0][0].depth, got[0][0].rank
        out = []
        for gi in range(len(refs)):
            m = g_all == gi
            out.append((Tree(depth, rank, tok[m], parent[m], score[m]), ver[m], prob[m]))
        return out

    def _shares_prefill(self, target: Stream) -> bool:
        """Whether the drafter is a layer-skip self-draft whose cache is the target's first
        N layers' (plain per-layer keys and values, no sliding window)."""
        n = getattr(self.drafter, "n_layers", None)
        layers = getattr(target.cache, "layers", None)
        if getattr(self.drafter, "kind", None) != "layer_skip" or not n or not layers or len(layers) < n:
            return False
        return not any(getattr(x, "is_sliding", False) or not isinstance(getattr(x, "keys", None), torch.Tensor) for x in layers)

    def _shared_prefill(self, target: Stream) -> Stream | None:
        """A layer-skip self-draft's prefill is the target's first N layers' cache (the
        same modules on the same tokens): a copy of those layers, or None where the cache
        is not plain per-layer keys and values."""
        if not self._shares_prefill(target):
            return None
        n = self.drafter.n_layers
        out = Stream(self.step, target.valid.shape[0], self.device)
        out.cache = copy.deepcopy(target.cache)
        out.cache.layers = out.cache.layers[:n]
        out.valid = target.valid.clone()
        return out

    def _chunk(self, refs: list[PathRef], g: np.ndarray, t: np.ndarray, cap: np.ndarray, ps: _Pass, base_lm: Stream | None, base_head: LiveHead | None) -> tuple[Tree, np.ndarray, np.ndarray]:
        """The rounds at starts t [B] of group rows g [B]: draft, then verify."""
        off, target, best = ps.off, ps.stream, ps.best
        root = np.asarray([refs[x].p for x in g]) + t - 1  # the root's index in its reference: the last token of the round's context
        slot_root = torch.as_tensor(off[g] + root, device=self.device)  # ... and its slot in the group's caches
        roots = [[refs[x].seq[r]] for x, r in zip(g, root, strict=True)]
        take = torch.as_tensor(g, device=self.device)
        src: Any
        if base_head is not None:
            head = base_head.take(take)
            hslot = torch.arange(head.length, device=self.device)
            # slot s holds the state at s: those before the root's own state (the one it is fed with)
            head.valid &= hslot[None, :] < (slot_root - 1).clamp(min=0)[:, None]
            src = HeadTree(self.drafter, 1, self.device)
            src.head = head
            feats = self._features(take, (slot_root - 1).clamp(min=0))
            toks = torch.as_tensor(roots, dtype=torch.long, device=self.device)
            head.pending = (feats, toks, torch.ones_like(toks, dtype=torch.bool))
        else:
            assert base_lm is not None
            first = None if ps.draft_root is None else ps.draft_root(take, slot_root)
            # the drafter's cache holds the root already where its depth-1 logits came with the pass
            src = LMTree(self.step, roots if first is None else [[] for _ in roots], self.device, first=first)
            src.stream = base_lm.take(take)
            dslot = torch.arange(src.stream.length, device=self.device)
            src.stream.valid &= dslot[None, :] < slot_root[:, None] + (0 if first is None else 1)
        with torch.inference_mode():
            tree, verified = draft(src, self.shape, cap, self.vocab)
            self.draft_calls += src.calls
            if self.sampling.greedy and self.read_greedy:
                known = self._greedy_along(tree, verified, refs, g, t, best)
                if known is not None:
                    return tree, verified, known
            tgt = target.take(take)
            slot = torch.arange(tgt.length, device=self.device)
            if ps.target_root is None:
                tgt.valid &= slot[None, :] < slot_root[:, None]
                blk = block(tgt, roots, tree, verified)
                w = blk.ids.shape[1] - blk.unseen
                logits = finite(ta.forward(tgt, blk.ids, blk.valid, blk.allowed, blk.pos, keep=w + 1))  # [B, 1 + W, V]
            else:  # the pass saw the root and gave its logits: the block is the tree alone
                tgt.valid &= slot[None, :] <= slot_root[:, None]
                blk = block(tgt, [[] for _ in roots], tree, verified)
                w = blk.ids.shape[1]
                at_root = ps.target_root(take, slot_root)[:, None]  # [B, 1, V]
                tree_logits = ta.forward(tgt, blk.ids, blk.valid, blk.allowed, blk.pos, keep=w) if w else at_root[:, :0]
                logits = finite(torch.cat([at_root, tree_logits.to(at_root.dtype)], dim=1))  # [B, 1 + W, V]
        self.target_calls += tgt.calls
        return tree, verified, self._accept(tree, blk.nodes, logits)

    def _greedy_along(self, tree: Tree, verified: np.ndarray, refs: list[PathRef], g: np.ndarray, t: np.ndarray, best: list[np.ndarray]) -> np.ndarray | None:
        """A greedy target's verdicts read off the reference: a node whose ancestors are
        the reference's tokens is accepted when its own token is the target's argmax after
        that prefix (`best[g][t + d − 1]`, from the prefill). Exact unless an accepted node
        leaves the reference (the target's argmax is not the reference's token there, as
        with a dataset's responses): then None, and the chunk gets its target pass."""
        b, m = tree.tok.shape
        out = np.zeros((b, m))
        for r in range(b):
            ref, top = refs[g[r]], best[g[r]]
            for j in np.flatnonzero(verified[r]):
                par = int(tree.parent[r, j])
                up = 1.0 if par < 0 else out[r, par]
                if up == 0.0:
                    continue
                d = int(tree.depth[j])
                tok = int(tree.tok[r, j])
                if tok != int(top[t[r] + d - 1]):
                    continue
                if tok != ref.seq[ref.p + t[r] + d - 1]:
                    return None  # accepted off the reference: its children need the target's pass
                out[r, j] = 1.0
        return out

    def _features(self, rows: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The target's states the head reads before each round's root (group rows [B],
        their slots [B] in the group's prefill): [B, 1, F]."""
        assert self._feats is not None
        return self._feats[rows, slot][:, None]

    _feats: torch.Tensor | None = None

    def _accept(self, tree: Tree, nodes: list[list[int]], logits: torch.Tensor) -> np.ndarray:
        """[B, M] each verified node's probability of being on the accepted path."""
        b, m = tree.tok.shape
        out = np.zeros((b, m))
        if self.sampling.greedy:
            best = logits.argmax(dim=-1).cpu().numpy()  # [B, 1 + W]
        else:
            pr = probs(logits.float(), self.sampling)  # [B, 1 + W, V]
        own = np.zeros((b, m))  # each reached node's factor: its acceptance once its parent is accepted
        reached = np.zeros((b, m), dtype=bool)
        for r, ns in enumerate(nodes):
            col = {j: c for c, j in enumerate(ns)}
            for j in ns:
                par = int(tree.parent[r, j])
                if par >= 0 and par not in col:
                    continue  # a node whose parent is not verified is never reached
                at = 0 if par < 0 else col[par] + 1
                tok = int(tree.tok[r, j])
                own[r, j] = float(best[r, at] == tok) if self.sampling.greedy else float(pr[r, at, tok])
                reached[r, j] = True
        if relaxed(self.thresholds) and not self.sampling.greedy:  # the verified siblings, in index order
            own = sibling_accept(own, tree.parent, self.thresholds, reached)
        for r, ns in enumerate(nodes):
            for j in ns:
                if reached[r, j]:
                    par = int(tree.parent[r, j])
                    out[r, j] = own[r, j] * (1.0 if par < 0 else out[r, par])
        return out


def run(target_model: Any, drafter: Any, shape: TreeShape, sampling: Sampling, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], progress: Any = None, rows: int = ROWS,
        starts: Sequence[np.ndarray | None] | None = None, thresholds: tuple[float, float] = EXACT) -> tuple[list[tuple[int, Nodes, np.ndarray, np.ndarray]], PathRounds]:  # fmt: skip
    """Every reference's rounds, in order: (its index, the rounds' nodes, [R, M] each node's
    probability of being on the accepted path, the R start positions). `starts`: per
    reference the start positions to draft (None there: leave the reference out); default
    every start of every reference. References too short to draft are left out.
    thresholds: SGLang's (single, acc) for a sampled target."""
    from specprobe.core.progress import Progress

    pr = PathRounds(target_model, drafter, shape, sampling, rows, thresholds=thresholds)
    todo = [(i, e, c) for i, (e, c) in enumerate(zip(encoded, conts, strict=True)) if len(c) >= 2 and (starts is None or starts[i] is not None)]
    out: list[tuple[int, Nodes, np.ndarray, np.ndarray]] = []
    with (progress or Progress()).task(f"drafting the tree on its candidate paths ({len(todo)} references)", len(todo)) as advance:
        got = pr.references([(e, c, None if starts is None else starts[i]) for i, e, c in todo], done=advance)
    for (i, _, c), one in zip(todo, got, strict=True):
        if one is not None:
            tree, verified, prob = one
            at = None if starts is None else starts[i]
            out.append((i, Nodes(tree.depth, tree.rank, tree.parent, tree.score, verified), prob, np.arange(len(c)) if at is None else np.asarray(at)))
    return out, pr
