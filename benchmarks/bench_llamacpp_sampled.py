"""Peer comparison at temperature > 0: `specprobe diagnose` and `simulate` with
`--engine llama.cpp` against llama-server's own accepted ÷ drafted.

The pair: SmolLM2-135M as target, its first N blocks as a layer-skip self-draft (the
GGUF the engine tests write: the target's own Q4_1 blocks). llama-server drafts the
drafter's top token K at a time (`--spec-type draft-simple`, `--spec-draft-n-min 0
--spec-draft-p-min 0`: no early stop) and verifies by sampling the target with the
request's sampler chain — here temperature T alone (top-k 0, top-p 1, min-p 0) — and
accepting while the sample equals the draft. Each request has its own seed.

specprobe, on the same built-in prompts (the suite's first --max-prompts), the same T, K
and token budget:
- diagnose --engine llama.cpp: the teacher-forced estimate, the k-table's accept rate at K
  (renewal: rounds start where the last one ended, as in the engine), one run per seed
  (the seed picks the on-policy references it scores);
- simulate --engine llama.cpp: the real draft → verify loop with llama.cpp's procedure.

Both sides' rates are pooled over the seeds; the standard error is over prompts × seeds
(ratio estimator) for the server, and over the seeds' runs for diagnose and simulate.
The model on specprobe's side is SmolLM2's GGUF dequantised to fp32 — Q4_1 against fp32
moves the distributions a little, so the two sides are not the same model to the bit.

Run: python benchmarks/bench_llamacpp_sampled.py [--temperatures 0.7,0] [--seeds 3]
     [--layers 28] [--k 4] [--max-prompts 16] [--max-new-tokens 64] [--out DIR]
Prints the table; asserts nothing. --out keeps every JSON the runs wrote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_llamacpp_peer import encoded_prompts, ratio_se  # noqa: E402

CLI = [sys.executable, "-c", "from specprobe.cli.main import run; run()"]


def sampling_flags(temperature: float) -> list[str]:
    return ["--engine", "llama.cpp", "--temperature", f"{temperature:g}", "--top-k", "0", "--top-p", "1", "--min-p", "0"]


def server_side(binary: Path, layers: int, k: int, prompts: list[list[int]], max_new: int, temperature: float, seeds: list[int], work: Path, threads: int) -> dict[str, Any]:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.llamacpp import llama_server, write_self_draft_gguf

    target = builtin_gguf_path("smollm2")
    draft = work / f"smollm2-first{layers}.gguf"
    if not draft.exists():
        write_self_draft_gguf(target, draft, layers)
    acc: list[int] = []
    dr: list[int] = []
    with llama_server(binary, target, draft, k, work / f"server-{layers}-{temperature:g}.log", threads=threads) as srv:
        for seed in seeds:
            for i, p in enumerate(prompts):
                t = srv.complete(p, max_new, temperature=temperature, seed=1000 * seed + i)["timings"]
                acc.append(int(t.get("draft_n_accepted", 0)))
                dr.append(int(t.get("draft_n", 0)))
    return {"rate": sum(acc) / sum(dr) if sum(dr) else float("nan"), "se": ratio_se(acc, dr), "accepted": sum(acc), "drafted": sum(dr)}


def _run(cmd: list[str], out: Path) -> dict[str, Any]:
    res = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603
    if not out.exists():
        raise SystemExit(f"{' '.join(cmd[3:6])} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _k_row(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    found = [r for r in rows if int(r.get("k", -1)) == k]
    if not found:
        raise SystemExit(f"no row for K={k}")
    return found[0]


def diagnose_side(layers: int, k: int, n_prompts: int, max_new: int, temperature: float, seeds: list[int], work: Path) -> dict[str, Any]:
    rates = []
    for seed in seeds:
        out = work / f"diagnose-{layers}-{temperature:g}-{seed}.json"
        doc = _run([*CLI, "diagnose", "smollm2", f"self:layers={layers}", *sampling_flags(temperature),
                    "--max-prompts", str(n_prompts), "--max-new-tokens", str(max_new), "--seed", str(seed),
                    "--k-max", str(k), "--cost-ratio", f"{layers / 30:.3f}", "--verify-factor", "1",
                    "--device", "cpu", "--json", str(out)], out)
        row = _k_row(doc.get("k_table") or [], k)
        rate = row.get("accept_rate_renewal")
        rates.append(float(rate if rate is not None else row["accept_rate"]))
    se = statistics.stdev(rates) / len(rates) ** 0.5 if len(rates) > 1 else float("nan")
    return {"rate": statistics.fmean(rates), "se": se, "per_seed": rates}


def simulate_side(layers: int, k: int, n_prompts: int, max_new: int, temperature: float, seeds: list[int], work: Path) -> dict[str, Any]:
    acc: list[int] = []
    dr: list[int] = []
    for seed in seeds:
        out = work / f"simulate-{layers}-{temperature:g}-{seed}.json"
        doc = _run([*CLI, "simulate", "smollm2", f"self:layers={layers}", *sampling_flags(temperature),
                    "--k", str(k), "--max-prompts", str(n_prompts), "--max-new-tokens", str(max_new), "--seed", str(seed),
                    "--cost-ratio", f"{layers / 30:.3f}", "--verify-factor", "1", "--device", "cpu", "--json", str(out)], out)
        depth = (doc.get("measured") or {}).get("depth") or {}
        if int(depth.get("k", -1)) != k:
            raise SystemExit(f"simulate's JSON has no per-position counts for K={k}")
        acc.append(sum(int(x) for x in depth["accepted_per_position"]))  # the seed's run: one sample
        dr.append(sum(int(x) for x in depth["drafted_per_position"]))
    return {"rate": sum(acc) / sum(dr) if sum(dr) else float("nan"), "se": ratio_se(acc, dr), "accepted": sum(acc), "drafted": sum(dr)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperatures", default="0.7,0")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-simulate", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs' JSON here")
    args = ap.parse_args()

    from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

    binary = find_llama_server()
    if binary is None:
        raise SystemExit(f"llama-server is not built: run {BUILD_SCRIPT} first")
    prompts = encoded_prompts(args.max_prompts)
    seeds = list(range(args.seeds))
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="specprobe-sampled-") as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for t in temps:
            run_seeds = seeds if t > 0 else seeds[:1]  # T = 0: every seed decodes the same text
            srv = server_side(binary, args.layers, args.k, prompts, args.max_new_tokens, t, run_seeds, work, args.threads)
            dia = diagnose_side(args.layers, args.k, args.max_prompts, args.max_new_tokens, t, run_seeds, work)
            sim = None if args.no_simulate else simulate_side(args.layers, args.k, args.max_prompts, args.max_new_tokens, t, run_seeds, work)
            rows.append((t, len(run_seeds), srv, dia, sim))
            print(f"T={t:g}: server {srv} | diagnose {dia} | simulate {sim}", file=sys.stderr)

    print(f"\nSmolLM2-135M, self-draft = first {args.layers} of 30 blocks, --engine llama.cpp, K={args.k} fixed "
          f"(n-min 0, p-min 0), temperature alone, {len(prompts)} built-in prompts × {args.max_new_tokens} new tokens ({binary.parent.parent.name})")
    print(f"{'T':>4} | {'seeds':>5} | {'llama-server accepted/drafted':>29} | {'diagnose (± SE)':>16} | {'rel.':>7} | {'simulate (± SE)':>16} | {'rel.':>7}")

    def cell(x: dict[str, Any] | None) -> str:
        return "—" if x is None else f"{x['rate']:.3f} ± {x['se']:.3f}"

    def rel(x: dict[str, Any] | None, ref: float) -> str:
        return "—" if x is None or not ref else f"{100 * (x['rate'] / ref - 1):+.1f}%"

    for t, n, srv, dia, sim in rows:
        srv_cell = f"{srv['rate']:.3f} ± {srv['se']:.3f} ({srv['accepted']}/{srv['drafted']})"
        print(f"{t:>4g} | {n:>5} | {srv_cell:>29} | {cell(dia):>16} | {rel(dia, srv['rate']):>7} | {cell(sim):>16} | {rel(sim, srv['rate']):>7}")


if __name__ == "__main__":
    main()
