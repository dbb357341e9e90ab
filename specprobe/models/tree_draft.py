"""One round of tree drafting from real drafter forwards, and the target's verify block
with its tree mask: what the tree loop (`simulate.tree`) runs each round, and what
diagnose runs at every start position of a reference to estimate a tree with the drafter
on each candidate path (`probe.tree_paths`).

    draft     the drafter runs on the candidate paths themselves. Depth 1: its top-T
              tokens (plain softmax of its logits, temperature 1, as SGLang scores them;
              ties to the lower id). Depth d > 1: the T beams of depth d − 1 are fed in
              ONE forward with a tree attention mask (`tree_attention`), each beam seeing
              only its own ancestors; each gets its top-T children, a child scored by the
              product of draft probabilities along its path, and the T best of the T²
              children are the next beams (ties to the lower index). Every expanded node
              is a candidate; the N − 1 best scores are verified (`estimates.tree.select`,
              the rule the estimate uses). A static tree (`paths`) expands the nodes that
              have children and verifies every listed node. An independent LM or a
              layer-skip self-draft reads its own KV cache; an EAGLE/MTP head chains on
              its own outputs (each beam's hidden state is the one its parent's step
              produced); Medusa's heads are independent (every depth-d node has head d's
              candidates).
    verify    `block`: the target's block [the tokens it has not seen, the verified
              nodes] with the tree mask and position ids root + depth."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from specprobe.estimates.tree import TreeShape, select, top_desc
from specprobe.metrics.core import align_vocab, finite
from specprobe.models import tree_attention as ta
from specprobe.models.heads.chain import HeadDrafter
from specprobe.models.heads.live import HeadTimed, LiveHead
from specprobe.models.kvcache import Stream, StreamTimed, right_align


# ----------------------------------------------------------------------------- the tree
@dataclass
class Tree:
    """One round's candidate nodes over B rows (index order: a parent before its children;
    a parent's children in rank order). depth [M] (1-based) and rank [M] (0-based) are
    the shape's; tok, parent (−1: the root) and score (−inf: not drafted) are per row."""

    depth: np.ndarray  # [M]
    rank: np.ndarray  # [M]
    tok: np.ndarray  # [B, M]
    parent: np.ndarray  # [B, M]
    score: np.ndarray  # [B, M]

    @classmethod
    def empty(cls, depth: np.ndarray, rank: np.ndarray, rows: int) -> Tree:
        m = len(depth)
        return cls(depth, rank, np.zeros((rows, m), dtype=np.int64), np.full((rows, m), -1, dtype=np.int64), np.full((rows, m), -np.inf))

    def ancestors(self, b: int, j: int) -> list[int]:
        """Node j's proper ancestors in row b, nearest first."""
        out = []
        p = int(self.parent[b, j])
        while p >= 0:
            out.append(p)
            p = int(self.parent[b, p])
        return out


