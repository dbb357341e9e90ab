"""SGLang's NGRAM speculator (`--speculative-algorithm NGRAM`), reimplemented from its
source: the `NGRAMWorker` (python/sglang/srt/speculative/ngram_worker.py) and the C++
n-gram cache under `cpp_ngram/` (`TrieCache`: insert, squeeze, match, buildRecency,
buildFrequency; `fillResult`). No model; pure Python.

The cache. One trie per server, shared by every request it serves (cross-request), of at
most `capacity` nodes (the root included). After every verify step the worker inserts
the sequence's last `branch_length` tokens (prompt + output, the tokens just verified
included; the prompt's pass inserts nothing — the worker's own FIXME leaves the prompt
out): for each start i with i + min_match_window_size < len, the tokens from i to the
end go in as one path from the root, each node's count (`freq`) raised by one and the
node moved to the front of its parent's recency list. A full trie evicts its least
recently touched leaves first (a global LRU, a path's nodes moved to its front deepest
first, so a parent is always ahead of its children).

A draft. Before each verify step, the last `max_match_window_size` tokens of the
sequence are the context; every window w from min(len, max) down to
`min_match_window_size` whose last w tokens are a path from the root gives an anchor
(the node at its end), longest first. From each anchor in turn, new nodes are added to
one tree of at most `num_draft_tokens − 1` nodes below the root (the last token),
merging where a token already sits under the same parent:

    BFS   breadth first over the anchor's subtree, each node's children in recency order
          (most recently inserted or touched first), at most ⌊b⌋ (≥ 1) of them, where the
          anchor starts at b = (max_window − w)·s + min_bfs_breadth and each level takes
          s off, s = (max_bfs_breadth − min_bfs_breadth) / (max_window − min_window + 1):
          a longer match branches less.
    PROB  best first by path probability: a node's children are its max_bfs_breadth most
          frequent (ties to the lower token), each with freq ÷ their freq sum × the
          parent's probability; the most probable candidate is taken next (one max-heap
          across anchors, its ties broken as libstdc++'s std::priority_queue breaks them,
          reproduced here move for move).

The tree goes out breadth first (`fillResult`) and is padded to exactly num_draft_tokens
tokens with token 0 under the root, so every step verifies num_draft_tokens tokens, a
match or not. Siblings keep the tree's index order; the engine lays out a node's children
in its `std::unordered_map`'s iteration order, this module in the order they were added
(the nodes in the tree are the same; only their numbering differs).

Verification (`NgramVerifyInput.verify`, sgl-kernel's `verify_tree_greedy` and
`tree_speculative_sampling_target_only`): greedy, from the root, the first child (index
order) that is the target's argmax is accepted, then its children, and so on; sampled,
one coin u per depth, the children tried in order and child c accepted when u ≤ the sum
of p(child) over the children tried so far; on no match the next token is drawn from p
with the tried tokens taken out. With distinct siblings the child accepted is c with
probability p(c) and the emitted token is distributed as p, so walking a target sample
(the reference) down the tree is exact in distribution (`probe.ngram`). The padding is
the exception: k > 1 padding siblings all token 0 add p(0) k times, so SGLang accepts
token 0 at the root with probability min(k·p(0), what the real children leave) — its own
bias, reproduced by simulate (it verifies the padded tree) and not by diagnose's walk.

Not read: --speculative-ngram-* batch-size overrides (batch_min_match_window_size,
batch_draft_token_num; unset by default) and newer releases' external corpus files."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

# SGLang's server_args defaults (speculative_ngram_*; num_draft_tokens: _handle_ngram's 12)
DEFAULTS: dict[str, int | str] = {
    "min_match_window_size": 1,
    "max_match_window_size": 12,
    "min_bfs_breadth": 1,
    "max_bfs_breadth": 10,
    "match_type": "BFS",
    "branch_length": 18,
    "capacity": 10_000_000,
    "num_draft_tokens": 12,
}
MATCH_TYPES = ("BFS", "PROB")


def check(knobs: dict[str, int | str]) -> str | None:
    """The C++ constructor's checks (`Ngram::Ngram`) -> what is wrong, or None."""
    lo, hi, branch = int(knobs["min_match_window_size"]), int(knobs["max_match_window_size"]), int(knobs["branch_length"])
    if branch <= 1:
        return f"branch_length={branch} must be greater than 1"
    if lo <= 0:
        return f"min_match_window_size={lo} must be greater than 0"
    if lo > hi:
        return f"min_match_window_size={lo} is above max_match_window_size={hi}"
    if hi >= branch:
        return f"max_match_window_size={hi} must be less than branch_length={branch}"
    if int(knobs["min_bfs_breadth"]) <= 0:
        return f"min_bfs_breadth={knobs['min_bfs_breadth']} must be greater than 0"
    if int(knobs["min_bfs_breadth"]) > int(knobs["max_bfs_breadth"]):
        return f"min_bfs_breadth={knobs['min_bfs_breadth']} is above max_bfs_breadth={knobs['max_bfs_breadth']}"
    if str(knobs["match_type"]).upper() not in MATCH_TYPES:
        return f"match_type={knobs['match_type']} is neither BFS nor PROB"
    if int(knobs["capacity"]) < branch + 1:
        return f"capacity={knobs['capacity']} cannot hold one branch of {branch} nodes and the root"
    return None


