"""The monitor loop: poll every source, keep windows, evaluate the SP4xx rules per model,
and hand out Snapshots (for the live view) and alert transitions (for the sink).

Time is always passed in, never read here, so tests drive the loop with synthetic
clocks. Fault handling lives here: a failed poll marks its source stale (its models keep
their last numbers, flagged), later polls back off exponentially up to `max_backoff`,
and warnings (missing families, malformed lines) are issued once per source and kind.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specprobe.judge.rules import RuleTable, sort_findings
from specprobe.monitor import drift as drift_mod
from specprobe.monitor.alerts import Alert, AlertTracker, alert_from_finding, iso
from specprobe.monitor.grouprules import Overrides, table_for
from specprobe.monitor.sources import IngestResult, Source, SourceError, Store
from specprobe.monitor.windows import (
    NAN,
    QUANTILES,
    AcceptanceStats,
    ModelData,
    RequestPoint,
    RequestStats,
    WindowCounts,
    compare,
    request_counts,
    request_stats,
    window_stats,
)
from specprobe.result import Finding

ALL = "all"  # the requests source's row of every group (monitor.requests.ALL)
MAX_BUCKETS = 20_000  # windows kept for the drift tests (the oldest go first)


@dataclass
class SourceStatus:
    name: str
    kind: str
    state: str = "waiting"  # waiting | ok | stale | down | no-data
    engine: str | None = None
    last_ok: float | None = None
    last_error: str = ""
    failures: int = 0  # consecutive
    polls_ok: int = 0
    polls_failed: int = 0
    malformed: int = 0
    missing: list[str] = field(default_factory=list)
    next_attempt: float = 0.0


@dataclass(frozen=True)
class ModelView:
    model: str
    sources: tuple[str, ...]
    stale: bool
    now: AcceptanceStats
    base: AcceptanceStats
    metrics: dict[str, float]
    findings: tuple[Finding, ...]
    resets: int = 0
    requests: RequestStats | None = None  # per-request records (--requests)
    drift: drift_mod.Drift | None = None


@dataclass(frozen=True)
class Snapshot:
    t: float
    window: float
    baseline: float
    models: tuple[ModelView, ...]
    sources: tuple[SourceStatus, ...]
    alerts: tuple[Alert, ...]
    window_tokens: int | None = None
    baseline_tokens: int | None = None

    @property
    def has_data(self) -> bool:
        return any(not m.now.empty for m in self.models)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON data (nan → null): per model the window's counts
        (accepted and drafted tokens, drafts) and rates, per source its state."""
        def num(v: float) -> float | None:
            return None if v is None or math.isnan(v) else (int(v) if float(v).is_integer() else v)

        def stats(a: AcceptanceStats) -> dict[str, Any]:
            return {
                "accepted_tokens": num(a.accepted),
                "draft_tokens": num(a.draft_tokens),
                "drafts": num(a.drafts),
                "accept_rate": num(a.accept_rate),
                "mean_accept_len_tokens": num(a.mean_accept_len),
                "per_pos_cum": [num(r) for r in a.per_pos_cum],
            }

        def reqs(r: RequestStats | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {
                "requests": r.requests,
                "requests_with_drafts": r.with_drafts,
                "accept_rate_request_mean": num(r.rate_mean),
                "mean_accept_len_request_mean": num(r.mean_len_mean),
                "accept_rate_quantiles": {f"p{round(100 * q)}": num(v) for q, v in zip(QUANTILES, r.quantiles, strict=False)},
                "threshold": num(r.threshold),
                "below_threshold": r.below,
                "below_threshold_share": num(r.below_share),
            }

        def drift(d: drift_mod.Drift | None) -> dict[str, Any] | None:
            if d is None:
                return None
            return {
                "windows": d.windows, "span_s": num(d.span_s), "slope_per_h": num(d.slope_per_h), "trend_drop_rel": num(d.trend_drop_rel),
                "mann_kendall_z": num(d.mk_z), "change_at": iso(d.change_at) if d.change_at is not None and d.change_at > 1e9 else d.change_at,
                "change_index": d.change_index, "change_stat": num(d.change_stat), "before": num(d.before), "after": num(d.after),
                "change_drop_rel": num(d.change_drop_rel),
            }

        return {
            "ts": iso(self.t),
            "window_s": self.window if self.window_tokens is None else None,
            "baseline_s": self.baseline if self.baseline_tokens is None else None,
            "window_tokens": self.window_tokens,
            "baseline_tokens": self.baseline_tokens,
            "models": [
                {"model": m.model, "sources": list(m.sources), "stale": m.stale, "now": stats(m.now), "baseline": stats(m.base),
                 "findings": [f.rule_id for f in m.findings], "counter_resets": m.resets,
                 **({"requests": reqs(m.requests)} if m.requests is not None else {}),
                 "drift": drift(m.drift)}
                for m in self.models
            ],
            "sources": [
                {"name": st.name, "kind": st.kind, "state": st.state, "engine": st.engine, "malformed": st.malformed, "missing": list(st.missing)}
                for st in self.sources
            ],
        }


class Monitor:
    def __init__(
        self,
        sources: Sequence[Source],
        table: RuleTable,
        *,
        window: float,
        baseline: float,
        interval: float,
        num_spec_tokens: int | None = None,
        warn: Callable[[str], None] | None = None,
        max_backoff: float = 60.0,
        window_tokens: int | None = None,
        baseline_tokens: int | None = None,
        request_threshold: float = 0.5,
        drift_span: float | None = None,
        group_overrides: Overrides | None = None,
    ) -> None:
        self.sources = list(sources)
        self.table = table
        self.window = window
        self.baseline = baseline
        self.interval = interval
        self.num_spec_tokens = num_spec_tokens
        self.max_backoff = max_backoff
        self.store: Store = {}
        self.status = {id(s): SourceStatus(s.name, s.kind) for s in self.sources}
        self.tracker = AlertTracker()
        self._warned: set[str] = set()
        self._warn_out = warn or (lambda msg: None)
        self.warnings: list[str] = []
        # Token windows (--window 100tok): over per-request records, whole requests.
        self.window_tokens = window_tokens
        self.baseline_tokens = baseline_tokens
        self.request_threshold = request_threshold
        self.drift_span = drift_span
        self.group_overrides = group_overrides or []
        # The run cut into consecutive windows, per model, for the drift tests.
        self.buckets: dict[str, list[drift_mod.Bucket]] = {}
        self._cursor: dict[str, float] = {}  # time windows: where the next one starts
        self._done: dict[str, int] = {}  # token windows: requests already in a window
        self._open: dict[str, list[RequestPoint]] = {}  # token windows: the one filling up

    # ------------------------------------------------------------------ warnings
    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(message)
        self._warn_out(message)

    # ------------------------------------------------------------------ polling
    def poll(self, now: float) -> None:
        for src in self.sources:
            st = self.status[id(src)]
            if now < st.next_attempt:
                continue  # backing off after failures
            try:
                res: IngestResult = src.poll(
                    now, self.store, self.warn_once,
                    window=self.window, baseline=self.baseline, num_spec_tokens=self.num_spec_tokens,
                    drift_span=self.drift_span,
                )
            except SourceError as e:
                st.failures += 1
                st.polls_failed += 1
                st.last_error = str(e)
                st.state = "stale" if st.last_ok is not None else "down"
                # First failure: try again next interval; then double, up to max_backoff.
                st.next_attempt = now + min(self.max_backoff, self.interval * 2 ** (st.failures - 1))
                self.warn_once(f"down:{src.name}", f"{src.name}: {e} — will retry with backoff (shown as {st.state})")
                continue
            st.failures = 0
            st.polls_ok += 1
            st.last_ok = now
            st.last_error = ""
            st.next_attempt = 0.0
            st.engine = res.engine or st.engine
            st.malformed += res.malformed
            if res.malformed and src.kind not in ("log", "requests"):  # log sources warn with the line itself
                self.warn_once(f"malformed:{src.name}", f"{src.name}: skipped {res.malformed} malformed sample(s)/line(s) (counted; this warning is shown once)")
            if res.missing and src.kind not in ("log", "requests"):
                st.missing = res.missing
                self.warn_once(f"missing:{src.name}:{','.join(res.missing)}", f"{src.name}: metric famil{'y' if len(res.missing) == 1 else 'ies'} missing: {', '.join(res.missing)}")
            else:
                st.missing = []
            st.state = "ok" if res.models or st.engine else "no-data"
        for model, data in self.store.items():
            self._advance_buckets(model, data)
        keep = self.window + self.baseline + 2 * self.interval
        for data in self.store.values():
            if data.precomputed is not None:
                continue
            if self.window_tokens is not None:
                data.prune_tokens(self.window_tokens + (self.baseline_tokens or 0))
            else:
                # Relative to the model's own latest sample: log files carry their own clock.
                data.prune((data.last_time if data.last_time is not None else now) - keep)

    # ------------------------------------------------------------------ drift windows
    def _bucket(self, model: str, start: float, end: float, c: WindowCounts) -> None:
        st = window_stats(c)
        if not math.isnan(st.accept_rate) and st.draft_tokens == st.draft_tokens and st.draft_tokens > 0:
            b = drift_mod.Bucket(start, end, st.accept_rate, st.accepted, st.draft_tokens)
        elif not math.isnan(st.accepted_per_draft) and st.drafts == st.drafts and st.drafts > 0:
            b = drift_mod.Bucket(start, end, st.accepted_per_draft, st.accepted_per_draft * st.drafts, st.drafts)
        elif not math.isnan(st.accepted_per_draft):  # gauges only: the window's mean, weight 1
            b = drift_mod.Bucket(start, end, st.accepted_per_draft, st.accepted_per_draft, 1.0)
        else:
            return
        series = self.buckets.setdefault(model, [])
        series.append(b)
        if len(series) > MAX_BUCKETS:
            del series[: len(series) - MAX_BUCKETS]

    def _advance_buckets(self, model: str, data: ModelData) -> None:
        """Close every window that is complete in the data seen so far (before pruning)."""
        if data.precomputed is not None or data.last_time is None:
            return
        if self.window_tokens is not None:
            first = data.requests_seen - len(data.requests)
            done = self._done.get(model, 0)
            pending = self._open.setdefault(model, [])
            for r in data.requests[max(0, done - first):]:
                pending.append(r)
                if sum(p.tokens for p in pending) >= self.window_tokens:
                    self._bucket(model, pending[0].t, pending[-1].t, request_counts(pending, data.num_spec_tokens))
                    pending.clear()
            self._done[model] = data.requests_seen
            return
        if model not in self._cursor:
            firsts = [pts[0][0] for pts in (*data.counters.values(), *data.events.values(), *data.gauges.values()) if pts]
            if not firsts:
                return
            # Events count in (start, end]: start just before the first one.
            self._cursor[model] = min(firsts) - 1e-6
        start = self._cursor[model]
        while start + self.window <= data.last_time:
            self._bucket(model, start, start + self.window, data.counts(start, start + self.window))
            start += self.window
        self._cursor[model] = start

    def _stale_after(self) -> float:
        return max(3 * self.interval, 1.0)

    def refresh_staleness(self, now: float) -> None:
        for st in self.status.values():
            if st.state == "ok" and st.last_ok is not None and now - st.last_ok > self._stale_after():
                st.state = "stale"

    # ------------------------------------------------------------------ evaluation
    def model_counts(self, data: ModelData, end: float) -> tuple[WindowCounts, WindowCounts]:
        if data.precomputed is not None:
            now_c, base_c = data.precomputed
        elif self.window_tokens is not None:
            now_r, base_r = data.token_split(self.window_tokens, self.baseline_tokens or 0)
            now_c, base_c = request_counts(now_r, data.num_spec_tokens), request_counts(base_r, data.num_spec_tokens)
        else:
            now_c = data.counts(end - self.window, end)
            base_c = data.counts(end - self.window - self.baseline, end - self.window)
        if self.num_spec_tokens and not now_c.num_spec_tokens:
            now_c = dataclasses.replace(now_c, num_spec_tokens=self.num_spec_tokens)
            base_c = dataclasses.replace(base_c, num_spec_tokens=self.num_spec_tokens)
        return now_c, base_c

    def evaluate(self, now: float, *, anchor_to_data: bool = False) -> Snapshot:
        """Evaluate the window ending at `now` (or, with anchor_to_data, at each model's
        latest observation — for log files replayed after the fact)."""
        self.refresh_staleness(now)
        by_name = {s.name: st for s, st in ((s, self.status[id(s)]) for s in self.sources)}
        views: list[ModelView] = []
        firing: list[Alert] = []
        for model in sorted(self.store):
            data = self.store[model]
            end = data.last_time if anchor_to_data and data.last_time is not None else now
            now_c, base_c = self.model_counts(data, end)
            stats_now, stats_base = window_stats(now_c), window_stats(base_c)
            metrics = compare(stats_now, stats_base)
            req: RequestStats | None = None
            if data.requests:
                if self.window_tokens is not None:
                    in_window = data.token_split(self.window_tokens, 0)[0]
                else:
                    in_window = [r for r in data.requests if end - self.window < r.t <= end]
                req = request_stats(in_window, self.request_threshold)
                metrics["monitor_accept_rate_request_mean"] = req.rate_mean
                metrics["monitor_requests_below_share"] = req.below_share
                grouped = model != ALL and "=" in model
                metrics["monitor_group_accept_rate"] = stats_now.accept_rate if grouped else NAN
            series = data.drift_buckets if data.precomputed is not None else self.buckets.get(model, ())
            dr = drift_mod.drift(series, span=self.drift_span)
            metrics.update(dr.metrics() if dr is not None else drift_mod.empty_metrics())
            table = table_for(self.table, self.group_overrides, model) if self.group_overrides else self.table
            findings = tuple(table.findings(metrics, families=["monitoring"]))
            stale = bool(data.sources) and all(by_name[s].state in ("stale", "down") for s in data.sources if s in by_name)
            views.append(ModelView(
                model=model,
                sources=tuple(sorted(data.sources)),
                stale=stale,
                now=stats_now,
                base=stats_base,
                metrics=metrics,
                findings=findings,
                resets=data.resets(end - self.window, end),
                requests=req,
                drift=dr,
            ))
            firing.extend(alert_from_finding(f, model, now) for f in sort_findings(findings))
        return Snapshot(
            t=now,
            window=self.window,
            baseline=self.baseline,
            models=tuple(views),
            sources=tuple(self.status[id(s)] for s in self.sources),
            alerts=tuple(firing),
            window_tokens=self.window_tokens,
            baseline_tokens=self.baseline_tokens,
        )

    def transitions(self, snap: Snapshot) -> list[Alert]:
        return self.tracker.update(list(snap.alerts), snap.t)


def summary_lines(snap: Snapshot | None, mon: Monitor) -> list[str]:
    """The plain-text closing summary (Ctrl-C, end of stdin)."""
    lines = []
    for st in mon.status.values():
        lines.append(
            f"source {st.name}: {st.state}, {st.polls_ok} ok / {st.polls_failed} failed polls, "
            f"{st.malformed} malformed skipped" + (f", missing {', '.join(st.missing)}" if st.missing else "")
        )
    if snap is not None:
        for m in snap.models:
            rate = m.metrics.get("monitor_accept_rate", math.nan)
            lines.append(
                f"model {m.model}: acceptance {_pct(rate)} (baseline {_pct(m.metrics.get('monitor_accept_rate_baseline', math.nan))}), "
                f"mean acceptance length {_num(m.metrics.get('monitor_mean_accept_len_tokens', math.nan))}"
            )
    lines.append(f"alerts fired: {mon.tracker.fired_total}, firing now: {len(mon.tracker.active)}")
    return lines


def _pct(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _num(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


