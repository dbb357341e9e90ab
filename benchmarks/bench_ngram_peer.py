"""Peer comparison for the n-gram drafters: llama-server's own `--spec-type ngram-*` against
specprobe's reimplementation (specprobe.drafters.ngram), request by request.

Target: SmolLM2-135M-Instruct (the built-in GGUF, Q4_1, in llama-server; dequantised to
fp32 in specprobe), greedy, the built-in suite's code and summarization prompts (tokenised
once with the chat template and sent as token ids), one slot (-np 1), no prompt cache, the
same number of new tokens. For every type the table gives the server's own counters
(the responses' `timings.draft_n`, `draft_n_accepted`) beside two specprobe numbers:

- replay: specprobe's drafter walked along the text llama-server emitted (probe.ngram.walk,
  one slot kept across the requests in order, as the server's one slot keeps its state).
  In greedy decoding an accepted draft token is the target's own next token, so on the
  same text the same algorithm drafts and accepts exactly what the server did: any
  difference here is the algorithm.
- simulate: specprobe's real draft → verify loop (simulate.speculate) with the fp32 model
  on the same prompts. What differs from the replay is the text (Q4_1 and fp32 argmaxes
  part ways at some token, and the drafts after it differ).

Run: python benchmarks/bench_ngram_peer.py [--max-new 96] [--prompts 16] [--types simple,map-k,...]
Prints the table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (label, llama-server flags, specprobe drafter spec)
TYPES: dict[str, tuple[list[str], str]] = {
    "ngram-simple (defaults)": (["--spec-type", "ngram-simple"], "ngram-simple"),
    "ngram-simple n=4 m=8": (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8"], "ngram-simple:size_n=4,size_m=8"),
    "ngram-map-k n=4 m=8": (["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "4", "--spec-ngram-map-k-size-m", "8"], "ngram-map-k:size_n=4,size_m=8"),
    "ngram-map-k4v n=2 m=4": (["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "2", "--spec-ngram-map-k4v-size-m", "4"], "ngram-map-k4v:size_n=2,size_m=4"),
    "ngram-mod match=4 min=2 max=8": (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "8"], "ngram-mod:n_match=4,n_min=2,n_max=8"),
    "ngram-cache": (["--spec-type", "ngram-cache"], "ngram-cache"),
    "ngram-mod,ngram-simple (list)": (["--spec-type", "ngram-mod,ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8", "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "8"], "ngram-simple:size_n=4,size_m=8,ngram-mod:n_match=4,n_min=2,n_max=8"),
}


def prompts(n: int) -> tuple[list[Any], list[list[int]]]:
    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    suite = builtin_suite().prompts
    items = [p for p in suite if p.domain == "code"][: n // 2] + [p for p in suite if p.domain == "summarization"][: n - n // 2]
    return items, [encode_prompt(tok, p) for p in items]


def server_command(binary: Path, target: Path, port: int, flags: list[str], threads: int) -> list[str]:
    return [
        str(binary), "-m", str(target), *flags,
        "--host", "127.0.0.1", "--port", str(port), "--metrics", "-np", "1", "-c", "2048",
        "-t", str(threads), "-tb", str(threads), "--poll", "0", "--no-warmup", "--log-colors", "off",
    ]  # fmt: skip


def serve(binary: Path, flags: list[str], encoded: list[list[int]], max_new: int, log: Path, threads: int) -> list[dict[str, Any]]:
    """One llama-server run: each prompt once, in order -> the responses."""
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers import stop
    from tests.helpers.llamacpp import LlamaServer, free_port, http_json

    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen(server_command(binary, builtin_gguf_path("smollm2"), port, flags, threads), stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})  # noqa: S603
    srv = LlamaServer(proc, port, log)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if http_json(srv.base + "/health", timeout=5).get("status") == "ok":
                    break
            except Exception:  # noqa: BLE001  (not up yet)
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not start; see {log}") from None
            time.sleep(0.5)
        return [srv.complete(p, max_new) for p in encoded]
    finally:
        stop(proc, 30)


def end_of_generation() -> frozenset[int]:
    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    return frozenset({int(tok.eos_token_id)})


def replay(spec: str, encoded: list[list[int]], responses: list[dict[str, Any]], max_new: int) -> list[tuple[int, int]]:
    from specprobe.drafters.ngram import NgramDrafter
    from specprobe.probe.ngram import walk

    slot = NgramDrafter(spec).slot()  # one slot across the requests, as -np 1 keeps it
    eog = end_of_generation()  # llama.cpp accepts no drafted EOG but a draft's last token
    out = []
    for p, r in zip(encoded, responses, strict=True):
        s = walk(slot, p, list(r.get("tokens") or []), max_new, eog)
        out.append((s.drafted, s.accepted))
    return out


def simulate(spec: str, encoded: list[list[int]], max_new: int, eos: set[int]) -> tuple[int, int, int]:
    from specprobe.drafters.ngram import NgramDrafter
    from specprobe.metrics.sampling import Sampling
    from specprobe.simulate import Procedure, speculate

    model = _model()
    drafter = NgramDrafter(spec)
    run = speculate(model.model, drafter, encoded, k=drafter.max_draft(), target_sampling=Sampling(temperature=0.0), max_new_tokens=max_new, eos_ids=eos, batch_size=8, procedure=Procedure.of("llama.cpp"))
    c = run.counters
    return c.drafted_tokens, c.accepted_tokens, c.emitted_tokens


_MODEL: Any = None


def _model() -> Any:
    global _MODEL
    if _MODEL is None:
        from specprobe.models.loader import load_model

        _MODEL = load_model("smollm2", "cpu", "float32")
    return _MODEL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="", help="comma-separated labels' first words (default: all)")
    ap.add_argument("--no-simulate", action="store_true")
    a = ap.parse_args()
    from specprobe.simulate.pipeline import eos_ids
    from tests.helpers.llamacpp import find_llama_server

    binary = find_llama_server()
    if binary is None:
        sys.exit("no llama-server: run benchmarks/build_llama_server.sh")
    items, encoded = prompts(a.prompts)
    eos = eos_ids(_model()) if not a.no_simulate else set()
    print(f"SmolLM2-135M-Instruct, greedy, {len(encoded)} prompts (built-in code + summarization), {a.max_new} new tokens, llama-server -np 1 (Q4_1) vs specprobe (fp32)")
    print(f"{'type':34} {'server drafted/accepted':>24} {'replay':>14} {'same per request':>17} {'simulate fp32':>14}")
    work = Path(tempfile.mkdtemp(prefix="ngram-peer-"))
    for label, (flags, spec) in TYPES.items():
        if a.types and not any(label.startswith(t) for t in a.types.split(",")):
            continue
        responses = serve(binary, flags, encoded, a.max_new, work / f"{label.split()[0]}.log", a.threads)
        server = [(int(r["timings"].get("draft_n", 0)), int(r["timings"].get("draft_n_accepted", 0))) for r in responses]
        mine = replay(spec, encoded, responses, a.max_new)
        same = sum(1 for x, y in zip(server, mine, strict=True) if x == y)
        sd, sa = sum(x for x, _ in server), sum(y for _, y in server)
        rd, ra = sum(x for x, _ in mine), sum(y for _, y in mine)
        sim = "—"
        if not a.no_simulate:
            d, acc, _ = simulate(spec, encoded, a.max_new, eos)
            sim = f"{d}/{acc}"
        print(f"{label:34} {sd:>11}/{sa:<12} {rd:>6}/{ra:<7} {same:>8}/{len(encoded):<8} {sim:>14}", flush=True)


if __name__ == "__main__":
    main()