def layout(shape: TreeShape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate slots of a shape -> depth [M], rank [M], static parent [M] (dynamic
    trees: −1, the parents are chosen per row). Dynamic: depth 1 at 0..T−1, then each
    level's T² children at base + beam·T + rank (`estimates.tree.dynamic_nodes`)."""
    if shape.static:
        index = {p: i for i, p in enumerate(shape.paths)}
        depth = np.asarray([len(p) for p in shape.paths], dtype=np.int64)
        rank = np.asarray([p[-1] for p in shape.paths], dtype=np.int64)
        par = np.asarray([index[p[:-1]] if len(p) > 1 else -1 for p in shape.paths], dtype=np.int64)
        return depth, rank, par
    t, s = shape.topk, shape.steps
    depth = np.concatenate([np.ones(t, dtype=np.int64)] + [np.full(t * t, i + 1, dtype=np.int64) for i in range(1, s)])
    rank = np.concatenate([np.arange(t)] + [np.tile(np.arange(t), t) for _ in range(1, s)]).astype(np.int64)
    return depth, rank, np.full(len(depth), -1, dtype=np.int64)


def top(logits: torch.Tensor, k: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The drafter's k most probable target ids under its plain softmax (temperature 1),
    largest first, ties to the lower id: logits [..., V'] -> (ids, probs) [..., k]."""
    lg = align_vocab(finite(logits), vocab).float()
    p = torch.softmax(lg, dim=-1)
    k = min(k, p.shape[-1])
    # the k largest, then in (probability descending, id ascending) order: a full sort of
    # the vocabulary gives the same, at a cost a tree's B·T rows per step feel
    _, idx = torch.topk(p, k, dim=-1)
    idx = idx.sort(dim=-1).values
    val, order = torch.sort(p.gather(-1, idx), dim=-1, descending=True, stable=True)
    idx = idx.gather(-1, order)
    tied = (p >= val[..., -1:]).sum(dim=-1) > k  # a tie across the k-th place: which ids win is the full sort's
    if bool(tied.any()):
        fv, fi = torch.sort(p[tied], dim=-1, descending=True, stable=True)
        val[tied], idx[tied] = fv[..., :k], fi[..., :k]
    return idx.cpu().numpy(), val.double().cpu().numpy()


class TreeSource(Protocol):
    """A drafter as the tree loop runs it."""

    @property
    def max_depth(self) -> int | None: ...

    @property
    def calls(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    def root(self, cap: np.ndarray, tree: Tree) -> torch.Tensor | None:
        """Catch up on the verified tokens -> depth-1 logits [B, V'] (None: no draft this round)."""
        ...

    def expand(self, tree: Tree, nodes: np.ndarray, feed: np.ndarray, depth: int) -> torch.Tensor:
        """The children logits [B, W, V'] of nodes [B, W] (all at depth − 1), for rows feed [B]."""
        ...

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def accept(self, tree: Tree, path: list[list[int]], nxt: list[int], cols: list[list[int]]) -> None:
        """Row b accepted nodes path[b] (root to leaf) and picked nxt[b]; cols[b]: the block
        columns of the verify pass that are now verified (its unseen tokens, the path)."""
        ...

    def compact(self) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...


def draft(src: TreeSource, shape: TreeShape, cap: np.ndarray, vocab: int) -> tuple[Tree, np.ndarray]:
    """Build each row's tree from real drafter forwards -> (the candidates, verified [B, M])."""
    depth, rank, spar = layout(shape)
    b = cap.shape[0]
    tree = Tree.empty(depth, rank, b)
    logits = src.root(cap, tree)
    if logits is None:
        return tree, np.zeros(tree.score.shape, dtype=bool)
    t = shape.topk
    ids, val = top(logits, t, vocab)  # [B, T]
    if shape.static:
        _static(src, tree, shape, spar, cap, vocab, ids, val)
        return tree, np.isfinite(tree.score)
    live = cap >= 1
    tree.tok[:, :t], tree.score[:, :t] = ids, np.where(live[:, None], val, -np.inf)
    beams = np.broadcast_to(np.arange(t), (b, t)).copy()
    for i in range(1, shape.steps):
        feed = cap > i  # rows that draft depth i + 1
        if not feed.any():
            break
        ids, val = top(src.expand(tree, beams, feed, i + 1), t, vocab)  # [B, T, T]
        base = t + (i - 1) * t * t
        sl = slice(base, base + t * t)
        tree.tok[:, sl] = ids.reshape(b, t * t)
        tree.parent[:, sl] = np.repeat(beams, t, axis=1)
        above = np.take_along_axis(tree.score, beams, axis=1)[:, :, None]  # [B, T, 1]
        level = np.where(np.isfinite(above), np.where(np.isfinite(above), above, 0.0) * val, -np.inf)
        tree.score[:, sl] = np.where(feed[:, None], level.reshape(b, t * t), -np.inf)
        beams = base + top_desc(tree.score[:, sl], t)
    return tree, select(tree.score, depth, shape.steps, shape.tokens)


def _static(src: TreeSource, tree: Tree, shape: TreeShape, spar: np.ndarray, cap: np.ndarray, vocab: int, ids: np.ndarray, val: np.ndarray) -> None:
    """A static tree: depth by depth, the listed nodes' parents fed in one forward."""
    b = cap.shape[0]
    tree.parent[:] = spar[None, :]
    for d in range(1, shape.steps + 1):
        at = np.flatnonzero(tree.depth == d)
        live = cap >= d
        if not live.any():
            break
        if d == 1:
            own_tok, own_p = ids[:, tree.rank[at]], val[:, tree.rank[at]]
            tree.tok[:, at], tree.score[:, at] = own_tok, np.where(live[:, None], own_p, -np.inf)
            continue
        parents = np.unique(spar[at])  # [W], depth d − 1, index order
        ids_d, val_d = top(src.expand(tree, np.broadcast_to(parents, (b, len(parents))).copy(), live, d), shape.topk, vocab)  # [B, W, T]
        w = np.searchsorted(parents, spar[at])
        tree.tok[:, at] = ids_d[:, w, tree.rank[at]]
        above = tree.score[:, spar[at]]
        sc = np.where(np.isfinite(above), np.where(np.isfinite(above), above, 0.0) * val_d[:, w, tree.rank[at]], -np.inf)
        tree.score[:, at] = np.where(live[:, None], sc, -np.inf)


# ----------------------------------------------------------------------------- verify
@dataclass
class Block:
    """The verify pass's block: [unseen tokens (right-aligned), the verified nodes]."""

    ids: torch.Tensor  # [B, U+W]
    valid: torch.Tensor  # [B, U+W]
    allowed: torch.Tensor  # [B, U+W, L+U+W]
    pos: torch.Tensor  # [B, U+W]
    nodes: list[list[int]]  # per row: the node of each tree column (index order)
    unseen: int  # U


def block(target: Stream, todo: list[list[int]], tree: Tree, verified: np.ndarray) -> Block:
    """The target's verify block with its tree mask and position ids (see module doc)."""
    dev = target.device
    b = len(todo)
    nodes = [np.flatnonzero(verified[r]).tolist() for r in range(b)]
    w = max((len(n) for n in nodes), default=0)
    if any(todo):
        uids, uvalid = right_align(todo, dev)  # [B, U]
    else:  # the target has seen the root already: the block is the tree alone
        uids, uvalid = torch.zeros((b, 0), dtype=torch.long, device=dev), torch.zeros((b, 0), dtype=torch.bool, device=dev)
    u = uids.shape[1]
    tids = torch.zeros((b, w), dtype=torch.long)
    tvalid = torch.zeros((b, w), dtype=torch.bool)
    tdepth = torch.zeros((b, w), dtype=torch.long)
    pcol = torch.full((b, w), -1, dtype=torch.long)
    for r, ns in enumerate(nodes):
        col = {j: c for c, j in enumerate(ns)}
        for c, j in enumerate(ns):
            tids[r, c] = int(tree.tok[r, j])
            tvalid[r, c] = True
            tdepth[r, c] = int(tree.depth[j] if tree.depth.ndim == 1 else tree.depth[r, j])  # 2-D: each row's own tree (an n-gram tree)
            pcol[r, c] = col.get(int(tree.parent[r, j]), -1)
    tids, tvalid, tdepth, pcol = tids.to(dev), tvalid.to(dev), tdepth.to(dev), pcol.to(dev)
    ids = torch.cat([uids, tids], dim=1)
    valid = torch.cat([uvalid, tvalid], dim=1)
    n = u + w
    causal = torch.ones((n, n), dtype=torch.bool, device=dev).tril_()
    inner = causal[None] & valid[:, None, :]  # [B, n, n] the unseen part: causal over real slots
    if w:
        inner[:, u:, u:] = ta.ancestor_matrix(pcol) & tvalid[:, None, :]  # a node sees its ancestors only
    inner[:, u:, :u] &= tvalid[:, :, None]  # a hole node sees nothing but itself
    prefix = target.valid[:, None, :].expand(-1, n, -1)
    allowed = torch.cat([prefix, inner], dim=2)
    allowed[:, :, target.length :] |= torch.eye(n, dtype=torch.bool, device=dev)[None]
    seen = target.valid.sum(dim=1, keepdim=True)  # [B, 1]
    upos = seen + uvalid.long().cumsum(dim=1) - 1  # [B, U]
    root = seen[:, 0] + uvalid.sum(dim=1) - 1  # [B] the root: the last unseen token
    pos = torch.cat([upos, root[:, None] + tdepth], dim=1)
    return Block(ids, valid, allowed, pos, nodes, u)


# ----------------------------------------------------------------------------- sources
def _prefix(valid: torch.Tensor, l0: int, tree: Tree, fed: np.ndarray, nodes: np.ndarray) -> torch.Tensor:
    """What fed nodes [B, W] see of a cache valid [B, L]: its real slots before the round's
    tree (slot < l0) and the slots of their own ancestors -> [B, W, L]."""
    b, w = nodes.shape
    see = np.zeros((b, w, valid.shape[1]), dtype=bool)
    for r in range(b):
        for c in range(w):
            for a in tree.ancestors(r, int(nodes[r, c])):
                if fed[r, a] >= 0:
                    see[r, c, fed[r, a]] = True
    out = torch.from_numpy(see).to(valid.device)
    out[:, :, :l0] |= valid[:, None, :l0]
    return out


class LMTree(StreamTimed):
    """A causal LM (independent or a layer-skip self-draft) drafting a tree from its own
    cache: its first forward catches up on the verified tokens it has not seen, each later
    depth feeds the beams, each seeing its ancestors' slots only."""

    max_depth = None

    def __init__(self, model: Any, prompts: Sequence[Sequence[int]], device: Any, first: torch.Tensor | None = None) -> None:
        self.stream = Stream(model, len(prompts), device)
        self.todo = [list(p) for p in prompts]
        # the depth-1 logits [B, V'] when the cache holds the root already (its last valid
        # slot): the first round feeds nothing
        self.first = first
        self._l0: int | None = None
        self._root = torch.zeros(len(prompts), dtype=torch.long)
        self._fed = np.zeros((len(prompts), 0), dtype=np.int64)

    def root(self, cap: np.ndarray, tree: Tree) -> torch.Tensor | None:
        self._l0 = None
        if not cap.any():
            return None
        if self.first is not None:
            logits, self.first = self.first, None
        else:
            ids, valid = right_align(self.todo, self.stream.device)
            logits = self.stream.forward(ids, valid, keep=1)[:, -1]
        self._l0 = self.stream.length
        self._root = self.stream.valid.sum(dim=1) - 1  # [B] the root's position
        self._fed = np.full(tree.tok.shape, -1, dtype=np.int64)
        self.todo = [[] for _ in self.todo]
        return logits

    def expand(self, tree: Tree, nodes: np.ndarray, feed: np.ndarray, depth: int) -> torch.Tensor:
        assert self._l0 is not None
        st, dev = self.stream, self.stream.device
        b, w = nodes.shape
        length = st.length
        prefix = _prefix(st.valid, self._l0, tree, self._fed, nodes)
        allowed = ta.block_allowed(prefix, torch.zeros((b, w, w), dtype=torch.bool, device=dev))
        ids = torch.from_numpy(np.take_along_axis(tree.tok, nodes, axis=1)).to(dev)
        valid = torch.from_numpy(np.repeat(feed[:, None], w, axis=1)).to(dev)
        pos = self._root.to(dev)[:, None] + (depth - 1) + torch.zeros((b, w), dtype=torch.long, device=dev)
        logits = ta.forward(st, ids, valid, allowed, pos)  # [B, W, V']
        for r in np.flatnonzero(feed):
            self._fed[r, nodes[r]] = length + np.arange(w)
        return logits

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return forward()

    def accept(self, tree: Tree, path: list[list[int]], nxt: list[int], cols: list[list[int]]) -> None:
        """The tree's slots become holes but the accepted path's; what it never fed of the
        path (at most its last node) and the next token are fed next round."""
        if self._l0 is None:
            self.todo = [self.todo[r] + [nxt[r]] for r in range(len(nxt))]
            return
        st = self.stream
        keep = torch.zeros_like(st.valid[:, self._l0 :])
        todo = []
        for r, pth in enumerate(path):
            fed = [int(self._fed[r, j]) for j in pth if self._fed[r, j] >= 0]
            if fed:
                keep[r, torch.tensor(fed) - self._l0] = True
            tail = [int(tree.tok[r, j]) for j in pth if self._fed[r, j] < 0]  # the last node at most
            todo.append(tail + [nxt[r]])
        st.valid[:, self._l0 :] &= keep
        self.todo = todo

    def compact(self) -> None:
        self.stream.compact()

    def select(self, rows: torch.Tensor) -> None:
        self.stream.select(rows)
        sel = rows.tolist()
        self.todo = [self.todo[r] for r in sel]


class HeadTree(HeadTimed):
    """A head drafter over a tree: EAGLE-1/2, EAGLE-3 and MTP chain on their own outputs
    (a beam is fed with the hidden state its parent's step produced, in the head's cache
    under the tree mask); Medusa's heads read the target's last state, so every node at
    depth d gets head d's candidates. Round 1, the prefill, drafts nothing; after verify
    every tree entry is dropped and the head catches up from the target's states on the
    accepted path (`models.heads.live`)."""

    def __init__(self, drafter: Any, batch: int, device: Any) -> None:
        self.head = LiveHead(drafter, batch, device)
        self._l0: int | None = None
        self._root = torch.zeros(batch, dtype=torch.long)
        self._root_h: torch.Tensor | None = None
        self._out_h: torch.Tensor | None = None  # [B, M, H] the hidden each fed node's step produced
        self._fed = np.zeros((batch, 0), dtype=np.int64)

    def root(self, cap: np.ndarray, tree: Tree) -> torch.Tensor | None:
        self._l0 = None
        if not cap.any() or not self.head.has_pending:
            return None
        logits = self.head.catch_up()
        self._l0 = self.head.length
        self._root = self.head.valid.sum(dim=1)  # a chain's depth-2 step sits here
        self._root_h = self.head.hidden
        self._out_h = None
        self._fed = np.full(tree.tok.shape, -1, dtype=np.int64)
        return logits

    def expand(self, tree: Tree, nodes: np.ndarray, feed: np.ndarray, depth: int) -> torch.Tensor:
        h = self.head
        b, w = nodes.shape
        if h.kind == "medusa":
            t0 = h._start()
            logits = h._medusa(depth)  # [B, V]
            h._stop(t0)
            return logits[:, None].expand(-1, w, -1)
        assert self._l0 is not None and self._root_h is not None
        dev = h.device
        if self._out_h is None:
            self._out_h = self._root_h.new_zeros((b, tree.tok.shape[1], self._root_h.shape[-1]))
        par = np.take_along_axis(tree.parent, nodes, axis=1)  # [B, W]
        parent_h = self._out_h[torch.arange(b, device=dev)[:, None], torch.from_numpy(np.maximum(par, 0)).to(dev)]  # [B, W, H]
        hin = torch.where(torch.from_numpy(par < 0).to(dev)[..., None], self._root_h[:, None], parent_h)
        length = h.length
        prefix = _prefix(h.valid, self._l0, tree, self._fed, nodes)
        mask = ta.additive(ta.block_allowed(prefix, torch.zeros((b, w, w), dtype=torch.bool, device=dev)), h.dtype)
        ids = torch.from_numpy(np.take_along_axis(tree.tok, nodes, axis=1)).to(dev)
        pos = self._root.to(dev)[:, None] + (depth - 2) + torch.zeros((b, w), dtype=torch.long, device=dev)
        h.valid = torch.cat([h.valid, torch.from_numpy(np.repeat(feed[:, None], w, axis=1)).to(dev)], dim=1)
        t0 = h._start()
        out_h, out = h._forward(h._embed(ids, pos, first=False), hin, pos, mask, first=False, depth=depth)
        logits = h.d.logits(out.reshape(b * w, -1), depth).view(b, w, -1)
        h._stop(t0)
        rows = np.flatnonzero(feed)
        for r in rows:
            self._fed[r, nodes[r]] = length + np.arange(w)
        if len(rows):
            ri = torch.from_numpy(rows).to(dev)
            self._out_h[ri[:, None], torch.from_numpy(nodes[rows]).to(dev)] = out_h[ri].to(self._out_h.dtype)
        return logits

    def watch(self, ids: torch.Tensor, valid: torch.Tensor, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        return self.head.watch(ids, forward)

    def accept(self, tree: Tree, path: list[list[int]], nxt: list[int], cols: list[list[int]]) -> None:
        """Queue the target's states at the verified columns (unseen tokens, accepted
        path), packed right-aligned as the chain's verify block is, then drop the tree."""
        h = self.head
        assert h._seen is not None, "accept() follows watch()"
        ids, feats = h._seen
        b = ids.shape[0]
        real = torch.tensor([len(c) for c in cols], dtype=torch.long)
        width = max(1, int(real.max()))
        src = torch.zeros((b, width), dtype=torch.long)
        for r, c in enumerate(cols):
            if c:
                src[r, width - len(c) :] = torch.tensor(c)
        src = src.to(ids.device)
        h._seen = (ids.gather(1, src), feats.gather(1, src[..., None].expand(-1, -1, feats.shape[-1])))
        real = real.to(ids.device)
        h.queue(width - real, real, torch.tensor(nxt, device=ids.device))
        if self._l0 is not None:
            h.invalidate_from(self._l0)

    def compact(self) -> None:
        self.head.compact()

    def select(self, rows: torch.Tensor) -> None:
        self.head.select(rows)
        self._root_h = self._out_h = None


def open_tree_source(drafter: Any, prompts: Sequence[Sequence[int]], device: Any) -> Any:
    """The tree source for a drafter: a head drafter or a causal LM (the n-gram drafters
    draft chains)."""
    if isinstance(drafter, HeadDrafter):
        return HeadTree(drafter, len(prompts), device)
    return LMTree(drafter, prompts, device)
