"""A tree round's measured costs on this machine: v_N (the target's pass over N tree
tokens under a tree-shaped 4D attention mask ÷ one decode step) and w_T (the drafter's
pass over T beams ÷ its one-token step), as `diagnose` times them for a run with a tree;
and whether the tree mask costs what a causal mask over the same N tokens costs.

SmolLM2-135M (the built-in local package) with its `self:layers=28` self-draft, float32,
batch 1, a KV cache of --context tokens repeated from one 256-token prefill (the cost
timing's own caches). Part 1 is `probe.timing.cost_block` with the tree grid (warm-up,
interleaved repeats, medians of per-repeat ratios). Part 2 times, interleaved A B A B, A =
the pass over N tokens with the tree mask (heap-ordered tree, topk 4), B = the same N
tokens under the causal mask the chain's verify pass uses, and prints A ÷ B per N:
median (min–max) over the repeats.

Run: nice python benchmarks/bench_tree_costs.py [--context 512] [--repeats 15] [--threads 1]
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specprobe.core.openmp import shorten_spin
from specprobe.estimates import costs
from specprobe.models.anatomy import layer_view
from specprobe.models.loader import load_model
from specprobe.probe import timing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 on a loaded machine, where OpenMP barriers stall")
    a = ap.parse_args()
    shorten_spin()
    if a.threads:
        torch.set_num_threads(a.threads)
    target = load_model("smollm2", "cpu", "float32")
    view = layer_view(target.model, 28)
    drafter = type("D", (), {"step_model": lambda self: view})()
    grid_n, grid_w = timing.tree_grid({"tokens": 8, "topk": 4})
    raw = timing.cost_block(target, drafter, None, k_max=8, batch_sizes=[1], context_tokens=a.context, tree_tokens=grid_n, tree_widths=grid_w, budget_s=0.0)
    b = raw["batches"][0]
    sec = costs.price(raw, cumulative=[0.5] * 8, alpha_mean=0.5, renewal=None, k_max=8, batch_size=1).section
    print(f"SmolLM2-135M + self:layers=28, float32, {torch.get_num_threads()} threads, batch 1, context {b['context_tokens']}, {b['repeats']} repeats")
    print(f"target step {b['target_step']['median_ms']:.1f} ms, drafter step {b['draft_step']['median_ms']:.1f} ms, c = {sec['cost_ratio']:.3f}")
    rng = lambda r: f"{statistics.median(r):.3f} ({min(r):.3f}–{max(r):.3f})"  # noqa: E731
    for x in b["tree_verify"]:
        print(f"  v_N  N = {x['tokens']:>2}: {rng(x['ratios'])}")
    for x in b["draft_width"]:
        print(f"  w_T  T = {x['width']:>2}: {rng(x['ratios'])}")
    print("  chain v_K (pass over K + 1 tokens): " + ", ".join(f"K={k + 1}: {statistics.median(v):.3f}" for k, v in enumerate(b["verify_ratios"]) if v))
    print(f"  tree round steps 3, topk 4, tokens 8: {costs.tree_round_cost(3, 4, 8, sec['cost_ratio'], *costs.tree_factors(b)):.3f} target steps; chain K = 3: {sec['batches'][0]['rows'][2]['round_cost']:.3f}")

    # part 2: tree mask against causal mask over the same N tokens, interleaved
    with torch.inference_mode():
        gen = torch.Generator().manual_seed(0)
        ctx = timing._Caches(target.model, None, a.context, "cpu", gen, lambda: 0.0, float("inf"))
        t = timing._Decoder.over(ctx.target_copy(1, a.context, 64), target.model, 1, a.context, "cpu", gen)
        calls = {}
        for n in (8, 32, 64):
            calls[f"tree{n}"] = t.tree_call(timing.tree_parents(n, 4))
            calls[f"causal{n}"] = t.call(n)
        s = costs.interleaved(calls, min_repeats=a.repeats, max_repeats=a.repeats)
    print(f"tree mask ÷ causal mask over the same N tokens (context {a.context}, {s.repeats} interleaved repeats):")
    for n in (8, 32, 64):
        r = costs.ratios(s.times[f"tree{n}"], s.times[f"causal{n}"])
        print(f"  N = {n:>2}: {rng(r)}  (causal {1e3 * statistics.median(s.times[f'causal{n}']):.1f} ms)")


if __name__ == "__main__":
    main()
