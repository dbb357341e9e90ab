"""Draft trees in the teacher-forced scoring: each depth's top candidates as the scorer
passes them (`candidates`), and the mergeable sums of what every tree in a run's grid
accepts (`TreeAccumulator`). The tree maths itself is `specprobe.estimates.tree`.

Per scored token and depth the scorer keeps the drafter's W most probable tokens under a
plain softmax of its logits (temperature 1: what SGLang ranks and scores tree nodes by),
sorted, and each one's acceptance probability under the run's target: p(c) from the
target's sampling distribution, or 1[c = argmax p] when the target is greedy (SGLang's
thresholds below 1 act on these per sibling in `estimates.tree.path_probs`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specprobe.estimates.estimate import (
    renewal_from_survival,
    renewal_tau,
    renewal_tokens_per_verify,
)
from specprobe.estimates.tree import (
    EXACT,
    GRID_TOPK,
    Nodes,
    TreeRounds,
    TreeShape,
    cells,
    dynamic_nodes,
    grid,
    path_probs,
    reach,
    relaxed,
    round_windows,
    select,
    static_nodes,
    tally,
)

# Candidates kept per depth when a run estimates trees: the widest topk of the grid.
DEFAULT_WIDTH = max(GRID_TOPK)


def candidates(draft_logits: Any, target_probs: Any, width: int, ids: Any = None, greedy_col: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """One depth of one chunk: draft_logits [N, V'] (a head's kept draft columns when ids
    maps them to target ids, [Vs]); target_probs [N, V] the target's sampling distribution,
    or None with greedy_col [N] the target's argmax id (a greedy target) -> (q [N, W] the
    top-W draft probabilities, largest first; accept [N, W] each candidate's acceptance
    probability)."""
    import torch

    x = draft_logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    w = min(width, x.shape[-1])
    top, col = torch.topk(x, w, dim=-1)  # sorted, largest first
    q = (top - lse).exp_()
    tid = col if ids is None else ids.to(col.device)[col]
    if target_probs is None:
        acc = (tid == greedy_col.to(tid.device)[:, None]).float()
    else:
        acc = target_probs.gather(-1, tid).clamp_(0.0, 1.0)
    qn, an = q.cpu().numpy().astype(np.float64), acc.cpu().numpy().astype(np.float64)
    if w < width:  # a vocabulary narrower than the width: the missing candidates never score
        qn = np.pad(qn, ((0, 0), (0, width - w)))
        an = np.pad(an, ((0, 0), (0, width - w)))
    return qn, an


def passing(drafts: Iterable[tuple[int, Any]], target_logits: Any, target_sampling: Any, width: int, vocab: Any = None) -> tuple[Iterator[tuple[int, Any]], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Wrap a chunk's (depth, logits) stream: each depth's candidates are taken as its
    logits pass to the scorer -> (the same stream, depth -> (q, accept), filled as they
    pass). The target's sampling distribution is computed once per chunk."""
    from specprobe.metrics.sampling import probs

    seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    side: dict[str, Any] = {}

    def target() -> tuple[Any, Any]:
        if "p" not in side:
            if target_sampling.greedy:
                side["p"], side["col"] = None, target_logits.argmax(-1)
            else:
                side["p"], side["col"] = probs(target_logits, target_sampling), None
        return side["p"], side["col"]

    def run() -> Iterator[tuple[int, Any]]:
        for d, dl in drafts:
            p, col = target()
            x, ids = dl, None
            if x.shape[-1] > target_logits.shape[-1] and (vocab is None or (vocab.ids is None and vocab.keep is None)):
                x = x[:, : target_logits.shape[-1]]  # padding rows beyond the target's vocabulary are dropped
            if vocab is not None and (vocab.ids is not None or vocab.keep is not None):
                lse = dl.float().logsumexp(-1, keepdim=True)
                kept = dl if vocab.keep is None else dl.index_select(1, vocab.keep.to(dl.device))
                # normalised over the head's whole vocabulary, ranked over the kept columns
                x, ids = kept.float() - lse, vocab.ids
            seen[d] = candidates(x, p, width, ids, col)
            yield d, dl

    return run(), seen


