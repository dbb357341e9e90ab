"""Scoring overhead of an EAGLE-3 head at K = 4 on the real SmolLM2-135M (V = 49,152).

A randomly initialised EAGLE-3 head of SmolLM2's sizes with a draft vocabulary of
`--draft-vocab` ids (32,000 by default; written in the speculators layout, loaded as
`diagnose` loads it) is scored at depths 1..4, chunk by chunk through `scoring.score_chunk`
as `diagnose` scores it. Forward = the target's pass (logits at every position, aux layers
captured) + the head's four chained steps + its LM head. Metrics, two ways, A/B
interleaved (their order alternates between repeats):

  mapped   every depth's logits written into the target vocabulary (−inf elsewhere, as
           vLLM does) and scored by `position_metrics`, the target's softmax redone per
           depth — the path heads took before `scoring.score_head_chunk`;
  head     `score_head_chunk`: the target's side once per chunk, every depth in the draft
           vocabulary (the target's probabilities gathered at the draft ids), reused buffers.

Each repeat's ratio is metrics time ÷ that repeat's forward time; printed as median and
min–max over the repeats, with the load average before and after (the machine may be
shared). Target ≤ 0.10, as for independent drafters (benchmarks/bench_diagnose.py).
Prints; asserts nothing.

Run: python benchmarks/bench_heads.py [--repeats 5] [--draft-vocab 32000]
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


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _spread(xs: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(xs) * scale)} ({fmt.format(min(xs) * scale)}–{fmt.format(max(xs) * scale)})"


def overhead(repeats: int, k: int = 4, draft_vocab: int = 32000, top: int = 0) -> None:
    import torch

    from specprobe.alignment import SamplingPair
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.drafters import TargetPass, build_drafter, drafter_info
    from specprobe.models.heads.vocab import map_logits
    from specprobe.models.loader import load_model
    from specprobe.options import DEFAULT_CHUNK_POSITIONS as CH
    from specprobe.prompts import builtin_suite, select
    from specprobe.references import encode_prompt
    from specprobe.scoring import capture_layers, score_chunk

    load_before = _load()
    target = load_model("smollm2", "cpu", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        head_dir = write_random_head(target, Path(tmp) / "eagle3", draft_vocab)
        drafter = build_drafter(str(head_dir), target, info=drafter_info(str(head_dir), target.info))
        drafter.ensure_built()
    vocab = drafter.scoring_vocab()
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
    pos = cols + 1  # the predicted token's index, as the scorer passes it
    s = Sampling(temperature=0.7)
    pair = SamplingPair(s, s)

    def mapped(tl, raw) -> None:
        for c in range(0, n, CH):
            drafts = ((d, map_logits(raw[d - 1][c : c + CH], drafter.ids, drafter.vocab)) for d in range(1, k + 1))
            score_chunk(tl[c : c + CH], drafts, pos[c : c + CH], pair, top)

    def head(tl, raw) -> None:
        for c in range(0, n, CH):
            drafts = ((d, raw[d - 1][c : c + CH]) for d in range(1, k + 1))
            score_chunk(tl[c : c + CH], drafts, pos[c : c + CH], pair, top, vocab=vocab)

    fwd: list[float] = []
    times: dict[str, list[float]] = {"mapped": [], "head": []}
    ratios: dict[str, list[float]] = {"mapped": [], "head": []}
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first round warms up and is not counted
            t0 = time.perf_counter()
            with capture_layers(target.model, drafter.target_layers_needed()) as cap:
                out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=False)
            tl = out.logits[rows, cols]  # [N, V]
            tp = TargetPass(ids, mask, None, dict(cap))
            feats = drafter.hidden(tp)
            raw = [drafter.draft_logits(feats[d][rows, cols - d + 1], d) for d in range(1, k + 1)]  # K × [N, Vd]
            f = time.perf_counter() - t0
            order = [("mapped", mapped), ("head", head)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn(tl, raw)
                dt = time.perf_counter() - t0
                if r:
                    times[name].append(dt)
                    ratios[name].append(dt / f)
            if r:
                fwd.append(f)
            del out, tl, raw, feats
    print(f"EAGLE-3 head scoring overhead on SmolLM2 (V={target.vocab_size:,}, draft vocab {draft_vocab:,}), K={k}, "
          f"{n} positions × {k} depths, chunks of {CH}, top-k {top}, {torch.get_num_threads()} threads; "
          f"{repeats} interleaved repeats, median (min–max); load average {load_before} before, {_load()} after")
    print(f"  forward: target + head (4 chained steps + LM head)   {_spread(fwd, 1e3, '{:.0f}')} ms")
    for name, label in (("mapped", "mapped into V, position_metrics per depth"), ("head", "score_head_chunk (draft vocabulary)")):
        print(f"  {label:45s} {_spread(times[name], 1e3, '{:.0f}')} ms   ratio {_spread(ratios[name])}  (target ≤ 0.10)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--top", type=int, default=0, help="also each side's top-k at depth 1 (the drill-down asks for 5)")
    a = ap.parse_args()
    overhead(a.repeats, draft_vocab=a.draft_vocab, top=a.top)
