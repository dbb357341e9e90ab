"""Draft trees in diagnose: the collector that feeds each reference's tree candidates to
the `metrics.tree.TreeAccumulator`, and the result's tree section — the run's own tree
(`--tree`, or the one an SGLang/TensorRT-LLM serving config verifies) and the best tree of
the grid beside the best chain, each priced with the measured costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from specprobe.engines import GREEDY, get
from specprobe.estimates.costs import tree_factors, tree_round_cost
from specprobe.estimates.tree import TreeShape
from specprobe.metrics.tree import DEFAULT_WIDTH, TreeAccumulator, TreeSums
from specprobe.prompts import Prompt
from specprobe.settings.pipeline import DiagnoseConfig


def wants_trees(cfg: DiagnoseConfig) -> bool:
    """A run estimates trees when it is given one, or when its engine verifies trees the
    way the estimate models them: greedy drafts (the top candidates; a sampled draft has
    no tree), verified exactly or with SGLang's relaxed thresholds (`--accept-threshold-*`
    below 1: each child's acceptance given its elder siblings, `estimates.tree.sibling_accept`)."""
    return cfg.tree is not None or (get(cfg.engine).verifies_trees and cfg.drafting == GREEDY)


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


def paths_starts(stride: int, conts: Sequence[Sequence[int]]) -> list[np.ndarray | None] | None:
    """The starts a paths pass drafts at this stride: every stride-th of each reference,
    offset by the reference's index (so the drafted starts do not line up with positions);
    None at stride 1 (every start)."""
    if stride <= 1:
        return None
    return [np.arange(i % stride if i % stride < len(c) else 0, len(c), stride) if len(c) else None for i, c in enumerate(conts)]


def add_paths(acc: TreeAccumulator, shape: TreeShape, rounds: Sequence[tuple[int, Any, np.ndarray, np.ndarray]], conts: Sequence[Sequence[int]], stride: int) -> None:
    """A paths pass's rounds (index, nodes, prob, starts) into `acc.paths`. At stride 1
    they are every start; at stride > 1 the other starts are estimated from their rounds
    along the reference plus the mean difference the drafted starts measured
    (`estimates.tree.shifted`), and τ with the shift one standard error either way is kept
    beside, for the references the scoring kept (`acc.along`: logits that were numbers)."""
    from specprobe.estimates.tree import mean_shift, shifted, tally
    from specprobe.metrics.tree import rounds_tau

    if stride <= 1:
        for _, nodes, prob, _at in rounds:
            acc.add_rounds(nodes, prob)
        return
    drafted = [(i, nodes, prob, at, tally(shape, nodes, prob)) for i, nodes, prob, at in rounds if i in acc.along]
    pairs = [(acc.along[i], at, got) for i, _, _, at, got in drafted]
    if not pairs:
        return
    shift = mean_shift(pairs)
    for i, nodes, prob, at, got in drafted:
        acc.add_rounds(nodes, prob, shifted(acc.along[i], at, got, shift), at, len(conts[i]))
    # τ with the shift one standard error either way: what the sampling of starts leaves open
    lo, hi = (rounds_tau(shape, [(shifted(acc.along[i], at, got, shift.moved(k)), len(conts[i])) for i, _, _, at, got in drafted]) for k in (-1.0, 1.0))
    acc.paths_sampling = {"stride": stride, "starts": int(sum(len(at) for _, _, _, at, _ in drafted)), "of": int(sum(len(conts[i]) for i, *_ in drafted)),
                          "shift": shift.survival.tolist(), "shift_se": shift.se.tolist(), "tau_low": lo, "tau_high": hi}


def paths_collector(cfg: DiagnoseConfig, target: Any, drafter: Any, sampling: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], progress: Any) -> PathsCollector | None:
    """The collector that drafts the run's own tree on its candidate paths during the
    scoring (`--tree-estimate paths`, the default with --tree), or None (no tree of the
    run's own, another estimate, or a drafter that cannot draft it: said in a note)."""
    from specprobe.probe import tree_paths

    if cfg.tree_shape is None or cfg.tree_estimate != "paths":
        return None
    why = tree_paths.why_not(drafter)
    if why:
        progress.note(f"--tree: {why}; the tree is estimated along the reference, as the grid is")
        return None
    stride = paths_stride(cfg.tree_paths_stride, conts)
    out = PathsCollector(target, drafter, cfg.tree_shape, sampling, encoded, conts, stride, cfg.thresholds)
    n = sum(len(c) for c in conts if len(c) >= 2)
    drafted = n if out.starts is None else sum(len(x) for x, c in zip(out.starts, conts, strict=True) if x is not None and len(c) >= 2)
    progress.note(f"drafting the tree on its candidate paths with the scoring: {drafted} of {n} starts" + (f" (one start in {stride})" if stride > 1 else ""))
    return out


