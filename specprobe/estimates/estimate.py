"""What a drafter buys, from teacher-forced acceptance probabilities. Pure functions.

Window estimate: τ(K) = 1 + Σ_{j≤K} r_j with r_j the mean over every start position
(bonus token included, the vLLM/SGLang "mean acceptance length"). Renewal estimate: the
same counts taken only over the positions where a real draft→verify loop starts a round
(where the previous round ended), by dynamic programming along each reference.
acceptance rate = (τ(K) − 1)/K; speedup(K) = τ(K) / (cost of one round in target decode
steps): K·c + v_K with c = drafter step ÷ target step and v_K = target pass over K + 1 tokens
÷ target step, both timed on the device (`RoundCost`), or (1 + K·c)·v when v is given
(`--verify-factor`). Derivations: docs/maths.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def tau(cumulative: Sequence[float], k: int) -> float:
    """Expected tokens per verify step when drafting k tokens."""
    r = np.nan_to_num(np.asarray(cumulative[:k], dtype=float), nan=0.0)
    return float(1.0 + r.sum())


def accept_rate(tau_k: float, k: int) -> float:
    return (tau_k - 1.0) / k if k > 0 else float("nan")


def conditional(cumulative: Sequence[float]) -> list[float]:
    """a_j = r_j / r_{j−1} (r_0 = 1); nan where r_{j−1} = 0."""
    out, prev = [], 1.0
    for r in cumulative:
        out.append(float(r / prev) if prev > 0 and not math.isnan(prev) else float("nan"))
        prev = r
    return out


def iid_tau(alpha: float, k: int) -> float:
    """Closed form for a constant per-token acceptance α: (1 − α^{K+1}) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_cost(k: int, cost_ratio: float, verify_factor: float = 1.0) -> float:
    """A round's cost in target decode steps when v is given: (1 + K·c)·v — the formula
    `--cost-ratio`/`--verify-factor` reproduce exactly."""
    return (1.0 + k * cost_ratio) * verify_factor


def speedup(tau_k: float, k: int, cost_ratio: float, verify_factor: float = 1.0) -> float:
    return tau_k / round_cost(k, cost_ratio, verify_factor)


# ----------------------------------------------------------------------------- cost model
@dataclass(frozen=True)
class RoundCost:
    """One draft→verify round at one K and batch size, in target decode steps: the median
    over timed repeats and its quartiles (all three equal when nothing was timed).
    verify_factor: v_K, the target pass over K + 1 tokens ÷ one decode step (or the given v)."""

    k: int
    cost: float
    low: float  # first quartile
    high: float  # third quartile
    verify_factor: float


def quantiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear interpolation; nan when empty."""
    a = np.asarray([x for x in xs if not math.isnan(x)], dtype=float)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    q1, med, q3 = np.quantile(a, [0.25, 0.5, 0.75])
    return float(q1), float(med), float(q3)


def round_costs(
    k_max: int,
    *,
    draft_ratios: Sequence[float] = (),
    verify_ratios: Sequence[Sequence[float]] = (),
    cost_ratio: float | None = None,
    verify_factor: float | None = None,
) -> list[RoundCost]:
    """Round costs for K = 1..k_max from per-repeat timings, each overridden by its flag.

    draft_ratios[i]: drafter step ÷ target step in repeat i; verify_ratios[K−1][i]: target
    pass over K + 1 tokens ÷ target step in repeat i (the repeats interleave every call, so
    one repeat's ratios share the machine's state and drift cancels). Per repeat,
    R_i(K) = K·c_i + v_{K,i}; with `verify_factor` given R_i(K) = (1 + K·c_i)·v (so both
    overrides give exactly `round_cost`); with `cost_ratio` given c_i = c. The median and
    quartiles are taken over the repeats' R_i(K)."""
    rows = []
    for k in range(1, k_max + 1):
        cs = [cost_ratio] if cost_ratio is not None else list(draft_ratios)
        if verify_factor is not None:
            samples = [round_cost(k, c, verify_factor) for c in cs]
            v_med = verify_factor
        else:
            vs = list(verify_ratios[k - 1]) if k - 1 < len(verify_ratios) else []
            if cost_ratio is not None:
                cs = [cost_ratio] * len(vs)
            samples = [k * c + v for c, v in zip(cs, vs, strict=False)]
            v_med = quantiles(vs)[1]
        q1, med, q3 = quantiles(samples)
        rows.append(RoundCost(k, med, q1, q3, v_med))
    return rows


