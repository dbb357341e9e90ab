"""Scoring overhead of an EAGLE-3 head at K = 4 on the real SmolLM2-135M (V = 49,152).

A randomly initialised EAGLE-3 head of SmolLM2's sizes with a draft vocabulary of
`--draft-vocab` ids (32,000 by default; written in the speculators layout, loaded as
`diagnose` loads it) is scored at depths 1..4, chunk by chunk through `scoring.score_chunk`
as `diagnose` scores it. Forward = the target's pass (logits at every position, aux layers
captured) + the head's four chained steps + its LM head. Metrics, two ways, A/B
interleaved (their order alternates between repeats):

  mapped   every depth's logits written into the target vocabulary (−inf elsewhere, as
           vLLM does) and scored by the eager whole-chunk `position_metrics` (its
           `position_metrics_reference` where that exists), the target's softmax redone
           per depth — the path heads took before `scoring.score_head_chunk`;
  head     `score_chunk` as `diagnose` calls it: `score_head_chunk` — the target's side once
           per chunk, every depth in the draft vocabulary (the target's probabilities
           gathered at the draft ids), reused buffers — or, for a head over the target's
           whole vocabulary on a CPU (`--draft-vocab 49152`), the compiled rows per depth;
           then `score_head_chunk` itself is timed too ("shared").

Each repeat's ratio is metrics time ÷ that repeat's forward time; printed as median and
min–max over the repeats, with the load average before and after (the machine may be
shared). Target ≤ 0.10, as for independent drafters (benchmarks/bench_diagnose.py).
Prints; asserts nothing.

`--head PATH` scores a head checkpoint of any layout instead (e.g. one written by
benchmarks/train_heads.py), at the depths it has up to K; `--top 5` adds the top-k columns
the drill-down asks for.

Run: python benchmarks/bench_heads.py [--repeats 5] [--draft-vocab 32000] [--head PATH] [--top 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import builtin_batch  # benchmarks/common.py: run as a script, its folder is on the path


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


def overhead(repeats: int, k: int = 4, draft_vocab: int = 32000, top: int = 0, head_path: str | None = None, block: int = 0) -> None:
    import torch

    from specprobe.drafters.base import TargetPass
    from specprobe.metrics import core
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.anatomy import capture_layers
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.heads.vocab import map_logits
    from specprobe.models.loader import load_model
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.scoring import _plain_head, score_chunk, score_head_chunk
    from specprobe.settings.pipeline import DEFAULT_CHUNK_POSITIONS as CH

    load_before = _load()
    target = load_model("smollm2", "cpu", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        spec = head_path or str(write_random_head(target, Path(tmp) / "eagle3", draft_vocab))
        drafter = build_drafter(spec, target, info=drafter_info(spec, target.info))
        drafter.ensure_built()
    vocab = drafter.scoring_vocab()
    vd = vocab.vocab if vocab.ids is None else int(vocab.ids.shape[0])
    ids, mask = builtin_batch(target.tokenizer)
    rows, cols = torch.nonzero(mask[:, k:], as_tuple=True)  # positions with all K depths inside
    cols = cols + k
    n = int(rows.numel())
    pos = cols + 1  # the predicted token's index, as the scorer passes it
    s = Sampling(temperature=0.7)
    pair = SamplingPair(s, s)

    # the eager whole-chunk computation (before any cache blocking of position_metrics)
    eager = getattr(core, "position_metrics_reference", core.position_metrics)

    def mapped(tl, raw) -> None:
        for c in range(0, n, CH):
            for d, r in raw.items():
                eager(tl[c : c + CH], _mapped(r[c : c + CH]), s, s, top=top if d == 1 else 0)

    def _mapped(r):
        return r if drafter.ids is None else map_logits(r, drafter.ids, drafter.vocab)

    def head(tl, raw, ch: int = CH) -> None:
        for c in range(0, n, ch):
            drafts = ((d, r[c : c + ch]) for d, r in raw.items())
            score_chunk(tl[c : c + ch], drafts, pos[c : c + ch], pair, top, vocab=vocab)

    def shared(tl, raw) -> None:  # score_head_chunk itself, even where score_chunk routes a head elsewhere
        for c in range(0, n, CH):
            drafts = ((d, r[c : c + CH]) for d, r in raw.items())
            score_head_chunk(tl[c : c + CH], drafts, pos[c : c + CH], pair, vocab, top)

    variants = {"mapped": mapped, "head": head}
    labels = {"mapped": "mapped into V, position_metrics per depth", "head": "score_chunk (as diagnose scores it)"}
    if _plain_head(torch.empty(0), vocab, pair):  # a full-vocabulary head on a CPU: compiled rows per depth
        variants["shared"] = shared
        labels["head"] = "score_chunk: compiled rows per depth"
        labels["shared"] = "score_head_chunk (shared target side)"
    if block:
        variants["blocked"] = lambda tl, raw: head(tl, raw, block)
        labels["blocked"] = f"score_head_chunk, {block} rows at a time"

    fwd: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first round warms up and is not counted
            t0 = time.perf_counter()
            with capture_layers(target.model, drafter.target_layers_needed()) as cap:
                last = target.last_hidden(ids, mask)  # [B, S, H]
            tl = target.head(last[rows, cols])  # [N, V], as the scorer applies the LM head
            tp = TargetPass(ids, mask, last, dict(cap))
            feats = drafter.hidden(tp)
            raw = {d: drafter.draft_logits(feats[d][rows, cols - d + 1], d) for d in feats if d <= k}  # depth -> [N, Vd]
            f = time.perf_counter() - t0
            order = list(variants.items())
            for name, fn in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn(tl, raw)
                dt = time.perf_counter() - t0
                if r:
                    times[name].append(dt)
                    ratios[name].append(dt / f)
            if r:
                fwd.append(f)
            feats_depths = sorted(raw)
            del last, tl, raw, feats
    print(f"{drafter.name}: head scoring overhead on SmolLM2 (V={target.vocab_size:,}, draft vocab {vd:,}), K={k}, "
          f"{n} positions × {len(feats_depths)} depths, chunks of {CH}, top-k {top}, {torch.get_num_threads()} threads; "
          f"{repeats} interleaved repeats, median (min–max); load average {load_before} before, {_load()} after")
    print(f"  forward: target + head (its steps + LM head)         {_spread(fwd, 1e3, '{:.0f}')} ms")
    for name, label in labels.items():
        print(f"  {label:45s} {_spread(times[name], 1e3, '{:.0f}')} ms   ratio {_spread(ratios[name])}  (target ≤ 0.10)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--head", default=None, help="a head checkpoint (any layout) instead of the random EAGLE-3 head")
    ap.add_argument("--block", type=int, default=0, help="also score_head_chunk on this many rows at a time (cache blocking)")
    ap.add_argument("--top", type=int, default=0, help="also each side's top-k at depth 1 (the drill-down asks for 5)")
    a = ap.parse_args()
    overhead(a.repeats, draft_vocab=a.draft_vocab, top=a.top, head_path=a.head, block=a.block)
