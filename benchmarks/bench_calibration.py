"""Calibration: how far diagnose's estimates are from what simulate measures on the same pair.

For SmolLM2-135M with its 28- and 24-layer self-drafts, on the built-in prompts and on a
Spec-Bench-format file (tests/data/prompts/spec_bench_question.jsonl, every turn), at
temperature 0 and 0.7 and K = 4, `simulate` runs the teacher-forced estimate and the real
draft → verify loop on the same prompts. Per run it reports

    τ   renewal estimate, window estimate, measured (at K = 4)
    speedup  estimated (renewal τ over the timed round cost K·c + v_K) and measured
             (tokens/s against plain decoding of the same prompts, same batch size)

and the bars: |renewal − measured τ| / measured ≤ 3 % and |estimated − measured speedup|
/ measured ≤ 10 %, each as the mean over the runs. Greedy runs are deterministic in τ,
so T = 0 runs one seed by default (--greedy-seeds); T = 0.7 runs --seeds.

Slow on a CPU: every run is cached as JSON under --out, keyed by its settings, so an
interrupted benchmark resumes where it stopped and a finished one only prints. --quick
runs a subset (built-in prompts, the 28-layer draft, one seed, fewer prompts); --prompts,
--layers and --temperature pick one prompt set, draft or temperature.
Asserts nothing. Run: python benchmarks/bench_calibration.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_BENCH = ROOT / "tests" / "data" / "prompts" / "spec_bench_question.jsonl"
K = 4


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run to make, as the settings that key its cache file."""
    prompt_sets = ["builtin"] if args.quick else ["builtin", str(SPEC_BENCH)]
    drafters = ["self:layers=28"] if args.quick else ["self:layers=28", "self:layers=24"]
    if args.prompts:
        prompt_sets = [str(SPEC_BENCH) if args.prompts == "spec-bench" else "builtin"]
    if args.layers:
        drafters = [f"self:layers={args.layers}"]
    seeds = list(range(1 if args.quick else args.seeds))
    runs = []
    for prompts in prompt_sets:
        for drafter in drafters:
            for temp in (0.0, 0.7) if args.temperature is None else (args.temperature,):
                for seed in seeds[: args.greedy_seeds] if temp == 0 else seeds:
                    runs.append({
                        "target": "smollm2", "drafter": drafter, "prompts": prompts, "temperature": temp, "seed": seed, "k": K,
                        "max_prompts": args.max_prompts if not args.quick else min(args.max_prompts, 6), "max_new_tokens": args.max_new_tokens,
                        "batch_size": args.batch_size,
                    })
    return runs


def key(run: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(run, sort_keys=True).encode()).hexdigest()[:16]


