"""Isotonic (non-decreasing) least-squares fit by pool-adjacent-violators. Pure.

The target's verify pass over K + 1 tokens cannot cost less than its pass over K: a
measured v_K that dips below v_{K−1} is timing noise, and left in it lets that noise pick
the best K (a drafter whose τ is flat in K gets K = 2 on one run and 1 on the next). The
cost model fits the measured verify factors with `non_decreasing` before pricing them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def non_decreasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares
    (pool-adjacent-violators: each run of values that falls is replaced by its weighted
    mean). NaN entries are left where they are and skipped by the fit; a weight ≤ 0
    counts as none (the value follows its neighbours' pool)."""
    xs = [float(v) for v in values]
    ws = [1.0] * len(xs) if weights is None else [float(w) for w in weights]
    if len(ws) != len(xs):
        raise ValueError(f"{len(xs)} values but {len(ws)} weights")
    idx = [i for i, v in enumerate(xs) if not math.isnan(v)]
    # blocks: [weighted sum, weight, count of entries]
    blocks: list[list[float]] = []
    for i in idx:
        w = max(ws[i], 0.0)
        blocks.append([xs[i] * w, w, 1.0, xs[i]])  # the last: the plain mean where the weight is 0
        while len(blocks) > 1 and _mean(blocks[-2]) > _mean(blocks[-1]):
            s, w2, n, plain = blocks.pop()
            b = blocks[-1]
            b[3] = (b[3] * b[2] + plain * n) / (b[2] + n)
            b[0] += s
            b[1] += w2
            b[2] += n
    out = list(xs)
    j = 0
    for b in blocks:
        m = _mean(b)
        for _ in range(int(b[2])):
            out[idx[j]] = m
            j += 1
    return out


def _mean(b: list[float]) -> float:
    return b[0] / b[1] if b[1] > 0 else b[3]


def non_decreasing_repeats(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-K repeat lists (rows[K−1][i]: v_K in repeat i) -> the same shape with every
    repeat made non-decreasing over K (`non_decreasing` on the Ks that repeat i timed).
    One repeat's calls interleave, so its v_K share the machine's state; and since every
    repeat is fitted, every quantile over the repeats (median, quartiles) is
    non-decreasing in K too where every K has the same repeats."""
    out = [list(map(float, r)) for r in rows]
    n = max((len(r) for r in out), default=0)
    for i in range(n):
        ks = [k for k in range(len(out)) if i < len(out[k])]
        fitted = non_decreasing([out[k][i] for k in ks])
        for k, v in zip(ks, fitted, strict=True):
            out[k][i] = v
    return out
