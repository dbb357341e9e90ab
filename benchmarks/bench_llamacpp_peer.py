"""Peer comparison: `specprobe simulate` against llama.cpp's own speculative decoding.

The same pair on both sides — SmolLM2-135M as target, its first N blocks as a layer-skip
self-draft (N = 28 and 24) — greedy, the same K, the same prompts (the built-in suite's
first --max-prompts, tokenised once with the target's chat template and sent to
llama-server as token ids), the same number of new tokens.

- llama.cpp: `llama-server` (benchmarks/build_llama_server.sh) with the self-draft
  written as a GGUF whose blocks are the target's own Q4_1 bytes; acceptance is the sum
  of the responses' `timings.draft_n_accepted` ÷ `draft_n`, and tokens per verify step
  comes from the server's `llamacpp:spec_decode_num_drafts_total` counter.
- specprobe: `specprobe simulate smollm2 self:layers=N --temperature 0 --k K` (the CLI,
  its --json); the model is SmolLM2's GGUF dequantised to fp32.

Both sides draft a fixed K: llama-server runs with --spec-draft-n-min 0 and
--spec-draft-p-min 0 (no early stop on a low-confidence draft token); it shortens a
draft only where the token budget runs out.

The two should agree within ~10 % (Q4_1 in llama.cpp against fp32 here moves a few
argmaxes, and from the first changed token on the two sides decode different text).
τ is 1 + accepted ÷ verify steps on both sides. Prints the table, with the standard
error of llama.cpp's acceptance over the prompts as a yardstick for the gap; asserts
nothing.

Then it splits the gap. In greedy decoding every accepted draft token is the target's
own, so one teacher-forced fp32 pass along llama.cpp's emitted text says, at each
position, whether specprobe's drafter would have proposed that token; replaying the
draft→verify steps on it gives what specprobe's drafter accepts on llama.cpp's very text.
Where that matches llama.cpp, the drafters agree and what is left of the gap is the text:
the fp32 target leaves llama.cpp's text at its first differing argmax (printed per prompt).

Run: python benchmarks/bench_llamacpp_peer.py [--layers 28,24] [--k 4] [--max-prompts 8]
     [--simulate-from DIR]   (reuse simulate-N.json from an earlier run's settings)
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers: the llama-server helpers the tests use


def encoded_prompts(max_prompts: int) -> list[list[int]]:
    """The prompts simulate runs with --prompts builtin --max-prompts N, as token ids."""
    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    return [encode_prompt(tok, p) for p in select(builtin_suite(), max_prompts=max_prompts).prompts]


def ratio_se(num: list[int], den: list[int]) -> float:
    """Standard error of Σnum/Σden over prompts (ratio estimator): how much the aggregate
    acceptance moves with the choice of prompts, which a few differing argmaxes (Q4_1 against
    fp32) reshuffle like a fresh sample."""
    n, total = len(num), sum(den)
    if n < 2 or not total:
        return float("nan")
    r = sum(num) / total
    return (n / (n - 1) * sum((a - r * d) ** 2 for a, d in zip(num, den, strict=True))) ** 0.5 / total


def llamacpp_side(binary: Path, layers: int, k: int, prompts: list[list[int]], max_new: int, work: Path, threads: int) -> dict[str, Any]:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.llamacpp import http_text, llama_server, write_self_draft_gguf

    def drafts_total(text: str) -> float:
        for line in text.splitlines():
            if line.startswith("llamacpp:spec_decode_num_drafts_total"):
                return float(line.split()[-1])
        return float("nan")

    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, work / f"smollm2-first{layers}.gguf", layers)
    with llama_server(binary, target, draft, k, work / f"server-{layers}.log", threads=threads) as srv:
        d0 = drafts_total(http_text(srv.base + "/metrics"))
        t0 = time.perf_counter()
        responses = [srv.complete(p, max_new) for p in prompts]
        timings = [r["timings"] for r in responses]
        wall = time.perf_counter() - t0
        d1 = drafts_total(http_text(srv.base + "/metrics"))
    outputs = [list(r.get("tokens") or []) for r in responses]
    stops = [str(r.get("stop_type", "")) for r in responses]
    drafted = sum(int(t.get("draft_n", 0)) for t in timings)
    accepted = sum(int(t.get("draft_n_accepted", 0)) for t in timings)
    generated = sum(int(t.get("predicted_n", 0)) for t in timings)
    drafts = d1 - d0
    return {
        "accept_rate": accepted / drafted if drafted else float("nan"),
        "accept_rate_se": ratio_se([int(t.get("draft_n_accepted", 0)) for t in timings], [int(t.get("draft_n", 0)) for t in timings]),
        "tokens_per_verify": 1 + accepted / drafts if drafts else float("nan"),
        "drafted": drafted,
        "accepted": accepted,
        "drafts": drafts,
        "generated": generated,
        "tokens_per_s": generated / wall if wall else float("nan"),
        "per_prompt": [(int(t.get("draft_n_accepted", 0)), int(t.get("draft_n", 0))) for t in timings],
        "outputs": outputs,
        "stops": stops,
    }


# ----------------------------------------------------------------------------- replay
@functools.cache
def _fp32_model() -> Any:
    """SmolLM2's GGUF dequantised to fp32: the model simulate runs."""
    import torch
    from transformers import AutoModelForCausalLM

    from specprobe.models.loader import checkpoint_dir, resolve

    return AutoModelForCausalLM.from_pretrained(str(checkpoint_dir(resolve("smollm2"))), dtype=torch.float32).eval()


