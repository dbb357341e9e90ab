"""diagnose with a draft tree against the chain of the same depth: wall time, interleaved
A B A B in fresh processes, medians with min–max and the ratio.

A: `diagnose … --engine sglang --tree steps=3,topk=4,tokens=8` (the run's tree drafted on
   its candidate paths at every start, the grid of trees for the recommendation, the tree
   passes timed with the costs).
R: the same with `--tree-estimate reference` (the run's tree estimated as the grid's, no
   paths pass).
B: `diagnose … --engine vllm --k-max 3` (the chain of the same depth, no trees); all
   with --k-max 3, so the K table, the cost timing and the tree grid go to depth 3.

Both draft with SmolLM2-135M's first layers (`self:layers=N`) against SmolLM2 on the
built-in prompts; the references come from the same on-disk cache (warmed first), so the
difference is the tree work. Goal (issue #24): A ≤ 1.5 × B. The arms rotate (A R B, R B A,
B A R, …), so each ratio is taken within one round.

    python benchmarks/bench_tree_diagnose.py [--repeats 3] [--prompts 16] [--tokens 64] [--temperature 1]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import parser  # benchmarks/common.py: run as a script, its folder is on the path


def run(args: list[str]) -> float:
    """One diagnose in a fresh process -> wall seconds."""
    t0 = time.perf_counter()
    subprocess.run(["specprobe", "diagnose", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = parser(__doc__, repeats=3, prompts=16, tokens=64, layers=24)
    ap.add_argument("--temperature", default="1", help="the target's temperature (0: greedy, where the paths pass needs no target pass)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tree-"))
    os.environ.setdefault("SPECPROBE_CACHE_DIR", str(work / "cache"))
    common = ["smollm2", f"self:layers={a.layers}", "--max-prompts", str(a.prompts), "--max-new-tokens", str(a.tokens), "--temperature", a.temperature, "--fail-on", "never"]
    tree = [*common, "--engine", "sglang", "--tree", "steps=3,topk=4,tokens=8", "--k-max", "3", "--json", str(work / "tree.json")]
    ref = [*tree[:-2], "--tree-estimate", "reference", "--json", str(work / "ref.json")]
    chain = [*common, "--engine", "vllm", "--k-max", "3", "--json", str(work / "chain.json")]
    run(chain)  # warm the reference cache (each engine's sampling semantics has its own) and the page cache
    run(tree)
    arms = [("tree", tree), ("ref", ref), ("chain", chain)]
    walls: dict[str, list[float]] = {name: [] for name, _ in arms}
    for i in range(a.repeats):
        for name, args in arms[i % 3 :] + arms[: i % 3]:
            w = run(args)
            walls[name].append(w)
            print(f"  {name:5s} {w:6.1f} s", flush=True)
    ratios = [t / c for t, c in zip(walls["tree"], walls["chain"], strict=True)]
    ref_ratios = [t / c for t, c in zip(walls["ref"], walls["chain"], strict=True)]

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"

    res = json.loads((work / "tree.json").read_text())
    t = (res.get("trees") or {}).get("tree") or {}
    print(f"SmolLM2-135M + self:layers={a.layers}, {a.prompts} built-in prompts × {a.tokens} tokens, {a.repeats} interleaved repeats, load {os.getloadavg()[0]:.1f}")
    print(f"T = {a.temperature}: wall s   tree (paths) {med(walls['tree'])}   tree (reference) {med(walls['ref'])}   chain {med(walls['chain'])}")
    print(f"tree (paths) ÷ chain {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})   tree (reference) ÷ chain {statistics.median(ref_ratios):.2f} ({min(ref_ratios):.2f}–{max(ref_ratios):.2f})")
    print(f"tree τ {t.get('tau_tokens')} vs its chain {t.get('chain_tau_tokens')}; speedup {t.get('speedup')} vs {t.get('chain_speedup')}")


if __name__ == "__main__":
    main()
