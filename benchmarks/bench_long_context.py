"""`diagnose` at long context: wall time and peak memory with and without the cost timing.

One RAG-style prompt per length (documents from the built-in suite concatenated before a
summarisation question, built to the exact token length by `probe.long_context`), the real
SmolLM2-135M with its 28-layer self-draft, 32 new tokens. Each run is a fresh process:

  A  diagnose as a user runs it (the drafter's and the verify passes' costs timed)
  B  scoring only (--cost-ratio 0.5 --verify-factor 1: nothing timed)

The references are generated once per length (an untimed warm-up run, B) and read from
the disk cache by every timed run, so A and B differ by the cost step alone. Runs are
interleaved A B A B … per length; printed: the medians (min–max) of wall time and peak
RSS, A ÷ B, and from A's result the cost step's own time against its cap, the batch sizes
and contexts it timed and what it skipped. Goals: cost timing within its cap + 20 %, the
whole run ≤ 1.5× scoring only, peak memory ≤ 1.5×.

Run: nice python benchmarks/bench_long_context.py [--lengths 1k,2k,4k,8k] [--repeats 3]
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CLI_CHILD  # benchmarks/common.py: run as a script, its folder is on the path


def build_prompt(n: int, folder: Path) -> Path:
    from specprobe.models.loader import load_info
    from specprobe.probe import long_context
    from specprobe.prompts import builtin_suite, select

    info = load_info("smollm2")
    suite = builtin_suite()
    question = select(suite, domains=["summarization"]).prompts[:1]
    others = [p for p in suite.prompts if p.id != question[0].id]
    ps = type(suite).from_prompts("bench", "builtin", [*question, *others])
    built, _ = long_context.build(ps, info.tokenizer, [n], limit=info.config.max_position_embeddings, max_new_tokens=32)
    p = next(x for x in built.prompts if x.domain == question[0].domain)
    path = folder / f"rag-{n}.jsonl"
    path.write_text(json.dumps({"id": p.id, "domain": p.domain, "prompt": p.turns[0]}) + "\n")
    return path


def run(prompts: Path, out: Path, scoring_only: bool) -> dict:
    out.unlink(missing_ok=True)
    args = ["diagnose", "smollm2", "self:layers=28", "--prompts", str(prompts), "--max-new-tokens", "32", "--json", str(out), "--fail-on", "never"]
    if scoring_only:
        args += ["--cost-ratio", "0.5", "--verify-factor", "1"]
    p = subprocess.run([sys.executable, "-c", CLI_CHILD, *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    line = next((x for x in p.stdout.splitlines()[::-1] if x.startswith("BENCH ")), None)
    if line is None or not out.exists() or p.returncode:
        raise SystemExit(f"diagnose failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    m = json.loads(line[6:])
    r = json.loads(out.read_text())
    m["cost"] = r.get("cost") or {}
    return m


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1k,2k,4k,8k", help="token lengths (k = 1,024; 8k is cut to SmolLM2's 8,192 − 32 new tokens)")
    ap.add_argument("--repeats", type=int, default=3, help="A B pairs per length")
    a = ap.parse_args()
    from specprobe.settings.lengths import parse_context_lengths

    lengths = [min(n, 8192 - 32) for n in parse_context_lengths(a.lengths)]
    load = os.getloadavg()[0]
    print(f"SmolLM2-135M (Q4_1 GGUF dequantised to float32) + self:layers=28 on {os.cpu_count()} CPUs, load {load:.1f}; one RAG prompt per length, 32 new tokens; {a.repeats} interleaved A B pair(s)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in lengths:
            prompts = build_prompt(n, folder)
            run(prompts, folder / f"warm-{n}.json", True)  # references into the disk cache, untimed
            res: dict[str, list[dict]] = {"A": [], "B": []}
            for i in range(a.repeats):
                for mode in "AB":
                    res[mode].append(run(prompts, folder / f"{mode}{i}-{n}.json", scoring_only=mode == "B"))
            rows.append((n, res))
            A, B = res["A"], res["B"]
            ratio_t = [x["wall_s"] / y["wall_s"] for x, y in zip(A, B, strict=True)]
            ratio_m = [x["rss_mb"] / y["rss_mb"] for x, y in zip(A, B, strict=True)]
            cost = [x["cost"] for x in A]
            over = [(c.get("elapsed_s") or 0) / c["cap_s"] for c in cost if c.get("cap_s")]
            last = cost[-1]
            batches = ", ".join(f"b{b['batch_size']}@{b.get('context_tokens')}×{b['repeats']}" for b in last.get("batches", []))
            print(f"\n{n} tokens:  wall A {med([x['wall_s'] for x in A])} s, B {med([x['wall_s'] for x in B])} s, A÷B {med(ratio_t)}")
            print(f"  peak RSS A {med([x['rss_mb'] for x in A])} MB, B {med([x['rss_mb'] for x in B])} MB, A÷B {statistics.median(ratio_m):.2f} ({min(ratio_m):.2f}–{max(ratio_m):.2f})")
            print(f"  cost step {med([c.get('elapsed_s') or 0 for c in cost])} s against a cap of {med([c.get('cap_s') or 0 for c in cost])} s (elapsed ÷ cap {statistics.median(over) if over else float('nan'):.2f}); timed {batches}; skipped: {last.get('skipped') or 'nothing'}")
    print(f"\nload after: {os.getloadavg()[0]:.1f}; finished {time.strftime('%H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
