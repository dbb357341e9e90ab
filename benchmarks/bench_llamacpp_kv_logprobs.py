"""llama.cpp's KV-cache types against specprobe's simulation of them, token by token:
llama-server serves SmolLM2-135M (the F32 GGUF, no draft model) with `-ctk T -ctv T -fa on`,
greedy, and returns each generated token's top-N log-probabilities (`n_probs`: the
softmax of the raw logits); specprobe teacher-forces the same prompt and text through the
same F32 weights, once with `--kv-cache-dtype T` (the cache as ggml stores it) and once
without, and the two are compared with the server's log-probabilities of its own top-N
tokens at every position.

Four distances per cache type: server vs specprobe fp32 (what the cache moves the
server's log-probabilities), server vs specprobe with the simulated cache, specprobe's
simulated cache vs its fp32 (what the simulation moves them), and the simulation vs
itself with the key weights nudged by float32-rounding-sized noise (--nudge, 1e-7
relative): a block-quantized K cache can be chaotic — a value near a rounding boundary
flips by one step on an ulp — and then no reimplementation reproduces another engine's
log-probabilities position by position; the nudged row says how far apart two correct
implementations would already be. The f16 cache (the server's default) is the reference.

Prints the table; asserts nothing.

Run: python benchmarks/bench_llamacpp_kv_logprobs.py [--types f16,q8_0,q4_0]
     [--max-prompts 4] [--max-new-tokens 32] [--n-probs 10] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def served_logprobs(binary: Path, target: Path, kv: str | None, prompts: list[list[int]], max_new: int, n_probs: int, log: Path, threads: int) -> list[dict[str, Any]]:
    """Per request: the tokens llama-server generated and, per token, its top-n_probs
    {token id: logprob} (pre-sampling: the raw logits' softmax)."""
    from tests.helpers.llamacpp import http_json, llama_server

    extra = ("-ctk", kv, "-ctv", kv, "-fa", "on") if kv else ()
    out = []
    with llama_server(binary, target, None, 0, log, threads=threads, extra=extra) as srv:
        for p in prompts:
            body = {"prompt": p, "n_predict": max_new, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "n_probs": n_probs, "cache_prompt": False, "return_tokens": True}
            r = http_json(srv.base + "/completion", body)
            probs = [{int(t["id"]): float(t["logprob"]) for t in step["top_logprobs"]} for step in r["completion_probabilities"]]
            out.append({"tokens": [int(t["id"]) for t in r["completion_probabilities"]], "top": probs})
    return out


def top_logprobs(loaded: Any, prompts: list[list[int]], served: list[dict[str, Any]]) -> list[list[dict[int, float]]]:
    """specprobe's log-probabilities of the server's top tokens along the server's text,
    per request and position; the argmax token under key -1."""
    import torch

    out = []
    with torch.no_grad():
        for prompt, s in zip(prompts, served, strict=True):
            if not s["tokens"]:
                out.append([])
                continue
            logp = torch.log_softmax(loaded.model(torch.tensor([prompt + s["tokens"]])).logits[0].float(), -1)
            rows = []
            for j, top in enumerate(s["top"]):
                row = logp[len(prompt) - 1 + j]
                rows.append({**{t: float(row[t]) for t in top}, -1: int(row.argmax())})
            out.append(rows)
    return out


def distance(a: list[list[dict[int, float]]], b: list[list[dict[int, float]]], tokens: list[list[int]]) -> dict[str, float]:
    """Mean and max |Δ logprob| over every (position, top token), the median of the
    requests' means, and how often a's argmax is the server's token."""
    diffs: list[float] = []
    per_request: list[float] = []
    same = total = 0
    for ra, rb, toks in zip(a, b, tokens, strict=True):
        mine = [abs(x[t] - y[t]) for x, y in zip(ra, rb, strict=True) for t in x if t != -1]
        if not mine:
            continue
        diffs += mine
        per_request.append(statistics.fmean(mine))
        same += sum(int(x[-1] == tok) for x, tok in zip(ra, toks, strict=True))
        total += len(ra)
    return {"mean": statistics.fmean(diffs), "max": max(diffs), "median_request": statistics.median(per_request), "argmax": same / total}


def server_rows(served: list[dict[str, Any]]) -> list[list[dict[int, float]]]:
    return [[{**top, -1: tok} for top, tok in zip(s["top"], s["tokens"], strict=True)] for s in served]


@contextmanager
def nudged_keys(loaded: Any, eps: float, seed: int = 0) -> Iterator[None]:
    """Every k_proj weight times (1 + eps·N(0, 1)) for the duration: keys that differ from
    the plain ones at the level of float32 rounding (eps ~ 1e-7), as another engine's
    summation order makes them differ — how reproducible a quantized cache's logits are."""
    import torch

    g = torch.Generator().manual_seed(seed)
    saved = []
    for layer in loaded.model.model.layers:
        w = layer.self_attn.k_proj.weight
        saved.append(w.data.clone())
        w.data.mul_(1 + eps * torch.randn(w.shape, generator=g))
    try:
        yield
    finally:
        for layer, w in zip(loaded.model.model.layers, saved, strict=True):
            layer.self_attn.k_proj.weight.data.copy_(w)


def main() -> None:
    from common import (
        int_options,  # benchmarks/common.py: run as a script, its folder is on the path
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="the server's -ctk/-ctv types (f16 is its default)")
    int_options(ap, max_prompts=4, max_new_tokens=32, n_probs=10, threads=2)
    ap.add_argument("--work", type=Path, default=None, help="keep the F32 GGUF here (reused when present)")
    ap.add_argument("--nudge", type=float, default=1e-7, help="relative noise on the key weights for the reproducibility row")
    args = ap.parse_args()

    from benchmarks.bench_llamacpp_peer import encoded_prompts
    from specprobe.models.loader import builtin_gguf_path, load_model
    from specprobe.precision.kv_served import serve_kv_cache
    from specprobe.precision.quant import as_loaded
    from tests.helpers.gguf_quant import write_gguf_at
    from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

    binary = find_llama_server()
    if binary is None:
        raise SystemExit(f"llama-server is not built: run {BUILD_SCRIPT} first")
    prompts = encoded_prompts(args.max_prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specprobe-kv-logprobs-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        f32 = work / "smollm2-F32.gguf"
        f32 = f32 if f32.exists() else write_gguf_at(builtin_gguf_path("smollm2"), f32, "F32")
        for kv in [t for t in args.types.split(",") if t]:
            served = served_logprobs(binary, f32, kv, prompts, args.max_new_tokens, args.n_probs, work / f"server-kv-{kv}.log", args.threads)
            loaded = load_model(str(f32), device="cpu", dtype="float32")
            serve_kv_cache(loaded, kv)
            server, tokens = server_rows(served), [s["tokens"] for s in served]
            sim = top_logprobs(loaded, prompts, served)
            with nudged_keys(loaded, args.nudge):
                nudged = top_logprobs(loaded, prompts, served)
            with as_loaded(loaded):
                plain = top_logprobs(loaded, prompts, served)
            r = {"plain": distance(plain, server, tokens), "sim": distance(sim, server, tokens), "sim_plain": distance(sim, plain, tokens), "sim_nudged": distance(nudged, sim, tokens)}
            rows.append((kv, r))
            print(f"{kv}: {r}", file=sys.stderr, flush=True)

    print(f"\nSmolLM2-135M F32 GGUF on llama-server (-ctk T -ctv T -fa on, greedy, no draft model), {len(prompts)} built-in prompts × {args.max_new_tokens} tokens; "
          f"specprobe teacher-forced on the server's text; |Δ| over the server's top-{args.n_probs} log-probabilities at every position")
    print(f"{'server cache':>12} | {'between':>44} | {'mean |Δ logprob|':>16} | {'max':>7} | {'median of requests':>18} | {'argmax = server':>15}")
    for kv, r in rows:
        for label, key in (("server and specprobe fp32 (no KV rounding)", "plain"), (f"server and specprobe --kv-cache-dtype {kv}", "sim"),
                           (f"specprobe {kv} and specprobe fp32", "sim_plain"), (f"specprobe {kv} and itself, keys nudged {args.nudge:g}", "sim_nudged")):
            d = r[key]
            print(f"{kv:>12} | {label:>44} | {d['mean']:>16.5f} | {d['max']:>7.4f} | {d['median_request']:>18.5f} | {100 * d['argmax']:>14.1f}%")


if __name__ == "__main__":
    main()
