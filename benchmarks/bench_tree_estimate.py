"""How close is diagnose's tree estimate to the real tree loop?

For each (temperature, seed): `specprobe simulate … --engine sglang --tree S` on the
built-in prompts, which scores the references teacher-forced (the estimate, `trees`) and
then runs the real tree draft → verify loop on the same prompts (`measured.tree`). Prints
the measured τ (tokens per round, bonus included) with its standard error from the
per-depth counts, the estimate (the run's tree drafted on its candidate paths at every
start), their gap, the same tree estimated along the reference (as the grid's trees are)
with its gap, and the chain of the same depth beside them. Then, for each of --strides,
`specprobe diagnose` on the same references (the on-disk cache) with
`--tree-paths-stride N`: the tree drafted on its paths at every N-th start only, the
others estimated along the reference shifted by what those measured — its τ, gap against
the loop and its one-standard-error τ range (0: leave that out).

    python benchmarks/bench_tree_estimate.py [--tree steps=3,topk=4,tokens=8] [--prompts 16] [--tokens 48] [--strides 3,6,12]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path


def specprobe(args: list[str]) -> None:
    """One specprobe command; on failure its last output lines, then exit."""
    p = subprocess.run(["specprobe", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"specprobe {' '.join(args)} failed ({p.returncode}):\n" + "\n".join(p.stderr.splitlines()[-15:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="steps=3,topk=4,tokens=8")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--runs", default="0:0,1:0,1:1", help="temperature:seed pairs, comma-separated")
    ap.add_argument("--strides", default="3,6,12", help="--tree-paths-stride values to estimate on the same references (0: none)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tree-est-"))
    import os

    os.environ.setdefault("SPECPROBE_CACHE_DIR", str(work / "cache"))  # simulate's references, reused by the diagnoses
    print(f"SmolLM2-135M + self:layers={a.layers}, --tree {a.tree}, {a.prompts} built-in prompts × {a.tokens} tokens")
    print(f"{'T':>4} {'seed':>4} {'rounds':>6} {'measured τ':>14} {'estimate':>9} {'gap':>7} {'reference':>9} {'gap':>7} {'chain est.':>10}")
    for pair in a.runs.split(","):
        temp, seed = pair.split(":")
        out = work / f"t{temp}_s{seed}.json"
        common = ["smollm2", f"self:layers={a.layers}", "--engine", "sglang", "--tree", a.tree, "--max-prompts", str(a.prompts), "--max-new-tokens", str(a.tokens),
                  "--temperature", temp, "--seed", seed, "--cost-ratio", "0.8", "--verify-factor", "1", "--fail-on", "never"]
        specprobe(["simulate", *common, "--tree-paths-stride", "1", "--json", str(out)])
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
        for stride in [int(x) for x in a.strides.split(",") if int(x) > 0]:
            dout = work / f"t{temp}_s{seed}_stride{stride}.json"
            specprobe(["diagnose", *common, "--tree-paths-stride", str(stride), "--json", str(dout)])
            tt = json.loads(dout.read_text())["trees"]["tree"]
            print(f"{'':>4} {'':>4} stride {stride:>2}: {tt['paths_starts']} of {tt['paths_positions']} starts drafted, τ {tt['tau_tokens']:.3f} "
                  f"({100 * (tt['tau_tokens'] / m['tau_measured_tokens'] - 1):+.1f}% against the loop, "
                  f"{100 * (tt['tau_tokens'] / m['tau_estimated_tokens'] - 1):+.1f}% against every start), "
                  f"one SE of the shift: {tt['paths_tau_low_tokens']:.3f}–{tt['paths_tau_high_tokens']:.3f}", flush=True)


if __name__ == "__main__":
    main()
