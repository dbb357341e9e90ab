"""Rendering a Snapshot with rich: one row per model (acceptance now against baseline,
mean acceptance length, per-position bars), the sources' states, and the alert list.
Used both by the in-place `Live` view and for the one-shot `--once` summary."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specprobe.monitor.runner import Snapshot

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
    models = Table(title=f"{title} — window {duration(snap.window)}, baseline {duration(snap.baseline)} before it, {time.strftime('%H:%M:%S', time.localtime(snap.t))}", expand=False)
    for col in ("model", "acceptance now", "baseline", "Δ", "mean len", "per-position r_i (depth 1…K)", "state"):
        models.add_column(col, overflow="fold")
    for m in snap.models:
        now, base = m.metrics["monitor_accept_rate"], m.metrics["monitor_accept_rate_baseline"]
        drop = m.metrics["monitor_accept_rate_drop_rel"]
        delta = "" if _isnan(drop) else ("±0%" if abs(drop) < 0.005 else f"{-100 * drop:+.0f}%")
        style = "red" if not _isnan(drop) and drop > 0.2 else ""
        positions = "\n".join(f"d{i + 1} {bar(r)} {pct(r)}" for i, r in enumerate(m.now.per_pos_cum)) or "—"
        mal = m.metrics["monitor_mean_accept_len_tokens"]
        worst = m.findings[0].severity if m.findings else None
        state = "[bold yellow]stale[/]" if m.stale else (f"[{_SEV[worst]}]{worst}[/]" if worst else "[green]healthy[/]")
        if m.resets:
            state += f"\n[dim]{m.resets} counter reset(s)[/]"
        models.add_row(m.model, pct(now), pct(base), Text(delta, style=style), "n/a" if _isnan(mal) else f"{mal:.2f}", positions, state)
    if not snap.models:
        models.add_row("[dim]no acceptance data yet[/]", "", "", "", "", "", "")

    sources = Table(show_header=True, box=None, pad_edge=False)
    for col in ("source", "engine", "state", "detail"):
        sources.add_column(col, overflow="fold")
    for st in snap.sources:
        age = "" if st.last_ok is None else f"last ok {max(0.0, snap.t - st.last_ok):.0f}s ago"
        detail = "; ".join(x for x in (
            st.last_error,
            age if st.state != "ok" else "",
            f"{st.malformed} malformed skipped" if st.malformed else "",
            f"missing {', '.join(st.missing)}" if st.missing else "",
        ) if x)
        sources.add_row(st.name, st.engine or "?", f"[{_STATE.get(st.state, '')}]{st.state}[/]", detail)

    parts: list[Any] = [models, sources]
    if snap.alerts:
        alerts = Table(title="alerts", show_header=True, box=None, pad_edge=False)
        for col in ("rule", "severity", "model", "message"):
            alerts.add_column(col, overflow="fold")
        for a in snap.alerts:
            alerts.add_row(a.rule_id, f"[{_SEV[a.severity]}]{a.severity}[/]", a.model, a.message)
        parts.append(alerts)
    else:
        parts.append(Text("no alerts", style="green"))
    return Group(*parts)
