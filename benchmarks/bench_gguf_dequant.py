"""What a GGUF's first load costs: the built-in SmolLM2 (Q4_1, 98 MB) dequantised into an
fp32 checkpoint by transformers' GGUF loader, as specprobe does it (each file's header
parsed once, gguf's tensor-name map built once: `loader.parsed_once`) against
transformers left alone (it parses the header three times and rebuilds the name map per
module). Each side runs in a fresh process (imports included, as a user's first run pays
them), interleaved (A B, B A, …). Prints each side's median (min–max) seconds and the
once ÷ alone ratio per pair.

    python benchmarks/bench_gguf_dequant.py [--repeats 3]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from common import parser  # benchmarks/common.py: run as a script, its folder is on the path

ROOT = Path(__file__).resolve().parents[1]

ONE = """
import contextlib, sys, tempfile, time
from pathlib import Path
from specprobe.models import loader
if sys.argv[1] == "alone":
    loader.parsed_once = contextlib.nullcontext
path = loader.builtin_gguf_path("smollm2")
with tempfile.TemporaryDirectory() as d:
    t = time.perf_counter()
    loader._dequantise_into(path, Path(d))
    print(time.perf_counter() - t)
"""


def one(side: str) -> float:
    res = subprocess.run([sys.executable, "-c", ONE, side], cwd=ROOT, capture_output=True, text=True, check=True)  # noqa: S603
    return float(res.stdout.strip().splitlines()[-1])


def main() -> None:
    a = parser(__doc__, repeats=3).parse_args()
    t: dict[str, list[float]] = {"once": [], "alone": []}
    for i in range(a.repeats):
        for side in ("once", "alone") if i % 2 == 0 else ("alone", "once"):
            t[side].append(one(side))
            print(f"  pair {i + 1}: {side} {t[side][-1]:.1f} s", flush=True)
    ratio = [o / n for o, n in zip(t["once"], t["alone"], strict=True)]
    for side, xs in t.items():
        print(f"{side:>6}: {statistics.median(xs):.1f} s ({min(xs):.1f}–{max(xs):.1f})")
    print(f"once ÷ alone: {statistics.median(ratio):.2f} ({min(ratio):.2f}–{max(ratio):.2f})")


if __name__ == "__main__":
    main()
