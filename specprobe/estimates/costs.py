"""What a round costs: the timing loop and its statistics (pure: the clock is an
argument), and the cost tables and speedups built from the timings of the target's decode
step, its verify pass over K + 1 tokens and the drafter's step. The timing itself, on the
run's device live in `specprobe.probe.timing`, the environment record in `specprobe.core.environment`.

Timing on a shared machine: one untimed warm-up round, then repeats that call every
timed function once in the same order (A B C … A B C …), so drift hits all of them alike;
the ratios the cost model needs are taken within each repeat, and their median and
quartiles over the repeats are reported. The measurement must not cost more than half
the scoring it serves: repeating stops at `max_repeats`, or once `min_repeats` are done and
the time spent reaches the budget (half the scoring time), and never starts a
repeat that would end past the cap (half the scoring time too) — one repeat runs unless a
hard limit (`stop_s`: what is left of the cap for the whole cost step) stops it, which
is checked before every call.
The timing loop takes its clock as an argument so tests drive it with a fake one."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specprobe.estimates.estimate import (
    KRow,
    RoundCost,
    best_k,
    budget_speedups,
    equivalent_range,
    headline_tau,
    k_table,
    quantiles,
    round_costs,
)
from specprobe.estimates.isotonic import non_decreasing_repeats

Clock = Callable[[], float]

# The cost measurement aims at BUDGET_FRACTION of the scoring time it serves and never
# starts a repeat that would take it past CAP_FRACTION of it (one repeat always runs).
BUDGET_FRACTION = 0.5
CAP_FRACTION = 0.5  # so a run with its costs timed takes at most 1.5× one given them
MIN_REPEATS = 5  # fewer leave a median that moves by ±10 % on a loaded machine
MAX_REPEATS = 15
MIN_BUDGET_S = 2.0  # a tiny run still gets a few repeats


# ----------------------------------------------------------------------------- timing (pure)
@dataclass(frozen=True)
class Samples:
    """Seconds per call of each timed function, repeat by repeat (times[name][i]: repeat i)."""

    times: dict[str, list[float]]
    elapsed_s: float  # warm-up included
    stopped_by_budget: bool  # fewer than max_repeats because the budget or the cap ran out
    warmup_rounds: int = 0  # warm-up rounds that ran to the end
    from_warmup: bool = False  # the hard stop cut the warm-up: times[name] is its one call, where it ran

    @property
    def repeats(self) -> int:
        return min((len(v) for v in self.times.values()), default=0)


def interleaved(
    calls: Mapping[str, Callable[[], object]],
    *,
    clock: Clock = time.perf_counter,
    warmup: int = 1,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
    budget_s: float = math.inf,
    cap_s: float = math.inf,
    stop_s: float = math.inf,
    sizes: Mapping[str, float] | None = None,
) -> Samples:
    """Time every call once per repeat, in the same order each time, after `warmup`
    untimed rounds. Stop at max_repeats; or when min_repeats are done and the time spent
    (warm-up included) has reached budget_s; or before a repeat that, as long as the last
    one, would end past cap_s. The first repeat runs unless stop_s, the hard limit, stops
    it: no call starts (the very first aside) that, as long as its last run (or the call
    before it scaled by `sizes` — each call's relative work, e.g. its new tokens — for one
    not run yet), would end past stop_s — a repeat cut short that way
    is dropped; when no repeat finished, each call's latest run (the warm-up's, or the cut
    repeat's) stands as one sample (`from_warmup`: first-call effects may be included)."""
    start = clock()
    last_of: dict[str, float] = {}
    prev, prev_name = 0.0, ""
    size = sizes or {}

    def run(name: str, f: Callable[[], object]) -> float | None:
        nonlocal prev, prev_name
        if last_of or prev:
            guess = last_of.get(name, prev * size.get(name, 1.0) / size.get(prev_name, 1.0))
            if clock() - start + guess > stop_s:
                return None
        t0 = clock()
        f()
        prev = last_of[name] = clock() - t0
        prev_name = name
        return prev

    times: dict[str, list[float]] = {name: [] for name in calls}
    warmed = 0
    for _ in range(warmup):
        for name, f in calls.items():
            if run(name, f) is None:  # cut: the calls the warm-up finished are all there is, one sample each
                return Samples({n: [last_of[n]] if n in last_of else [] for n in calls}, clock() - start, True, warmed, from_warmup=True)
        warmed += 1
    done, stopped, last = 0, False, 0.0
    while done < max_repeats:
        spent = clock() - start
        if done and ((done >= min_repeats and spent >= budget_s) or spent + last > min(cap_s, stop_s)):
            stopped = True
            break
        r0 = clock()
        got: dict[str, float] = {}
        for name, f in calls.items():
            t = run(name, f)
            if t is None:  # a repeat cut short is dropped; with none finished, each call's latest run stands as one
                if done:
                    return Samples(times, clock() - start, True, warmed)
                return Samples({n: [last_of[n]] if n in last_of else [] for n in calls}, clock() - start, True, warmed, from_warmup=True)
            got[name] = t
        for name, t in got.items():
            times[name].append(t)
        last = clock() - r0
        done += 1
    return Samples(times, clock() - start, stopped, warmed)


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-repeat num[i] ÷ den[i] (repeats where den is 0 are dropped)."""
    return [a / b for a, b in zip(num, den, strict=False) if b > 0]


def stats_ms(xs: Sequence[float]) -> dict[str, Any] | None:
    """Seconds per call -> median, quartiles, min and max in milliseconds."""
    if not xs:
        return None
    q1, med, q3 = quantiles(xs)
    return {"median_ms": 1e3 * med, "q1_ms": 1e3 * q1, "q3_ms": 1e3 * q3, "min_ms": 1e3 * min(xs), "max_ms": 1e3 * max(xs), "repeats": len(xs)}


def batch_timings(samples: Samples, k_max: int, batch_size: int, tree_tokens: Sequence[int] = (), tree_widths: Sequence[int] = ()) -> dict[str, Any]:
    """One batch size's samples ('target', 'draft', 'verify{K}', and for a tree 'tree{N}',
    'draftw{T}') -> its raw cost entry: timing statistics and the per-repeat ratios the
    cost model reads (a tree pass over N tokens ÷ the target's step; the drafter over T
    tokens ÷ its own one-token step)."""
    t = samples.times
    t1 = t.get("target", [])
    tree = {}
    if tree_tokens or tree_widths:
        tree = {
            "tree_verify": [{"tokens": int(n), "timing": stats_ms(t.get(f"tree{n}", [])), "ratios": ratios(t.get(f"tree{n}", []), t1)} for n in tree_tokens],
            "draft_width": [{"width": int(w), "timing": stats_ms(t.get(f"draftw{w}", [])), "ratios": ratios(t.get(f"draftw{w}", []), t.get("draft", []))} for w in tree_widths],
        }
    return {
        **tree,
        "batch_size": batch_size,
        "repeats": samples.repeats if not samples.from_warmup else int(bool(t1)),
        "from_warmup": samples.from_warmup,
        "target_step": stats_ms(t1),
        "draft_step": stats_ms(t.get("draft", [])),
        "verify": [stats_ms(t.get(f"verify{k}", [])) for k in range(1, k_max + 1)],
        "draft_ratios": ratios(t.get("draft", []), t1),
        "verify_ratios": [ratios(t.get(f"verify{k}", []), t1) for k in range(1, k_max + 1)],
    }


def budget_for(scoring_s: float | None) -> tuple[float, float]:
    """(budget, cap): the time the cost measurement aims at and the most it may take,
    fractions of the scoring it serves."""
    if scoring_s is None or math.isnan(scoring_s):
        return math.inf, math.inf
    return max(MIN_BUDGET_S, BUDGET_FRACTION * scoring_s), max(MIN_BUDGET_S, CAP_FRACTION * scoring_s)


# ----------------------------------------------------------------------------- cost tables (pure)
@dataclass(frozen=True)
class BatchCosts:
    """One batch size: the drafter/target cost ratio (median, quartiles) and a round's cost
    for every K, with what was given rather than measured already applied."""

    batch_size: int
    cost_ratio: float
    cost_ratio_q1: float
    cost_ratio_q3: float
    rounds: list[RoundCost]
    raw: dict[str, Any]
    verify_raw: list[float | None] = field(default_factory=list)  # v_K's median before the isotonic fit (None: given, not measured)


def cost_tables(raw: Mapping[str, Any], k_max: int, cost_ratio: float | None, verify_factor: float | None) -> list[BatchCosts]:
    """The raw timings (`cost_block`) + the overrides -> round costs per batch size. A
    drafter whose step was not timed at a batch size (the cap came first, or it has no
    step to time) costs what the weights its step reads give (`raw["draft_estimate"]`,
    never 0: a free drafter would overstate every speedup) — 0 only where even that
    cannot be counted; a verify pass that could not be timed counts as one step (v = 1).
    `sources` says which. Measured verify factors are made non-decreasing in K, repeat by
    repeat (`isotonic.non_decreasing_repeats`: a pass over more tokens never costs less,
    so a dip is timing noise), before they are priced; `verify_raw` keeps their medians
    as timed. A given --verify-factor is used as given."""
    out = []
    guess = unmeasured_cost_ratio(raw)
    for b in raw.get("batches", []):
        dr = list(b.get("draft_ratios") or [])
        vr = fill_verify([list(v) for v in (b.get("verify_ratios") or [])], k_max)
        c = cost_ratio if cost_ratio is not None else (None if dr else guess)
        v = verify_factor if verify_factor is not None else (None if vr and all(vr) else 1.0)
        measured_v = v is None
        raw_v: list[float | None] = [quantiles(x)[1] for x in vr] if measured_v else [None] * k_max
        rounds = round_costs(k_max, draft_ratios=dr, verify_ratios=non_decreasing_repeats(vr) if measured_v else vr, cost_ratio=c, verify_factor=v)
        cq1, cmed, cq3 = (c, c, c) if c is not None else quantiles(dr)
        out.append(BatchCosts(int(b["batch_size"]), cmed, cq1, cq3, rounds, dict(b), raw_v))
    return out


def fill_verify(vr: Sequence[Sequence[float]], k_max: int) -> list[list[float]]:
    """Per K = 1..k_max the per-repeat v_K, those not timed (an empty list: a K left out
    of the timing, or past where the cap cut it) linear in K between the timed ones in the
    same repeat, and past the last one along the last two timed (flat from one). Nothing
    timed: unchanged (empty)."""
    rows = [list(vr[k]) if k < len(vr) else [] for k in range(k_max)]
    timed = [k for k in range(k_max) if rows[k]]
    if not timed:
        return rows
    n = min(len(rows[k]) for k in timed)
    for k in range(k_max):
        if rows[k]:
            continue
        lo = max((j for j in timed if j < k), default=None)
        hi = min((j for j in timed if j > k), default=None)
        if lo is not None and hi is not None:
            a, b = lo, hi
        elif lo is not None:  # past the last timed K
            below = [j for j in timed if j < lo]
            a, b = (below[-1], lo) if below else (lo, lo)
        else:  # before the first timed K (never: K = 1 is timed first)
            a = b = hi  # type: ignore[assignment]
        assert a is not None and b is not None
        rows[k] = [rows[a][i] + (rows[b][i] - rows[a][i]) * (k - a) / (b - a) if b != a else rows[a][i] for i in range(n)]
    return rows


def unmeasured_cost_ratio(raw: Mapping[str, Any]) -> float:
    """c where the drafter's step was not timed: the estimate from the weights each step
    reads, else 0 (nothing to count)."""
    est = raw.get("draft_estimate") or {}
    c = est.get("cost_ratio")
    return float(c) if c is not None and not math.isnan(float(c)) else 0.0


def sources(raw: Mapping[str, Any], cost_ratio_from: str | None, verify_factor_from: str | None) -> dict[str, str]:
    """Where c and v came from: the flag or config key that gave them, measured,
    estimated (from the weights each step reads, where the step was not timed), or assumed."""
    batches = raw.get("batches", [])
    timed_draft = any(b.get("draft_ratios") for b in batches)
    untimed = [str(b["batch_size"]) for b in batches if not b.get("draft_ratios")]
    est = raw.get("draft_estimate") or {}
    if est.get("cost_ratio") is not None:
        why = "its step was not timed" + (" (the cap came first)" if raw.get("stopped_by_budget") else "")
        guessed = f"estimated {float(est['cost_ratio']):.3f} from {est.get('how')}; {why}"
    else:
        guessed = "not measured and not estimable (0 assumed: the speedup is an upper bound)"
    drafted = "measured" if timed_draft and not untimed else (f"measured; at batch size {', '.join(untimed)} {guessed}" if timed_draft else guessed)
    every_k = any(b.get("verify_ratios") and all(b["verify_ratios"]) for b in batches)
    some_k = any(b.get("verify_ratios") and any(b["verify_ratios"]) for b in batches)
    measured = "measured per K" if every_k else "measured at some K, interpolated between" if some_k else "not measured (1 assumed)"
    return {
        "cost_ratio": cost_ratio_from or drafted,
        "verify_factor": verify_factor_from or measured,
    }


@dataclass(frozen=True)
class Priced:
    """The estimate priced by the cost model: the K table at the run's batch size, the
    cost section of the result and its catalogue metrics."""

    k_table: list[KRow]
    best: KRow | None
    cost_ratio: float
    verify: list[float]  # v_K at the run's batch size, K = 1..k_max
    section: dict[str, Any]
    metrics: dict[str, Any]


def price(
    raw: Mapping[str, Any],
    *,
    cumulative: Sequence[float],
    alpha_mean: float,
    renewal: Sequence[float] | None,
    k_max: int,
    batch_size: int,
    cost_ratio: float | None = None,
    verify_factor: float | None = None,
    origins: Mapping[str, str] | None = None,
    budget: tuple[float, Any, Any] | None = None,
) -> Priced:
    """Raw timings (`cost_block`) + τ(K) -> speedup per (batch size, K), the headline K
    table at `batch_size` (the run's), and the metrics the SP3xx rules read. budget: the
    summed renewal counts (tokens, rounds [K], drafted [K, K]) for the speedup at the run's
    own token budget (`estimate.budget_speedups`)."""
    origins = origins or {}
    tables = cost_tables(raw, k_max, cost_ratio, verify_factor)
    head = next((t for t in tables if t.batch_size == batch_size), tables[0] if tables else None)
    c = head.cost_ratio if head is not None else (cost_ratio if cost_ratio is not None else unmeasured_cost_ratio(raw))
    if c is None or math.isnan(c):
        c = unmeasured_cost_ratio(raw)
    vf = verify_factor if verify_factor is not None else 1.0

    def table(rounds: Sequence[RoundCost] | None, ratio: float) -> list[KRow]:
        if not cumulative:
            return []
        at_budget = None
        if budget is not None and renewal is not None and not all(math.isnan(x) for x in renewal):
            verify = [r.verify_factor for r in rounds] if rounds else [vf] * k_max
            at_budget = budget_speedups(budget[0], budget[1], budget[2], ratio, verify, verify_factor)
        return k_table(cumulative, alpha_mean, ratio, vf, renewal, rounds=rounds, budget=at_budget)

    ktab = table(head.rounds if head else None, c)
    best = best_k(ktab) if ktab else None
    batches = []
    for t in tables:
        rows = ktab if t is head else table(t.rounds, t.cost_ratio)
        b_best = best_k(rows) if rows else None
        raw_b = t.raw
        batches.append({
            "batch_size": t.batch_size,
            "repeats": raw_b.get("repeats", 0),
            "target_step": raw_b.get("target_step"),
            "draft_step": raw_b.get("draft_step"),
            "cost_ratio": t.cost_ratio,
            "cost_ratio_q1": t.cost_ratio_q1,
            "cost_ratio_q3": t.cost_ratio_q3,
            "best_k": b_best.k if b_best else None,
            "best_k_equivalent": equivalent_range(rows) if rows else [],
            "speedup_best": b_best.speedup if b_best else None,
            "rows": [
                {
                    "k": r.k, "tau_tokens": headline_tau(r), "verify_factor": rc.verify_factor, "verify_factor_raw": raw_v, "round_cost": rc.cost,
                    "round_cost_q1": rc.low, "round_cost_q3": rc.high, "speedup": r.speedup, "speedup_low": r.speedup_low,
                    "speedup_high": r.speedup_high, "verify": (raw_b.get("verify") or [None] * k_max)[r.k - 1],
                }
                for r, rc, raw_v in zip(rows, t.rounds, t.verify_raw or [None] * len(t.rounds), strict=False)
            ],
            "draft_ratios": raw_b.get("draft_ratios", []),
            "verify_ratios": raw_b.get("verify_ratios", []),
            "context_tokens": raw_b.get("context_tokens"),
            "skipped": raw_b.get("skipped"),
            **tree_rows(raw, raw_b, [rc.verify_factor for rc in t.rounds]),
        })
    spread = None
    if best is not None and head is not None and head.raw.get("repeats", 0) >= 2:
        rc = head.rounds[best.k - 1]
        spread = (rc.high - rc.low) / rc.cost if rc.cost and not math.isnan(rc.cost) else None
    no_pay = next((b for b in batches if b["speedup_best"] is not None and b["speedup_best"] < 1.0), None)
    hraw = head.raw if head else {}
    repeats = int(hraw.get("repeats") or 0) if raw.get("measured") else None
    section = {
        "cost_ratio": c,
        "target_step_ms": (hraw.get("target_step") or {}).get("median_ms"),
        "draft_step_ms": (hraw.get("draft_step") or {}).get("median_ms"),
        "measured": bool(raw.get("measured")),
        "verify_factor": verify_factor,
        "sources": sources(raw, origins.get("cost_ratio", "given") if cost_ratio is not None else None, origins.get("verify_factor", "given") if verify_factor is not None else None),
        "batch_size": head.batch_size if head else batch_size,
        "context_tokens": raw.get("context_tokens"),
        "budget_s": raw.get("budget_s"),
        "cap_s": raw.get("cap_s"),
        "elapsed_s": raw.get("elapsed_s"),
        "stopped_by_budget": bool(raw.get("stopped_by_budget")),
        "spread_rel": spread,
        "best_k_equivalent": equivalent_range(ktab) if ktab else [],
        "repeats": repeats,
        "method": raw.get("method"),
        "prefill_tokens": raw.get("prefill_tokens"),
        "memory_bytes": raw.get("memory_bytes"),
        "skipped": list(raw.get("skipped", [])),
        "batches": batches,
        "notes": list(raw.get("notes", [])),
        "by_length": length_costs(raw, k_max, cost_ratio, verify_factor, head),
        "tree_mask": (raw.get("tree") or {}).get("mask"),
        "tree_verify": next((b["tree_verify"] for b in batches if head is not None and b["batch_size"] == head.batch_size), []),
        "draft_width": next((b["draft_width"] for b in batches if head is not None and b["batch_size"] == head.batch_size), []),
    }
    metrics = {
        "tau_tokens": headline_tau(best) if best else None,
        "tau_window_tokens": best.tau_tokens if best else None,
        "accept_rate_best_k": (best.accept_rate if math.isnan(best.accept_rate_renewal) else best.accept_rate_renewal) if best else None,
        "best_k": best.k if best else None,
        "speedup_best": best.speedup if best else None,
        "speedup_best_low": best.speedup_low if best and spread is not None else None,
        "speedup_best_high": best.speedup_high if best and spread is not None else None,
        "verify_factor_best_k": best.verify_factor if best else None,
        "cost_ratio": c,
        "cost_spread_rel": spread,
        "cost_repeats": repeats if best else None,
        "cost_batch_size": head.batch_size if head else batch_size,
        "batch_size_no_speedup": no_pay["batch_size"] if no_pay else (0 if best else None),
        "speedup_batch_no_speedup": no_pay["speedup_best"] if no_pay else None,
    }
    verify = [r.verify_factor for r in head.rounds] if head else []
    return Priced(ktab, best, c, verify, section, metrics)


def length_costs(raw: Mapping[str, Any], k_max: int, cost_ratio: float | None, verify_factor: float | None, head: BatchCosts | None) -> list[dict[str, Any]]:
    """--context-lengths: per prompt length, the round cost for every K from the timings
    at that length's own context (`raw["by_length"]`), the overrides applied; a length the
    cap or the memory left untimed takes the run's headline costs (`head`, the prompts'
    typical context) and says so in `source`."""
    out = []
    entries = list(raw.get("by_length") or [])
    tables = cost_tables({"batches": entries, **{k: v for k, v in raw.items() if k not in ("batches", "by_length")}}, k_max, cost_ratio, verify_factor)
    for e, t in zip(entries, tables, strict=False):
        timed = bool(e.get("repeats"))
        use = t if timed or head is None else head
        out.append({
            "length": int(e["length"]),
            "batch_size": int(e["batch_size"]),
            "context_tokens": e.get("context_tokens"),
            "repeats": int(e.get("repeats") or 0),
            "target_step": e.get("target_step"),
            "draft_step": e.get("draft_step"),
            "cost_ratio": use.cost_ratio,
            "verify_factors": [rc.verify_factor for rc in use.rounds],
            "round_costs": [rc.cost for rc in use.rounds],
            "source": "timed at this length's context" if timed else f"not timed at this length ({e.get('skipped') or 'no repeat finished'}): the run's costs at {raw.get('context_tokens')} tokens",
            "skipped": e.get("skipped"),
        })
    return out


def tree_rows(raw: Mapping[str, Any], batch: Mapping[str, Any], chain_verify: Sequence[float]) -> dict[str, list[dict[str, Any]]]:
    """One batch size's tree timings -> the cost section's rows: per N of the grid v_N
    (median and quartiles over the repeats where measured; else interpolated from the
    measured ones, or from the chain's verify factors where none was), per T (1 included)
    w_T likewise (1 where not measured)."""
    grid = raw.get("tree") or {}
    if not grid:
        return {"tree_verify": [], "draft_width": []}
    measured_v, measured_w = tree_factors(batch)
    by_n = {int(x["tokens"]): x for x in batch.get("tree_verify") or []}
    by_w = {int(x["width"]): x for x in batch.get("draft_width") or []}
    fallback: FactorTable = measured_v or list(chain_verify)
    verify = []
    for n in grid.get("tokens", []):
        x = by_n.get(int(n)) or {}
        r = list(x.get("ratios") or [])
        q1, med, q3 = quantiles(r) if r else (None, tree_verify_factor(int(n), fallback), None)
        verify.append({"tokens": int(n), "verify_factor": med, "verify_factor_q1": q1, "verify_factor_q3": q3, "measured": bool(r), "timing": x.get("timing")})
    width = [{"width": 1, "width_factor": 1.0, "width_factor_q1": None, "width_factor_q3": None, "measured": False, "timing": None}]
    for w in grid.get("widths", []):
        x = by_w.get(int(w)) or {}
        r = list(x.get("ratios") or [])
        q1, med, q3 = quantiles(r) if r else (None, draft_width_factor(int(w), measured_w or None), None)
        width.append({"width": int(w), "width_factor": med, "width_factor_q1": q1, "width_factor_q3": q3, "measured": bool(r), "timing": x.get("timing")})
    return {"tree_verify": verify, "draft_width": width}


# ----------------------------------------------------------------------------- tree rounds (pure)
# A tree round in SGLang's shape — steps S, topk T, N tokens verified (the root included):
# the drafter runs S steps, the first over 1 token and the next S − 1 over the T beams
# each, then the target runs one pass over the N tree tokens under a tree attention mask.
# In target decode steps: c·(1 + (S − 1)·w_T) + v_N, where
#   c    the drafter's one-token step ÷ the target's (the chain's cost ratio),
#   w_T  the drafter's pass over T tokens ÷ its one-token step (w_1 = 1),
#   v_N  the target's pass over N tokens ÷ its one-token step (v_1 = 1).
# With T = 1 and N = S + 1 this is the chain's K·c + v_K at K = S.
FactorTable = Mapping[int, float] | Sequence[float]


def chain_verify_by_tokens(verify: Sequence[float]) -> dict[int, float]:
    """The chain's verify factors (verify[K − 1]: the target pass over K + 1 tokens) as
    tokens -> v, with v at 1 token = 1."""
    return {1: 1.0, **{k + 2: float(v) for k, v in enumerate(verify)}}


def linear_at(points: Mapping[int, float], x: int) -> float:
    """The value at x of the piecewise-linear curve through `points` (exact at a point),
    extended past the last point along the last two (flat from one), before the first
    along the first two. NaN when there is no point."""
    xs = sorted(int(k) for k, v in points.items() if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    if x in points and x in xs:
        return float(points[x])
    if len(xs) == 1:
        return float(points[xs[0]])
    lo = max((k for k in xs if k < x), default=None)
    hi = min((k for k in xs if k > x), default=None)
    if lo is None:
        lo, hi = xs[0], xs[1]
    elif hi is None:
        lo, hi = xs[-2], xs[-1]
    a, b = float(points[lo]), float(points[hi])
    return a + (b - a) * (x - lo) / (hi - lo)


def tree_verify_factor(tokens: int, verify_by_tokens: FactorTable | None) -> float:
    """v_N: a Mapping is tokens -> v measured for the tree (with v at 1 token = 1 added
    where absent); a Sequence is the chain's verify factors (`chain_verify_by_tokens`);
    None: 1 (one decode step, as the chain assumes v untimed). Linear between the
    points and beyond the last."""
    if verify_by_tokens is None:
        return 1.0
    pts = dict(verify_by_tokens) if isinstance(verify_by_tokens, Mapping) else chain_verify_by_tokens(verify_by_tokens)
    pts.setdefault(1, 1.0)
    return linear_at(pts, int(tokens))


def draft_width_factor(topk: int, width_factor: Mapping[int, float] | float | None) -> float:
    """w_T: the drafter's pass over T tokens ÷ its one-token step — 1 at T = 1 and when
    not measured (None), a number as given, or linear between the widths measured."""
    if topk <= 1 or width_factor is None:
        return 1.0
    if not isinstance(width_factor, Mapping):
        return float(width_factor)
    pts = {int(k): float(v) for k, v in width_factor.items()}
    pts[1] = 1.0
    return linear_at(pts, int(topk))


def tree_round_cost(
    steps: int, topk: int, tokens: int, cost_ratio: float, verify_by_tokens: FactorTable | None = None, width_factor: Mapping[int, float] | float | None = None,
) -> float:
    """One tree round's cost in target decode steps: c·(1 + (S − 1)·w_T) + v_N for
    steps S, topk T and N tokens verified (the root included). verify_by_tokens: the
    tree pass's measured v by token count (tokens -> v), or the chain's verify factors
    (a sequence, verify[K − 1] over K + 1 tokens), or None (v = 1); width_factor: the
    measured w by width (T -> w), a number, or None (w = 1). For T = 1 and N = S + 1
    with the chain's factors it is exactly the chain's K·c + v_K."""
    if steps < 1 or topk < 1 or tokens < 1:
        raise ValueError(f"a tree needs steps, topk and tokens ≥ 1 (got {steps}, {topk}, {tokens})")
    w = draft_width_factor(topk, width_factor)
    c = float(cost_ratio)
    return c * (1 + (steps - 1) * w) + tree_verify_factor(tokens, verify_by_tokens)


def tree_factors(batch: Mapping[str, Any]) -> tuple[dict[int, float], dict[int, float]]:
    """One batch size's raw or priced cost entry -> (tokens -> v_N, width -> w_T): the
    medians over the repeats of what the tree timing measured (empty where nothing was),
    ready for `tree_round_cost`."""
    def med(xs: Sequence[float]) -> float:
        return quantiles(xs)[1]

    def table(rows: Sequence[Mapping[str, Any]], key: str, value: str) -> dict[int, float]:
        out = {}
        for x in rows:
            if x.get("ratios"):  # a raw entry (`batch_timings`)
                out[int(x[key])] = med(x["ratios"])
            elif x.get("measured") and x.get(value) is not None:  # the cost section's row (`tree_rows`)
                out[int(x[key])] = float(x[value])
        return out

    return table(batch.get("tree_verify") or [], "tokens", "verify_factor"), table(batch.get("draft_width") or [], "width", "width_factor")
