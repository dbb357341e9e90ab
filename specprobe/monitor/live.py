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


def duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


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
        title=f"{title} — window {duration(snap.window)}, baseline {duration(snap.baseline)} before it, {time.strftime('%H:%M:%S', time.localtime(snap.t))}",
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

    parts: list[Any] = [models, sources]
    if snap.alerts:
        alerts = Grid([Column("rule"), Column("severity"), Column("model"), Column("message", fallback="under", order=1)], title="alerts")
        for a in snap.alerts:
            alerts.add(a.rule_id, Text(a.severity, style=_SEV[a.severity]), a.model, a.message)
        parts.append(alerts)
    else:
        parts.append(Text("no alerts", style="green"))
    return Group(*parts)