def measure(run: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """One simulate run -> the calibration numbers at K (and what the run took)."""
    from specprobe.alignment import SamplingFlags
    from specprobe.diagnose import load_pair
    from specprobe.options import DiagnoseConfig, SimulateConfig
    from specprobe.progress import Progress
    from specprobe.simulate import run_simulate

    d = DiagnoseConfig(
        target=run["target"], drafter=run["drafter"], prompts=run["prompts"], max_prompts=run["max_prompts"], max_new_tokens=run["max_new_tokens"],
        sampling=SamplingFlags(temperature=run["temperature"]), seed=run["seed"], batch_size=run["batch_size"], k_max=run["k"], device="cpu",
        keep_positions=False,
    )
    progress = Progress()
    if "target" not in models:
        models["target"] = load_pair(d, progress).target
    if run["drafter"] not in models:
        from specprobe.models.drafters import build_drafter

        models[run["drafter"]] = build_drafter(run["drafter"], models["target"])
    pair = load_pair(d, progress, target=models["target"], drafter=models[run["drafter"]])
    t0 = time.perf_counter()
    r = run_simulate(SimulateConfig(d, ks=[run["k"]]), progress, pair=pair)
    m = r.metrics
    cost = r.cost
    return {
        "tau_renewal": m.get("tau_estimated_tokens"),
        "tau_window": m.get("tau_window_estimated_tokens"),
        "tau_measured": m.get("tau_measured_tokens"),
        "speedup_estimated": m.get("speedup_estimated_cal_k"),
        "speedup_measured": m.get("speedup_measured_cal_k"),
        "cost_ratio": m.get("cost_ratio"),
        "verify_factor": next((row.verify_factor for row in r.k_table if row.k == run["k"]), None),
        "cost_spread_rel": m.get("cost_spread_rel"),
        "cost_repeats": min((b.repeats for b in cost.batches), default=0) if cost else 0,
        "cost_s": cost.elapsed_s if cost else None,
        "num_drafts": m.get("num_drafts_measured"),
        "wall_s": time.perf_counter() - t0,
    }


def rel(est: float | None, meas: float | None) -> float | None:
    return None if est is None or not meas else (est - meas) / meas


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def table(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    head = f"{'prompts':10} {'drafter':8} {'T':>4} {'seed':>4} | {'τ ren':>6} {'τ win':>6} {'τ meas':>6} {'ren err':>8} {'win err':>8} | {'S est':>6} {'S meas':>6} {'S err':>7} | {'c':>5} {'v_K':>5} {'rep':>3} {'cost s':>6} {'run s':>6}"
    print(head)
    print("-" * len(head))
    for run, res in rows:
        ps = "builtin" if run["prompts"] == "builtin" else "spec-bench"
        print(
            f"{ps:10} {run['drafter'].split('=')[-1] + ' lay':8} {run['temperature']:>4g} {run['seed']:>4} | "
            f"{_f(res['tau_renewal'], '.3f'):>6} {_f(res['tau_window'], '.3f'):>6} {_f(res['tau_measured'], '.3f'):>6} "
            f"{_f(rel(res['tau_renewal'], res['tau_measured']), '+.1%'):>8} {_f(rel(res['tau_window'], res['tau_measured']), '+.1%'):>8} | "
            f"{_f(res['speedup_estimated'], '.2f'):>6} {_f(res['speedup_measured'], '.2f'):>6} {_f(rel(res['speedup_estimated'], res['speedup_measured']), '+.1%'):>7} | "
            f"{_f(res['cost_ratio'], '.2f'):>5} {_f(res['verify_factor'], '.2f'):>5} {res['cost_repeats']:>3} {_f(res['cost_s'], '.0f'):>6} {_f(res['wall_s'], '.0f'):>6}"
        )


def summary(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    def mean_abs(name_est: str, name_meas: str) -> float | None:
        xs = [abs(e) for _, r in rows if (e := rel(r[name_est], r[name_meas])) is not None]
        return statistics.fmean(xs) if xs else None

    ren, win, sp = mean_abs("tau_renewal", "tau_measured"), mean_abs("tau_window", "tau_measured"), mean_abs("speedup_estimated", "speedup_measured")
    print()
    print(f"runs: {len(rows)}")
    print(f"mean |renewal τ − measured τ| / measured:  {_f(ren, '.1%')}  (bar ≤ 3%: {'met' if ren is not None and ren <= 0.03 else 'NOT met'})")
    print(f"mean |window τ − measured τ| / measured:   {_f(win, '.1%')}  (the estimate the renewal one replaces)")
    print(f"mean |est. − measured speedup| / measured: {_f(sp, '.1%')}  (bar ≤ 10%: {'met' if sp is not None and sp <= 0.10 else 'NOT met'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: built-in prompts, the 28-layer draft, one seed, ≤ 6 prompts")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_calibration", help="where each run's numbers are cached")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--greedy-seeds", type=int, default=1, help="seeds at T = 0 (greedy τ is the same for every seed)")
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--prompts", choices=("builtin", "spec-bench"), help="only this prompt set")
    ap.add_argument("--layers", type=int, choices=(24, 28), help="only this self-draft")
    ap.add_argument("--temperature", type=float, choices=(0.0, 0.7), help="only this temperature")
    ap.add_argument("--print-only", action="store_true", help="print what is cached, run nothing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = plan(args)
    models: dict[str, Any] = {}
    done: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i, run in enumerate(runs, 1):
        path = args.out / f"{key(run)}.json"
        if path.exists():
            done.append((run, json.loads(path.read_text())["result"]))
            continue
        if args.print_only:
            continue
        print(f"[{i}/{len(runs)}] {run['drafter']} T={run['temperature']:g} seed {run['seed']} on {Path(run['prompts']).name} …", flush=True)
        res = measure(run, models)
        path.write_text(json.dumps({"run": run, "result": res}, indent=1))
        done.append((run, res))
        print(f"    τ renewal {_f(res['tau_renewal'], '.3f')} / measured {_f(res['tau_measured'], '.3f')}; speedup est. {_f(res['speedup_estimated'], '.2f')} / measured {_f(res['speedup_measured'], '.2f')} ({res['wall_s']:.0f} s)", flush=True)
    print()
    table(done)
    summary(done)
    if len(done) < len(runs):
        print(f"{len(runs) - len(done)} of {len(runs)} runs not done yet: run again to resume")


if __name__ == "__main__":
    main()
