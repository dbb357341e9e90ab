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
from specprobe.monitor.alerts import Alert, AlertTracker, alert_from_finding, iso
from specprobe.monitor.sources import IngestResult, Source, SourceError, Store
from specprobe.monitor.windows import (
    AcceptanceStats,
    ModelData,
    WindowCounts,
    compare,
    window_stats,
)
from specprobe.result import Finding


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


@dataclass(frozen=True)
class Snapshot:
    t: float
    window: float
    baseline: float
    models: tuple[ModelView, ...]
    sources: tuple[SourceStatus, ...]
    alerts: tuple[Alert, ...]

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

        return {
            "ts": iso(self.t),
            "window_s": self.window,
            "baseline_s": self.baseline,
            "models": [
                {"model": m.model, "sources": list(m.sources), "stale": m.stale, "now": stats(m.now), "baseline": stats(m.base),
                 "findings": [f.rule_id for f in m.findings], "counter_resets": m.resets}
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
            if res.malformed and src.kind != "log":  # log sources warn with the line itself
                self.warn_once(f"malformed:{src.name}", f"{src.name}: skipped {res.malformed} malformed sample(s)/line(s) (counted; this warning is shown once)")
            if res.missing and src.kind != "log":
                st.missing = res.missing
                self.warn_once(f"missing:{src.name}:{','.join(res.missing)}", f"{src.name}: metric famil{'y' if len(res.missing) == 1 else 'ies'} missing: {', '.join(res.missing)}")
            else:
                st.missing = []
            st.state = "ok" if res.models or st.engine else "no-data"
        keep = self.window + self.baseline + 2 * self.interval
        for data in self.store.values():
            if data.precomputed is None:
                # Relative to the model's own latest sample: log files carry their own clock.
                data.prune((data.last_time if data.last_time is not None else now) - keep)

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
            findings = tuple(self.table.findings(metrics, families=["monitoring"]))
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
            ))
            firing.extend(alert_from_finding(f, model, now) for f in sort_findings(findings))
        return Snapshot(
            t=now,
            window=self.window,
            baseline=self.baseline,
            models=tuple(views),
            sources=tuple(self.status[id(s)] for s in self.sources),
            alerts=tuple(firing),
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


