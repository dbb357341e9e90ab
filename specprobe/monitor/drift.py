"""Drift over a run: a slow fall of acceptance over hours, and the moment it changed.

The run is cut into consecutive windows (of `--window` seconds, or of `--window Ntok`
drafted tokens), each with its own acceptance; two tests read that series (pure maths,
no I/O):

- trend: the Theil–Sen slope (the median of the pairwise slopes: robust to a quarter of
  the windows being outliers) gives the fitted fall from the first window to the last,
  1 − fit(last) ÷ fit(first); it counts only when the Mann–Kendall test finds a falling
  trend at the 1 % level (one-sided), so noise around a flat level reads 0;
- change point: the CUSUM of the windows' deviations from their mean, scaled by a noise
  level estimated from successive differences (robust to the step itself), is compared
  with the 1 % point of its maximum under no change (the Kolmogorov distribution,
  1.628); the split is where the CUSUM peaks, and the drop is 1 − after ÷ before, each
  side's acceptance summed from its windows' counters (accepted ÷ drafted).

A slow linear decay also splits (near its middle) when it is large against the noise;
the trend is the test meant for it. Fewer than MIN_WINDOWS windows give nan (not
evaluated).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NAN = float("nan")
MIN_WINDOWS = 8
KOLMOGOROV_1PCT = 1.628  # P(sup |Brownian bridge| > 1.628) = 0.01
MK_Z_1PCT = 2.326  # one-sided 1 % point of the standard normal
MAX_SLOPE_POINTS = 400  # Theil–Sen on more windows merges neighbours first (O(n²) pairs)


@dataclass(frozen=True)
class Bucket:
    """One window of the run: its span and its counts (value: acceptance, or accepted
    tokens per draft where the source has no draft-token count)."""

    t_start: float
    t_end: float
    value: float
    num: float  # accepted tokens (or accepted per draft × drafts)
    den: float  # drafted tokens (or drafts)


@dataclass(frozen=True)
class Drift:
    windows: int
    span_s: float  # seconds from the first window's start to the last one's end
    slope_per_h: float  # fitted change of the value per hour (Theil–Sen)
    trend_drop_rel: float  # 1 − fit(last) ÷ fit(first), 0 when no significant fall
    mk_z: float  # Mann–Kendall z (negative: falling)
    change_at: float | None  # time of the split (the first window after it starts there)
    change_index: int | None
    change_stat: float  # max CUSUM ÷ (σ √n)
    before: float
    after: float
    change_drop_rel: float  # 1 − after ÷ before at a significant split, else 0

    def metrics(self) -> dict[str, float]:
        return {"monitor_drift_drop_rel": self.trend_drop_rel, "monitor_change_drop_rel": self.change_drop_rel}


def empty_metrics() -> dict[str, float]:
    return {"monitor_drift_drop_rel": NAN, "monitor_change_drop_rel": NAN}


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept): the median pairwise slope, the median of y − slope·x."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not slopes:
        return NAN, NAN
    b = statistics.median(slopes)
    a = statistics.median(y - b * x for x, y in zip(xs, ys, strict=True))
    return b, a


def mann_kendall_z(ys: Sequence[float]) -> float:
    """The Mann–Kendall trend statistic as a z score (ties corrected), continuity-corrected."""
    n = len(ys)
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    ties: dict[float, int] = {}
    for y in ys:
        ties[y] = ties.get(y, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0
    if var <= 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(var) if s else 0.0


def noise_sigma(ys: Sequence[float]) -> float:
    """The windows' noise: MAD of successive differences / 0.6745 / √2 (a step or a slow
    trend barely moves it), falling back to their standard deviation."""
    diffs = [b - a for a, b in zip(ys, ys[1:], strict=False)]
    if not diffs:
        return NAN
    med = statistics.median(diffs)
    mad = statistics.median(abs(d - med) for d in diffs)
    sigma = mad / 0.6745 / math.sqrt(2)
    if sigma <= 0:
        sigma = statistics.pstdev(diffs) / math.sqrt(2)
    return sigma


def cusum_split(ys: Sequence[float]) -> tuple[int | None, float]:
    """(index of the first window after the split, max |CUSUM| ÷ (σ √n))."""
    n = len(ys)
    sigma = noise_sigma(ys)
    if n < 2 or not sigma or math.isnan(sigma) or sigma <= 0:
        return None, 0.0
    mean = sum(ys) / n
    run, best, at = 0.0, 0.0, None
    for k in range(1, n):
        run += ys[k - 1] - mean
        if abs(run) > best:
            best, at = abs(run), k
    return at, best / (sigma * math.sqrt(n))


def _merge(buckets: Sequence[Bucket], limit: int) -> list[Bucket]:
    if len(buckets) <= limit:
        return list(buckets)
    step = math.ceil(len(buckets) / limit)
    out = []
    for i in range(0, len(buckets), step):
        part = buckets[i:i + step]
        num, den = sum(b.num for b in part), sum(b.den for b in part)
        out.append(Bucket(part[0].t_start, part[-1].t_end, num / den if den else NAN, num, den))
    return out


def drift(buckets: Sequence[Bucket], *, span: float | None = None) -> Drift | None:
    """Trend and change point over the windows (those ending within `span` seconds of
    the last one when given); None with fewer than MIN_WINDOWS windows."""
    bs = [b for b in buckets if b.den > 0 and not math.isnan(b.value)]
    if span is not None and bs:
        bs = [b for b in bs if b.t_end >= bs[-1].t_end - span]
    if len(bs) < MIN_WINDOWS:
        return None
    pts = _merge(bs, MAX_SLOPE_POINTS)
    ys = [b.value for b in pts]
    t0, t1 = pts[0].t_start, pts[-1].t_end
    timed = t1 > t0 and len({b.t_end for b in pts}) == len(pts)
    xs = [(b.t_start + b.t_end) / 2 for b in pts] if timed else [float(i) for i in range(len(pts))]
    slope, icept = theil_sen(xs, ys)
    z = mann_kendall_z(ys)
    first, last = icept + slope * xs[0], icept + slope * xs[-1]
    fall = 1.0 - last / first if first > 0 else NAN
    trend = max(0.0, fall) if z < -MK_Z_1PCT and not math.isnan(fall) else 0.0
    k, stat = cusum_split(ys)
    before = after = NAN
    change = 0.0
    at: float | None = None
    if k is not None:
        nb, db = sum(b.num for b in pts[:k]), sum(b.den for b in pts[:k])
        na, da = sum(b.num for b in pts[k:]), sum(b.den for b in pts[k:])
        before, after = (nb / db if db else NAN), (na / da if da else NAN)
        if stat > KOLMOGOROV_1PCT:
            at = pts[k].t_start
            if before > 0 and after < before:
                change = 1.0 - after / before
    return Drift(
        windows=len(bs),
        span_s=t1 - t0,
        slope_per_h=slope * 3600.0 if timed else NAN,
        trend_drop_rel=trend,
        mk_z=z,
        change_at=at,
        change_index=k if at is not None else None,
        change_stat=stat,
        before=before,
        after=after,
        change_drop_rel=change,
    )
