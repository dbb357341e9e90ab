"""Draft trees in diagnose: the collector that feeds each reference's tree candidates to
the `metrics.tree.TreeAccumulator`, and the result's tree section — the run's own tree
(`--tree`, or the one an SGLang/TensorRT-LLM serving config verifies) and the best tree of
the grid beside the best chain, each priced with the measured costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from specprobe.estimates.costs import tree_factors, tree_round_cost
from specprobe.estimates.tree import TreeShape
from specprobe.metrics.tree import DEFAULT_WIDTH, TreeAccumulator, TreeSums
from specprobe.prompts import Prompt
from specprobe.settings.pipeline import TREE_ENGINES, DiagnoseConfig


def wants_trees(cfg: DiagnoseConfig) -> bool:
    """A run estimates trees when it is given one, or when its engine verifies trees the
    way the estimate models them: greedy drafts (the top candidates; a sampled draft has
    no tree), verified exactly or with SGLang's relaxed thresholds (`--accept-threshold-*`
    below 1: each child's acceptance given its elder siblings, `estimates.tree.sibling_accept`)."""
    return cfg.tree is not None or (cfg.engine in TREE_ENGINES and cfg.drafting == "greedy")


class TreeCollector:
    """A scoring `Collector` (with `tree_width`): one reference at a time into the
    accumulator, the prompts whose logits were not numbers left out as the metrics leave
    them out."""

    def __init__(self, cfg: DiagnoseConfig, prompts: Sequence[Prompt]) -> None:
        shape = cfg.tree_shape
        self.tree_width = max(DEFAULT_WIDTH, shape.topk if shape is not None else 0)
        self.acc = TreeAccumulator(cfg.k_max, self.tree_width, shape, thresholds=cfg.thresholds)
        self.k_max = cfg.k_max
        self.prompts = prompts
        self._pending: list[tuple[Any, Any]] = []

    def chunk(self, chunk: Any, scores: Any) -> None:
        self._pending.append((chunk, scores))

    def batch_done(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or not pending[0][1].tree:
            return
        prompt = np.concatenate([c.prompt for c, _ in pending])
        broken = np.concatenate([s.broken if s.broken is not None else np.zeros(len(c.prompt), dtype=np.int8) for c, s in pending])
        depths = sorted(pending[0][1].tree)
        q = {d: np.concatenate([s.tree[d][0] for _, s in pending]) for d in depths}
        a = {d: np.concatenate([s.tree[d][1] for _, s in pending]) for d in depths}
        # the first candidate is the drafter's argmax: its acceptance is the scorer's own
        # p(argmax q), so the chain read off a tree (topk 1) is the chain estimate exactly
        for d in depths:
            g = [s.values["accept_prob_greedy_draft"] if d == 1 else s.greedy_by_depth.get(d) for _, s in pending]
            if all(x is not None for x in g):
                a[d] = a[d].copy()
                a[d][:, 0] = np.concatenate([np.asarray(x, dtype=np.float64) for x in g])
        cuts = [0, *(np.flatnonzero(np.diff(prompt)) + 1).tolist(), len(prompt)]
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            if broken[lo:hi].any():
                continue
            # an autoregressive drafter predicts depth 1 only: every depth repeats it
            qs = [q.get(d, q[depths[0]])[lo:hi] for d in range(1, self.k_max + 1)]
            as_ = [a.get(d, a[depths[0]])[lo:hi] for d in range(1, self.k_max + 1)]
            self.acc.add_sequence(qs, as_, ref=int(prompt[lo]))


# The starts a paths pass drafts by default, in all: the mean shift's standard error depends
# on how many starts measured it, not on what share of the positions they are.
PATHS_STARTS = 128


def paths_stride(stride: int | None, conts: Sequence[Sequence[int]]) -> int:
    """The paths pass's stride: the one given, else positions ÷ PATHS_STARTS (at least 1)."""
    if stride is not None:
        return stride
    return max(1, round(sum(len(c) for c in conts) / PATHS_STARTS))


def draft_on_paths(acc: TreeAccumulator, target: Any, drafter: Any, shape: TreeShape, sampling: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], progress: Any,
                   stride: int = 1) -> bool:  # fmt: skip
    """The run's own tree with the drafter on every candidate path (`probe.tree_paths`),
    into `acc.paths` -> False when Ctrl-C stopped it (the tree then keeps the reference's
    estimate, as the grid's trees do, and the run is marked interrupted).

    stride > 1 drafts every stride-th start of each reference (offset by the reference's
    index, so the drafted starts do not line up with positions) and estimates the other
    starts from their rounds along the reference plus the mean difference the drafted
    starts measured (`estimates.tree.shifted`): about 1/stride of the pass's forwards."""
    from specprobe.estimates.tree import mean_shift, shifted, tally
    from specprobe.metrics.tree import rounds_tau
    from specprobe.probe import tree_paths

    why = tree_paths.why_not(drafter)
    if why:
        progress.note(f"--tree: {why}; the tree is estimated along the reference, as the grid is")
        return True
    starts: list[np.ndarray | None] | None = None
    if stride > 1:
        starts = [np.arange(i % stride if i % stride < len(c) else 0, len(c), stride) if i in acc.along else None for i, c in enumerate(conts)]
    try:
        rounds, _ = tree_paths.run(target.model, drafter, shape, sampling, encoded, conts, progress, starts=starts, thresholds=acc.thresholds)
    except KeyboardInterrupt:
        progress.note("interrupted while drafting the tree on its candidate paths: the tree keeps the estimate along the reference")
        return False
    if starts is None:
        for _, nodes, prob, _at in rounds:
            acc.add_rounds(nodes, prob)
        return True
    drafted = [(i, nodes, prob, at, tally(shape, nodes, prob)) for i, nodes, prob, at in rounds]
    pairs = [(acc.along[i], at, got) for i, _, _, at, got in drafted]
    if not pairs:
        return True
    shift = mean_shift(pairs)
    for i, nodes, prob, at, got in drafted:
        acc.add_rounds(nodes, prob, shifted(acc.along[i], at, got, shift), at, len(conts[i]))
    # τ with the shift one standard error either way: what the sampling of starts leaves open
    lo, hi = (rounds_tau(shape, [(shifted(acc.along[i], at, got, shift.moved(k)), len(conts[i])) for i, _, _, at, got in drafted]) for k in (-1.0, 1.0))
    acc.paths_sampling = {"stride": stride, "starts": int(sum(len(at) for _, _, _, at, _ in drafted)), "of": int(sum(len(conts[i]) for i, *_ in drafted)),
                          "shift": shift.survival.tolist(), "shift_se": shift.se.tolist(), "tau_low": lo, "tau_high": hi}
    return True


