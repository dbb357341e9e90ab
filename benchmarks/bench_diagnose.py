"""Benchmarks for `diagnose` on the real SmolLM2-135M (49,152-token vocabulary).

1. Scoring overhead: time to compute the per-position metrics from the logits ÷ time of
   the target + drafter forward passes over the same positions (target ≤ 0.10), next to
   a naive unfused computation measured in the same run.
2. Memory: peak RSS of a diagnose run with 4× the prompts ÷ with 1× (target ≤ 1.15),
   each in a fresh subprocess.

Prints ratios measured side by side in one run; nothing is asserted.
Run: python benchmarks/bench_diagnose.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def naive_metrics(tl, dl, t: float):
    """What a first version typically writes: separate softmaxes, logs and reductions."""
    import torch
    import torch.nn.functional as F

    p = F.softmax(tl / t, dim=-1)
    q = F.softmax(dl / t, dim=-1)
    logp = torch.log(p + 1e-30)
    logq = torch.log(q + 1e-30)
    kl = (p * (logp - logq)).sum(-1)
    alpha = torch.minimum(p, q).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    ent = -(p * logp).sum(-1)
    conf = q.max(-1).values
    agree = (p.argmax(-1) == q.argmax(-1)).float()
    return kl, alpha, tv, ent, conf, agree


def overhead(repeats: int) -> None:
    import torch

    from specprobe.metrics.core import position_metrics
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model
    from specprobe.options import DEFAULT_CHUNK_POSITIONS as CH
    from specprobe.prompts import builtin_suite, select
    from specprobe.references import encode_prompt

    torch.manual_seed(0)
    target = load_model("smollm2", "cpu", "float32")
    drafter = build_drafter("self:layers=24", target)
    dm = drafter.step_model()
    prompts = select(builtin_suite(), max_prompts=8).prompts
    seqs = [encode_prompt(target.tokenizer, p)[:96] for p in prompts]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), target.tokenizer.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    sel = mask.bool()
    n = int(sel.sum())
    s = Sampling(temperature=0.7)
    fwd, ours, naive = [], [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            tl = target.model(input_ids=ids, attention_mask=mask).logits[sel]  # [N, V]
            dl = dm(input_ids=ids, attention_mask=mask).logits[sel]  # [N, V]
            fwd.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for c in range(0, n, CH):
                position_metrics(tl[c : c + CH], dl[c : c + CH], s, s)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for c in range(0, n, CH):
                naive_metrics(tl[c : c + CH], dl[c : c + CH], 0.7)
            naive.append(time.perf_counter() - t0)
    f, o, nv = statistics.median(fwd), statistics.median(ours), statistics.median(naive)
    print(f"scoring overhead on SmolLM2 (V=49,152), {n} positions, {torch.get_num_threads()} threads, median of {repeats}:")
    print(f"  target + drafter forward passes   {f * 1e3:8.1f} ms")
    print(f"  specprobe metrics                 {o * 1e3:8.1f} ms   ratio {o / f:.3f}  (target ≤ 0.10)")
    print(f"  naive unfused metrics             {nv * 1e3:8.1f} ms   ratio {nv / f:.3f}")


_CHILD = """
import json, resource, sys
from specprobe.alignment import SamplingFlags
from specprobe.diagnose import DiagnoseConfig, run_diagnose
cfg = DiagnoseConfig(target="smollm2", drafter="self:layers=24", max_prompts=int(sys.argv[1]), max_new_tokens=32,
                     sampling=SamplingFlags(temperature=0.7), cost_ratio=0.8, device="cpu")
r = run_diagnose(cfg)
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "positions": r.metrics["num_positions"]}))
"""


def memory(base: int) -> None:
    res = {}
    for n in (base, 4 * base):
        out = subprocess.run([sys.executable, "-c", _CHILD, str(n)], capture_output=True, text=True, check=True)
        res[n] = json.loads(out.stdout.strip().splitlines()[-1])
    a, b = res[base], res[4 * base]
    print(f"peak memory (RSS, fresh process each): {base} prompts {a['rss_mb']:.0f} MB ({a['positions']} positions); "
          f"{4 * base} prompts {b['rss_mb']:.0f} MB ({b['positions']} positions)")
    print(f"  ratio 4× / 1× = {b['rss_mb'] / a['rss_mb']:.3f}  (target ≤ 1.15)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=12, help="prompts in the 1× memory run (4× uses four times as many)")
    args = ap.parse_args()
    overhead(args.repeats)
    memory(args.prompts)
