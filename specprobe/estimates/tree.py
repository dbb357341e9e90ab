"""Draft trees: their shapes, the nodes an engine picks, and what a tree accepts. Pure numpy.

A chain drafts K tokens and the target accepts a prefix. A tree drafts several candidates
per step; the target verifies every node in one pass under a tree attention mask and
keeps the longest accepted path. Two kinds of tree are built here:

- **dynamic** (SGLang's EAGLE/EAGLE-3/STANDALONE, TensorRT-LLM's `use_dynamic_tree`, the
  EAGLE-2 algorithm): `steps` S, `topk` T, `tokens` N (nodes verified, the root — the last
  verified token — included). Step 1 takes the drafter's T most probable tokens; each later
  step expands every one of the T current beams by its T most probable children, scores a
  child by the product of draft probabilities along its path, and keeps the T best of the
  T² as the next beams. Every expanded node joins the candidate list (T + (S−1)·T² nodes);
  the N − 1 with the highest scores are verified.
- **static** (Medusa's `medusa_choices`, TensorRT-LLM's `eagle_choices`): a list of paths of
  candidate ranks, `[[0], [0, 0], [1], …]`: node (r₁ … r_d) is the rank-r_d candidate at
  depth d below node (r₁ … r_{d−1}).

Verification walks the tree from the root. Greedy: the child whose token is the target's
argmax is accepted. Sampled (SGLang's `tree_speculative_sampling_target_only` with its
thresholds at 1, TensorRT-LLM's sample-and-compare): the children are tried against one
target sample, so the child c is accepted with probability p(c) — the emitted token is
still an exact target sample. Either way the probability that a node is on the accepted
path is Π p(token) along its path (p one-hot under a greedy target), and a round accepts
depth j with probability Σ over the verified depth-j nodes of that product. SGLang's
thresholds below 1 replace each p(token) by its child's closed-form acceptance given the
siblings tried before it (`sibling_accept`).

Teacher-forced (the chain's estimate, extended): the candidates and probabilities at
depth d of a round starting at t are those of the depth-d prediction of token t + d − 1
along the reference, for every node at that depth. For T = 1, N = S + 1 this is exactly
the chain's r_j(t) = Π_{i<j} α^{(i+1)}_{t+i}. Derivations: docs/maths.md §4b."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

# The most candidates per step a run collects (and so the widest topk it can estimate).
MAX_TOPK = 10
# The recommendation grid: SGLang's knobs over the values its docs and launches use.
GRID_TOPK = (1, 2, 4, 8)
GRID_TOKENS = (4, 8, 16, 32, 64)


@dataclass(frozen=True)
class TreeShape:
    """One tree. Dynamic: `paths` empty, the EAGLE-2 selection of (steps, topk, tokens).
    Static: `paths` the rank paths (0-based), steps/topk/tokens derived from them."""

    steps: int  # depth S
    topk: int  # candidates per step (dynamic); the widest rank + 1 (static)
    tokens: int  # nodes verified, the root included (N)
    paths: tuple[tuple[int, ...], ...] = ()

    @property
    def static(self) -> bool:
        return bool(self.paths)

    @property
    def chain(self) -> bool:
        """A single path of `steps` drafts: what every chain estimate computes."""
        return self.topk == 1 and self.tokens == self.steps + 1

    @property
    def draft_tokens(self) -> int:
        return self.tokens - 1

    def label(self) -> str:
        if self.static:
            return f"static tree: {len(self.paths)} nodes, depth {self.steps}, width {self.topk}"
        return f"steps={self.steps},topk={self.topk},tokens={self.tokens}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": self.steps, "topk": self.topk, "tokens": self.tokens}
        if self.static:
            out["paths"] = [list(p) for p in self.paths]
        return out


def max_tokens(steps: int, topk: int) -> int:
    """The most nodes a dynamic tree can verify, the root included: 1 + T + (S−1)·T²."""
    return 1 + topk + (steps - 1) * topk * topk


def dynamic(steps: int, topk: int, tokens: int) -> TreeShape:
    """A dynamic tree, checked: ValueError says what is wrong and what to use."""
    if steps < 1 or topk < 1:
        raise ValueError(f"steps and topk must be at least 1 (got steps={steps}, topk={topk})")
    if topk > MAX_TOPK:
        raise ValueError(f"topk={topk} is wider than specprobe collects; use topk ≤ {MAX_TOPK}")
    top = max_tokens(steps, topk)
    if not 2 <= tokens <= top:
        raise ValueError(f"tokens={tokens} does not fit steps={steps}, topk={topk}; use 2 ≤ tokens ≤ {top} (1 + topk + (steps − 1)·topk²)")
    return TreeShape(steps, topk, tokens)


def static(paths: Any) -> TreeShape:
    """A static tree from its rank paths (a list of lists of ints), checked: every path's
    prefix is itself a path, ranks are ≥ 0 and < MAX_TOPK, no path twice."""
    if not isinstance(paths, list | tuple) or not paths:
        raise ValueError("a static tree is a non-empty list of paths, e.g. [[0], [0, 0], [1]]")
    out: list[tuple[int, ...]] = []
    for p in paths:
        if not isinstance(p, list | tuple) or not p or not all(isinstance(r, int) and not isinstance(r, bool) for r in p):
            raise ValueError(f"tree path {p!r} is not a non-empty list of candidate ranks (ints)")
        if any(r < 0 or r >= MAX_TOPK for r in p):
            raise ValueError(f"tree path {list(p)} has a rank outside 0..{MAX_TOPK - 1}")
        out.append(tuple(int(r) for r in p))
    seen = set(out)
    if len(seen) != len(out):
        raise ValueError("a static tree lists a path twice")
    for p in out:
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"tree path {list(p)} has no parent path {list(p[:-1])}: list every prefix")
    ordered = tuple(sorted(out, key=lambda p: (len(p), p)))
    return TreeShape(max(len(p) for p in ordered), max(max(p) for p in ordered) + 1, len(ordered) + 1, ordered)


def parse(text: str) -> TreeShape:
    """`steps=S,topk=T,tokens=N` (SGLang's three knobs; tokens defaults to the whole tree
    when topk = 1, i.e. steps + 1) or a JSON list of rank paths (a static tree)."""
    s = text.strip()
    if s.startswith("["):
        try:
            paths = json.loads(s)
        except json.JSONDecodeError as e:
            raise ValueError(f"the static tree is not a JSON list of paths ({e.msg})") from None
        return static(paths)
    vals: dict[str, int] = {}
    for part in s.split(","):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in ("steps", "topk", "tokens"):
            raise ValueError(f"{part.strip()!r} is not steps=S, topk=T or tokens=N")
        try:
            vals[key] = int(val)
        except ValueError:
            raise ValueError(f"{key}={val.strip()!r} is not an integer") from None
    if "steps" not in vals:
        raise ValueError("a tree needs steps=S (its depth)")
    steps, topk = vals["steps"], vals.get("topk", 1)
    if "tokens" not in vals and topk != 1:
        raise ValueError("a tree with topk > 1 needs tokens=N (the nodes verified, the root included)")
    return dynamic(steps, topk, vals.get("tokens", steps + 1))


# ----------------------------------------------------------------------------- node tables
@dataclass(frozen=True)
class Nodes:
    """A tree's candidate nodes for n rounds at once (node index order: a parent before its
    children). depth [M] (1-based) and rank [M] (0-based, among the parent's candidates)
    are the same for every round; parent [n, M] (−1: the root) and score [n, M] (the
    product of draft probabilities along the path) are per round; verified [n, M] marks
    the nodes the engine verifies."""

    depth: np.ndarray
    rank: np.ndarray
    parent: np.ndarray
    score: np.ndarray
    verified: np.ndarray


def top_desc(x: np.ndarray, k: int) -> np.ndarray:
    """[n, m] -> [n, k] column indices of the k largest values per row, largest first, ties
    to the lower index (the engines' top-k on sorted candidates)."""
    return np.argsort(-x, axis=1, kind="stable")[:, :k]


def dynamic_nodes(q: np.ndarray, steps: int, topk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """EAGLE-2's expansion for n rounds: q [n, S', T'] the draft probabilities of the
    candidates at each depth (sorted, largest first; S' ≥ steps, T' ≥ topk), the same for
    every node at a depth (teacher-forced) -> depth [M], rank [M], parent [n, M], score [n, M]
    with M = T + (S−1)·T²; level i ≥ 1 holds beam b's children at b·T + r."""
    n = q.shape[0]
    t = topk
    m = t + (steps - 1) * t * t
    depth = np.empty(m, dtype=np.int64)
    rank = np.empty(m, dtype=np.int64)
    parent = np.full((n, m), -1, dtype=np.int64)
    score = np.zeros((n, m))
    depth[:t], rank[:t] = 1, np.arange(t)
    score[:, :t] = q[:, 0, :t]
    beams = np.broadcast_to(np.arange(t), (n, t))
    for i in range(1, steps):
        base = t + (i - 1) * t * t
        sl = slice(base, base + t * t)
        depth[sl] = i + 1
        rank[sl] = np.tile(np.arange(t), t)
        parent[:, sl] = np.repeat(beams, t, axis=1)
        level = np.take_along_axis(score, beams, axis=1)[:, :, None] * q[:, i, None, :t]  # [n, T, T]
        score[:, sl] = level.reshape(n, t * t)
        beams = base + top_desc(score[:, sl], t)
    return depth, rank, parent, score


def static_nodes(q: np.ndarray, shape: TreeShape) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A static tree's nodes for n rounds (every node verified) -> depth, rank, parent, score."""
    n = q.shape[0]
    index = {p: i for i, p in enumerate(shape.paths)}
    depth = np.asarray([len(p) for p in shape.paths], dtype=np.int64)
    rank = np.asarray([p[-1] for p in shape.paths], dtype=np.int64)
    par = np.asarray([index[p[:-1]] if len(p) > 1 else -1 for p in shape.paths], dtype=np.int64)
    score = np.zeros((n, len(shape.paths)))
    for i, p in enumerate(shape.paths):
        own = q[:, len(p) - 1, p[-1]]
        score[:, i] = own if par[i] < 0 else score[:, par[i]] * own
    return depth, rank, np.broadcast_to(par, (n, len(par))).copy(), score


def select(score: np.ndarray, depth: np.ndarray, steps: int, tokens: int) -> np.ndarray:
    """[n, M] which nodes are verified: the tokens − 1 best scores among depth ≤ steps,
    ties to the lower index (so a parent, scored at least as high, comes first)."""
    live = np.where(depth[None, :] <= steps, score, -np.inf)
    pick = top_desc(live, tokens - 1)
    out = np.zeros(score.shape, dtype=bool)
    np.put_along_axis(out, pick, True, axis=1)
    return out & np.isfinite(live)


EXACT = (1.0, 1.0)  # SGLang's (threshold_single, threshold_acc) off: exact verification


def relaxed(thresholds: tuple[float, float]) -> bool:
    """Whether SGLang's thresholds relax the verification (either below 1)."""
    return min(thresholds) < 1


def sibling_accept(p: np.ndarray, parent: np.ndarray, thresholds: tuple[float, float], included: np.ndarray | None = None) -> np.ndarray:
    """[n, M] each child's probability of being accepted once its parent is on the accepted
    path, under SGLang's `tree_speculative_sampling_target_only` with its thresholds: p [n, M]
    each node's target probability after its parent's path, parent [n, M] (−1: the root),
    included [n, M] the nodes in the tree (default all). The kernel draws one coin u per
    accepted node and tries its children in index order (the parent's rank order) with
    P_j the sum of the target probabilities of the children tried so far, accepting child
    j when u ≤ P_j ÷ θ_acc or p_j ≥ θ_single. P_j only grows, so child j is accepted with
    min(P_j/θ_acc, 1) − min(P_{j−1}/θ_acc, 1) before the first child j* with p ≥ θ_single,
    1 − min(P_{j*−1}/θ_acc, 1) at j*, and 0 after it. θ_acc is clamped at 1e-9 as the
    kernel does. At (1, 1) this is p_j up to round-off (`path_probs` keeps p there)."""
    single, acc = float(thresholds[0]), max(float(thresholds[1]), 1e-9)
    n, m = parent.shape
    rows = np.arange(n)
    tried = np.zeros((n, m + 1))  # by parent + 1: Σ p of the children tried so far
    done = np.zeros((n, m + 1), dtype=bool)  # by parent + 1: a child with p ≥ θ_single came first
    inc = np.ones((n, m), dtype=bool) if included is None else included
    out = np.zeros((n, m))
    for j in range(m):
        slot = parent[:, j] + 1
        before, blocked = tried[rows, slot], done[rows, slot]
        pj = p[:, j]
        lo = np.minimum(before / acc, 1.0)
        outright = pj >= single
        got = np.where(outright, 1.0 - lo, np.minimum((before + pj) / acc, 1.0) - lo)
        out[:, j] = np.where(blocked | ~inc[:, j], 0.0, np.maximum(got, 0.0))
        tried[rows, slot] = before + np.where(inc[:, j], pj, 0.0)
        done[rows, slot] = blocked | (outright & inc[:, j])
    return out


def path_probs(accept: np.ndarray, depth: np.ndarray, rank: np.ndarray, parent: np.ndarray, thresholds: tuple[float, float] = EXACT) -> np.ndarray:
    """[n, M] the probability that each node is on the accepted path: accept [n, S', T'] the
    acceptance probability of each depth's candidates (p(c), one-hot under a greedy target),
    multiplied along the path (parents have lower indices). With SGLang's thresholds below
    1 a child's own acceptance depends on its elder siblings (`sibling_accept`): taken
    over every expanded sibling, which for a verified node of a dynamic tree are exactly
    its verified ones (a parent's children are scored parent · q_r with q sorted, so the
    verified ones are a rank prefix), and every node of a static tree is verified."""
    n, m = parent.shape
    own = accept[:, depth - 1, rank]  # [n, M]
    if relaxed(thresholds):
        own = sibling_accept(own, parent, thresholds)
    out = np.empty((n, m))
    rows = np.arange(n)
    for j in range(m):
        par = parent[:, j]
        out[:, j] = own[:, j] * np.where(par < 0, 1.0, out[rows, np.maximum(par, 0)])
    return out


@dataclass(frozen=True)
class TreeRounds:
    """What one tree accepts for n rounds (teacher-forced). survival [S+1, n]: r_j(t) the
    probability that a round starting at t accepts depths 1..j (r_0 = 1); by_rank [S, T, n]
    the probability that the accepted depth-d node is its parent's rank-r candidate."""

    survival: np.ndarray
    by_rank: np.ndarray


def rounds(shape: TreeShape, q: np.ndarray, accept: np.ndarray, thresholds: tuple[float, float] = EXACT) -> TreeRounds:
    """A tree's rounds from the teacher-forced candidates: q [n, S', T'] their draft
    probabilities (sorted per depth), accept [n, S', T'] their target probabilities
    (one-hot under a greedy target); thresholds: SGLang's (single, acc)."""
    if shape.static:
        depth, rank, parent, score = static_nodes(q, shape)
        verified = np.ones(score.shape, dtype=bool)
    else:
        depth, rank, parent, score = dynamic_nodes(q, shape.steps, shape.topk)
        verified = select(score, depth, shape.steps, shape.tokens)
    return tally(shape, Nodes(depth, rank, parent, score, verified), path_probs(accept, depth, rank, parent, thresholds))


def cells(shape: TreeShape, depth: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """[M, S·T] node -> its (depth, rank) cell (0 for nodes deeper than the tree): the
    matrix `tally` sums path probabilities with. The same for every round of a shape."""
    group = np.zeros((len(depth), shape.steps * shape.topk))
    idx = np.flatnonzero((depth <= shape.steps) & (rank < shape.topk))
    group[idx, (depth[idx] - 1) * shape.topk + rank[idx]] = 1.0
    return group


def tally(shape: TreeShape, nodes: Nodes, prob: np.ndarray, group: np.ndarray | None = None) -> TreeRounds:
    """Sum the verified nodes' path probabilities by depth and by (depth, rank) (group:
    `cells` of the shape, when the caller keeps it)."""
    n = prob.shape[0]
    w = np.where(nodes.verified, prob, 0.0)  # [n, M]
    if group is None:
        group = cells(shape, nodes.depth, nodes.rank)
    by_rank = (w @ group).reshape(n, shape.steps, shape.topk).transpose(1, 2, 0)  # [S, T, n]
    surv = np.ones((shape.steps + 1, n))
    surv[1:] = by_rank.sum(axis=1)
    return TreeRounds(np.clip(surv, 0.0, 1.0), by_rank)


def reach(steps: int, n: int, starts: np.ndarray | None = None) -> np.ndarray:
    """[S, R] whether a round starting at t (default: every t < n) drafts depth d: a round
    at t drafts at most n − 1 − t deep."""
    t = np.arange(n) if starts is None else np.asarray(starts)
    return np.arange(1, steps + 1)[:, None] <= (n - 1 - t)[None, :]


@dataclass
class Shift:
    """The mean difference (drafted on the candidate paths − along the reference) of a
    round's survival per depth [S] and of its rank table per (depth, rank) [S, T], over
    the starts where both were computed and the depth is drafted (`count` [S] of them),
    with the standard error of the survival's mean [S]."""

    survival: np.ndarray
    by_rank: np.ndarray
    count: np.ndarray
    se: np.ndarray

    def moved(self, k: float) -> Shift:
        """The survival's shift k standard errors away (by_rank unchanged)."""
        return Shift(self.survival + k * np.nan_to_num(self.se), self.by_rank, self.count, self.se)


def mean_shift(pairs: list[tuple[TreeRounds, np.ndarray, TreeRounds]]) -> Shift:
    """pairs: (a reference's rounds along the reference [all n starts], the starts drafted
    on their paths, those starts' rounds drafted on their paths) -> the `Shift`."""
    s, t = pairs[0][0].by_rank.shape[:2]
    tot, sq, cnt, rank = np.zeros(s), np.zeros(s), np.zeros(s), np.zeros((s, t))
    for ref, at, drafted in pairs:
        live = reach(s, ref.survival.shape[1], at)  # [S, R]
        d = (drafted.survival[1:] - ref.survival[1:, at]) * live
        tot += d.sum(axis=1)
        sq += (d * d).sum(axis=1)
        cnt += live.sum(axis=1)
        rank += ((drafted.by_rank - ref.by_rank[:, :, at]) * live[:, None, :]).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0)
        var = np.where(cnt > 1, (sq - cnt * mean * mean) / np.maximum(cnt - 1, 1), np.nan)
        se = np.sqrt(np.maximum(var, 0.0) / np.maximum(cnt, 1))
    return Shift(mean, np.where(cnt[:, None] > 0, rank / np.maximum(cnt, 1)[:, None], 0.0), cnt, se)


def shifted(ref: TreeRounds, at: np.ndarray, drafted: TreeRounds, shift: Shift) -> TreeRounds:
    """One reference's rounds for every start: the drafted starts' own, every other start's
    along the reference plus the mean shift (the difference estimator of sampling: the
    sum over starts is the reference's sum plus n times the mean difference), kept a
    survival (within [0, 1], never rising with depth) and zero past each start's reach."""
    s, n = ref.by_rank.shape[0], ref.survival.shape[1]
    live = reach(s, n)
    surv = ref.survival.copy()
    surv[1:] = np.where(live, np.clip(surv[1:] + shift.survival[:, None], 0.0, 1.0), 0.0)
    rank = np.where(live[:, None, :], np.maximum(ref.by_rank + shift.by_rank[:, :, None], 0.0), 0.0)
    surv[:, at] = drafted.survival
    rank[:, :, at] = drafted.by_rank
    return TreeRounds(np.minimum.accumulate(surv, axis=0), rank)


def round_windows(per_token: list[np.ndarray]) -> np.ndarray:
    """Per-depth arrays indexed by predicted token ([n, T'] each; depth d at index d − 1) ->
    [n, D, T'] the candidates of a round starting at t: depth d from token t + d − 1 (zero
    past the end of the sequence, where no round drafts)."""
    d = len(per_token)
    n, w = per_token[0].shape
    out = np.zeros((n, d, w))
    for i, a in enumerate(per_token):
        if i < n:
            out[: n - i, i] = a[i:]
    return out


def chain_survival(depth_alpha: np.ndarray, steps: int) -> np.ndarray:
    """The chain's r_j(t) (`estimate.survival`) for j ≤ steps: the reference the T = 1 tree
    must reproduce."""
    from specprobe.estimates.estimate import survival

    return survival(depth_alpha[:steps])[: steps + 1]


def grid(k_max: int, topk_max: int) -> list[TreeShape]:
    """The dynamic trees the recommendation compares: steps 1..k_max, topk in GRID_TOPK up
    to the width collected, tokens in GRID_TOKENS that fit (and the chain, tokens = S + 1)."""
    out: list[TreeShape] = []
    for s in range(1, k_max + 1):
        for t in GRID_TOPK:
            if t > topk_max:
                continue
            if t == 1:
                out.append(TreeShape(s, 1, s + 1))
                continue
            for n in GRID_TOKENS:
                if n <= max_tokens(s, t):
                    out.append(TreeShape(s, t, n))
    return out