def _row(shape: TreeShape, sums: TreeSums, cost: float, chain_cost: float | None = None) -> dict[str, Any]:
    tau = sums.tau()
    return {
        **shape.to_dict(), "label": shape.label(),
        "tau_tokens": _f(tau), "tau_window_tokens": _f(sums.tau_window()), "tokens_per_verify": _f(sums.tokens_per_verify()),
        "round_cost": _f(cost), "speedup": _f(tau / cost if cost > 0 else math.nan),
    }


def _f(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def by_batch(acc: TreeAccumulator, cost: dict[str, Any], k_max: int, cost_ratio: float | None, verify_factor: float | None) -> list[dict[str, Any]]:
    """The best tree and the best chain at each batch size the costs were timed at (two or
    more), each priced with that batch size's own costs."""
    from specprobe.estimates.costs import cost_tables

    tables = cost_tables(cost, k_max, cost_ratio, verify_factor)
    if len(tables) < 2:
        return []
    out = []
    for t in tables:
        c = 0.0 if t.cost_ratio is None or math.isnan(t.cost_ratio) else t.cost_ratio
        sec = tree_section(acc, c, [r.verify_factor for r in t.rounds], t.raw, verify_factor)
        out.append({"batch_size": t.batch_size, "best_tree": sec["best_tree"], "best_chain": sec["best_chain"]})
    return out


def tree_section(acc: TreeAccumulator, cost_ratio: float, verify: Sequence[float], batch_cost: dict[str, Any] | None, verify_factor: float | None = None) -> dict[str, Any]:
    """The result's tree section: the run's tree (per-depth acceptance, per-rank shares,
    its chain of the same depth), every grid tree's τ and speedup, and the best of each.
    A round costs c·(1 + (S − 1)·w_T) + v_N (`costs.tree_round_cost`); with a given
    --verify-factor v, (1 + c·(1 + (S − 1)·w_T))·v — the chain's (1 + K·c)·v at topk 1."""
    verify_by_tokens: Any = list(verify)
    width: Any = None
    measured = False
    if batch_cost:
        v, w = tree_factors(batch_cost)
        if v:
            verify_by_tokens, measured = v, True
        width = w or None
    rows = []
    exact = acc.paths is not None and acc.paths.rounds > 0
    for key, shape in acc.shapes.items():
        sums = acc.sums[key]
        if exact and shape == acc.shape:  # the run's own tree, drafted on its candidate paths
            assert acc.paths is not None
            sums = acc.paths
        if sums.rounds <= 0:
            continue
        if verify_factor is not None:
            c = (1.0 + tree_round_cost(shape.steps, shape.topk, shape.tokens, cost_ratio, None, width) - 1.0) * verify_factor
        else:
            c = tree_round_cost(shape.steps, shape.topk, shape.tokens, cost_ratio, verify_by_tokens, width)
        row = _row(shape, sums, c)
        if shape == acc.shape:
            row["estimate"] = "paths" if exact else "reference"
        rows.append((shape, sums, row))
    grid_rows = [r for s, _, r in rows if not s.static]
    chains = [r for r in grid_rows if r["topk"] == 1]
    trees = [r for r in grid_rows if r["topk"] > 1]

    def best(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
        ok = [r for r in rs if r["speedup"] is not None]
        return max(ok, key=lambda r: (r["speedup"], -r["tokens"], -r["steps"])) if ok else None

    out: dict[str, Any] = {
        "grid": grid_rows, "best_tree": best(trees), "best_chain": best(chains),
        "costs": (f"a round costs (1 + drafting)·{verify_factor:g} (--verify-factor)" if verify_factor is not None
                  else "verify passes over the tree's tokens timed on the device" if measured
                  else "the chain's verify passes, by token count; each drafting step over topk tokens costs one step"),
    }
    if acc.shape is not None:
        own = acc.paths if exact else acc.own
        assert own is not None and acc.own is not None
        mine = next((r for s, _, r in rows if s == acc.shape), None)
        if mine is not None:
            chain = next((r for r in chains if r["steps"] == acc.shape.steps), None)
            out["tree"] = {**mine, "depth_accept": [_f(x) for x in own.depth_accept()], "nodes": acc.node_table(paths=exact),
                           "rank_shares": [[_f(x) for x in r] for r in own.rank_shares()],
                           # the grid's way (every depth-d node with the reference's depth-d candidates), for comparison
                           "tau_reference_tokens": _f(acc.own.tau()) if exact else None,
                           **(_sampling(acc) if exact else {}),
                           "chain_tau_tokens": chain["tau_tokens"] if chain else None, "chain_speedup": chain["speedup"] if chain else None}
    return out


def _sampling(acc: TreeAccumulator) -> dict[str, Any]:
    """How many starts the paths pass drafted, and the shift it gave the others."""
    ps = acc.paths_sampling
    if not ps:
        return {"paths_stride": 1}
    return {"paths_stride": int(ps["stride"]), "paths_starts": int(ps["starts"]), "paths_positions": int(ps["of"]),
            "paths_shift": [_f(x) for x in ps["shift"]], "paths_shift_se": [_f(x) for x in ps["shift_se"]],
            "paths_tau_low_tokens": _f(ps["tau_low"]) if ps.get("tau_low") is not None else None,
            "paths_tau_high_tokens": _f(ps["tau_high"]) if ps.get("tau_high") is not None else None}


def tree_batch(cost: dict[str, Any], batch_size: int) -> dict[str, Any] | None:
    """The raw cost entry of the run's batch size (where the tree passes were timed)."""
    batches = cost.get("batches") or []
    return next((b for b in batches if int(b.get("batch_size", -1)) == batch_size), batches[0] if batches else None)


def tree_metrics(section: dict[str, Any], best_chain_row: Any) -> dict[str, Any]:
    """The catalogue metrics the tree rules read: the run's tree τ and speedup against its
    chain of the same depth, the best tree of the grid against the best chain (K table's
    best K), and how much of depth 1's acceptance the ranks past the first two add."""
    own = section.get("tree") or {}
    best_tree = section.get("best_tree") or {}
    chain_speedup = best_chain_row.speedup if best_chain_row is not None and math.isfinite(best_chain_row.speedup) else None
    shares = own.get("rank_shares") or []
    tail = sum(x for x in shares[0][2:] if x is not None) if shares and len(shares[0]) > 2 else None
    return {
        "tree_tau_tokens": own.get("tau_tokens"),
        "tree_speedup": own.get("speedup"),
        "tree_chain_tau_tokens": own.get("chain_tau_tokens"),
        "tree_topk": own.get("topk"),
        "tree_tokens": own.get("tokens"),
        "tree_rank_tail_share": _f(tail) if tail is not None else None,
        "tree_speedup_vs_chain": _f(own["speedup"] / own["chain_speedup"]) if own.get("speedup") and own.get("chain_speedup") else None,
        "tree_best_speedup": best_tree.get("speedup"),
        "tree_best_steps": best_tree.get("steps"),
        "tree_best_topk": best_tree.get("topk"),
        "tree_best_tokens": best_tree.get("tokens"),
        "tree_best_vs_own": _f(best_tree["speedup"] / own["speedup"]) if best_tree.get("speedup") and own.get("speedup") else None,
        "tree_best_vs_chain": _f(best_tree["speedup"] / chain_speedup) if best_tree.get("speedup") and chain_speedup else None,
    }