@dataclass(frozen=True)
class KRow:
    """One K. tau_tokens, accept_rate, speedup_window: the window estimate (every start
    position); tau_renewal_tokens, accept_rate_renewal: the renewal estimate (rounds start
    where the previous one ended). speedup uses the renewal τ when it is known, else the
    window τ; speedup_low/high: the same τ over the round cost's third/first quartile
    (timing noise); verify_factor: v_K used. speedup_budget: these prompts at this token
    budget, the final short rounds included (`budget_speedups`) — what `simulate`
    measures; speedup is the steady state of long generations."""

    k: int
    tau_tokens: float
    accept_rate: float
    iid_tau_tokens: float
    speedup: float
    tau_renewal_tokens: float = math.nan
    accept_rate_renewal: float = math.nan
    speedup_window: float = math.nan
    verify_factor: float = math.nan
    speedup_low: float = math.nan
    speedup_high: float = math.nan
    speedup_budget: float = math.nan
    # standard errors over prompts of the renewal figures (prompts the independent units)
    accept_rate_renewal_se: float = math.nan
    tau_renewal_se: float = math.nan
    speedup_se: float = math.nan  # speedup × tau_renewal_se ÷ τ: the round cost is fixed at a K
    # per draft position as an engine counts it: rounds accepting 1..i ÷ rounds drafted (renewal)
    per_position_renewal: list[float] = field(default_factory=list)
    per_position_renewal_se: list[float] = field(default_factory=list)


def k_table(
    cumulative: Sequence[float],
    alpha_mean: float,
    cost_ratio: float,
    verify_factor: float = 1.0,
    renewal: Sequence[float] | None = None,
    rounds: Sequence[RoundCost] | None = None,
    budget: Sequence[float] | None = None,
) -> list[KRow]:
    """One row per K = 1..len(cumulative); renewal[K−1] is the renewal τ(K) (`renewal_tau`).
    rounds[K−1]: the round's cost (`round_costs`); without it (1 + K·c)·v. budget[K−1]:
    the speedup at the run's own token budget (`budget_speedups`)."""
    rows = []
    for k in range(1, len(cumulative) + 1):
        rc = rounds[k - 1] if rounds is not None and k <= len(rounds) else None
        if rc is None:
            c = round_cost(k, cost_ratio, verify_factor)
            rc = RoundCost(k, c, c, c, verify_factor)
        t = tau(cumulative, k)
        tr = float(renewal[k - 1]) if renewal is not None and k <= len(renewal) else math.nan
        head = t if math.isnan(tr) else tr
        rows.append(KRow(
            k, t, accept_rate(t, k), iid_tau(alpha_mean, k), head / rc.cost, tr, accept_rate(tr, k), t / rc.cost,
            rc.verify_factor, head / rc.high, head / rc.low,
            float(budget[k - 1]) if budget is not None and k <= len(budget) else math.nan,
        ))
    return rows


def headline_tau(row: KRow) -> float:
    """The τ a row's speedup uses: renewal when known, else window."""
    return row.tau_tokens if math.isnan(row.tau_renewal_tokens) else row.tau_renewal_tokens


def _num(x: float, default: float) -> float:
    return default if x is None or math.isnan(x) else float(x)


def equivalent_ks(rows: Sequence[KRow]) -> list[KRow]:
    """The Ks the cost timing cannot tell apart from the fastest one, smallest K first:
    the K with the highest speedup and every K whose speedup range (τ over the round
    cost's quartiles, `speedup_low`–`speedup_high`) reaches its low end. A range of zero
    width (costs given by --cost-ratio/--verify-factor, not timed) overlaps nothing: the
    fastest K then stands alone, as it does when the ranges are apart. Empty when no K
    has a speedup."""
    valid = [r for r in rows if not math.isnan(r.speedup)]
    if not valid:
        return []
    top = max(valid, key=lambda r: (r.speedup, -r.k))

    def timed(r: KRow) -> bool:
        return _num(r.speedup_high, r.speedup) > _num(r.speedup_low, r.speedup)

    if not timed(top):
        return [top]
    floor = _num(top.speedup_low, top.speedup)
    return sorted([top, *(r for r in valid if r.k != top.k and timed(r) and _num(r.speedup_high, r.speedup) >= floor)], key=lambda r: r.k)