class _TNode:
    __slots__ = ("child", "freq", "parent", "token")

    def __init__(self, token: int, parent: _TNode | None) -> None:
        self.token = token
        self.parent = parent
        self.freq = 0
        # children by token; the order is the recency list: the last is the front
        self.child: OrderedDict[int, _TNode] = OrderedDict()

    def recent(self) -> list[_TNode]:
        """The children, most recently inserted or touched first (the engine's `lru`)."""
        return list(reversed(self.child.values()))

    def by_freq(self) -> list[_TNode]:
        """The children by count, ties to the lower token (`sorted_children`)."""
        return sorted(self.child.values(), key=lambda c: (-c.freq, c.token))


@dataclass
class NgramTree:
    """One step's draft tree: tokens[0] is the root (the last token), parents[i] the index
    of node i's parent (−1 for the root), index order breadth first; `real` nodes were
    drafted, the rest (token 0 under the root) pad it to num_draft_tokens tokens."""

    tokens: list[int]
    parents: list[int]
    real: int

    @property
    def width(self) -> int:
        """Tokens verified beside the root."""
        return len(self.tokens) - 1

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        return kids

    def depths(self) -> list[int]:
        out = [0] * len(self.tokens)
        for i in range(1, len(self.tokens)):
            out[i] = out[self.parents[i]] + 1
        return out

    def accepted(self, following: Sequence[int]) -> int:
        """How many of `following` the tree's longest matching path takes: from the root,
        the first child (index order) with the next token, as greedy verification walks."""
        kids = self.children()
        cur, n = 0, 0
        while n < len(following):
            nxt = next((c for c in kids[cur] if self.tokens[c] == int(following[n])), None)
            if nxt is None:
                break
            cur, n = nxt, n + 1
        return n

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf token path (the root left out)."""
        kids = self.children()
        out: list[list[int]] = []

        def go(i: int, acc: list[int]) -> None:
            if not kids[i]:
                out.append(acc)
                return
            for c in kids[i]:
                go(c, [*acc, self.tokens[c]])

        go(0, [])
        return out


class TrieCache:
    """SGLang's `TrieCache` (module doc)."""

    def __init__(self, capacity: int, min_window: int, max_window: int, branch_length: int, min_bfs: int, max_bfs: int, match_type: str) -> None:
        self.capacity, self.min_window, self.max_window = capacity, min_window, max_window
        self.branch_length, self.min_bfs, self.max_bfs = branch_length, min_bfs, max_bfs
        self.match_type = match_type.upper()
        self.reset()

    def reset(self) -> None:
        self.root = _TNode(-1, None)
        self.free = self.capacity - 1  # the root takes one
        self.lru: OrderedDict[_TNode, None] = OrderedDict()  # first: most recent

    @property
    def nodes(self) -> int:
        return self.capacity - 1 - self.free

    def insert(self, tokens: Sequence[int]) -> None:
        toks = [int(t) for t in tokens]
        n = len(toks)
        for i in range(n - self.min_window):  # i + min_match_window_size < len
            seg = toks[i : i + min(n - i, self.branch_length)]
            if len(seg) > self.free:
                self._squeeze(len(seg) - self.free)
            cursor = self.root
            path: list[_TNode] = []
            for tok in seg:
                node = cursor.child.get(tok)
                if node is None:
                    node = _TNode(tok, cursor)
                    node.freq = 1
                    cursor.child[tok] = node  # the front of the parent's recency list
                    self.free -= 1
                    self.lru[node] = None  # the back of the global LRU
                else:
                    node.freq += 1
                    cursor.child.move_to_end(tok)
                cursor = node
                path.append(node)
            for node in reversed(path):  # deepest first: the path's head ends in front
                self.lru.move_to_end(node, last=False)

    def _squeeze(self, count: int) -> None:
        if self.nodes < count:
            raise RuntimeError(f"the n-gram trie cannot free {count} nodes")
        for _ in range(count):
            last, _ = self.lru.popitem(last=True)
            if last.child:
                raise RuntimeError("the least recently used trie node still has children")
            assert last.parent is not None
            del last.parent.child[last.token]
            self.free += 1

    def match(self, context: Sequence[int]) -> list[tuple[_TNode, int]]:
        """Anchors: (node, window) for every window from the longest down whose last
        tokens are a path from the root."""
        ctx = [int(t) for t in context]
        out = []
        for w in range(min(len(ctx), self.max_window), self.min_window - 1, -1):
            cursor: _TNode | None = self.root
            for tok in ctx[len(ctx) - w :]:
                cursor = cursor.child.get(tok) if cursor is not None else None
                if cursor is None:
                    break
            if cursor is not None:
                out.append((cursor, w))
        return out

    def build(self, context: Sequence[int], last_token: int, draft_token_num: int) -> NgramTree:
        """The tree of at most draft_token_num nodes below the root (BFS or PROB), padded."""
        anchors = self.match(context)
        tree: list[dict[int, int]] = [{} for _ in range(draft_token_num + 1)]
        if self.match_type == "BFS":
            cursor = self._recency(anchors, tree, draft_token_num)
        else:
            cursor = self._frequency(anchors, tree, draft_token_num)
        return _fill(last_token, draft_token_num + 1, tree, cursor - 1)

    def _recency(self, anchors: list[tuple[_TNode, int]], tree: list[dict[int, int]], limit: int) -> int:
        scale = float(self.max_bfs - self.min_bfs) / float(self.max_window - self.min_window + 1)
        cursor = 1
        for node, depth in anchors:
            queue: deque[tuple[int, float, _TNode]] = deque([(0, (self.max_window - depth) * scale + self.min_bfs, node)])
            while queue and cursor <= limit:
                parent, breadth_f, tn = queue.popleft()
                breadth = max(1, int(breadth_f))  # int32_t(double): toward zero
                for i, child in enumerate(tn.recent()):
                    if i >= breadth or cursor > limit:
                        break
                    pos = tree[parent].get(child.token)
                    if pos is None:
                        pos = tree[parent][child.token] = cursor
                        cursor += 1
                    queue.append((pos, breadth_f - scale, child))
        return cursor

    def _frequency(self, anchors: list[tuple[_TNode, int]], tree: list[dict[int, int]], limit: int) -> int:
        heap = _Heap()
        top_k = self.max_bfs

        def add(parent: int, tn: _TNode, prob: float) -> None:
            kids = tn.by_freq()[:top_k]
            total = float(sum(c.freq for c in kids))
            if total <= 0:
                total = 1.0
            for c in kids:
                heap.push((parent, c, float(c.freq) / total * prob))

        cursor = 1
        for node, _ in anchors:
            add(0, node, 1.0)
            while heap and cursor <= limit:
                parent, tn, prob = heap.pop()
                pos = tree[parent].get(tn.token)
                if pos is None:
                    pos = tree[parent][tn.token] = cursor
                    cursor += 1
                add(pos, tn, prob)
        return cursor


