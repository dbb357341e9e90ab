"""Calibration: how far diagnose's estimates are from what simulate measures on the same pair.

For SmolLM2-135M with its 28- and 24-layer self-drafts, on the built-in prompts and on a
Spec-Bench-format file (tests/data/prompts/spec_bench_question.jsonl, every turn), at
temperature 0 and 0.7 and K = 4, `simulate` runs the teacher-forced estimate and the real
draft → verify loop on the same prompts. Per run it reports

    τ   renewal estimate, window estimate, measured (at K = 4)
    speedup  estimated at the run's own token budget (tokens over the expected cost of the
             rounds the loop runs, final short rounds included, timed costs), the
             steady-state one (renewal τ over K·c + v_K), and measured (tokens/s against
             plain decoding of the same prompts, same batch size)

then per configuration (seeds pooled) and the bars: |renewal − measured τ| / measured
≤ 3 % in aggregate (τ over all runs weighted by tokens, with the measurement's standard
error) and |estimated − measured speedup| / measured ≤ 10 % (mean over the runs; also
with τ's error taken out, the round cost's alone). Greedy runs are deterministic in τ,
so T = 0 runs one seed by default (--greedy-seeds); T = 0.7 runs --seeds. Defaults:
6 prompts × 32 new tokens at batch size 1 (a static batch runs until its slowest row is
done, which the estimate does not model), torch on one thread, CPU-time clock.

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
import math
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_BENCH = ROOT / "tests" / "data" / "prompts" / "spec_bench_question.jsonl"
K = 4


def use_clock(clock: str, threads: int) -> None:
    """Before specprobe is imported: torch's thread count, and with "cpu" every timer
    (cost timing, the loop's phases, the scoring time that sets the cost budget) reads
    this process's CPU time. With one thread that is the time the work took on one core,
    whatever else the machine runs; wall time on a loaded machine mixes in the others'
    load, which changes between the baseline pass, the speculative pass and the cost
    timing minutes apart."""
    import torch

    torch.set_num_threads(threads)
    if clock == "cpu":
        time.perf_counter = time.thread_time  # specprobe reads perf_counter at call time or binds it at import (after this)


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
                        "batch_size": args.batch_size, "threads": args.threads, "clock": args.clock,
                    })
    return runs


def key(run: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(run, sort_keys=True).encode()).hexdigest()[:16]


def measure(run: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """One simulate run -> the calibration numbers at K (and what the run took)."""
    from specprobe.core.progress import Progress
    from specprobe.probe.diagnose import load_pair
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate

    d = DiagnoseConfig(
        target=run["target"], drafter=run["drafter"], prompts=run["prompts"], max_prompts=run["max_prompts"], max_new_tokens=run["max_new_tokens"],
        sampling=SamplingFlags(temperature=run["temperature"]), seed=run["seed"], batch_size=run["batch_size"], k_max=run["k"], device="cpu",
        keep_positions=True,  # the per-position α, kept with the run, to re-derive the estimate from
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
        "speedup_steady": next((row.speedup for row in r.k_table if row.k == run["k"]), None),
        "speedup_budget": next((row.speedup_budget for row in r.k_table if row.k == run["k"]), None),
        "speedup_measured": m.get("speedup_measured_cal_k"),
        "cost_ratio": m.get("cost_ratio"),
        "verify_factor": next((row.verify_factor for row in r.k_table if row.k == run["k"]), None),
        "cost_spread_rel": m.get("cost_spread_rel"),
        "cost_repeats": min((b.repeats for b in cost.batches), default=0) if cost else 0,
        "cost_s": cost.elapsed_s if cost else None,
        "num_drafts": m.get("num_drafts_measured"),
        "wall_s": time.perf_counter() - t0,
        **_breakdown(r),
    }


def _breakdown(r: Any) -> dict[str, Any]:
    """What the loop itself timed and counted, to take a gap apart: per-depth counters
    (for the measured τ's standard error and pooling), emitted tokens, the phases' times,
    and the loop's own ms per drafter / target call beside the cost timing's."""
    ms = r.measured
    row = next((x for x in ms.k_table if x.k == K), None) if ms else None
    depth = ms.depth if ms else None
    cost = r.cost
    b = next((x for x in cost.batches if x.batch_size == cost.batch_size), None) if cost else None
    alpha: dict[str, list[float]] = {}
    if r.positions is not None:
        order = sorted(zip(r.positions.prompt_id, r.positions.position, r.positions.accept_prob, strict=True), key=lambda x: (x[0], x[1]))
        for pid, _, a in order:
            alpha.setdefault(pid, []).append(float("nan") if a is None else float(a))
    rows = b.rows if b else []
    return {
        "alpha": alpha,
        "cost_c": b.cost_ratio if b else None,
        "cost_v": [x.verify_factor for x in sorted(rows, key=lambda x: x.k)],
        "accepted_at": list(depth.accepted_per_position) if depth else None,
        "drafted_at": list(depth.drafted_per_position) if depth else None,
        "emitted_tokens": row.emitted_tokens if row else None,
        "loop_s": row.wall_s if row else None,
        "baseline_s": ms.baseline_wall_s if ms else None,
        "loop_draft_ms": row.draft_ms_per_step if row else None,
        "loop_target_ms": row.target_ms_per_step if row else None,
        "baseline_target_ms": ms.baseline_target_ms_per_step if ms else None,
        "cost_target_ms": b.target_step.median_ms if b and b.target_step else None,
        "cost_draft_ms": b.draft_step.median_ms if b and b.draft_step else None,
        "cost_verify_ms": next((x.verify.median_ms for x in b.rows if x.k == K and x.verify), None) if b else None,
    }


def rel(est: float | None, meas: float | None) -> float | None:
    return None if est is None or not meas else (est - meas) / meas


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def budget_speedup(res: dict[str, Any]) -> float | None:
    """The estimate re-derived from the run's per-position α and timed costs: tokens ÷ the
    expected cost of the rounds K = 4 runs along each sequence, final short rounds included
    (`estimate.budget_cost`), against one decode step per token."""
    import numpy as np

    from specprobe.estimates.estimate import budget_cost, renewal_counts

    alpha, c, v = res.get("alpha"), res.get("cost_c"), res.get("cost_v")
    if not alpha or c is None or not v:
        return None
    tokens, rounds, drafted = 0.0, 0.0, np.zeros(K)
    for seq in alpha.values():
        cnt = renewal_counts(np.tile(np.asarray(seq, dtype=float), (K, 1)))
        if cnt.rounds.size < K:
            continue
        tokens += cnt.tokens
        rounds += float(cnt.rounds[K - 1])
        drafted += cnt.drafted[K - 1]
    cost = budget_cost(rounds, drafted.tolist(), c, v)
    return tokens / cost if cost > 0 else None


def normalise(res: dict[str, Any]) -> dict[str, Any]:
    """A cached run -> its numbers with both speedup estimates: speedup_steady (renewal τ over
    the round cost, long generations) and speedup_estimated (at the run's own token budget,
    what simulate compares with). Runs cached before simulate reported the budget estimate
    get it re-derived from their per-position α."""
    res = dict(res)
    if res.get("speedup_steady") is None:
        res["speedup_steady"] = res["speedup_estimated"]
    if res.get("speedup_budget") is None:
        res["speedup_budget"] = budget_speedup(res)
    res["speedup_estimated"] = res["speedup_budget"]
    return res


def tau_se(res: dict[str, Any]) -> float | None:
    """Standard error of the measured τ from its per-depth counters: with p_i = accepted
    at depth i ÷ drafts, E[n] = Σ p_i and E[n²] = Σ (2i − 1) p_i for n accepted per
    draft (rounds taken as independent). None for greedy runs (τ is fixed by the text)."""
    acc, n = res.get("accepted_at"), res.get("num_drafts")
    if not acc or not n:
        return None
    p = [a / n for a in acc]
    mean = sum(p)
    var = sum((2 * i + 1) * x for i, x in enumerate(p)) - mean**2
    return math.sqrt(max(var, 0.0) / n)


def cost_err(res: dict[str, Any]) -> float | None:
    """The estimated speedup's error with the τ error taken out: per token of τ, estimated
    against measured — what is left is the round-cost model and its timing."""
    e, m, te, tm = res.get("speedup_estimated"), res.get("speedup_measured"), res.get("tau_renewal"), res.get("tau_measured")
    return rel(e / te, m / tm) if e and m and te and tm else None


def _label(run: dict[str, Any]) -> str:
    ps = "builtin" if run["prompts"] == "builtin" else "spec-bench"
    return f"{ps:10} {run['drafter'].split('=')[-1] + ' lay':8} {run['temperature']:>4g}"


def table(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    head = (
        f"{'prompts':10} {'drafter':8} {'T':>4} {'seed':>4} | {'τ ren':>6} {'τ win':>6} {'τ meas':>6} {'±se':>5} {'ren err':>8} {'win err':>8} | "
        f"{'S ss':>6} {'S est':>6} {'S meas':>6} {'ss err':>7} {'S err':>7} | {'c':>5} {'v_K':>5} {'rep':>3}"
    )
    print(head)
    print("-" * len(head))
    for run, res in rows:
        se = tau_se(res) if run["temperature"] > 0 else None
        print(
            f"{_label(run)} {run['seed']:>4} | "
            f"{_f(res['tau_renewal'], '.3f'):>6} {_f(res['tau_window'], '.3f'):>6} {_f(res['tau_measured'], '.3f'):>6} {_f(se, '.3f'):>5} "
            f"{_f(rel(res['tau_renewal'], res['tau_measured']), '+.1%'):>8} {_f(rel(res['tau_window'], res['tau_measured']), '+.1%'):>8} | "
            f"{_f(res['speedup_steady'], '.3f'):>6} {_f(res['speedup_estimated'], '.3f'):>6} {_f(res['speedup_measured'], '.3f'):>6} "
            f"{_f(rel(res['speedup_steady'], res['speedup_measured']), '+.1%'):>7} {_f(rel(res['speedup_estimated'], res['speedup_measured']), '+.1%'):>7} | "
            f"{_f(res['cost_ratio'], '.2f'):>5} {_f(res['verify_factor'], '.2f'):>5} {res['cost_repeats']:>3}"
        )


def pooled(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, float | None]:
    """τ over several runs weighted by tokens (renewal, window, measured, and the measured
    one's standard error); speedups as plain means over the runs."""
    ok = [(run, r) for run, r in rows if r["tau_measured"] and r["tau_renewal"] and r.get("emitted_tokens")]
    if not ok:
        return {}
    w = [float(r["emitted_tokens"]) for _, r in ok]
    tot = sum(w)

    def avg(name: str) -> float:
        return sum(x * r[name] for x, (_, r) in zip(w, ok, strict=True)) / tot

    ses = [(tau_se(r) or 0.0) if run["temperature"] > 0 else 0.0 for run, r in ok]
    sp = [(r["speedup_estimated"], r["speedup_measured"], r["speedup_steady"]) for _, r in rows if r["speedup_estimated"] and r["speedup_measured"]]
    return {
        "tau_renewal": avg("tau_renewal"), "tau_window": avg("tau_window"), "tau_measured": avg("tau_measured"),
        "tau_se": math.sqrt(sum((x * e) ** 2 for x, e in zip(w, ses, strict=True))) / tot,
        "speedup_estimated": statistics.fmean(e for e, _, _ in sp) if sp else None,
        "speedup_measured": statistics.fmean(m for _, m, _ in sp) if sp else None,
        "speedup_steady": statistics.fmean(x for _, _, x in sp) if sp else None,
        "cost_err": statistics.fmean(c for _, r in rows if (c := cost_err(r)) is not None) if any(cost_err(r) is not None for _, r in rows) else None,
    }


def summary(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for run, res in rows:
        groups.setdefault(_label(run), []).append((run, res))
    print()
    print("per configuration (seeds pooled: τ weighted by tokens, speedup averaged)")
    head = (
        f"{'prompts':10} {'drafter':8} {'T':>4} {'runs':>4} | {'τ ren':>6} {'τ meas':>6} {'±se':>5} {'ren err':>8} {'win err':>8} | "
        f"{'S ss':>6} {'S est':>6} {'S meas':>6} {'ss err':>7} {'S err':>7} {'cost':>6}"
    )
    print(head)
    print("-" * len(head))
    for label, g in groups.items():
        p = pooled(g)
        if not p:
            continue
        print(
            f"{label} {len(g):>4} | {p['tau_renewal']:>6.3f} {p['tau_measured']:>6.3f} {p['tau_se']:>5.3f} "
            f"{_f(rel(p['tau_renewal'], p['tau_measured']), '+.1%'):>8} {_f(rel(p['tau_window'], p['tau_measured']), '+.1%'):>8} | "
            f"{_f(p['speedup_steady'], '.3f'):>6} {_f(p['speedup_estimated'], '.3f'):>6} {_f(p['speedup_measured'], '.3f'):>6} "
            f"{_f(rel(p['speedup_steady'], p['speedup_measured']), '+.1%'):>7} {_f(rel(p['speedup_estimated'], p['speedup_measured']), '+.1%'):>7} "
            f"{_f(p['cost_err'], '+.1%'):>6}"
        )
    print("cost: the error left in S est once τ is right, (S est ÷ τ renewal) ÷ (S meas ÷ τ measured) − 1: the round-cost model and its timing alone")

    def mean_abs(name_est: str, name_meas: str) -> float | None:
        xs = [abs(e) for _, r in rows if (e := rel(r[name_est], r[name_meas])) is not None]
        return statistics.fmean(xs) if xs else None

    agg = pooled(rows)
    if not agg:
        return
    ren = rel(agg["tau_renewal"], agg["tau_measured"])
    win = rel(agg["tau_window"], agg["tau_measured"])
    se = agg["tau_se"] / agg["tau_measured"] if agg["tau_measured"] else None
    sp = mean_abs("speedup_estimated", "speedup_measured")
    sp_signed = [e for _, r in rows if (e := rel(r["speedup_estimated"], r["speedup_measured"])) is not None]
    print()
    print(f"runs: {len(rows)}")
    print(f"aggregate τ (all runs, weighted by tokens): renewal {agg['tau_renewal']:.3f}, window {agg['tau_window']:.3f}, measured {agg['tau_measured']:.3f} ± {agg['tau_se']:.3f}")
    print(f"  renewal − measured: {_f(ren, '+.1%')} (measured's standard error {_f(se, '.1%')}; bar |·| ≤ 3%: {'met' if ren is not None and abs(ren) <= 0.03 else 'NOT met'})")
    print(f"  window − measured:  {_f(win, '+.1%')} (the estimate the renewal one replaces)")
    print(f"  mean |renewal − measured| / measured over single runs: {_f(mean_abs('tau_renewal', 'tau_measured'), '.1%')} (sampling noise included)")
    print(f"speedup at the token budget: mean |estimated − measured| / measured over runs: {_f(sp, '.1%')}, mean signed {_f(statistics.fmean(sp_signed) if sp_signed else None, '+.1%')} (bar ≤ 10%: {'met' if sp is not None and sp <= 0.10 else 'NOT met'})")
    ce = [e for _, r in rows if (e := cost_err(r)) is not None]
    print(f"  of which the round cost (τ error taken out): mean |·| {_f(statistics.fmean(abs(x) for x in ce) if ce else None, '.1%')}, mean signed {_f(statistics.fmean(ce) if ce else None, '+.1%')}")
    ss = [e for _, r in rows if (e := rel(r["speedup_steady"], r["speedup_measured"])) is not None]
    print(f"steady-state speedup (τ / (K·c + v_K)):  mean |·| {_f(statistics.fmean(abs(x) for x in ss) if ss else None, '.1%')}, mean signed {_f(statistics.fmean(ss) if ss else None, '+.1%')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: built-in prompts, the 28-layer draft, one seed, ≤ 6 prompts")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_calibration", help="where each run's numbers are cached")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--greedy-seeds", type=int, default=1, help="seeds at T = 0 (greedy τ is the same for every seed)")
    ap.add_argument("--max-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=1, help="1: every sequence runs alone, as the estimate models it (a static batch runs until its slowest row is done)")
    ap.add_argument("--prompts", choices=("builtin", "spec-bench"), help="only this prompt set")
    ap.add_argument("--layers", type=int, choices=(24, 28), help="only this self-draft")
    ap.add_argument("--temperature", type=float, choices=(0.0, 0.7), help="only this temperature")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: a shared machine; two threads that wait on each other under load run ~10× slower)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="what every timer reads: this process's CPU time (other users of a shared machine stay out of the measurement) or wall time")
    ap.add_argument("--print-only", action="store_true", help="print what is cached, run nothing")
    args = ap.parse_args()
    use_clock(args.clock, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = plan(args)
    models: dict[str, Any] = {}
    done: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i, run in enumerate(runs, 1):
        path = args.out / f"{key(run)}.json"
        if path.exists():
            done.append((run, normalise(json.loads(path.read_text())["result"])))
            continue
        if args.print_only:
            continue
        print(f"[{i}/{len(runs)}] {run['drafter']} T={run['temperature']:g} seed {run['seed']} on {Path(run['prompts']).name} …", flush=True)
        res = measure(run, models)
        path.write_text(json.dumps({"run": run, "result": res}, indent=1))
        res = normalise(res)
        done.append((run, res))
        print(f"    τ renewal {_f(res['tau_renewal'], '.3f')} / measured {_f(res['tau_measured'], '.3f')}; speedup est. {_f(res['speedup_estimated'], '.2f')} / measured {_f(res['speedup_measured'], '.2f')} ({res['wall_s']:.0f} s)", flush=True)
    print()
    table(done)
    summary(done)
    if len(done) < len(runs):
        print(f"{len(runs) - len(done)} of {len(runs)} runs not done yet: run again to resume")


if __name__ == "__main__":
    main()