def best_k(rows: Sequence[KRow]) -> KRow:
    """The K to recommend: the smallest of those the timing cannot tell from the fastest
    (`equivalent_ks`) — as fast within the noise, and less drafting wasted on rejections —
    so that timing noise does not pick K (the same weights timed twice get the same K).
    With given costs (no spread) or ranges apart: the fastest K, the smaller on a tie."""
    eq = equivalent_ks(rows)
    return eq[0] if eq else max(rows, key=lambda r: (r.speedup, -r.k))


def equivalent_range(rows: Sequence[KRow]) -> list[int]:
    """The Ks `best_k` chose among, in order, when there was a choice (more than one);
    else empty."""
    eq = equivalent_ks(rows)
    return [r.k for r in eq] if len(eq) > 1 else []


@dataclass(frozen=True)
class Adaptive:
    threshold: float
    tau_tokens: float
    speedup: float
    mean_k: float


def verify_at(drafted: float, verify: Sequence[float]) -> float:
    """v for a verify pass after `drafted` tokens on average: linear between the measured
    v_K (verify[K−1]), with v_0 = 1 (a pass over one token is one decode step)."""
    xs = np.arange(len(verify) + 1, dtype=float)
    ys = np.concatenate([[1.0], np.nan_to_num(np.asarray(verify, dtype=float), nan=1.0)])
    return float(np.interp(drafted, xs, ys))


def adaptive_threshold(
    thresholds: Sequence[float],
    table: np.ndarray,
    cost_ratio: float,
    verify_factor: float | None = 1.0,
    verify: Sequence[float] | None = None,
) -> Adaptive | None:
    """table[i] = (Σ expected accepted, Σ drafter passes, Σ drafted, windows) for thresholds[i].
    Speedup is a ratio of expectations: tokens per step over cost per step — with v given,
    (1 + c·passes)·v; else c·passes + v at the mean drafted count (`verify_at`)."""
    best: Adaptive | None = None
    for theta, (acc, passes, drafted, n) in zip(thresholds, table, strict=True):
        if n <= 0:
            continue
        t = 1.0 + acc / n
        if verify_factor is not None or not verify:
            cost = (1.0 + cost_ratio * passes / n) * (verify_factor if verify_factor is not None else 1.0)
        else:
            cost = cost_ratio * passes / n + verify_at(drafted / n, verify)
        cand = Adaptive(float(theta), float(t), float(t / cost), float(drafted / n))
        if best is None or cand.speedup > best.speedup + 1e-12:
            best = cand
    return best


# ----------------------------------------------------------------------------- renewal estimate
@dataclass(frozen=True)
class RenewalCounts:
    """Expected counts of one reference sequence of n tokens under the real loop's schedule,
    for every K = 1..k_max (row K−1). Sums of these over sequences stay exact expectations,
    so shards merge by adding.

    tokens: n (every token is emitted by exactly one round); rounds[K−1]: expected verify
    rounds; drafted[K−1, i−1]: expected rounds that drafted depth i; accepted[K−1, i−1]:
    expected rounds whose depths 1..i were all accepted (vLLM's per-position counters)."""

    tokens: float
    rounds: np.ndarray  # [K]
    accepted: np.ndarray  # [K, K]
    drafted: np.ndarray  # [K, K]
    starts: np.ndarray | None = None  # [n, K] P(a round starts at t), when asked for


