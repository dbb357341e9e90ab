"""Benchmark the real tree loop (`simulate --tree`) against the chain of the same depth on
SmolLM2-135M with a layer-skip self-draft (first N of its 30 layers), offline.

1. Throughput: simulate tokens/s for `--tree steps=3,topk=4,tokens=8` and the chain K=3
   (`topk=1`), greedy, interleaved A B A B, medians with min–max, and their ratio.
2. τ (tokens per verify step, bonus included) of the tree against the chain on the
   built-in prompts: at T = 0 (deterministic) and at T = 0.7 over several seeds (mean ±
   standard error), with the tree's per-rank share of accepted nodes.

Prints numbers; asserts nothing. Run: nice python benchmarks/bench_tree.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
import torch


def encode_prompts(tok: Any, n: int) -> list[list[int]]:
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    return [encode_prompt(tok, p) for p in select(builtin_suite(), max_prompts=n).prompts]


def run(target: Any, step: Any, prompts: list[list[int]], tree: str, temperature: float, max_new: int, batch: int, seed: int) -> Any:
    from specprobe.estimates.tree import parse
    from specprobe.metrics.sampling import Sampling
    from specprobe.simulate.tree import speculate_tree

    # no EOS: every prompt generates max_new tokens
    return speculate_tree(target, step, prompts, shape=parse(tree), target_sampling=Sampling(temperature), max_new_tokens=max_new, batch_size=batch, seed=seed).counters


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=16, help="layer-skip drafter depth")
    ap.add_argument("--tree", default="steps=3,topk=4,tokens=8")
    ap.add_argument("--repeats", type=int, default=3, help="A B pairs timed")
    ap.add_argument("--seeds", type=int, default=4, help="seeds at T = 0.7")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 prompts, 16 tokens, 2 pairs, 2 seeds")
    a = ap.parse_args()
    if a.quick:
        a.prompts, a.max_new_tokens, a.repeats, a.seeds = 4, 16, 2, 2
    torch.set_num_threads(a.threads)
    from specprobe.estimates.tree import parse
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model

    tm = load_model("smollm2", "cpu", "float32")
    step = build_drafter(f"self:layers={a.layers}", tm).step_model()
    prompts = encode_prompts(tm.tokenizer, a.prompts)
    chain = f"steps={parse(a.tree).steps}"
    print(f"SmolLM2-135M, self:layers={a.layers}, {len(prompts)} built-in prompts, {a.max_new_tokens} new tokens, batch {a.batch_size}, {a.threads} threads, CPU")

    # 1. throughput, interleaved
    tps: dict[str, list[float]] = {a.tree: [], chain: []}
    for _ in range(a.repeats):
        for t in (a.tree, chain):
            tps[t].append(run(tm.model, step, prompts, t, 0.0, a.max_new_tokens, a.batch_size, 0).tokens_per_s)
    ratio = [x / y for x, y in zip(tps[a.tree], tps[chain], strict=True)]
    print(f"tokens/s  tree {a.tree}: {spread(tps[a.tree])}   chain K={parse(a.tree).steps}: {spread(tps[chain])}   tree ÷ chain: {spread(ratio)} ({a.repeats} pairs)")

    # 2. τ tree vs chain
    for temp, seeds in ((0.0, [0]), (0.7, list(range(a.seeds)))):
        taus: dict[str, list[float]] = {a.tree: [], chain: []}
        ranks = None
        for s in seeds:
            for t in (a.tree, chain):
                c = run(tm.model, step, prompts, t, temp, a.max_new_tokens, a.batch_size, s)
                taus[t].append(c.tau_tokens)
                if t == a.tree:
                    ranks = c.by_rank if ranks is None else ranks + c.by_rank
        def show(xs: list[float]) -> str:
            se = float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else 0.0
            return f"{np.mean(xs):.3f} ± {se:.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
        assert ranks is not None
        share = [f"{(row / row.sum()).round(2).tolist()}" if row.sum() else "-" for row in ranks]
        print(f"T={temp:g} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})  τ tree {show(taus[a.tree])}  τ chain {show(taus[chain])}  tree rank shares by depth {share}")


if __name__ == "__main__":
    main()
