"""vLLM's suffix decoding (`method: suffix`, speculative_config's suffix_decoding_* knobs):
the suffix trees of Arctic Inference that vLLM's `SuffixDecodingProposer` calls,
reimplemented from their source (`arctic_inference/suffix_decoding`: the C++
`SuffixTree` and the Python `SuffixDecodingCache`). No model; pure Python.

What is counted. A tree holds sequences; every suffix of every sequence is inserted up to
`max_depth` tokens, so a node at string s has count = how many times s occurs (as a
substring of at most max_depth tokens) across the tree's sequences — the occurrence that
ends a sequence, with nothing after it yet, included. The engine compresses chains into
segments; this module keeps one node per token, which changes no count and no order.

The children's order. Siblings are kept in decreasing count, and the first is the one a
draft follows. Among equal counts the engine's linked lists decide, and this module
repeats their moves exactly: a new child joins the end; a child whose count rises by one
moves in front of the head of its previous sibling's group (so it becomes the head of
the group it joins when it was the head of its own, else the last of it); a child whose
count falls by one moves to the head of the next group when its next sibling had its
count (`_increment_count`, `_decrement_count`).

A proposal (`SuffixTree::speculate`, the path form vLLM asks for): for each match length
m = 1, 2, … below the context's length, the last m tokens are matched from the root
(the first m that does not match ends the search); from the node matched, the draft
follows the first child again and again, the probability multiplied by child count ÷
node count at each step, while the draft is shorter than min(max_spec_tokens,
⌊m·max_spec_factor + 1e-6⌋) and the probability is at least min_token_prob; its score is
the sum of its tokens' probabilities, and the highest score wins, a later (longer) m on a
tie. Probabilities and scores are single-precision floats, as the engine's are.

The cache (`SuffixDecodingCache`): each active request has a tree of its own (its prompt,
then every token it samples); one global tree holds the responses of the requests
started so far — earlier requests', whole, and the active ones' so far — at most
max_cached_requests of them (the oldest evicted first; 0: no global tree). A proposal is
the request's own tree's draft when its score is at least the global tree's, else the
global tree's. The context is the sequence's last max_depth tokens."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32
EPS = 1e-6  # the engine's slack in ⌊m · factor + offset + 1e-6⌋


class _Node:
    __slots__ = ("children", "count", "order", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.order: list[_Node] = []  # the children, the one a draft follows first


def _increment(parent: _Node, child: _Node) -> None:
    lst = parent.order
    i = lst.index(child)
    c = child.count
    if i == 0 or lst[i - 1].count > c + 1:
        child.count += 1  # stays where it is
        return
    prev = lst[i - 1].count  # c or c + 1: in front of that group's head
    j = i - 1
    while j > 0 and lst[j - 1].count == prev:
        j -= 1
    del lst[i]
    child.count += 1
    lst.insert(j, child)


def _decrement(parent: _Node, child: _Node) -> None:
    lst = parent.order
    i = lst.index(child)
    c = child.count
    if i == len(lst) - 1 or lst[i + 1].count < c:
        child.count -= 1  # stays (and heads the next group when that one has c − 1)
        return
    del lst[i]  # its next sibling shares c: to the head of the next group
    child.count -= 1
    k = i
    while k < len(lst) and lst[k].count >= c:
        k += 1
    lst.insert(k, child)


@dataclass
class SuffixDraft:
    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTree:
    """Sequences by id, their suffixes to max_depth tokens (module doc)."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node(-1)
        self.seqs: dict[int, list[int]] = {}
        self._active: dict[int, deque[_Node]] = {}

    def append(self, seq_id: int, token: int) -> None:
        seq = self.seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        active.append(self.root)
        self.root.count += 1
        if len(active) > self.max_depth:
            active.popleft()
        seq.append(token)
        for i, node in enumerate(active):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(token)
                child.count = 1
                node.order.append(child)
            else:
                _increment(node, child)
            active[i] = child

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(seq_id, int(t))

    def remove(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, [])
        self._active.pop(seq_id, None)
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for idx in range(start, len(seq)):
                child = node.children.get(seq[idx])
                if child is None:
                    break
                if child.count > 1:
                    _decrement(node, child)
                else:  # only this suffix passed here: the child and all below it go
                    node.order.remove(child)
                    del node.children[seq[idx]]
                    break
                node = child

    def _match(self, context: Sequence[int]) -> _Node | None:
        node = self.root
        for t in context:
            nxt = node.children.get(t)
            if nxt is None:
                return None
            node = nxt
        return node

    def speculate(self, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float, min_token_prob: float, max_spec_offset: float = 0.0) -> SuffixDraft:
        best = SuffixDraft()
        floor_prob = F32(min_token_prob)
        for m in range(1, len(context)):
            node = self._match(context[len(context) - m :])
            if node is None:
                break
            # single precision, as the engine computes match_len * factor + offset
            cap = min(max_spec_tokens, int(float(F32(m) * F32(max_spec_factor) + F32(max_spec_offset)) + EPS))
            draft = self._path(node, max(cap, 0), floor_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = m
        return best

    @staticmethod
    def _path(node: _Node, max_tokens: int, floor_prob: np.float32) -> SuffixDraft:
        out = SuffixDraft()
        prob, score = F32(1.0), F32(0.0)
        while len(out.tokens) < max_tokens and prob >= floor_prob and node.order:
            child = node.order[0]
            prob = F32(prob * (F32(child.count) / F32(node.count)))
            if not prob >= floor_prob:
                break
            out.tokens.append(child.token)
            out.probs.append(float(prob))
            score = F32(score + prob)
            node = child
        out.score = float(score)
        return out


class SuffixCache:
    """The requests' own trees and the global tree of responses (module doc)."""

    def __init__(self, max_depth: int = 24, max_cached_requests: int = 10000) -> None:
        self.max_depth = max_depth
        self.max_cached = max_cached_requests
        self.global_tree = SuffixTree(max_depth)
        self.local: dict[Hashable, SuffixTree] = {}
        self.seq_of: dict[Hashable, int] = {}  # cached responses, oldest first
        self._next = 0

    def start(self, req: Hashable, prompt: Sequence[int]) -> None:
        tree = self.local[req] = SuffixTree(self.max_depth)
        tree.extend(0, prompt)
        if self.max_cached != 0:
            if req in self.seq_of:
                self.evict(req)
            seq = self.seq_of[req] = self._next
            self._next += 1
            while self.max_cached > 0 and len(self.seq_of) > self.max_cached:
                old = next(r for r, s in self.seq_of.items() if s != seq)
                self.evict(old)

    def add(self, req: Hashable, tokens: Sequence[int]) -> None:
        self.local[req].extend(0, tokens)
        if req in self.seq_of:
            self.global_tree.extend(self.seq_of[req], tokens)

    def stop(self, req: Hashable) -> None:
        self.local.pop(req, None)

    def evict(self, req: Hashable) -> None:
        self.global_tree.remove(self.seq_of.pop(req))

    def speculate(self, req: Hashable, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float, min_token_prob: float) -> SuffixDraft:
        ctx = list(context[-self.max_depth :])
        own = self.local[req].speculate(ctx, max_spec_tokens, max_spec_factor, min_token_prob)
        other = self.global_tree.speculate(ctx, max_spec_tokens, max_spec_factor, min_token_prob)
        return own if own.score >= other.score else other


class SuffixSlot:
    """One request at a time of a vLLM server's suffix decoding (the drafter's cache is
    the server's): `begin` starts a request, `propose` adds what was sampled since the
    last call and drafts, as `SuffixDecodingProposer.propose` does each step, and
    `finish` adds the request's last tokens (vLLM's last step still passes them)."""

    def __init__(self, cache: SuffixCache, k: int, factor: float, min_prob: float, max_model_len: int | None, new_id: object) -> None:
        self.cache, self.k, self.factor, self.min_prob = cache, k, factor, min_prob
        self.max_model_len = max_model_len
        self.new_id = new_id
        self.req: Hashable | None = None
        self.seen = 0

    def begin(self, prompt: Sequence[int]) -> None:
        if self.req is not None:
            self.cache.stop(self.req)
        self.req = self.new_id() if callable(self.new_id) else object()
        self.cache.start(self.req, list(prompt))
        self.seen = len(prompt)

    def observe(self, history: Sequence[int]) -> None:
        if self.req is not None and len(history) > self.seen:
            self.cache.add(self.req, list(history[self.seen :]))
            self.seen = len(history)

    def propose(self, history: Sequence[int]) -> list[int]:
        self.observe(history)
        if self.req is None:
            return []
        n = len(history)
        cap = self.k if self.max_model_len is None else min(self.k, self.max_model_len - n - 1)
        if self.max_model_len is not None and n >= self.max_model_len:
            return []
        return self.cache.speculate(self.req, history[max(0, n - self.cache.max_depth) :], cap, self.factor, self.min_prob).tokens

    def finish(self, history: Sequence[int]) -> None:
        self.observe(history)
        if self.req is not None:
            self.cache.stop(self.req)
            self.req = None

    def accept(self, n_accepted: int) -> None:
        pass
