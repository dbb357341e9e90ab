"""Scoring overhead of an EAGLE-3 head at K = 4 on the real SmolLM2-135M (V = 49,152).

A randomly initialised EAGLE-3 head of SmolLM2's sizes with a 32,000-id draft vocabulary
(written in the speculators layout, loaded as `diagnose` loads it) is scored at depths
1..4. Forward = the target's pass (logits at every position, aux layers captured) + the
head's four chained steps + its LM head; metrics = the d2t mapping into the target
vocabulary + the per-position metrics, for every depth; and the leaner path that depths
≥ 2 allow (they feed only α and max q into the depth curves): the target's distribution
once per chunk and each depth's α in the draft vocabulary (`vocab.depth_accept`). Target
ratio ≤ 0.10, as for independent drafters (benchmarks/bench_diagnose.py). Prints;
asserts nothing.

Run: python benchmarks/bench_heads.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def write_random_head(target, dest: Path, draft_vocab: int = 32000) -> Path:
    import torch

    from specprobe.models.heads.export import eagle3_layer_config, write_eagle3_speculators
    from specprobe.models.heads.layers import Eagle3Head
    from specprobe.models.heads.layout import default_aux_layers

    torch.manual_seed(0)
    cfg = eagle3_layer_config(target.config)
    h = int(cfg["hidden_size"])
    head = Eagle3Head(cfg, h, 3 * h, draft_vocab, norm_before_residual=False)
    ids = torch.randperm(target.vocab_size)[:draft_vocab].sort().values
    aux = list(default_aux_layers(target.num_layers))
    return write_eagle3_speculators(dest, head, cfg, ids, target.vocab_size, aux_ids=aux, verifier="HuggingFaceTB/SmolLM2-135M-Instruct")


def overhead(repeats: int, k: int = 4) -> None:
    import torch

    from specprobe.metrics.core import position_metrics
    from specprobe.metrics.sampling import Sampling, probs
    from specprobe.models.drafters import TargetPass, build_drafter, drafter_info
    from specprobe.models.heads.vocab import depth_accept, map_logits
    from specprobe.models.loader import load_model
    from specprobe.options import DEFAULT_CHUNK_POSITIONS as CH
    from specprobe.prompts import builtin_suite, select
    from specprobe.references import encode_prompt
    from specprobe.scoring import capture_layers

    target = load_model("smollm2", "cpu", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        head_dir = write_random_head(target, Path(tmp) / "eagle3")
        drafter = build_drafter(str(head_dir), target, info=drafter_info(str(head_dir), target.info))
        drafter.ensure_built()
    prompts = select(builtin_suite(), max_prompts=8).prompts
    seqs = [encode_prompt(target.tokenizer, p)[:96] for p in prompts]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), target.tokenizer.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    rows, cols = torch.nonzero(mask[:, k:], as_tuple=True)  # positions with all K depths inside
    cols = cols + k
    n = int(rows.numel())
    s = Sampling(temperature=0.7)
    fwd, ours, lean = [], [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            with capture_layers(target.model, drafter.target_layers_needed()) as cap:
                out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=False)
            tl = out.logits[rows, cols]  # [N, V]
            tp = TargetPass(ids, mask, None, dict(cap))
            feats = drafter.hidden(tp)
            raw = [drafter.head_logits(feats[d][rows, cols - d + 1], d) for d in range(1, k + 1)]  # K × [N, Vd]
            fwd.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for d in range(1, k + 1):
                for c in range(0, n, CH):
                    q = map_logits(raw[d - 1][c : c + CH], drafter.ids, drafter.vocab)
                    position_metrics(tl[c : c + CH], q, s, s)
            ours.append(time.perf_counter() - t0)
            # depth 1 in full; depths ≥ 2 need only α and max q: the target's p once per
            # chunk, each depth in the draft vocabulary (vocab.depth_accept)
            t0 = time.perf_counter()
            for c in range(0, n, CH):
                position_metrics(tl[c : c + CH], map_logits(raw[0][c : c + CH], drafter.ids, drafter.vocab), s, s)
                p = probs(tl[c : c + CH], s)
                for d in range(2, k + 1):
                    depth_accept(p, raw[d - 1][c : c + CH], drafter.ids, s)
            lean.append(time.perf_counter() - t0)
    f, o, le = statistics.median(fwd), statistics.median(ours), statistics.median(lean)
    print(f"EAGLE-3 head scoring overhead on SmolLM2 (V=49,152, draft vocab 32,000), K={k}, {n} positions × {k} depths, {torch.get_num_threads()} threads, median of {repeats}:")
    print(f"  target forward + head (4 chained steps + LM head)   {f * 1e3:8.1f} ms")
    print(f"  d2t mapping + full metrics at every depth           {o * 1e3:8.1f} ms   ratio {o / f:.3f}  (target ≤ 0.10)")
    print(f"  full metrics at depth 1, α + max q at depths 2..{k}    {le * 1e3:8.1f} ms   ratio {le / f:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    overhead(ap.parse_args().repeats)