class _Heap:
    """std::priority_queue over (parent, node, prob) by prob, with libstdc++'s
    push_heap/pop_heap moves (so equal probabilities leave in the engine's order)."""

    def __init__(self) -> None:
        self.a: list[tuple[int, _TNode, float]] = []

    def __bool__(self) -> bool:
        return bool(self.a)

    def push(self, item: tuple[int, _TNode, float]) -> None:
        self.a.append(item)
        self._up(len(self.a) - 1, 0, item)

    def _up(self, hole: int, top: int, value: tuple[int, _TNode, float]) -> None:
        a = self.a
        parent = (hole - 1) // 2
        while hole > top and a[parent][2] < value[2]:
            a[hole] = a[parent]
            hole = parent
            parent = (hole - 1) // 2
        a[hole] = value

    def pop(self) -> tuple[int, _TNode, float]:
        a = self.a
        top = a[0]
        if len(a) > 1:
            value = a[-1]
            a[-1] = a[0]
            n = len(a) - 1  # __adjust_heap over the first n
            hole, second = 0, 0
            while second < (n - 1) // 2:
                second = 2 * (second + 1)
                if a[second][2] < a[second - 1][2]:
                    second -= 1
                a[hole] = a[second]
                hole = second
            if n % 2 == 0 and second == (n - 2) // 2:
                second = 2 * (second + 1)
                a[hole] = a[second - 1]
                hole = second - 1
            self._up(hole, 0, value)
        a.pop()
        return top