# ----------------------------------------------------------------------------- the sums
@dataclass
class TreeSums:
    """One tree's sums over a run (mergeable by adding): the renewal counters at its depth
    (as `estimate.RenewalCounts`), the window survival Σ r_j(t) with its count, and the
    accepted node's rank per depth weighted by the rounds the loop would run."""

    steps: int
    topk: int
    tokens: float = 0.0
    rounds: float = 0.0
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [S] rounds accepting depths 1..i
    drafted: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [S] rounds drafting depth i
    window: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [S] Σ_t r_i(t) over the starts whose depth i lies inside
    windows: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [S] how many such starts
    by_rank: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [S, T]
    starts: np.ndarray | None = None  # one reference's P(a round starts at t) [n] (not summed)

    def __post_init__(self) -> None:
        for name in ("accepted", "drafted", "window", "windows"):
            if len(getattr(self, name)) != self.steps:
                setattr(self, name, np.zeros(self.steps))
        if self.by_rank.shape != (self.steps, self.topk):
            self.by_rank = np.zeros((self.steps, self.topk))

    def add(self, other: TreeSums) -> None:
        self.starts = None  # one reference's; a sum has none
        self.tokens += other.tokens
        self.rounds += other.rounds
        self.accepted += other.accepted
        self.drafted += other.drafted
        self.window += other.window
        self.windows += other.windows
        self.by_rank += other.by_rank

    def tau(self) -> float:
        """Mean acceptance length (bonus included), as the engines and `simulate` count it."""
        acc = np.zeros((self.steps, self.steps))
        dr = np.zeros((self.steps, self.steps))
        acc[-1], dr[-1] = self.accepted, self.drafted
        return float(renewal_tau(acc, dr)[-1])

    def tokens_per_verify(self) -> float:
        return float(renewal_tokens_per_verify(self.tokens, np.asarray([self.rounds]))[0])

    def tau_window(self) -> float:
        """1 + Σ_i (mean r_i over the starts whose depth i lies inside), as the chain's window τ."""
        if not np.all(self.windows > 0):
            return math.nan
        return 1.0 + float(np.sum(self.window / self.windows))

    def depth_accept(self) -> list[float]:
        """P(a round accepts depths 1..i), per round the loop drafts depth i."""
        return [float(a / d) if d > 0 else math.nan for a, d in zip(self.accepted, self.drafted, strict=True)]

    def rank_shares(self) -> list[list[float]]:
        """[S][T]: of the rounds accepting depth d, the share whose accepted node was its
        parent's rank-r candidate (rank 1 first)."""
        out = []
        for row in self.by_rank:
            tot = float(row.sum())
            out.append([float(x / tot) if tot > 0 else math.nan for x in row])
        return out

    def to_state(self) -> dict[str, Any]:
        return {"steps": self.steps, "topk": self.topk, "tokens": self.tokens, "rounds": self.rounds, "accepted": self.accepted.tolist(),
                "drafted": self.drafted.tolist(), "window": self.window.tolist(), "windows": self.windows.tolist(), "by_rank": self.by_rank.tolist()}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> TreeSums:
        return cls(int(s["steps"]), int(s["topk"]), float(s["tokens"]), float(s["rounds"]), np.asarray(s["accepted"], dtype=float),
                   np.asarray(s["drafted"], dtype=float), np.asarray(s["window"], dtype=float), np.asarray(s["windows"], dtype=float),
                   np.asarray(s["by_rank"], dtype=float).reshape(int(s["steps"]), int(s["topk"])))


def rounds_tau(shape: TreeShape, rounds: Iterable[tuple[TreeRounds, int]]) -> float:
    """τ of a tree from references' rounds (each with its length n), renewal as the sums do."""
    sums = TreeSums(shape.steps, shape.topk)
    for r, n in rounds:
        sums.add(_sequence_sums(shape, r.survival, r.by_rank, n))
    return sums.tau()