def greedy_rounds(agree: list[bool], k: int, budget: int) -> list[tuple[int, int, int]]:
    """Greedy speculative decoding replayed along a fixed output T (len L, T[0] from the
    prompt pass): agree[j] says the drafter's greedy token after prompt + T[:j] is T[j].
    Every accepted draft token is a token of T (in greedy decoding the target's own; when
    the target samples, its sample), so the drafter's context inside an accepted run is T
    itself and one teacher-forced pass decides every step. Draft length per step as
    llama-server sets it: min(K, tokens left in the budget − 1). One (t, accepted, drafted)
    per verify step: it drafted T[t + 1 .. t + drafted], accepted the first `accepted`."""
    t, rounds = 0, []
    while t < len(agree) - 1:
        kk = min(k, budget - (t + 1) - 1)
        if kk <= 0:  # no room for a draft: an ordinary decoding step
            t += 1
            continue
        n = 0
        while n < kk and t + 1 + n < len(agree) and agree[t + 1 + n]:
            n += 1
        rounds.append((t, n, kk))
        t += n + 1  # the accepted drafts and the target's own next token
    return rounds


def replay_greedy(agree: list[bool], k: int, budget: int) -> tuple[int, int, int]:
    """`greedy_rounds` counted: (accepted, drafted, verify steps)."""
    rounds = greedy_rounds(agree, k, budget)
    return sum(n for _, n, _ in rounds), sum(kk for _, _, kk in rounds), len(rounds)


def fp32_agreement(prompts: list[list[int]], outputs: list[list[int]], layers_list: list[int]) -> dict[str, Any]:
    """One fp32 forward of the dequantised target over prompt + output for each prompt:
    per output position, does the self-draft of N layers (and the target itself) pick the
    token that llama.cpp emitted?"""
    import torch

    model = _fp32_model()
    draft: dict[int, list[list[bool]]] = {n: [] for n in layers_list}
    target: list[list[bool]] = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs, strict=True):
            ids = torch.tensor([prompt + out])  # [1, S]
            res = model(ids, output_hidden_states=True)
            pos = slice(len(prompt) - 1, len(prompt) + len(out) - 1)  # logits that predict out[j]
            want = ids[0, len(prompt) :]
            target.append((res.logits[0, pos].argmax(-1) == want).tolist())
            for n in layers_list:
                # hidden_states[n]: the output of the first n blocks; the final norm and the
                # head on top make the self-draft's logits (hidden_states[-1] is normed already)
                logits = model.lm_head(model.model.norm(res.hidden_states[n][0, pos]))  # [L, V]
                draft[n].append((logits.argmax(-1) == want).tolist())  # [0] unused: T[0] is not drafted
    return {"draft": draft, "target": target}