def _fill(last_token: int, size: int, tree: list[dict[int, int]], real: int) -> NgramTree:
    """`fillResult`: breadth first from the root, then token 0 under the root up to size."""
    tokens, parents = [int(last_token)], [-1]
    queue: deque[tuple[int, int, int]] = deque((tok, nxt, 0) for tok, nxt in tree[0].items())
    while queue:
        tok, nxt, prev = queue.popleft()
        tokens.append(tok)
        parents.append(prev)
        here = len(tokens) - 1
        queue.extend((t, n, here) for t, n in tree[nxt].items())
    while len(tokens) < size:
        tokens.append(0)
        parents.append(0)
    return NgramTree(tokens, parents, real)


class SglangSlot:
    """One request at a time of an SGLang server's NGRAM worker over the server's trie:
    `propose` first inserts what the last verify step left (the sequence's last
    branch_length tokens; nothing before the first draft: the prompt's pass inserts
    nothing), then drafts from the last max_match_window_size tokens; `finish` inserts
    after the request's last verify step."""

    def __init__(self, cache: TrieCache, num_draft_tokens: int) -> None:
        self.cache = cache
        self.limit = num_draft_tokens - 1
        self.pending = False  # a verify step ran whose tokens are not inserted yet

    def begin(self, prompt: Sequence[int]) -> None:
        self.pending = False

    def _update(self, history: Sequence[int]) -> None:
        if self.pending:
            self.cache.insert(list(history[-self.cache.branch_length :]))
            self.pending = False

    def propose_tree(self, history: Sequence[int]) -> NgramTree:
        self._update(history)
        ctx = list(history[-self.cache.max_window :])
        tree = self.cache.build(ctx, int(history[-1]), self.limit)
        self.pending = True
        return tree

    def finish(self, history: Sequence[int]) -> None:
        self._update(history)

    def observe(self, history: Sequence[int]) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass
