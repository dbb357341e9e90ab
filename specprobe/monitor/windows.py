"""Counters → windowed rates, and the acceptance maths on top of them (pure, no I/O).

Conventions (the engines' own, written down once):
- acceptance rate = accepted draft tokens / drafted tokens over the window;
- mean acceptance length = 1 + accepted / drafts — the bonus token is included, as in
  vLLM's `SpecDecodingLogging` and SGLang's "accept len";
- per-position cumulative rate r_i = accepted at position i / drafts (vLLM's
  "Per-position acceptance rate"), conditional rate a_i = r_i / r_{i-1} (a_1 = r_1);
- positions are 0-based in the engines' `position` label and shown from depth 1;
- nan when nothing was drafted in the window.

Counter windows follow Prometheus `increase()`: the sum of the differences between
consecutive samples inside the window, where a value lower than its predecessor means
the counter was reset (a restarted server) and counts from zero. Unlike Prometheus we do
not extrapolate to the window's edges: every quantity here is a ratio of two increases
over the same samples, and extrapolation would scale both by the same factor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.metrics import spec_counts

NAN = float("nan")

# Canonical quantity names every source maps its engine's metrics onto.
ACCEPTED = "accepted_tokens"
DRAFT_TOKENS = "draft_tokens"
DRAFTS = "drafts"
EMITTED = "emitted_tokens"  # vLLM V0 only: tokens actually emitted, bonus included
POS_PREFIX = "accepted_pos_"  # + 0-based position
GAUGE_ACCEPT_LEN = "accept_len"  # SGLang's gauge (last logging interval's value)
GAUGE_ACCEPT_RATE = "accept_rate"
GAUGE_EFFICIENCY = "efficiency"  # vLLM V0 system efficiency


def pos_key(position: int) -> str:
    return f"{POS_PREFIX}{position}"


# ----------------------------------------------------------------------------- durations
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_DUR_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """'300s', '5m', '1h', '250ms' or plain seconds → seconds (> 0)."""
    m = _DUR_RE.match(str(text))
    if not m:
        raise ConfigError(f"bad {what} {text!r}", "write e.g. 300s, 5m, 1h or 250ms")
    seconds = float(m.group(1)) * _DUR_UNIT[m.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{what} {text!r} must be longer than zero", "write e.g. 300s, 5m, 1h")
    return seconds


_TOK_RE = re.compile(r"^\s*(\d+)\s*(tok|tokens?)\s*$")


def parse_window(text: str, what: str = "--window") -> tuple[float | None, int | None]:
    """'5m' → (300.0, None); '100tok' → (None, 100): a window of drafted tokens."""
    m = _TOK_RE.match(str(text))
    if m:
        n = int(m.group(1))
        if n <= 0:
            raise ConfigError(f"{what} {text!r} must hold at least one token", "write e.g. 100tok")
        return None, n
    try:
        return parse_duration(text, what), None
    except ConfigError:
        raise ConfigError(f"bad {what} {text!r}", "write a duration (300s, 5m, 1h) or a token count (100tok)") from None


def prom_duration(seconds: float) -> str:
    """Seconds → a PromQL range ('300s', '1500ms')."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# ----------------------------------------------------------------------------- counters
def increase(points: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """Prometheus-style increase over samples with start ≤ t ≤ end; None with < 2 samples."""
    inside = [v for t, v in points if start <= t <= end]
    if len(inside) < 2:
        return None
    total = 0.0
    prev = inside[0]
    for v in inside[1:]:
        # A drop means the process restarted and the counter began again at zero.
        total += v - prev if v >= prev else v
        prev = v
    return total


def count_resets(points: Iterable[tuple[float, float]], start: float, end: float) -> int:
    inside = [v for t, v in points if start <= t <= end]
    return sum(1 for a, b in zip(inside, inside[1:], strict=False) if b < a)


def gauge_mean(points: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """avg_over_time: the mean of the gauge's samples stamped in (start, end] — half-open so
    a sample on the boundary belongs to one window, not to both."""
    inside = [v for t, v in points if start < t <= end and not math.isnan(v)]
    return sum(inside) / len(inside) if inside else None


def events_sum(events: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """Sum of per-interval deltas (log lines) stamped in (start, end]."""
    inside = [v for t, v in events if start < t <= end]
    return sum(inside) if inside else None


# ----------------------------------------------------------------------------- store
@dataclass(frozen=True)
class RequestPoint:
    """One finished request's counters (`monitor --requests`): integers, so sums are exact."""

    t: float
    accepted: int
    drafted: int | None  # None: not reported and K unknown
    steps: int | None  # verify steps; None: not reported
    per_pos: tuple[int, ...] = ()  # draft tokens accepted at position i (0-based)

    @property
    def tokens(self) -> int:
        """What a token window counts: drafted tokens, else the tokens the steps yielded."""
        if self.drafted is not None:
            return self.drafted
        return self.accepted + (self.steps or 0)


@dataclass
class ModelData:
    """Everything observed for one model_name: counter series, interval deltas, gauges.

    Series are keyed by (quantity, series id): the series id holds the labels other than
    model_name and position (engine, instance, …) so each series is reset-checked on its
    own before they are summed, as `sum(increase(...))` does."""

    counters: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    events: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gauges: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    num_spec_tokens: int | None = None
    last_time: float | None = None
    sources: set[str] = field(default_factory=set)
    # A Prometheus server computes the windows itself: (current, baseline) counts.
    precomputed: tuple[WindowCounts, WindowCounts] | None = None
    # Per-request records (`--requests`), oldest first; also added as events above.
    requests: list[RequestPoint] = field(default_factory=list)
    requests_seen: int = 0  # every request ever added (requests[0] is number requests_seen − len)
    # A Prometheus server's history as consecutive windows (the drift tests' series).
    drift_buckets: list[Any] = field(default_factory=list)  # drift.Bucket, oldest first

    def _touch(self, t: float) -> None:
        self.last_time = t if self.last_time is None else max(self.last_time, t)

    def add_counter(self, quantity: str, series: str, t: float, value: float) -> None:
        self.counters.setdefault((quantity, series), []).append((t, value))
        self._touch(t)

    def add_event(self, quantity: str, t: float, value: float) -> None:
        self.events.setdefault(quantity, []).append((t, value))
        self._touch(t)

    def add_gauge(self, quantity: str, series: str, t: float, value: float) -> None:
        self.gauges.setdefault((quantity, series), []).append((t, value))
        self._touch(t)

    def add_request(self, r: RequestPoint) -> None:
        """A finished request: its counters as events at its time, and the record itself
        (request-weighted statistics, token windows)."""
        self.requests.append(r)
        self.requests_seen += 1
        self.add_event(ACCEPTED, r.t, r.accepted)
        if r.drafted is not None:
            self.add_event(DRAFT_TOKENS, r.t, r.drafted)
        if r.steps is not None:
            self.add_event(DRAFTS, r.t, r.steps)
        for i, a in enumerate(r.per_pos):
            self.add_event(pos_key(i), r.t, a)

    def token_split(self, now_tokens: float, base_tokens: float) -> tuple[list[RequestPoint], list[RequestPoint]]:
        """The newest requests holding at least `now_tokens` tokens (whole requests), and
        the ones before them holding at least `base_tokens`."""
        now: list[RequestPoint] = []
        base: list[RequestPoint] = []
        got = 0.0
        i = len(self.requests) - 1
        while i >= 0 and got < now_tokens:
            now.append(self.requests[i])
            got += self.requests[i].tokens
            i -= 1
        got = 0.0
        while i >= 0 and got < base_tokens:
            base.append(self.requests[i])
            got += self.requests[i].tokens
            i -= 1
        return now[::-1], base[::-1]

    def prune_tokens(self, keep_tokens: float) -> None:
        """Token windows: keep the newest requests holding `keep_tokens` tokens (and one
        more), and the events from the oldest kept request on."""
        got, i = 0.0, len(self.requests) - 1
        while i >= 0 and got < keep_tokens:
            got += self.requests[i].tokens
            i -= 1
        if i > 0:
            del self.requests[:i]
        if self.requests:
            before = self.requests[0].t
            for ekey, epts in self.events.items():
                self.events[ekey] = [p for p in epts if p[0] >= before]

    def prune(self, before: float) -> None:
        """Forget samples older than `before` (the start of the baseline window)."""
        self.requests = [r for r in self.requests if r.t >= before]
        for key, pts in self.counters.items():
            self.counters[key] = [p for p in pts if p[0] >= before]
        for ekey, epts in self.events.items():
            self.events[ekey] = [p for p in epts if p[0] >= before]
        for gkey, gpts in self.gauges.items():
            self.gauges[gkey] = [p for p in gpts if p[0] >= before]

    def resets(self, start: float, end: float) -> int:
        return sum(count_resets(pts, start, end) for pts in self.counters.values())

    def counts(self, start: float, end: float) -> WindowCounts:
        """Sum every source of each quantity over [start, end]."""

        def total(quantity: str) -> float | None:
            parts = [increase(pts, start, end) for (q, _), pts in self.counters.items() if q == quantity]
            parts.append(events_sum(self.events.get(quantity, ()), start, end))
            got = [p for p in parts if p is not None]
            return sum(got) if got else None

        def gauge(quantity: str) -> float | None:
            means = [gauge_mean(pts, start, end) for (q, _), pts in self.gauges.items() if q == quantity]
            got = [m for m in means if m is not None]
            return sum(got) / len(got) if got else None

        positions = sorted(
            {int(q[len(POS_PREFIX):]) for q, _ in self.counters if q.startswith(POS_PREFIX)}
            | {int(q[len(POS_PREFIX):]) for q in self.events if q.startswith(POS_PREFIX)}
        )
        per_pos: list[float | None] = [total(pos_key(p)) for p in range(positions[-1] + 1)] if positions else []
        return WindowCounts(
            accepted=total(ACCEPTED),
            draft_tokens=total(DRAFT_TOKENS),
            drafts=total(DRAFTS),
            emitted=total(EMITTED),
            accepted_per_pos=tuple(per_pos),
            accept_len_gauge=gauge(GAUGE_ACCEPT_LEN),
            accept_rate_gauge=gauge(GAUGE_ACCEPT_RATE),
            num_spec_tokens=self.num_spec_tokens,
        )


def request_counts(reqs: Sequence[RequestPoint], num_spec_tokens: int | None = None) -> WindowCounts:
    """A list of requests summed as a window (None where no request reported a count)."""
    if not reqs:
        return WindowCounts(num_spec_tokens=num_spec_tokens)
    drafted = [r.drafted for r in reqs if r.drafted is not None]
    steps = [r.steps for r in reqs if r.steps is not None]
    depth = max(len(r.per_pos) for r in reqs)
    per_pos = tuple(sum(r.per_pos[i] for r in reqs if i < len(r.per_pos)) for i in range(depth)) if depth and all(r.per_pos for r in reqs) else ()
    return WindowCounts(
        accepted=sum(r.accepted for r in reqs),
        draft_tokens=sum(drafted) if len(drafted) == len(reqs) else None,
        drafts=sum(steps) if len(steps) == len(reqs) else None,
        accepted_per_pos=per_pos,
        num_spec_tokens=num_spec_tokens,
    )


@dataclass(frozen=True)
class RequestStats:
    """Request-level statistics of one window: every request counts once."""

    requests: int = 0
    with_drafts: int = 0  # requests that drafted at least one token
    rate_mean: float = NAN  # request-weighted: the mean of per-request acceptance
    mean_len_mean: float = NAN  # request-weighted mean acceptance length
    quantiles: tuple[float, ...] = ()  # per-request acceptance at QUANTILES
    below: int = 0  # requests under the threshold
    threshold: float = NAN

    @property
    def below_share(self) -> float:
        return self.below / self.with_drafts if self.with_drafts else NAN


QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    if not sorted_values:
        return NAN
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def request_stats(reqs: Sequence[RequestPoint], threshold: float, num_spec_tokens: int | None = None) -> RequestStats:
    rates = sorted(r.accepted / r.drafted for r in reqs if r.drafted)
    lens = [1.0 + r.accepted / r.steps for r in reqs if r.steps]
    return RequestStats(
        requests=len(reqs),
        with_drafts=len(rates),
        rate_mean=sum(rates) / len(rates) if rates else NAN,
        mean_len_mean=sum(lens) / len(lens) if lens else NAN,
        quantiles=tuple(quantile(rates, q) for q in QUANTILES) if rates else (),
        below=sum(1 for r in rates if r < threshold),
        threshold=threshold,
    )


# ----------------------------------------------------------------------------- stats
@dataclass(frozen=True)
class WindowCounts:
    """Increases (counters, deltas) and gauge means over one window; None = not observed."""

    accepted: float | None = None
    draft_tokens: float | None = None
    drafts: float | None = None
    emitted: float | None = None
    accepted_per_pos: tuple[float | None, ...] = ()
    accept_len_gauge: float | None = None
    accept_rate_gauge: float | None = None
    num_spec_tokens: int | None = None


@dataclass(frozen=True)
class AcceptanceStats:
    """What one window says about acceptance. nan = not measurable from this source."""

    accept_rate: float = NAN
    mean_accept_len: float = NAN
    accepted_per_draft: float = NAN  # mean_accept_len − 1: proportional to accept_rate at fixed K
    per_pos_cum: tuple[float, ...] = ()  # r_i, index 0 = depth 1
    per_pos_cond: tuple[float, ...] = ()  # a_i = r_i / r_{i-1}
    draft_tokens: float = NAN
    drafts: float = NAN
    accepted: float = NAN  # accepted draft tokens in the window (bonus tokens not included)

    @property
    def empty(self) -> bool:
        return math.isnan(self.accept_rate) and math.isnan(self.mean_accept_len)

    @property
    def depth_decay(self) -> float:
        """r_K / r_1: the share of depth-1 acceptances that survive to the deepest position."""
        return decay_ratio(self.per_pos_cum)


def safe_div(a: float | None, b: float | None) -> float:
    if a is None or b is None or b <= 0 or math.isnan(a) or math.isnan(b):
        return NAN
    return a / b


def conditional_rates(cum: Sequence[float]) -> tuple[float, ...]:
    """a_1 = r_1, a_i = r_i / r_{i-1}."""
    return tuple(spec_counts.conditional_rates(cum))


def _nums(a: float | None, b: float | None) -> tuple[float, float]:
    return (NAN if a is None else a, NAN if b is None else b)


def decay_ratio(cum: Sequence[float]) -> float:
    if len(cum) < 2:
        return NAN
    return safe_div(cum[-1], cum[0])


def derive_drafts(c: WindowCounts) -> float | None:
    """Drafts from the window, or from draft tokens / K when only those are counted."""
    if c.drafts is not None:
        return c.drafts
    if c.draft_tokens is not None and c.num_spec_tokens:
        return c.draft_tokens / c.num_spec_tokens
    return None


def window_stats(c: WindowCounts) -> AcceptanceStats:
    drafts = derive_drafts(c)
    rate = spec_counts.acceptance_rate(*_nums(c.accepted, c.draft_tokens))
    if math.isnan(rate) and c.accept_rate_gauge is not None:
        rate = c.accept_rate_gauge
    if c.emitted is not None and c.drafts is None:
        # vLLM V0: "accepted" counts every matching position, even after a rejection;
        # emitted tokens are what users got (bonus included), so the length uses them.
        mal = safe_div(c.emitted, drafts)
    else:
        mal = spec_counts.mean_acceptance_length(*_nums(c.accepted, drafts))
    if math.isnan(mal) and c.accept_len_gauge is not None and c.accept_len_gauge > 0:
        mal = c.accept_len_gauge
    if math.isnan(rate) and not math.isnan(mal) and c.num_spec_tokens:
        rate = (mal - 1.0) / c.num_spec_tokens
    cum: tuple[float, ...] = ()
    if c.accepted_per_pos and drafts:
        cum = tuple(spec_counts.per_position_rate_vllm([NAN if a is None else a for a in c.accepted_per_pos], drafts))
    return AcceptanceStats(
        accept_rate=rate,
        mean_accept_len=mal,
        accepted_per_draft=mal - 1.0 if not math.isnan(mal) else NAN,
        per_pos_cum=cum,
        per_pos_cond=conditional_rates(cum),
        draft_tokens=c.draft_tokens if c.draft_tokens is not None else NAN,
        drafts=drafts if drafts is not None else NAN,
        accepted=c.accepted if c.accepted is not None else NAN,
    )


def relative_drop(now: float, base: float) -> float:
    """1 − now / base: 0.25 means a quarter below the baseline; negative is a rise."""
    if math.isnan(now) or math.isnan(base) or base <= 0:
        return NAN
    return 1.0 - now / base


def compare(now: AcceptanceStats, base: AcceptanceStats) -> dict[str, float]:
    """The catalogue's monitor_* metrics for one model: current window against baseline.

    The drop uses the acceptance rate when both windows have it, else accepted tokens per
    draft (mean length − 1), which is the rate times K and so drops by the same fraction."""
    drop = relative_drop(now.accept_rate, base.accept_rate)
    if math.isnan(drop):
        drop = relative_drop(now.accepted_per_draft, base.accepted_per_draft)
    decay_now, decay_base = now.depth_decay, base.depth_decay
    return {
        "monitor_accept_rate": now.accept_rate,
        "monitor_accept_rate_baseline": base.accept_rate,
        "monitor_accept_rate_drop_rel": drop,
        "monitor_mean_accept_len_tokens": now.mean_accept_len,
        "monitor_mean_accept_len_baseline_tokens": base.mean_accept_len,
        "monitor_depth_decay_ratio": decay_now,
        "monitor_depth_decay_excess": relative_drop(decay_now, decay_base),
        "monitor_draft_tokens": now.draft_tokens,
    }
