"""Benchmarks for `diagnose` on the real SmolLM2-135M (49,152-token vocabulary).

1. Scoring overhead: time to compute the per-position metrics from the logits ÷ time of
   the target + drafter forward passes over the same positions (target ≤ 0.10), measured
   in interleaved rounds (the machine's load swings both parts independently: a ratio
   per round, median and min–max shown). Each round times the forward, a streaming
   floor — one read pass over both logit tensors — and every scorer on the same logits:
   the default (`metrics.blocked` with its numba-compiled rows, `metrics.kernel`), the
   same blocks in torch ops (SPECPROBE_SCORER=torch, the fallback without numba), the
   previous whole-chunk eager one
   (`position_metrics_reference`), a naive unfused computation, and with --fused the
   torch.compile'd one (its compile timed apart). Each scorer is printed as a ratio to
   the forward and as "N× the streaming floor", with the `uptime` load before and after.
   The scorers are asked for the top-5 tokens as `diagnose` asks (the drill-down);
   --top 0 leaves them out.
2. Memory: peak RSS of a diagnose run with 4× the prompts ÷ with 1× (target ≤ 1.15),
   each in a fresh subprocess.

Prints ratios measured side by side in one run; nothing is asserted.
Run: python benchmarks/bench_diagnose.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import builtin_batch  # benchmarks/common.py: run as a script, its folder is on the path

from specprobe.core.openmp import shorten_spin

shorten_spin()  # as the `specprobe` command does, before torch loads


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


def _spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    """median (min–max)."""
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def load() -> str:
    """The 1/5/15-minute load averages, as `uptime` prints them."""
    import os

    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def overhead(repeats: int, device: str = "cpu", dtype: str = "float32", fused: bool = False, positions: int = 0, top: int = 5) -> dict[str, float]:
    """Forward and metrics measured in interleaved rounds (each round: forward, floor,
    then every scorer on the same logits), a ratio per round; and each scorer against a
    streaming floor in the same round: one read pass over both logit tensors (a sum)."""
    import torch

    from specprobe.metrics import core
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model
    from specprobe.settings.pipeline import DEFAULT_CHUNK_POSITIONS as CH

    torch.manual_seed(0)
    target = load_model("smollm2", device, dtype)
    drafter = build_drafter("self:layers=24", target, device, dtype)
    dm = drafter.step_model()
    ids, mask = builtin_batch(target.tokenizer)
    ids, mask = ids.to(target.device), mask.to(target.device)
    sel = mask.bool()
    s = Sampling(temperature=0.7)
    sync = torch.cuda.synchronize if str(target.device).startswith("cuda") else (lambda: None)

    def clock() -> float:
        sync()
        return time.perf_counter()

    def torch_ops(a, b, s1, s2):  # the row blocks in torch ops: what runs without numba
        os.environ["SPECPROBE_SCORER"] = "torch"
        try:
            return core.position_metrics(a, b, s1, s2, top=top)
        finally:
            os.environ.pop("SPECPROBE_SCORER")

    paths = {
        "specprobe (compiled rows, default)": lambda a, b, s1, s2: core.position_metrics(a, b, s1, s2, top=top),
        "torch ops (SPECPROBE_SCORER=torch)": torch_ops,
        "previous eager (whole chunk)": lambda a, b, s1, s2: core.position_metrics_reference(a, b, s1, s2, top=top),
        "naive unfused": lambda a, b, s1, s2: naive_metrics(a, b, 0.7),
    }
    if fused:
        paths["torch.compile fused"] = lambda a, b, s1, s2: core.position_metrics_fused(a, b, s1, s2, top=top)
    rows: dict[str, list[float]] = {"forward": [], "floor": [], **{k: [] for k in paths}}
    with torch.inference_mode():
        tl = target.model(input_ids=ids, attention_mask=mask).logits[sel].float()  # [N, V]
        n = tl.shape[0]
        print(f"before: {load()}")
        t0 = clock()  # the compiled rows: compiled, or read from numba's on-disk cache, on first use
        core.position_metrics(tl[:2], tl[:2], s, s, top=top)
        print(f"  first call of the default scorer (numba compile or cache load): {clock() - t0:.1f} s")
        if fused:  # compile outside the timed rounds (reported apart)
            t0 = clock()
            core.position_metrics_fused(tl[:CH], tl[:CH], s, s, top=top)
            print(f"  torch.compile of the fused scorer: {clock() - t0:.1f} s (once per process and sampling case; {core._FUSED['broken'] or 'ok'})")
        for i in range(repeats):
            t0 = clock()
            tl = target.model(input_ids=ids, attention_mask=mask).logits[sel].float()  # [N, V]
            dl = dm(input_ids=ids, attention_mask=mask).logits[sel].float()  # [N, V]
            rows["forward"].append(clock() - t0)
            t0 = clock()
            for c in range(0, n, CH):  # the floor: every logit read once, per chunk as scoring does
                tl[c : c + CH].sum()
                dl[c : c + CH].sum()
            rows["floor"].append(clock() - t0)
            names = list(paths)
            for name in names[i % len(names) :] + names[: i % len(names)]:  # each scorer takes its turn first
                fn = paths[name]
                t0 = clock()
                for c in range(0, n, CH):
                    fn(tl[c : c + CH], dl[c : c + CH], s, s)
                rows[name].append(clock() - t0)
    fwd, floor = rows["forward"], rows["floor"]
    print(f"after:  {load()}")
    print(f"scoring overhead on SmolLM2 (V=49,152) on {device} {dtype}, {n} positions, chunk {CH}, top-{top}, T=0.7, "
          f"{torch.get_num_threads()} threads; {repeats} interleaved rounds, median (min–max):")
    print(f"  target + drafter forward passes   {_spread([x * 1e3 for x in fwd], '{:.1f}')} ms")
    print(f"  streaming floor (1 read pass)     {_spread([x * 1e3 for x in floor], '{:.1f}')} ms")
    out: dict[str, float] = {"forward_s": statistics.median(fwd), "positions": n}
    for name in paths:
        t = rows[name]
        ratio = [m / f for m, f in zip(t, fwd, strict=True)]
        floors = [m / fl for m, fl in zip(t, floor, strict=True)]
        print(f"  {name:<32}  {_spread([x * 1e3 for x in t], '{:.1f}')} ms   ratio to forward {_spread(ratio)}   "
              f"{_spread(floors, '{:.1f}')}× the streaming floor")
        out[name] = statistics.median(ratio)
    return out


_CHILD = """
import json, resource, sys
from specprobe.probe.alignment import SamplingFlags
from specprobe.probe.diagnose import run_diagnose
from specprobe.settings.pipeline import DiagnoseConfig
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
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--fused", action="store_true", help="also time the torch.compile'd scorer (compiled once first)")
    ap.add_argument("--top", type=int, default=5, help="top-k tokens asked of the scorers (diagnose's drill-down asks 5; 0: none)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-memory", action="store_true", help="skip the RSS comparison")
    ap.add_argument("--prompts", type=int, default=12, help="prompts in the 1× memory run (4× uses four times as many)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    overhead(args.repeats, args.device, args.dtype, args.fused, top=args.top)
    if not args.no_memory:
        memory(args.prompts)
