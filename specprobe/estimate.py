"""What a drafter buys (design.md §2), from teacher-forced depth curves. Pure functions.

τ(K) = 1 + Σ_{j≤K} r_j (bonus token included, the vLLM/SGLang "mean acceptance length");
acceptance rate = (τ(K) − 1)/K; speedup(K) = τ(K) / (1 + K·c) / v with c the drafter/target
cost ratio per step and v the verify-cost factor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def speedup(tau_k: float, k: int, cost_ratio: float, verify_factor: float = 1.0) -> float:
    return tau_k / (1.0 + k * cost_ratio) / verify_factor


@dataclass(frozen=True)
class KRow:
    k: int
    tau_tokens: float
    accept_rate: float
    iid_tau_tokens: float
    speedup: float


def k_table(cumulative: Sequence[float], alpha_mean: float, cost_ratio: float, verify_factor: float = 1.0) -> list[KRow]:
    rows = []
    for k in range(1, len(cumulative) + 1):
        t = tau(cumulative, k)
        rows.append(KRow(k, t, accept_rate(t, k), iid_tau(alpha_mean, k), speedup(t, k, cost_ratio, verify_factor)))
    return rows


def best_k(rows: Sequence[KRow]) -> KRow:
    return max(rows, key=lambda r: (r.speedup, -r.k))


@dataclass(frozen=True)
class Adaptive:
    threshold: float
    tau_tokens: float
    speedup: float
    mean_k: float


def adaptive_threshold(thresholds: Sequence[float], table: np.ndarray, cost_ratio: float, verify_factor: float = 1.0) -> Adaptive | None:
    """table[i] = (Σ expected accepted, Σ drafter passes, Σ drafted, windows) for thresholds[i].
    Speedup is a ratio of expectations: tokens per step over cost per step."""
    best: Adaptive | None = None
    for theta, (acc, passes, drafted, n) in zip(thresholds, table, strict=True):
        if n <= 0:
            continue
        t = 1.0 + acc / n
        s = t / (1.0 + cost_ratio * passes / n) / verify_factor
        cand = Adaptive(float(theta), float(t), float(s), float(drafted / n))
        if best is None or cand.speedup > best.speedup + 1e-12:
            best = cand
    return best
