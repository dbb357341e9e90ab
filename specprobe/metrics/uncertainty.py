"""Standard errors over prompts, and when a rate is too thin to read — one definition each,
shared by the estimate (`accumulate`), the real loop (`simulate.counters`) and the reports.

Every rate here is a ratio of sums over prompts, R = Σ_p a_p ÷ Σ_p d_p (accepted ÷
drafted, one depth's Σ r_j(t) ÷ its windows). Prompts are the independent units: a
prompt's tokens share its text, so treating tokens (or rounds) as independent would
understate the spread several-fold. The ratio estimator's linearised variance is

    Var(R) ≈ n ÷ (n − 1) · Σ_p (a_p − R·d_p)² ÷ (Σ_p d_p)²,

what a bootstrap over prompts approximates (tests/test_uncertainty.py checks it against
one). It needs only Σ a², Σ a·d and Σ d² beside the sums, so shards and chunks of a run
still merge by adding. A sum of ratios (the loop's τ = 1 + Σ_i r_i) linearises the same
way: each prompt's influence is Σ_i (a_{p,i} − r_i·d_{p,i}) ÷ D_i (`linear_se`)."""

from __future__ import annotations

import math

import numpy as np

# A depth is "thin" — too little evidence to read its rate — when fewer than MIN_PROMPTS
# prompts or MIN_DRAFTS drafts (teacher-forced windows, for the estimate) reach it, or its
# standard error is as large as the rate itself, or cannot be computed (0 ± 0 over enough
# drafts is read: nothing was accepted). Reports grey thin depths out; the figures stay in the result.
MIN_PROMPTS = 2
MIN_DRAFTS = 30
# Two figures agree when they are within AGREE_SE standard errors of their difference
# (about a 95 % band): what the reports, the calibration rule and the tests call agreement.
AGREE_SE = 2.0


def ratio_se(num: np.ndarray, den: np.ndarray, sq: np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """SE of num ÷ den over n prompts (a number, or one per ratio) from the sums (`sq[..., :]`
    = Σ a², Σ a·d, Σ d² of each prompt's a and d); nan with fewer than two prompts or
    nothing drafted."""
    num, den, sq = np.asarray(num, dtype=float), np.asarray(den, dtype=float), np.asarray(sq, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), num.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
        resid = np.maximum(sq[..., 0] - 2 * r * sq[..., 1] + r * r * sq[..., 2], 0.0)  # Σ (a − r·d)²
        return np.where((den > 0) & (n >= 2), np.sqrt(n / (n - 1) * resid) / den, math.nan)


def squares(a: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
    """[..., 3] a², a·d, d²: one prompt's terms of `ratio_se`'s sums."""
    a, d = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(d, dtype=float))
    return np.stack([a * a, a * d, d * d], axis=-1)


def linear_se(influence: np.ndarray) -> float:
    """SE of a statistic from each prompt's linearised influence z_p (Σ_p z_p = 0):
    √(n ÷ (n − 1) · Σ z_p²); nan with fewer than two prompts."""
    z = np.asarray(influence, dtype=float)
    n = z.shape[0]
    if n < 2 or not np.all(np.isfinite(z)):
        return math.nan
    return math.sqrt(n / (n - 1) * float((z * z).sum()))


def unit_ratio_se(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """SE of Σ_p a_p ÷ Σ_p d_p from per-prompt arrays [P, ...] (rows the prompts)."""
    a, d = np.asarray(a, dtype=float), np.asarray(d, dtype=float)
    return ratio_se(a.sum(axis=0), d.sum(axis=0), squares(a, d).sum(axis=0), a.shape[0])


def thin(rate: list[float] | np.ndarray, se: list[float] | np.ndarray, prompts: list[float] | np.ndarray, drafts: list[float] | np.ndarray) -> list[bool]:
    """Per depth: too thin to read (the rule above)."""
    out = []
    for r, s, p, d in zip(rate, se, prompts, drafts, strict=True):
        known = not (math.isnan(r) or math.isnan(s))
        out.append(bool(p < MIN_PROMPTS or d < MIN_DRAFTS or not known or 0 < r <= s or (r == 0 < s)))
    return out


def combined_z(gap: float, *ses: float) -> float:
    """A gap in standard errors of the difference of independent figures (√Σ se²); nan
    when any SE is unknown or all are 0."""
    if any(s is None or math.isnan(s) for s in ses) or gap is None or math.isnan(gap):
        return math.nan
    both = math.sqrt(sum(s * s for s in ses))
    return gap / both if both > 0 else math.nan