def specprobe_side(layers: int, k: int, max_prompts: int, max_new: int, work: Path, reuse: Path | None = None) -> dict[str, Any]:
    out = work / f"simulate-{layers}.json"
    if reuse is not None:  # a result an earlier run wrote with these same settings
        out = reuse / f"simulate-{layers}.json"
        return _simulate_row(json.loads(out.read_text()), k, max_prompts, max_new)
    cmd = [
        sys.executable, "-c", "from specprobe.cli.main import run; run()",
        "simulate", "smollm2", f"self:layers={layers}", "--temperature", "0", "--k", str(k),
        "--max-prompts", str(max_prompts), "--max-new-tokens", str(max_new), "--device", "cpu",
        "--cost-ratio", f"{layers / 30:.3f}",  # the estimate's cost ratio, given: no timing run
        "--json", str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603
    if not out.exists():
        raise SystemExit(f"simulate failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return _simulate_row(json.loads(out.read_text()), k, max_prompts, max_new)


def _simulate_row(doc: dict[str, Any], k: int, max_prompts: int, max_new: int) -> dict[str, Any]:
    cfg = doc.get("config") or {}
    if doc.get("interrupted") or cfg.get("max_new_tokens") not in (None, max_new):
        raise SystemExit(f"the simulate result was interrupted or made with other settings ({cfg.get('max_new_tokens')} new tokens)")
    rows = [r for r in (doc.get("measured") or {}).get("k_table", []) if int(r.get("k", -1)) == k]
    if not rows:
        raise SystemExit(f"simulate's JSON has no measured row for K={k}")
    row = rows[0]
    return {
        "accept_rate": float(row["accept_rate"]),
        # 1 + Σ r_i: with full-length drafts, 1 + accepted/drafts as llama.cpp counts it
        "tokens_per_verify": float(row.get("tau_tokens", float("nan"))),
        "drafts": row.get("num_drafts"),
        "generated": row.get("emitted_tokens"),
    }


def _rate(acc: int, dr: int) -> float:
    return acc / dr if dr else float("nan")


def main() -> None:
    from common import (
        int_options,  # benchmarks/common.py: run as a script, its folder is on the path
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="28,24", help="self-draft depths, comma-separated")
    int_options(ap, k=4, max_prompts=8, max_new_tokens=64)
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads")
    ap.add_argument("--simulate-from", type=Path, default=None, metavar="DIR", help="read simulate-N.json from DIR (an earlier run with these settings) instead of running simulate")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve
    from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

    binary = find_llama_server()
    if binary is None:
        raise SystemExit(f"llama-server is not built: run {BUILD_SCRIPT} first")
    prompts = encoded_prompts(args.max_prompts)
    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    eos = {int(tok.eos_token_id)} | {int(i) for i in tok.convert_tokens_to_ids(["<|endoftext|>"]) if i is not None}
    layers_list = [int(x) for x in args.layers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="specprobe-peer-") as tmp:
        work = Path(tmp)
        for layers in layers_list:
            lc = llamacpp_side(binary, layers, args.k, prompts, args.max_new_tokens, work, args.threads)
            sp = specprobe_side(layers, args.k, args.max_prompts, args.max_new_tokens, work, args.simulate_from)
            rows.append((layers, lc, sp))
            brief = {k: v for k, v in lc.items() if k not in ("outputs", "stops")}
            print(f"N={layers}: llama.cpp {brief} | specprobe {sp}", file=sys.stderr)

    print(f"\nSmolLM2-135M, self-draft = first N of 30 blocks, greedy, K={args.k}, "
          f"{len(prompts)} built-in prompts × {args.max_new_tokens} new tokens ({binary.parent.parent.name})")
    print(f"{'N':>3} | {'llama.cpp accept (± SE over prompts)':>36} | {'specprobe accept':>16} | {'rel. diff':>9} | {'llama.cpp τ':>11} | {'specprobe τ':>11}")
    for layers, lc, sp in rows:
        rel = sp["accept_rate"] / lc["accept_rate"] - 1 if lc["accept_rate"] else float("nan")
        lc_acc = f"{lc['accept_rate']:.3f} ± {lc['accept_rate_se']:.3f}"
        print(f"{layers:>3} | {lc_acc:>36} | {sp['accept_rate']:>16.3f} | {100 * rel:>+8.1f}% | {lc['tokens_per_verify']:>11.2f} | {sp['tokens_per_verify']:>11.2f}")
        print(f"    llama.cpp: {lc['accepted']}/{lc['drafted']} accepted over {lc['drafts']:.0f} verify steps, {lc['generated']} tokens")

    # Where the gap comes from. Greedy acceptance depends on the text decoded, and Q4_1
    # (llama.cpp) and fp32 (specprobe) targets decode different texts from the first
    # argmax they disagree on. Replaying each side's drafter along one fixed text splits
    # the gap into "another text" and "another drafter on the same text".
    lc_texts = {layers: [o + [min(eos)] if stop == "eos" and (not o or o[-1] not in eos) else o for o, stop in zip(lc["outputs"], lc["stops"], strict=True)] for layers, lc, _ in rows}
    print("\nThe fp32 drafter (specprobe's) replayed along llama.cpp's own text — greedy, K, and the")
    print("draft length per step as llama-server sets it (accepted / drafted):")
    print(f"{'N':>3} | {'llama.cpp on its text':>21} | {'fp32 drafter, same text':>23} | {'same per prompt':>15} | {'simulate, fp32 text':>19}")
    for layers, lc, sp in rows:
        found = fp32_agreement(prompts, lc_texts[layers], [layers])
        rep = [replay_greedy(a, args.k, args.max_new_tokens) for a in found["draft"][layers]]
        same = sum((a, d) == pp for (a, d, _), pp in zip(rep, lc["per_prompt"], strict=True))
        a1, d1 = sum(r[0] for r in rep), sum(r[1] for r in rep)
        lc_cell = f"{_rate(lc['accepted'], lc['drafted']):.3f} {lc['accepted']}/{lc['drafted']}"
        fp_cell = f"{_rate(a1, d1):.3f} {a1}/{d1}"
        print(f"{layers:>3} | {lc_cell:>21} | {fp_cell:>23} | {f'{same} of {len(prompts)}':>15} | {sp['accept_rate']:>19.3f}")
        per = ", ".join(f"{a}/{d}→{ra}/{rd}" for (a, d), (ra, rd, _) in zip(lc["per_prompt"], rep, strict=True))
        print(f"    per prompt, llama.cpp → fp32 drafter on its text: {per}")
        # the first token of llama.cpp's text the fp32 target would not have picked: from
        # there on the two sides decode different texts
        first = [next((j for j, ok in enumerate(t) if not ok), None) for t in found["target"]]
        agree_t = sum(sum(t) for t in found["target"]) / sum(len(t) for t in found["target"])
        print(f"    the fp32 target picks llama.cpp's token at {100 * agree_t:.1f} % of the positions; first other pick per prompt: {first}")


if __name__ == "__main__":
    main()