def survival(depth_alpha: np.ndarray) -> np.ndarray:
    """[D, n] acceptance probabilities α^{(d)}_t (row d−1: the depth-d prediction of token t)
    -> r [D+2, n], r[j, t] = Π_{i<j} α^{(i+1)}_{t+i}: the probability that a round starting at
    t accepts depths 1..j. r[0] = 1; entries whose window runs past the end are 0 (never
    read: a round's draft length is capped inside the sequence), as is row D+1."""
    a = np.clip(np.nan_to_num(np.asarray(depth_alpha, dtype=np.float64), nan=0.0), 0.0, 1.0)
    d, n = a.shape
    r = np.zeros((d + 2, n))
    r[0] = 1.0
    for j in range(1, d + 1):
        m = n - j + 1  # starts whose depth-j draft is still inside the sequence
        if m <= 0:
            break
        r[j, :m] = r[j - 1, :m] * a[j - 1, j - 1 : j - 1 + m]
    return r


def renewal_counts(depth_alpha: np.ndarray, draft_lengths: np.ndarray | None = None, n_min: int = 0) -> RenewalCounts:
    """Expected rounds and per-depth counters along one reference, rounds starting only
    where the previous round ended, for every K = 1..D at once ([D, n] input as in
    `survival`; an autoregressive drafter repeats its per-position α on every row).

    Boundary (as the loop in `simulate` and transformers' assisted generation): a round
    starting at t, with m = n − t tokens still to come, drafts c = min(K, m − 1) tokens, so
    the target always emits the last token and no round overshoots. It accepts exactly j
    with probability r_j(t) − r_{j+1}(t) for j < c and r_c(t) for j = c, and emits j + 1
    tokens. Forward recursion over start probabilities π: π(0) = 1,
    π(t + j + 1) += π(t)·P(j | t); expected rounds = Σ_{t<n} π(t) (the same number as the
    backward R(0) with R(t) = 1 + Σ_j P(j | t)·R(t + j + 1), R(n) = 0).

    Early stop (llama.cpp's --spec-draft-p-min / -n-min): draft_lengths[t] caps the draft of
    a round at t (the depths its drafter was confident at), and a draft that ends up shorter
    than n_min — by that cap or the budget — is dropped: the round decodes one token."""
    return renewal_from_survival(survival(depth_alpha), draft_lengths, n_min)


def renewal_from_survival(r: np.ndarray, draft_lengths: np.ndarray | None = None, n_min: int = 0, with_starts: bool = False) -> RenewalCounts:
    """`renewal_counts` from the survival r [D+2, n] itself (r[j, t]: a round starting at t
    accepts depths 1..j; row D+1 zero) — for a draft tree, whose r_j(t) is a sum over its
    depth-j nodes rather than a product along one path. with_starts: also keep the
    probability that a round starts at t ([n, K], `RenewalCounts.starts`)."""
    r = np.asarray(r, dtype=np.float64)
    kmax, n = r.shape[0] - 2, r.shape[1]
    ks = np.arange(1, kmax + 1)  # [K]
    if n == 0 or kmax == 0:
        z = np.zeros((kmax, kmax))
        return RenewalCounts(0.0, np.zeros(kmax), z, z.copy())
    t = np.arange(n)
    cap = np.minimum(ks[None, :], (n - 1 - t)[:, None])  # [n, K] draft length of a round at t
    if draft_lengths is not None:
        cap = np.minimum(cap, np.asarray(draft_lengths, dtype=np.int64)[:, None])
    if n_min > 1:
        cap = np.where(cap < n_min, 0, cap)
    j = np.arange(kmax + 1)  # accepted count
    rt = r[: kmax + 1].T  # [n, K+1] r_j(t)
    exact = rt - r[1 : kmax + 2].T  # [n, K+1] P(accept exactly j) when the draft is longer than j
    lt = j[None, None, :] < cap[:, :, None]  # [n, K, K+1]
    eq = j[None, None, :] == cap[:, :, None]
    step = np.where(lt, exact[:, None, :], np.where(eq, rt[:, None, :], 0.0))  # [n, K, K+1]
    pi = np.zeros((kmax, n + 1))  # [K, n+1] probability that a round starts at t
    pi[:, 0] = 1.0
    for s in range(n):
        w = min(kmax + 1, n - s)  # step[s, :, j] = 0 for j ≥ n − s: nothing lands past n
        pi[:, s + 1 : s + 1 + w] += pi[:, s : s + 1] * step[s, :, :w]
    start = pi[:, :n].T  # [n, K]
    i = np.arange(1, kmax + 1)
    reach = i[None, None, :] <= cap[:, :, None]  # [n, K, K(depth i)] round at t drafts depth i
    drafted = np.einsum("tk,tki->ki", start, reach.astype(np.float64))
    accepted = np.einsum("tk,tki,ti->ki", start, reach.astype(np.float64), r[1 : kmax + 1].T)
    return RenewalCounts(float(n), start.sum(axis=0), accepted, drafted, start if with_starts else None)


