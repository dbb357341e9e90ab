"""SVG charts drawn as strings: line charts, grouped bar charts and histograms.

Pure functions, no dependencies beyond the standard library: numbers in, an inline
`<svg>` element out, styled by the class names (`grid`, `axis`, `ref`, `mark`, `tick`,
`label`, `legend`) that the page's stylesheet defines. Every text that reaches the
markup goes through `esc`, so labels taken from user data (prompt-set names, domain
names) cannot break the document.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def esc(x: Any) -> str:
    """Text or attribute value made safe for HTML/SVG markup; None becomes empty."""
    return html.escape("" if x is None else str(x), quote=True)


W, H = 560, 280  # viewBox size; the page scales the chart to its column
ML, MR, MT, MB = 56, 16, 40, 46  # margins: room for axis labels and a legend


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]
    color: str
    dash: str = ""  # SVG stroke-dasharray; conditional curves and measurements are dashed
    err: Sequence[float | None] = ()  # line charts: each point's error-bar half-width (the page says what it is: ±2 SE)
    faded: Sequence[bool] = ()  # line charts: points too thin to read, drawn faded with the lines into them


def _at(xs: Sequence[Any], i: int) -> Any:
    return xs[i] if i < len(xs) else None


def _nice_max(v: float) -> float:
    if v <= 0 or math.isnan(v):
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def _svg_open(chart_id: str, title: str) -> list[str]:
    return [
        f'<svg id="{esc(chart_id)}" class="chart" viewBox="0 0 {W} {H}" role="img" aria-labelledby="{esc(chart_id)}-t" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{esc(chart_id)}-t">{esc(title)}</title>',
    ]


def _axes(parts: list[str], y_top: float, y_fmt: Callable[[float], str], y_label: str, x_label: str) -> None:
    pw, ph = W - ML - MR, H - MT - MB
    for t in _ticks(y_top):
        y = MT + ph - ph * t / y_top
        parts.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{esc(y_fmt(t))}</text>')
    parts.append(f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" class="axis"/>')
    parts.append(f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" class="axis"/>')
    parts.append(f'<text x="{ML + pw / 2:.1f}" y="{H - 6}" class="label" text-anchor="middle">{esc(x_label)}</text>')
    parts.append(f'<text x="14" y="{MT + ph / 2:.1f}" class="label" text-anchor="middle" transform="rotate(-90 14 {MT + ph / 2:.1f})">{esc(y_label)}</text>')


def _legend(parts: list[str], items: Sequence[tuple[str, str, str]]) -> None:
    # Wraps onto a second row inside the top margin rather than running off the chart.
    x, y = float(ML), 12.0
    for label, color, dash in items:
        width = 30 + 6.0 * len(label)
        if x + width > W - MR and x > ML:
            x, y = float(ML), y + 14
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{x:.0f}" y1="{y:.0f}" x2="{x + 18:.0f}" y2="{y:.0f}" stroke="{color}" stroke-width="2.5"{dash_attr}/>')
        parts.append(f'<text x="{x + 22:.0f}" y="{y + 4:.0f}" class="legend">{esc(label)}</text>')
        x += width


def line_chart(
    chart_id: str,
    title: str,
    x: Sequence[Any],
    series: Sequence[Series],
    *,
    y_label: str,
    x_label: str,
    y_fmt: Callable[[float], str] = lambda v: f"{v:g}",
    y_max: float | None = None,
    hline: tuple[float, str] | None = None,
    mark_x: tuple[Any, str] | None = None,
) -> str:
    """Lines over categorical x positions; None values break a line. A series' `err` draws
    an error bar at each point (the axis makes room for it); its `faded` points, and the
    lines into them, are drawn faded."""
    vals = [v for s in series for v in s.values if v is not None]
    vals += [v + e for s in series for i, v in enumerate(s.values) if v is not None and (e := _at(s.err, i)) is not None]
    top = y_max if y_max is not None else _nice_max(max(vals + [hline[0] if hline else 0.0], default=1.0) * 1.05)
    pw, ph = W - ML - MR, H - MT - MB
    n = max(len(x), 1)

    def px(i: int) -> float:
        return ML + pw * (i + 0.5) / n

    def py(v: float) -> float:
        return MT + ph - ph * min(max(v, 0.0), top) / top

    parts = _svg_open(chart_id, title)
    _axes(parts, top, y_fmt, y_label, x_label)
    for i, xv in enumerate(x):
        parts.append(f'<text x="{px(i):.1f}" y="{MT + ph + 16}" class="tick" text-anchor="middle">{esc(xv)}</text>')
    if hline is not None and hline[0] <= top:
        parts.append(f'<line x1="{ML}" y1="{py(hline[0]):.1f}" x2="{ML + pw}" y2="{py(hline[0]):.1f}" class="ref"/>')
        parts.append(f'<text x="{ML + pw - 4}" y="{py(hline[0]) - 4:.1f}" class="tick" text-anchor="end">{esc(hline[1])}</text>')
    if mark_x is not None and mark_x[0] in list(x):
        i = list(x).index(mark_x[0])
        parts.append(f'<line x1="{px(i):.1f}" y1="{MT}" x2="{px(i):.1f}" y2="{MT + ph}" class="mark" data-mark="{esc(mark_x[0])}"/>')
        parts.append(f'<text x="{px(i) + 4:.1f}" y="{MT + 12}" class="marktext">{esc(mark_x[1])}</text>')
    # error bars of several series at one x sit side by side, a few pixels apart
    with_err = [id(s) for s in series if any(e is not None for e in s.err)]
    dodge = {sid: (i - (len(with_err) - 1) / 2) * 5.0 for i, sid in enumerate(with_err)}
    for s in series:
        segs: list[list[tuple[int, float, float]]] = [[]]
        for i, v in enumerate(s.values):
            if v is None:
                segs.append([])
            else:
                segs[-1].append((i, px(i), py(v)))
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for seg in segs:
            # a run of the line is faded where it reaches a point too thin to read
            runs: list[tuple[bool, list[tuple[float, float]]]] = []
            for (i0, a0, b0), (i1, a1, b1) in zip(seg, seg[1:], strict=False):
                fade = bool(_at(s.faded, i0) or _at(s.faded, i1))
                if runs and runs[-1][0] == fade:
                    runs[-1][1].append((a1, b1))
                else:
                    runs.append((fade, [(a0, b0), (a1, b1)]))
            for fade, pts_run in runs:
                pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts_run)
                cls = ' class="faded"' if fade else ""
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="2.2"{dash}{cls}/>')
            for i, a, b in seg:
                v = s.values[i]
                e = _at(s.err, i)
                fade = bool(_at(s.faded, i))
                tip = f"{s.label}: {y_fmt(v) if v is not None else ''}" + (f" (± {y_fmt(e)}: {y_fmt(max(v - e, 0.0))}–{y_fmt(v + e)})" if e is not None and v is not None else "") + (" — too thin to read" if fade else "")
                if e is not None and v is not None and e > 0:
                    lo, hi, ex = py(v - e), py(v + e), a + dodge.get(id(s), 0.0)
                    cls = "errbar faded" if fade else "errbar"
                    parts.append(
                        f'<path class="{cls}" d="M{ex:.1f},{lo:.1f}V{hi:.1f}M{ex - 4:.1f},{lo:.1f}h8M{ex - 4:.1f},{hi:.1f}h8" stroke="{s.color}" fill="none"><title>{esc(tip)}</title></path>'
                    )
                cls = ' class="faded"' if fade else ""
                parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{s.color}"{cls}><title>{esc(tip)}</title></circle>')
    _legend(parts, [(s.label, s.color, s.dash) for s in series])
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    chart_id: str,
    title: str,
    categories: Sequence[Any],
    series: Sequence[Series],
    *,
    y_label: str,
    x_label: str,
    y_fmt: Callable[[float], str] = lambda v: f"{v:g}",
    y_max: float | None = None,
    hline: tuple[float, str] | None = None,
    tick_every: int = 1,
) -> str:
    """Vertical bars, grouped when there are several series."""
    vals = [v for s in series for v in s.values if v is not None]
    top = y_max if y_max is not None else _nice_max(max(vals, default=1.0) * 1.05)
    pw, ph = W - ML - MR, H - MT - MB
    n = max(len(categories), 1)
    slot = pw / n
    bw = slot * 0.8 / max(len(series), 1)
    stagger = any(len(str(c)) * 6.0 > slot * tick_every for c in categories)
    parts = _svg_open(chart_id, title)
    _axes(parts, top, y_fmt, y_label, x_label)
    for i, c in enumerate(categories):
        cx = ML + slot * (i + 0.5)
        if i % tick_every == 0:
            label = _fit(str(c), slot * tick_every)
            # Alternate rows when labels are long, so neighbours never overlap.
            dy = 16 + (11 if stagger and i % 2 else 0)
            parts.append(f'<text x="{cx:.1f}" y="{MT + ph + dy}" class="tick" text-anchor="middle">{esc(label)}<title>{esc(c)}</title></text>')
        for k, s in enumerate(series):
            v = s.values[i] if i < len(s.values) else None
            if v is None:
                continue
            h = ph * min(max(v, 0.0), top) / top
            x0 = ML + slot * i + slot * 0.1 + k * bw
            parts.append(f'<rect x="{x0:.1f}" y="{MT + ph - h:.1f}" width="{max(bw - 1, 1):.1f}" height="{h:.1f}" fill="{s.color}"><title>{esc(c)} · {esc(s.label)}: {esc(y_fmt(v))}</title></rect>')
    if hline is not None and hline[0] <= top:
        y = MT + ph - ph * hline[0] / top
        parts.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" class="ref"/>')
        parts.append(f'<text x="{ML + pw - 4}" y="{y - 4:.1f}" class="tick" text-anchor="end">{esc(hline[1])}</text>')
    if len(series) > 1:
        _legend(parts, [(s.label, s.color, "") for s in series])
    parts.append("</svg>")
    return "\n".join(parts)


def _fit(label: str, room: float) -> str:
    """Shorten a tick label to what fits its slot (≈6 px a character at 10.5 px)."""
    limit = max(int(room * 2 / 6.0) - 1, 4)  # staggered rows give each label two slots
    return label if len(label) <= limit else label[: limit - 1] + "…"


def pct_axis(v: float) -> str:
    """Axis tick for a fraction: 0.25 → "25%"."""
    return f"{100 * v:.0f}%"


def histogram_chart(
    chart_id: str,
    title: str,
    bin_labels: Sequence[str],
    counts: Sequence[int | None],
    *,
    color: str,
    x_label: str,
) -> str:
    """Share of the total in each bin, as bars; a tick label every fourth bin."""
    total = sum(c or 0 for c in counts) or 1
    shares: list[float | None] = [(c or 0) / total for c in counts]
    return bar_chart(chart_id, title, bin_labels, [Series("", shares, color)], y_label="share of positions", x_label=x_label, y_fmt=pct_axis, tick_every=4)


def tree_chart(chart_id: str, title: str, nodes: Sequence[tuple[Sequence[int], float | None, float | None]], max_nodes: int = 40) -> str:
    """A draft tree drawn left to right: the root, then each node by its rank path (depth
    across, siblings down), an edge to its parent, its fill darker the likelier it is on
    the accepted path, labelled with that probability; a node verified in only some
    rounds is drawn dashed. nodes: (rank path, share of rounds verifying it, probability
    it is on the accepted path)."""
    kept = sorted(nodes, key=lambda n: (-(n[1] or 0.0), len(n[0]), tuple(n[0])))[:max_nodes]
    paths = {tuple(p) for p, _, _ in kept}
    kept = [n for n in kept if len(n[0]) == 1 or tuple(n[0][:-1]) in paths]  # every drawn node's parent is drawn
    kept.sort(key=lambda n: tuple(n[0]))  # depth-first order: a subtree's rows stay together
    depth = max((len(p) for p, _, _ in kept), default=1)
    leaves = max(1, len(kept))
    h = max(H, 24 + 22 * leaves)
    x_of = lambda d: 30 + (W - 160) * d / max(depth, 1)  # noqa: E731
    y_of = lambda i: 30 + (h - 50) * (i + 0.5) / leaves  # noqa: E731
    parts = [
        f'<svg id="{esc(chart_id)}" class="chart" viewBox="0 0 {W} {h}" role="img" aria-labelledby="{esc(chart_id)}-t" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{esc(chart_id)}-t">{esc(title)}</title>',
        f'<text class="label" x="8" y="16">{esc(title)}</text>',
    ]
    root_y = (y_of(0) + y_of(leaves - 1)) / 2 if kept else h / 2
    pos: dict[tuple[int, ...], tuple[float, float]] = {(): (x_of(0), root_y)}
    for i, (p, _, _) in enumerate(kept):
        pos[tuple(p)] = (x_of(len(p)), y_of(i))
    for p, _, _ in kept:
        (x0, y0), (x1, y1) = pos[tuple(p[:-1])], pos[tuple(p)]
        parts.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="#94a3b8" stroke-width="1.2"/>')
    parts.append(f'<circle cx="{pos[()][0]:.1f}" cy="{pos[()][1]:.1f}" r="7" fill="#334155"><title>root: the last verified token</title></circle>')
    for p, ver, acc in kept:
        x, y = pos[tuple(p)]
        a = 0.0 if acc is None or math.isnan(acc) else max(0.0, min(1.0, acc))
        shade = int(235 - 190 * math.sqrt(a))
        dash = "" if ver is None or ver >= 0.999 else ' stroke-dasharray="3 2"'
        ranks = ".".join(str(r + 1) for r in p)
        tip = f"rank path {ranks}: verified in {100 * (ver or 0):.0f}% of rounds, on the accepted path in {100 * a:.1f}%"
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="rgb({shade},{shade + 10 if shade < 245 else 255},255)" stroke="#1e3a8a"{dash}><title>{esc(tip)}</title></circle>')
        parts.append(f'<text class="tick" x="{x + 10:.1f}" y="{y + 4:.1f}">{esc(ranks)} · {100 * a:.1f}%</text>')
    parts.append(f'<text class="tick" x="8" y="{h - 8}">ranks from 1 (the drafter\'s best); dashed: not in every round\'s tree</text>')
    parts.append("</svg>")
    return "".join(parts)
