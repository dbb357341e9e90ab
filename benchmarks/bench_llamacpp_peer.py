"""Peer comparison: `specprobe simulate` against llama.cpp's own speculative decoding.

The same pair on both sides — SmolLM2-135M as target, its first N blocks as a layer-skip
self-draft (N = 28 and 24) — greedy, the same K, the same prompts (the built-in suite's
first --max-prompts, tokenised once with the target's chat template and sent to
llama-server as token ids), the same number of new tokens.

- llama.cpp: `llama-server` (benchmarks/build_llama_server.sh) with the self-draft
  written as a GGUF whose blocks are the target's own Q4_1 bytes; acceptance is the sum
  of the responses' `timings.draft_n_accepted` ÷ `draft_n`, and tokens per verify step
  comes from the server's `llamacpp:spec_decode_num_drafts_total` counter.
- specprobe: `specprobe simulate smollm2 self:layers=N --temperature 0 --k K` (the CLI,
  its --json); the model is SmolLM2's GGUF dequantised to fp32.

The two should agree within ~10 % (Q4_1 in llama.cpp against fp32 here moves a few
argmaxes, and from the first changed token on the two sides decode different text).
τ is 1 + accepted ÷ verify steps on both sides. Prints the table, with the standard
error of llama.cpp's acceptance over the prompts as a yardstick for the gap; asserts
nothing.

Run: python benchmarks/bench_llamacpp_peer.py [--layers 28,24] [--k 4] [--max-prompts 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers: the llama-server helpers the tests use


def encoded_prompts(max_prompts: int) -> list[list[int]]:
    """The prompts simulate runs with --prompts builtin --max-prompts N, as token ids."""
    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve
    from specprobe.prompts import builtin_suite, select
    from specprobe.references import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    return [encode_prompt(tok, p) for p in select(builtin_suite(), max_prompts=max_prompts).prompts]


def ratio_se(num: list[int], den: list[int]) -> float:
    """Standard error of Σnum/Σden over prompts (ratio estimator): how much the aggregate
    acceptance moves with the choice of prompts, which a few differing argmaxes (Q4_1 against
    fp32) reshuffle like a fresh sample."""
    n, total = len(num), sum(den)
    if n < 2 or not total:
        return float("nan")
    r = sum(num) / total
    return (n / (n - 1) * sum((a - r * d) ** 2 for a, d in zip(num, den, strict=True))) ** 0.5 / total


def llamacpp_side(binary: Path, layers: int, k: int, prompts: list[list[int]], max_new: int, work: Path, threads: int) -> dict[str, Any]:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.llamacpp import http_text, llama_server, write_self_draft_gguf

    def drafts_total(text: str) -> float:
        for line in text.splitlines():
            if line.startswith("llamacpp:spec_decode_num_drafts_total"):
                return float(line.split()[-1])
        return float("nan")

    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, work / f"smollm2-first{layers}.gguf", layers)
    with llama_server(binary, target, draft, k, work / f"server-{layers}.log", threads=threads) as srv:
        d0 = drafts_total(http_text(srv.base + "/metrics"))
        t0 = time.perf_counter()
        timings = [srv.complete(p, max_new)["timings"] for p in prompts]
        wall = time.perf_counter() - t0
        d1 = drafts_total(http_text(srv.base + "/metrics"))
    drafted = sum(int(t.get("draft_n", 0)) for t in timings)
    accepted = sum(int(t.get("draft_n_accepted", 0)) for t in timings)
    generated = sum(int(t.get("predicted_n", 0)) for t in timings)
    drafts = d1 - d0
    return {
        "accept_rate": accepted / drafted if drafted else float("nan"),
        "accept_rate_se": ratio_se([int(t.get("draft_n_accepted", 0)) for t in timings], [int(t.get("draft_n", 0)) for t in timings]),
        "tokens_per_verify": 1 + accepted / drafts if drafts else float("nan"),
        "drafted": drafted,
        "accepted": accepted,
        "drafts": drafts,
        "generated": generated,
        "tokens_per_s": generated / wall if wall else float("nan"),
    }


def specprobe_side(layers: int, k: int, max_prompts: int, max_new: int, work: Path) -> dict[str, Any]:
    out = work / f"simulate-{layers}.json"
    cmd = [
        sys.executable, "-c", "from specprobe.cli.main import run; run()",
        "simulate", "smollm2", f"self:layers={layers}", "--temperature", "0", "--k", str(k),
        "--max-prompts", str(max_prompts), "--max-new-tokens", str(max_new), "--device", "cpu",
        "--cost-ratio", f"{layers / 30:.3f}",  # the estimate's cost ratio, given: no timing run
        "--json", str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603
    if not out.exists():
        raise SystemExit(f"simulate failed ({res.returncode}):\n{res.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    rows = [r for r in (doc.get("measured") or {}).get("k_table", []) if int(r.get("k", -1)) == k]
    if not rows:
        raise SystemExit(f"simulate's JSON has no measured row for K={k}")
    row = rows[0]
    return {
        "accept_rate": float(row["accept_rate"]),
        # 1 + Σ r_i: with full-length drafts, 1 + accepted/drafts as llama.cpp counts it
        "tokens_per_verify": float(row.get("tau_tokens", float("nan"))),
        "drafts": row.get("num_drafts"),
        "generated": row.get("emitted_tokens"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="28,24", help="self-draft depths, comma-separated")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads")
    args = ap.parse_args()

    from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

    binary = find_llama_server()
    if binary is None:
        raise SystemExit(f"llama-server is not built: run {BUILD_SCRIPT} first")
    prompts = encoded_prompts(args.max_prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specprobe-peer-") as tmp:
        work = Path(tmp)
        for layers in (int(x) for x in args.layers.split(",")):
            lc = llamacpp_side(binary, layers, args.k, prompts, args.max_new_tokens, work, args.threads)
            sp = specprobe_side(layers, args.k, args.max_prompts, args.max_new_tokens, work)
            rows.append((layers, lc, sp))
            print(f"N={layers}: llama.cpp {lc} | specprobe {sp}", file=sys.stderr)

    print(f"\nSmolLM2-135M, self-draft = first N of 30 blocks, greedy, K={args.k}, "
          f"{len(prompts)} built-in prompts × {args.max_new_tokens} new tokens ({binary.parent.parent.name})")
    print(f"{'N':>3} | {'llama.cpp accept (± SE over prompts)':>36} | {'specprobe accept':>16} | {'rel. diff':>9} | {'llama.cpp τ':>11} | {'specprobe τ':>11}")
    for layers, lc, sp in rows:
        rel = sp["accept_rate"] / lc["accept_rate"] - 1 if lc["accept_rate"] else float("nan")
        lc_acc = f"{lc['accept_rate']:.3f} ± {lc['accept_rate_se']:.3f}"
        print(f"{layers:>3} | {lc_acc:>36} | {sp['accept_rate']:>16.3f} | {100 * rel:>+8.1f}% | {lc['tokens_per_verify']:>11.2f} | {sp['tokens_per_verify']:>11.2f}")
        print(f"    llama.cpp: {lc['accepted']}/{lc['drafted']} accepted over {lc['drafts']:.0f} verify steps, {lc['generated']} tokens")


if __name__ == "__main__":
    main()