def renewal_tau(accepted: np.ndarray, drafted: np.ndarray, per_draft: bool = False) -> np.ndarray:
    """[K, K] summed expected counters -> [K] τ_renewal(K) = 1 + Σ_{i≤K} A_i / D_i, the mean
    acceptance length exactly as `simulate` (and vLLM) count it, in expectation. Summed over
    sequences, rounds weigh every sequence by its own number of rounds. A depth no round
    drafted adds nothing; nan when no round drafted at all.

    per_draft: 1 + Σ_i A_i / D_1 — accepted tokens per draft made, as llama-server counts
    its mean acceptance length (1 + accepted ÷ drafts). Under an early stop (drafts of
    varying length) this is the tokens a drafting round emits; the per-depth form would
    count a deep depth's rate as if every round had drafted it."""
    k = accepted.shape[0]
    out = np.full(k, math.nan)
    for kk in range(k):
        d, a = drafted[kk, : kk + 1], accepted[kk, : kk + 1]
        if d[0] > 0:
            if per_draft:
                out[kk] = 1.0 + float(np.sum(a) / d[0])
            else:
                out[kk] = 1.0 + float(np.sum(np.where(d > 0, a / np.where(d > 0, d, 1.0), 0.0)))
    return out


def renewal_tokens_per_verify(tokens: float, rounds: np.ndarray) -> np.ndarray:
    """[K] Σ tokens ÷ Σ expected rounds, the final short rounds included: `simulate`'s
    tokens_per_verify, in expectation."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(rounds > 0, tokens / np.where(rounds > 0, rounds, 1.0), math.nan)


def budget_cost(rounds: float, drafted: Sequence[float] | np.ndarray, cost_ratio: float, verify: Sequence[float], verify_factor: float | None = None) -> float:
    """Expected cost, in target decode steps, of the rounds one K runs over whole sequences
    (summed renewal counts: `rounds` = Σ expected rounds, drafted[i−1] = Σ expected rounds
    that drafted depth i, i = 1..K). Near the end of its budget a round drafts fewer than K
    tokens (m = min(K, remaining − 1)); a round drafting m costs m·c + v_m, with v_m the
    verify pass over m + 1 tokens (verify[m−1]) and v_0 = 1 — or (1 + m·c)·v when
    `verify_factor` v is given."""
    d = [float(x) for x in drafted] + [0.0]
    k = len(d) - 1
    exact = [float(rounds) - d[0]] + [d[m - 1] - d[m] for m in range(1, k + 1)]  # rounds drafting exactly m
    if verify_factor is not None:
        return float(sum(e * round_cost(m, cost_ratio, verify_factor) for m, e in enumerate(exact)))
    v = [1.0] + [float(x) for x in verify[:k]]
    return float(sum(e * (m * cost_ratio + v[m]) for m, e in enumerate(exact)))


def budget_speedups(
    tokens: float,
    rounds: Sequence[float],
    drafted: np.ndarray,
    cost_ratio: float,
    verify: Sequence[float],
    verify_factor: float | None = None,
) -> list[float]:
    """[K] speedup over the sequences the renewal counts were summed over (tokens, rounds[K−1],
    drafted[K−1, :K]), the final short rounds priced as they run (`budget_cost`), against
    plain decoding's one step per token: Σ tokens ÷ Σ expected cost. nan for a K no
    round reached."""
    out = []
    for k in range(1, len(rounds) + 1):
        cost = budget_cost(rounds[k - 1], drafted[k - 1, :k], cost_ratio, verify, verify_factor) if rounds[k - 1] > 0 else math.nan
        out.append(tokens / cost if cost > 0 else math.nan)
    return out
