"""What holding a GGUF as its ggml blocks costs in time: one forward of the built-in
SmolLM2 (Q4_1) held as its blocks (`--gguf-weights held`: every layer dequantized at every
forward) against the same model from its fp32 checkpoint (`--gguf-weights float`), both
loaded in one process, timed interleaved (A B, B A, …), at a prefill-like shape (one
sequence of --prefill tokens) and a decode-like one (--batch sequences of one token).
Prints each side's median (min–max) and the held ÷ float ratio per pair.

    python benchmarks/bench_gguf_held_speed.py [--repeats 7] [--prefill 128] [--batch 8] [--threads 2]
"""

from __future__ import annotations

import os
import statistics
import time

from common import parser  # benchmarks/common.py: run as a script, its folder is on the path


def main() -> None:
    import torch

    from specprobe.models.loader import load_model

    a = parser(__doc__, repeats=7, prefill=128, batch=8, threads=2).parse_args()
    torch.set_num_threads(a.threads)
    models = {"held": load_model("smollm2", "cpu", "float32", gguf_weights="held").model, "float": load_model("smollm2", "cpu", "float32", gguf_weights="float").model}
    print(f"SmolLM2-135M Q4_1, float32 compute, {a.threads} threads, {a.repeats} interleaved pairs, load {os.getloadavg()[0]:.1f}")
    for label, shape in ((f"prefill 1×{a.prefill}", (1, a.prefill)), (f"decode {a.batch}×1", (a.batch, 1))):
        ids = torch.randint(0, 1000, shape)
        t: dict[str, list[float]] = {"held": [], "float": []}
        with torch.inference_mode():
            for m in models.values():
                m(ids)  # warm
            for i in range(a.repeats):
                for name in ("held", "float") if i % 2 == 0 else ("float", "held"):
                    t0 = time.perf_counter()
                    models[name](ids)
                    t[name].append(time.perf_counter() - t0)
        ratio = [h / f for h, f in zip(t["held"], t["float"], strict=True)]

        def med(xs: list[float]) -> str:
            return f"{1000 * statistics.median(xs):.0f} ms ({1000 * min(xs):.0f}–{1000 * max(xs):.0f})"

        print(f"  {label:14s} held {med(t['held'])}   float {med(t['float'])}   held ÷ float {statistics.median(ratio):.2f} ({min(ratio):.2f}–{max(ratio):.2f})")


if __name__ == "__main__":
    main()
