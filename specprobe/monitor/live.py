"""Rendering a Snapshot with rich: one row per model (acceptance now against baseline,
mean acceptance length; per-position bars under the row), the sources' states, and the
alert list — tables that fit 80 columns (report.terminal.Grid). Used both by the
in-place `Live` view and for the one-shot `--once` summary."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Group
from rich.text import Text

from specprobe.monitor.runner import Snapshot
from specprobe.report.terminal import Column, Grid

_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATE = {"ok": "green", "stale": "bold yellow", "down": "bold red", "waiting": "dim", "no-data": "yellow"}


def _isnan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def pct(v: Any) -> str:
    return "n/a" if _isnan(v) else f"{100 * v:.1f}%"


def bar(frac: float, width: int = 8) -> str:
    """A horizontal bar for a fraction in [0, 1], eighth-block resolution."""
    if _isnan(frac):
        return "·" * width
    cells = max(0.0, min(1.0, frac)) * width
    full = int(cells)
    part = " ▏▎▍▌▋▊▉"[int((cells - full) * 8)]
    return ("█" * full + (part if full < width else "")).ljust(width, " ")


def _span(seconds: float) -> str:
    """A run's length: '5h 50m', '12m', '40s'."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m" if s % 3600 >= 60 else f"{s // 3600}h"
    return f"{s // 60}m" if s >= 60 else f"{s}s"


def _win(seconds: float, tokens: int | None) -> str:
    return f"{tokens} tokens" if tokens is not None else duration(seconds)


def duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def _drift_note(m: Any) -> Text | None:
    d = m.drift
    if d is None:
        return None
    span = f"over {_span(d.span_s)}" if d.span_s > 0 else f"over {d.windows} windows"
    parts = [f"trend {'-' + format(100 * d.trend_drop_rel, '.0f') + '%' if d.trend_drop_rel > 0 else 'flat'} {span} ({d.windows} windows)"]
    if d.change_index is not None:
        when = time.strftime("%m-%d %H:%M", time.localtime(round(d.change_at))) if d.change_at and d.change_at > 1e9 else f"window {d.change_index + 1}"
        parts.append(f"change at {when}: {pct(d.before)} → {pct(d.after)}")
    style = "red" if d.trend_drop_rel > 0 or d.change_drop_rel > 0 else "dim"
    return Text("drift: " + "; ".join(parts), style=style)


def _requests_grid(snap: Snapshot) -> Grid | None:
    rows = [m for m in snap.models if m.requests is not None]
    if not rows:
        return None
    thr = rows[0].requests.threshold if rows[0].requests else math.nan
    grid = Grid(
        [
            Column("group"),
            Column("requests", "reqs", "right"),
            Column("token-weighted", "tok-w", "right"),
            Column("request-weighted", "req-w", "right"),
            Column("p10 / p50 / p90", "p10/50/90", "right", fallback="drop", order=2),
            Column(f"under {pct(thr)}", "under", "right"),
        ],
        title="per-request acceptance in the current window (token-weighted: Σ accepted ÷ Σ drafted; request-weighted: each request once)",
    )
    for m in rows:
        r = m.requests
        assert r is not None
        q = dict(zip((0.1, 0.25, 0.5, 0.75, 0.9), r.quantiles, strict=False))
        dist = " / ".join(pct(q.get(k)) for k in (0.1, 0.5, 0.9)) if r.quantiles else "n/a"
        under = f"{pct(r.below_share)} ({r.below})" if r.with_drafts else "n/a"
        grid.add(m.model, str(r.requests), pct(m.now.accept_rate), pct(r.rate_mean), dist, under)
    return grid


def render(snap: Snapshot, *, title: str = "specprobe monitor") -> Group:
    models = Grid(
        [
            Column("model"),
            Column("acceptance now", "now", "right"),
            Column("baseline", "base", "right"),
            Column("Δ", justify="right"),
            Column("mean len", "len", "right"),
            Column("state"),
        ],
        title=f"{title} — window {_win(snap.window, snap.window_tokens)}, baseline {_win(snap.baseline, snap.baseline_tokens)} before it, {time.strftime('%H:%M:%S', time.localtime(snap.t))}",
    )
    for m in snap.models:
        now, base = m.metrics["monitor_accept_rate"], m.metrics["monitor_accept_rate_baseline"]
        drop = m.metrics["monitor_accept_rate_drop_rel"]
        mal = m.metrics["monitor_mean_accept_len_tokens"]
        # SGLang reports the mean acceptance length only: a rate needs K (--num-spec-tokens)
        needs_k = _isnan(now) and not _isnan(mal)
        delta = "" if _isnan(drop) else ("±0%" if abs(drop) < 0.005 else f"{-100 * drop:+.0f}%") + ("¹" if needs_k else "")
        style = "red" if not _isnan(drop) and drop > 0.2 else ""
        worst = m.findings[0].severity if m.findings else None
        state = Text("stale", style="bold yellow") if m.stale else (Text(worst, style=_SEV[worst]) if worst else Text("healthy", style="green"))
        if m.resets:
            state.append(f" ({m.resets} counter reset(s))", style="dim")
        notes: list[Any] = [Text(f"d{i + 1} {bar(r)} {pct(r)}") for i, r in enumerate(m.now.per_pos_cum)]
        dn = _drift_note(m)
        if dn is not None:
            notes.append(dn)
        if needs_k:
            notes.append(Text("acceptance n/a: this source gives only the mean acceptance length; pass --num-spec-tokens K to turn it into a rate. "
                              "¹ Δ compares accepted tokens per draft (mean len − 1), which moves with the rate at a fixed K.", style="dim"))
        na = "n/a (K?)" if needs_k else "n/a"
        models.add(m.model, na if _isnan(now) else pct(now), na if _isnan(base) and needs_k else pct(base), Text(delta, style=style), "n/a" if _isnan(mal) else f"{mal:.2f}", state, notes=notes)
    if not snap.models:
        models.add(Text("no acceptance data yet", style="dim"), "", "", "", "", "")

    sources = Grid([Column("source"), Column("engine"), Column("state"), Column("detail", fallback="under", order=1)])
    for st in snap.sources:
        age = "" if st.last_ok is None else f"last ok {max(0.0, snap.t - st.last_ok):.0f}s ago"
        detail = "; ".join(x for x in (
            st.last_error,
            age if st.state != "ok" else "",
            f"{st.malformed} malformed skipped" if st.malformed else "",
            f"missing {', '.join(st.missing)}" if st.missing else "",
        ) if x)
        sources.add(st.name, st.engine or "?", Text(st.state, style=_STATE.get(st.state, "")), detail)

    parts: list[Any] = [models]
    rg = _requests_grid(snap)
    if rg is not None:
        parts.append(rg)
    parts.append(sources)
    if snap.alerts:
        alerts = Grid([Column("rule"), Column("severity"), Column("model"), Column("message", fallback="under", order=1)], title="alerts")
        for a in snap.alerts:
            alerts.add(a.rule_id, Text(a.severity, style=_SEV[a.severity]), a.model, a.message)
        parts.append(alerts)
    else:
        parts.append(Text("no alerts", style="green"))
    return Group(*parts)
