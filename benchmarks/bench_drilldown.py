"""Benchmarks for the token-level drill-down.

1. Scoring overhead on the real SmolLM2-135M (V = 49,152) with a self-draft: the whole
   `score()` (target pass, drafter, metrics) without and with the drill-down collector
   (top-5 of both sides per position, the what-if probe, the bookkeeping), timed in
   interleaved pairs A B A B … so machine load hits both alike; prints the median ratio
   with its min–max (goal ≤ 1.10).
2. Size: the drill-down section for 480 prompts × 128 tokens, built by the real collector
   from synthetic chunks (no model), as JSON the way a result file writes it (goal
   < 20 MB), and the time to build it.

Prints; asserts nothing. Run: python benchmarks/bench_drilldown.py [--pairs 5] [--prompts 24] [--new-tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace
from typing import Any

import numpy as np


# ----------------------------------------------------------------------------- size
class _Tok:
    """Decodes id i as ' w<i>' (byte-level style: the space is part of the token)."""

    all_special_ids = [0, 1, 2]

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(f" w{i}" for i in ids)


def synthetic_section(n_prompts: int, n_tokens: int, vocab: int = 49_152, seed: int = 0) -> dict[str, Any]:
    """The drill-down section the real collector makes from synthetic chunks of
    n_prompts × n_tokens positions (Zipf-distributed token ids, random α and KL)."""
    from specprobe.metrics.sampling import Sampling
    from specprobe.probe.chunks import ROW_FIELDS, Chunk, ChunkScores
    from specprobe.probe.counterfactual import TEMPERATURE_GRID
    from specprobe.probe.drilldown import TOP, DrillCollector

    rng = np.random.default_rng(seed)
    ids = lambda *shape: np.minimum(rng.zipf(1.3, size=shape), vocab - 1).astype(np.int64)  # noqa: E731
    items = [SimpleNamespace(id=f"p{i}", domain=("code", "math", "chat", "writing")[i % 4]) for i in range(n_prompts)]
    encoded = [ids(32).tolist() for _ in items]
    conts = [ids(n_tokens).tolist() for _ in items]
    pair = SimpleNamespace(target=Sampling(0.7), draft=Sampling(0.7))
    col = DrillCollector(_Tok(), items, encoded, conts, pair, k_max=8)
    for i in range(n_prompts):
        n = n_tokens
        a = rng.beta(2, 1, n)
        values = {f: rng.random(n) for f in ROW_FIELDS}
        values["accept_prob"], values["kl_target_draft_nats"] = a, rng.exponential(0.5, n)
        tp = np.sort(rng.dirichlet(np.ones(8), n)[:, :TOP], axis=1)[:, ::-1]
        dp = np.sort(rng.dirichlet(np.ones(8), n)[:, :TOP], axis=1)[:, ::-1]
        extra = {"target_ids": ids(n, TOP), "target_probs": tp, "draft_ids": ids(n, TOP), "draft_probs": dp, "target_probs_at_draft": dp * rng.random((n, TOP)), "draft_probs_at_target": tp * rng.random((n, TOP))}
        if col.probe.sampled(np.asarray([i]))[0]:
            extra.update({f"cf_temperature_{t:g}": np.clip(a + 0.05, 0, 1) for t in TEMPERATURE_GRID} | {"cf_vocab_ceiling": np.ones(n)})
        col.chunk(Chunk(np.full(n, i), len(encoded[i]) + np.arange(n)), ChunkScores(values, extra=extra))
        if i % 8 == 7:
            col.batch_done()
    col.batch_done()
    by_domain = [{"group": d, "positions": n_prompts * n_tokens // 4, "accept_prob_mean": m} for d, m in zip(("code", "math", "chat", "writing"), (0.55, 0.6, 0.7, 0.65), strict=True)]
    section, _ = col.section(4, by_domain, 0.62)
    return section


def size(n_prompts: int, n_tokens: int) -> None:
    from specprobe.result import DrillDown

    t0 = time.perf_counter()
    section = synthetic_section(n_prompts, n_tokens)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    text = json.dumps(DrillDown.model_validate(section).model_dump(mode="json"), indent=1, ensure_ascii=False)
    dumped = time.perf_counter() - t0
    mb = len(text.encode()) / 1e6
    print(f"drill-down section for {n_prompts} prompts × {n_tokens} tokens: {mb:.1f} MB as written (goal < 20 MB); "
          f"collector + section {built:.1f} s, validate + JSON {dumped:.1f} s; {len(section['vocab']):,} token texts")


# ----------------------------------------------------------------------------- overhead
def overhead(pairs: int, n_prompts: int, new_tokens: int) -> None:
    import torch

    from specprobe.core.progress import Progress
    from specprobe.probe.diagnose import load_pair
    from specprobe.probe.drilldown import DrillCollector
    from specprobe.probe.references import load_prompt_set, references_by_turn
    from specprobe.probe.scoring import score
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    cfg = DiagnoseConfig(target="smollm2", drafter="self:layers=24", max_prompts=n_prompts, max_new_tokens=new_tokens, sampling=SamplingFlags(temperature=0.7), cost_ratio=0.8, device="cpu", keep_positions=False)
    progress = Progress()
    pair = load_pair(cfg, progress)
    refs = references_by_turn(pair.target, list(load_prompt_set(cfg).prompts), cfg, pair.sampling.target, progress)

    def run(with_drill: bool) -> float:
        sinks = [DrillCollector(pair.target.tokenizer, refs.items, refs.encoded, refs.conts, pair.sampling, k_max=cfg.k_max)] if with_drill else []
        t0, c0 = time.perf_counter(), time.process_time()
        score(pair.target, pair.drafter, refs.items, refs.encoded, refs.conts, pair.sampling, cfg, progress, collectors=sinks)
        return time.perf_counter() - t0, time.process_time() - c0

    run(False), run(True)  # warm-up: caches, allocator, thread pool
    a, b = [], []
    for _ in range(pairs):
        a.append(run(False))
        b.append(run(True))
    n = sum(len(c) for c in refs.conts)
    print(f"scoring {len(refs.items)} prompts, {n} positions on SmolLM2 (V=49,152), self:layers=24, {torch.get_num_threads()} threads, {pairs} interleaved pairs:")
    # wall time swings with other processes' load; the process's CPU time much less so
    for k, what in ((0, "wall"), (1, "CPU")):
        x, y = [t[k] for t in a], [t[k] for t in b]
        r = [q / p for p, q in zip(x, y, strict=True)]
        print(f"  {what:4} without drill-down  median {statistics.median(x):.2f} s (min {min(x):.2f}, max {max(x):.2f})")
        print(f"  {what:4} with drill-down     median {statistics.median(y):.2f} s (min {min(y):.2f}, max {max(y):.2f})")
        print(f"  {what:4} ratio with/without  median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})  goal ≤ 1.10")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 is steadier on a busy machine")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    size(480, 128)
    if not args.skip_overhead:
        overhead(args.pairs, args.prompts, args.new_tokens)
