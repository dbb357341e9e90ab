"""What drafting the run's own tree on its candidate paths costs in diagnose
(`probe.tree_paths`), against the teacher-forced scoring forwards it adds to.

In one process, on SmolLM2-135M with a layer-skip self-draft (`self:layers=N`) and the
built-in prompts' greedy references, each round times, in this order:

    pair      the target's and the drafter's forward over every reference (what the
              scoring's teacher-forced pass runs per reference);
    paths     `PathRounds.reference` over every reference, at 16 and at 64 start
              positions a batch (`--tree steps=3,topk=4,tokens=8`).

Prints each one's median (min–max) over the rounds and its ratio to the pair.

    python benchmarks/bench_tree_paths.py [--prompts 4] [--tokens 48] [--repeats 3] [--temperature 1]
"""

from __future__ import annotations

import statistics
import time

from common import parser  # benchmarks/common.py: run as a script, its folder is on the path


def main() -> None:
    import torch

    from specprobe.estimates.tree import parse
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_model
    from specprobe.probe import tree_paths
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    ap = parser(__doc__, prompts=4, tokens=48, repeats=3, layers=24)
    ap.add_argument("--temperature", type=float, default=1.0, help="the target's (0: greedy, no target pass on its own text)")
    ap.add_argument("--tree", default="steps=3,topk=4,tokens=8")
    a = ap.parse_args()
    torch.set_num_threads(2)
    t = load_model("smollm2", device="cpu", dtype="float32")
    spec = f"self:layers={a.layers}"
    d = build_drafter(spec, t, info=drafter_info(spec, t.info))
    enc = [encode_prompt(t.tokenizer, p) for p in select(builtin_suite(), max_prompts=a.prompts).prompts]
    shape, s = parse(a.tree), Sampling(temperature=a.temperature)
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        refs = []
        for e in enc:
            ids = torch.tensor([e])
            g = t.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.tokens, do_sample=False)
            refs.append(g[0, len(e) :].tolist())
        full = [torch.tensor([e + c]) for e, c in zip(enc, refs, strict=True)]
        t.model(full[0])
        d.step_model()(full[0])  # warm both
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for f in full:
                t.model(f)
                d.step_model()(f)
            times.setdefault("pair", []).append(time.perf_counter() - t0)
            for rows in (16, 64):
                pr = tree_paths.PathRounds(t.model, d, shape, s, rows=rows)
                t0 = time.perf_counter()
                for e, c in zip(enc, refs, strict=True):
                    pr.reference(e, c)
                times.setdefault(f"paths, {rows} starts a batch", []).append(time.perf_counter() - t0)
    import os

    base = statistics.median(times["pair"])
    print(f"SmolLM2-135M + {spec}, --tree {a.tree}, T = {a.temperature:g}, {a.prompts} built-in prompts × {a.tokens} tokens, {a.repeats} rounds, load {os.getloadavg()[0]:.1f}")
    for k, v in times.items():
        print(f"  {k:26s} {statistics.median(v):7.2f} s ({min(v):.2f}–{max(v):.2f})   ÷ pair {statistics.median(v) / base:5.2f}")


if __name__ == "__main__":
    main()