class PathsCollector:
    """A scoring collector that drafts the run's tree on its candidate paths from each
    scoring batch's own target pass (its KV cache and states: `wants_pass`), so the
    references get no second target prefill; its rounds go to `add_paths` once the scoring
    is done. A greedy target's argmax along each reference comes from the scoring's own
    logits (`probe`). Ctrl-C during a batch's drafting stops the scoring there, as Ctrl-C
    during a batch does."""

    wants_pass = True

    def __init__(self, target: Any, drafter: Any, shape: TreeShape, sampling: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], stride: int,
                 thresholds: tuple[float, float]) -> None:  # fmt: skip
        from specprobe.probe import tree_paths

        self.paths = tree_paths.PathRounds(target.model, drafter, shape, sampling, thresholds=thresholds)
        self.head = getattr(target, "head", None)  # the target's LM head: each root's logits from the pass
        self.shape, self.encoded, self.conts, self.stride = shape, encoded, conts, stride
        self.starts = paths_starts(stride, conts)
        self.rounds: list[tuple[int, Any, np.ndarray, np.ndarray]] = []
        self.seconds = 0.0  # the drafting's own time, inside the scoring's
        self._pass: tuple[list[int], Any, Any] | None = None
        self._best: dict[int, np.ndarray] = {}
        self.probe = self._argmax if sampling.greedy else None

    def _argmax(self, chunk: Any, target_logits: Any, draft_logits: Any) -> dict[str, np.ndarray]:
        return {"paths_argmax": target_logits.argmax(dim=-1).cpu().numpy()}

    def chunk(self, chunk: Any, scores: Any) -> None:
        top = scores.extra.get("paths_argmax")
        if top is None:
            return
        for i in np.unique(chunk.prompt):
            m = chunk.prompt == i
            row = self._best.setdefault(int(i), np.full(len(self.conts[i]), -1, dtype=np.int64))
            row[chunk.token_pos[m] - len(self.encoded[i])] = top[m]

    def target_pass(self, idx: list[int], tp: Any, cache: Any) -> None:
        self._pass = (idx, tp, cache)

    def batch_done(self) -> None:
        import copy
        import time

        import torch

        from specprobe.core.errors import ConfigError
        from specprobe.estimates.tree import Nodes
        from specprobe.probe.memory import _free, is_oom
        from specprobe.probe.tree_paths import PathRef

        got, self._pass = self._pass, None
        if got is None:
            return
        idx, tp, cache = got
        keep = [g for g, i in enumerate(idx) if len(self.conts[i]) >= 2 and len(self.encoded[i]) >= 1 and (self.starts is None or self.starts[i] is not None)]
        best = [self._best.pop(i, None) for i in idx]
        if not keep or cache is None:
            return
        t0 = time.perf_counter()
        rows = torch.as_tensor(keep, device=tp.input_ids.device)
        if len(keep) < len(idx):  # a copy: the pass may serve other collectors (sweep: one per drafter)
            cache = copy.deepcopy(cache)
            cache.batch_select_indices(rows)
        pick = (lambda x: x) if len(keep) == len(idx) else (lambda x: x[rows])
        refs = []
        for g in keep:
            i = idx[g]
            n = len(self.conts[i])
            at = np.arange(n) if self.starts is None else np.asarray(self.starts[i])
            refs.append(PathRef([int(x) for x in self.encoded[i]] + [int(x) for x in self.conts[i]], len(self.encoded[i]), n, at))
        along = [x for x in (best[g] for g in keep) if x is not None] if self.probe is not None else []
        assert self.probe is None or len(along) == len(keep), "a greedy target's argmax comes with every scored chunk"
        while True:
            try:
                with torch.inference_mode():
                    out = self.paths.from_pass(refs, pick(tp.input_ids), pick(tp.attention_mask), cache, {k: pick(v) for k, v in tp.layer_hidden.items()}, pick(tp.last_hidden),
                                               along, self.head)  # fmt: skip
                break
            except Exception as e:  # out of memory: fewer rounds per forward (the pass itself is not touched)
                if not is_oom(e):
                    raise
                if self.paths.rows <= 1:  # not an out-of-memory error for the scoring to retry: its batch was committed
                    raise ConfigError("out of memory drafting the tree on its candidate paths, at one round per forward",
                                      "use --tree-estimate reference (no extra forwards) or a smaller --batch-size") from e
                _free()
                self.paths.rows = max(1, self.paths.rows // 2)
        for g, (tree, verified, prob) in zip(keep, out, strict=True):
            i = idx[g]
            self.rounds.append((i, Nodes(tree.depth, tree.rank, tree.parent, tree.score, verified), prob, refs[keep.index(g)].at))
        self.seconds += time.perf_counter() - t0

    def finish(self, acc: TreeAccumulator) -> None:
        """The rounds into `acc.paths` (`add_paths`)."""
        add_paths(acc, self.shape, self.rounds, self.conts, self.stride)


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
