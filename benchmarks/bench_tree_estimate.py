"""How close is diagnose's tree estimate to the real tree loop?

For each (temperature, seed): `specprobe simulate … --engine sglang --tree S` on the
built-in prompts, which scores the references teacher-forced (the estimate, `trees`) and
then runs the real tree draft → verify loop on the same prompts (`measured.tree`). Prints
the measured τ (tokens per round, bonus included) with its standard error from the
per-depth counts, the estimate (the run's tree drafted on its candidate paths at every
start), their gap, the same tree estimated along the reference (as the grid's trees are)
with its gap, and the chain of the same depth beside them.

    python benchmarks/bench_tree_estimate.py [--tree steps=3,topk=4,tokens=8] [--prompts 16] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="steps=3,topk=4,tokens=8")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--runs", default="0:0,1:0,1:1", help="temperature:seed pairs, comma-separated")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tree-est-"))
    print(f"SmolLM2-135M + self:layers={a.layers}, --tree {a.tree}, {a.prompts} built-in prompts × {a.tokens} tokens")
    print(f"{'T':>4} {'seed':>4} {'rounds':>6} {'measured τ':>14} {'estimate':>9} {'gap':>7} {'reference':>9} {'gap':>7} {'chain est.':>10}")
    for pair in a.runs.split(","):
        temp, seed = pair.split(":")
        out = work / f"t{temp}_s{seed}.json"
        subprocess.run(["specprobe", "simulate", "smollm2", f"self:layers={a.layers}", "--engine", "sglang", "--tree", a.tree,
                        "--max-prompts", str(a.prompts), "--max-new-tokens", str(a.tokens), "--temperature", temp, "--seed", seed,
                        "--cost-ratio", "0.8", "--verify-factor", "1", "--fail-on", "never", "--json", str(out)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = json.loads(out.read_text())
        m, t = r["metrics"], r["measured"]["tree"]
        surv = [x for x in t["depth_accept"] if x is not None]  # P(a round accepts depths 1..d)
        mean = sum(surv)
        second = sum((2 * j - 1) * p for j, p in enumerate(surv, start=1))  # E[A²] from the survival
        se = math.sqrt(max(second - mean * mean, 0.0) / t["num_drafts"])
        gap = m["tau_estimated_tokens"] / m["tau_measured_tokens"] - 1
        ref = ((r.get("trees") or {}).get("tree") or {}).get("tau_reference_tokens") or float("nan")
        rgap = ref / m["tau_measured_tokens"] - 1
        print(f"{temp:>4} {seed:>4} {t['num_drafts']:>6} {m['tau_measured_tokens']:>8.3f} ± {se:.3f} {m['tau_estimated_tokens']:>9.3f} {100 * gap:>+6.1f}% "
              f"{ref:>9.3f} {100 * rgap:>+6.1f}% {m.get('tree_chain_tau_tokens') or float('nan'):>10.3f}")


if __name__ == "__main__":
    main()