def _key(shape: TreeShape) -> str:
    return shape.label() if not shape.static else "static:" + ";".join(".".join(map(str, p)) for p in shape.paths)


@dataclass
class TreeAccumulator:
    """The sums of the run's own tree (`shape`, None for a chain run) and of every tree in
    the recommendation grid up to depth k_max, from each reference's candidates."""

    k_max: int
    width: int = DEFAULT_WIDTH
    shape: TreeShape | None = None
    sums: dict[str, TreeSums] = field(default_factory=dict)
    shapes: dict[str, TreeShape] = field(default_factory=dict)
    # the run's own tree, node by node: rank path -> [Σ rounds verifying it, Σ P(it is on
    # the accepted path)], rounds weighted by the probability that the loop starts one there
    nodes: dict[tuple[int, ...], list[float]] = field(default_factory=dict)
    _cells: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # each shape's `cells` (node layout fixed per shape)
    # the run's own tree with the drafter on every candidate path (`probe.tree_paths`):
    # its sums and node table, beside the teacher-forced ones above (None: not run)
    paths: TreeSums | None = None
    path_nodes: dict[tuple[int, ...], list[float]] = field(default_factory=dict)
    # the run's own tree along each reference (by its index), for a paths pass that drafts
    # only some starts and estimates the others from these (this process only: not saved)
    along: dict[int, TreeRounds] = field(default_factory=dict, repr=False)
    # that pass's stride, starts drafted and its shift with standard errors (`estimates.tree.Shift`)
    paths_sampling: dict[str, Any] | None = None
    # SGLang's (threshold_single, threshold_acc): below 1 a child's acceptance depends on
    # its elder siblings (`estimates.tree.sibling_accept`); (1, 1): exact verification
    thresholds: tuple[float, float] = EXACT

    def __post_init__(self) -> None:
        if not self.shapes:
            wanted = grid(self.k_max, self.width)
            if self.shape is not None and self.shape not in wanted:
                wanted.append(self.shape)
            self.shapes = {_key(s): s for s in wanted}
        for k, s in self.shapes.items():
            self.sums.setdefault(k, TreeSums(s.steps, s.topk))

    @property
    def own(self) -> TreeSums | None:
        return None if self.shape is None else self.sums[_key(self.shape)]

    def add_sequence(self, q_by_depth: Sequence[np.ndarray], accept_by_depth: Sequence[np.ndarray], ref: int | None = None) -> None:
        """One reference: per depth d (index d − 1) the candidates of the depth-d prediction
        of each token, [n, W] draft probabilities and acceptance probabilities (ref: the
        reference's index, under which the run's own tree's rounds are kept in `along`
        for a paths pass that drafts only some starts)."""
        q = round_windows(list(q_by_depth))  # [n, D, W]
        acc = round_windows(list(accept_by_depth))
        n = q.shape[0]
        if n == 0:
            return
        built: dict[tuple[int, int], tuple[Nodes, np.ndarray]] = {}
        for key, shape in self.shapes.items():
            if shape.static:
                depth, rank, parent, score = static_nodes(q, shape)
                nodes = Nodes(depth, rank, parent, score, np.ones(score.shape, dtype=bool))
                prob = path_probs(acc, depth, rank, parent, self.thresholds)
            else:
                # every steps ≤ k_max shares the deepest expansion of its topk: levels are prefixes
                deepest = max(s.steps for s in self.shapes.values() if not s.static and s.topk == shape.topk)
                if (shape.topk, deepest) not in built:
                    depth, rank, parent, score = dynamic_nodes(q, deepest, shape.topk)
                    built[(shape.topk, deepest)] = (Nodes(depth, rank, parent, score, np.ones(score.shape, dtype=bool)), path_probs(acc, depth, rank, parent, self.thresholds))
                full, prob = built[(shape.topk, deepest)]
                nodes = Nodes(full.depth, full.rank, full.parent, full.score, select(full.score, full.depth, shape.steps, shape.tokens))
            if key not in self._cells:
                self._cells[key] = cells(shape, nodes.depth, nodes.rank)
            counted = tally(shape, nodes, prob, self._cells[key])
            seq = _sequence_sums(shape, counted.survival, counted.by_rank, n)
            self.sums[key].add(seq)
            if shape == self.shape and seq.starts is not None:
                self._add_nodes(shape, nodes, prob, seq.starts, self.nodes)
            if shape == self.shape and ref is not None:
                self.along[ref] = counted

    def add_rounds(self, nodes: Nodes, prob: np.ndarray, full: TreeRounds | None = None, at: np.ndarray | None = None, n: int | None = None) -> None:
        """One reference's rounds of the run's own tree drafted on its candidate paths:
        the rounds' nodes (each round's own tree) and [R, M] each node's probability of
        being on the accepted path (`probe.tree_paths`). Every start drafted (R = n) by
        default; else the rounds at starts `at` of the reference's n, with `full` the
        rounds of every start to sum (`estimates.tree.shifted`), and the node table from
        the drafted starts weighted up to all n."""
        assert self.shape is not None
        if prob.shape[0] == 0:
            return
        n = prob.shape[0] if n is None else n
        counted = full if full is not None else tally(self.shape, nodes, prob)
        seq = _sequence_sums(self.shape, counted.survival, counted.by_rank, n)
        if self.paths is None:
            self.paths = TreeSums(self.shape.steps, self.shape.topk)
        self.paths.add(seq)
        if seq.starts is not None:
            rows = np.arange(n) if at is None else np.asarray(at)
            self._add_nodes(self.shape, nodes, prob, seq.starts[rows] * (n / len(rows)), self.path_nodes, rows, n)

    def _add_nodes(self, shape: TreeShape, nodes: Nodes, prob: np.ndarray, start: np.ndarray, into: dict[tuple[int, ...], list[float]],
                   at: np.ndarray | None = None, length: int | None = None) -> None:  # fmt: skip
        """Each verified node's rank path, summed over the rounds (weighted by `start`; the
        rounds start at `at` of a reference of `length`, default every start)."""
        n, m = prob.shape
        base = shape.topk + 1
        code = np.zeros((n, m), dtype=np.int64)
        rows = np.arange(n)
        for j in range(m):
            par = nodes.parent[:, j]
            code[:, j] = np.where(par < 0, 0, code[rows, np.maximum(par, 0)]) * base + nodes.rank[j] + 1
        # as the rank table: a round at t drafts only the depths up to n − 1 − t
        t = rows if at is None else np.asarray(at)
        within = nodes.depth[None, :] <= ((n if length is None else length) - 1 - t)[:, None]
        live = nodes.verified & (nodes.depth[None, :] <= shape.steps) & within
        codes, inv = np.unique(code[live], return_inverse=True)
        w = np.broadcast_to(start[:, None], (n, m))[live]
        ver = np.bincount(inv, weights=w, minlength=len(codes))
        acc = np.bincount(inv, weights=(w * prob[live]), minlength=len(codes))
        for c, v, a in zip(codes.tolist(), ver.tolist(), acc.tolist(), strict=True):
            path: list[int] = []
            while c:
                path.append(c % base - 1)
                c //= base
            cell = into.setdefault(tuple(reversed(path)), [0.0, 0.0])
            cell[0] += v
            cell[1] += a

    def node_table(self, limit: int = 64, paths: bool = False) -> list[dict[str, Any]]:
        """The run's tree node by node, most often verified first: its rank path, the share
        of rounds that verify it and the probability that it is on a round's accepted path
        (`paths`: from the rounds drafted on their candidate paths)."""
        own = self.paths if paths else self.own
        if own is None or not len(own.drafted) or own.drafted[0] <= 0:
            return []
        per = float(own.drafted[0])  # the rounds that drafted (the last token of a reference drafts nothing)
        rows = sorted((self.path_nodes if paths else self.nodes).items(), key=lambda kv: (-kv[1][0], len(kv[0]), kv[0]))[:limit]
        return [{"path": list(p), "verified": round(v / per, 6), "accepted": round(a / per, 6)} for p, (v, a) in sorted(rows, key=lambda kv: (len(kv[0]), kv[0]))]

    def merge(self, other: TreeAccumulator) -> TreeAccumulator:
        for k, s in other.sums.items():
            if k in self.sums:
                self.sums[k].add(s)
        for mine, theirs in ((self.nodes, other.nodes), (self.path_nodes, other.path_nodes)):
            for p, (v, a) in theirs.items():
                cell = mine.setdefault(p, [0.0, 0.0])
                cell[0] += v
                cell[1] += a
        if other.paths_sampling:  # shards drafted with their own strides and shifts: starts add up, the shift is the first's
            if not self.paths_sampling:
                self.paths_sampling = dict(other.paths_sampling)
            else:
                self.paths_sampling = {**self.paths_sampling, "starts": self.paths_sampling["starts"] + other.paths_sampling["starts"],
                                       "of": self.paths_sampling["of"] + other.paths_sampling["of"]}
        if other.paths is not None:
            if self.paths is None:
                self.paths = TreeSums(other.paths.steps, other.paths.topk)
            self.paths.add(other.paths)
        return self

    def to_state(self) -> dict[str, Any]:
        return {"k_max": self.k_max, "width": self.width, "shape": None if self.shape is None else self.shape.to_dict(),
                "sums": {k: s.to_state() for k, s in self.sums.items()}, "nodes": [[list(p), v] for p, v in self.nodes.items()],
                "paths": None if self.paths is None else self.paths.to_state(), "path_nodes": [[list(p), v] for p, v in self.path_nodes.items()],
                "paths_sampling": self.paths_sampling, **({"thresholds": list(self.thresholds)} if relaxed(self.thresholds) else {})}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> TreeAccumulator:
        from specprobe.estimates.tree import dynamic, static

        sh = s.get("shape")
        shape = None if sh is None else (static(sh["paths"]) if sh.get("paths") else dynamic(sh["steps"], sh["topk"], sh["tokens"]))
        th = s.get("thresholds") or EXACT
        acc = cls(int(s["k_max"]), int(s["width"]), shape, thresholds=(float(th[0]), float(th[1])))
        for k, v in s["sums"].items():
            if k in acc.sums:
                acc.sums[k] = TreeSums.from_state(v)
        acc.nodes = {tuple(p): [float(x) for x in v] for p, v in s.get("nodes", [])}
        if s.get("paths"):
            acc.paths = TreeSums.from_state(s["paths"])
        acc.path_nodes = {tuple(p): [float(x) for x in v] for p, v in s.get("path_nodes", [])}
        acc.paths_sampling = s.get("paths_sampling")
        return acc


def _sequence_sums(shape: TreeShape, surv: np.ndarray, by_rank: np.ndarray, n: int) -> TreeSums:
    """One reference's renewal counters for one tree (its depth's row), window sums over
    the starts whose whole depth lies inside, and the rank table weighted by the
    probability that a round starts at t."""
    s = shape.steps
    r = np.zeros((s + 2, n))
    r[: s + 1] = surv
    ren = renewal_from_survival(r, with_starts=True)
    assert ren.starts is not None
    start = ren.starts[:, s - 1]  # [n]
    out = TreeSums(s, shape.topk, ren.tokens, float(ren.rounds[s - 1]), ren.accepted[s - 1, :s].copy(), ren.drafted[s - 1, :s].copy())
    for j in range(1, s + 1):  # the chain's window: depth j over the starts t with t + j − 1 < n
        m = max(n - j + 1, 0)
        out.window[j - 1] = surv[j, :m].sum()
        out.windows[j - 1] = m
    # a round at t drafts only up to n − 1 − t; the rank table counts depths it drafted
    out.by_rank = np.einsum("drn,n,dn->dr", by_rank, start, reach(s, n).astype(float))
    out.starts = start
    return out
