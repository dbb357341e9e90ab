"""Self-contained HTML reports: one file, inline CSS and inline SVG (drawn by `report.charts`).

Nothing is fetched when the file is opened (no scripts, fonts, CDNs), so it works as an
offline CI artifact and prints cleanly. The reader sees the verdict and the findings
first, then each chart with its numbers in a table beside it — the table is the
accessible and exact form, the chart the quick read.

Every function here is pure: a result dict in, a string out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specprobe.catalog import CATALOG, format_value
from specprobe.report.charts import Series, bar_chart, esc, histogram_chart, line_chart, pct_axis
from specprobe.report.load import describe, effective_temperatures, measured, num, rows

SEV_COLOR = {"error": "#b91c1c", "warning": "#b45309", "info": "#0369a1", None: "#15803d"}
EST = "#2563eb"  # estimate (teacher forcing)
MEAS = "#ea580c"  # measured (real draft→verify loop)
BASE = "#6b7280"  # compare: baseline
CAND = "#2563eb"  # compare: candidate


def pct(x: Any, digits: int = 1) -> str:
    v = num(x)
    return "–" if v is None else f"{100 * v:.{digits}f}%"


def fnum(x: Any, fmt: str = ".3f") -> str:
    v = num(x)
    return "–" if v is None else format(v, fmt)


def metric(name: str, value: Any) -> str:
    v = num(value)
    return "–" if v is None else format_value(name, int(v) if CATALOG.get(name) and CATALOG[name].unit in ("count", "bool") else v)


# ----------------------------------------------------------------------------- HTML pieces
CSS = """
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#ffffff; --card:#f9fafb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); margin: 0; padding: 24px 32px 48px; max-width: 1240px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 0 0 6px; }
.meta { color: var(--muted); font-size: 12.5px; margin-bottom: 14px; }
.meta code { font-size: 12px; }
.verdict { border-left: 6px solid; padding: 12px 16px; background: var(--card); margin: 12px 0 16px; }
.verdict .head { font-size: 20px; font-weight: 700; text-transform: capitalize; }
.verdict .sub { color: var(--muted); }
.finding { border: 1px solid var(--line); border-left: 5px solid; border-radius: 4px; padding: 8px 12px; margin: 8px 0; break-inside: avoid; }
.finding .id { font-weight: 700; } .sev { display: inline-block; color: #fff; border-radius: 3px; padding: 0 6px; font-size: 11.5px; text-transform: uppercase; margin-right: 6px; }
.finding .remedy { margin-top: 4px; } .finding .remedy b { color: var(--muted); }
.finding .thr { color: var(--muted); font-size: 12.5px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.finding ul { margin: 4px 0 0 18px; padding: 0; color: var(--muted); font-size: 12.5px; }
.kpis { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 8px; margin: 8px 0; }
.kpi { background: var(--card); border: 1px solid var(--line); border-radius: 4px; padding: 8px 10px; }
.kpi .v { font-size: 18px; font-weight: 700; } .kpi .n { color: var(--muted); font-size: 12px; }
.row { display: grid; grid-template-columns: minmax(0, 560px) minmax(0, 1fr); gap: 20px; align-items: start; margin: 10px 0 18px; break-inside: avoid; }
figure { margin: 0; } figcaption { color: var(--muted); font-size: 12px; margin-top: 4px; }
svg.chart { width: 100%; height: auto; background: #fff; border: 1px solid var(--line); border-radius: 4px; }
svg .grid { stroke: #eef0f3; } svg .axis { stroke: #9ca3af; } svg .ref { stroke: #9ca3af; stroke-dasharray: 4 3; }
svg .mark { stroke: #15803d; stroke-width: 2; stroke-dasharray: 5 3; } svg .marktext { fill: #15803d; font-size: 11px; font-weight: 700; }
svg .tick { fill: #4b5563; font-size: 10.5px; } svg .label { fill: #374151; font-size: 11.5px; } svg .legend { fill: #374151; font-size: 11px; }
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: var(--card); font-weight: 600; } td:first-child, th:first-child { text-align: left; }
tr.best td { background: #ecfdf5; font-weight: 600; }
td.worse { color: #b91c1c; } td.better { color: #15803d; }
table.kv td { text-align: left; white-space: normal; } table.kv td:first-child { width: 26%; white-space: nowrap; }
.note { color: var(--muted); font-size: 12.5px; }
.tag { display: inline-block; border: 1px solid; border-radius: 3px; padding: 0 5px; font-size: 11px; margin-left: 6px; }
.tag.est { color: #2563eb; } .tag.meas { color: #ea580c; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
@media (max-width: 900px) { .row { grid-template-columns: 1fr; } }
@media print {
  @page { margin: 14mm; }
  body { padding: 0; max-width: none; font-size: 11px; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  .row { grid-template-columns: 56% 1fr; }
  h2 { break-after: avoid; } section, .finding, .row, table { break-inside: avoid; }
}
"""


def _table(
    headers: Sequence[str],
    body: Sequence[Sequence[Any]],
    *,
    row_class: Callable[[int], str] | None = None,
    cell_class: Callable[[int, int], str] | None = None,
    kind: str = "",
) -> str:
    out = [f'<table class="{kind}"><thead><tr>' if kind else "<table><thead><tr>", "".join(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for i, r in enumerate(body):
        cls = row_class(i) if row_class else ""
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        for j, c in enumerate(r):
            cc = cell_class(i, j) if cell_class else ""
            out.append(f'<td class="{cc}">{esc(c)}</td>' if cc else f"<td>{esc(c)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _row(chart: str, caption: str, table: str, title: str) -> str:
    return f'<div class="row"><figure>{chart}<figcaption>{caption}</figcaption></figure><div><h3>{esc(title)}</h3>{table}</div></div>'


def _findings_html(findings: Sequence[Mapping[str, Any]], empty: str) -> str:
    if not findings:
        return f'<p class="note">{esc(empty)}</p>'
    out = []
    for f in findings:
        color = SEV_COLOR.get(f.get("severity"), "#374151")
        ev = "".join(f"<li>{esc(e)}</li>" for e in f.get("evidence") or [])
        out.append(
            f'<div class="finding" style="border-left-color:{color}" id="finding-{esc(f.get("rule_id"))}">'
            f'<span class="sev" style="background:{color}">{esc(f.get("severity"))}</span>'
            f'<span class="id">{esc(f.get("rule_id"))} {esc(f.get("name"))}</span>'
            f'<div class="msg">{esc(f.get("message"))}</div>'
            f'<div class="thr">threshold: {esc(f.get("threshold"))}</div>'
            f'<div class="remedy"><b>Remedy</b> {esc(f.get("remedy"))}</div>'
            + (f"<ul>{ev}</ul>" if ev else "")
            + "</div>"
        )
    return "\n".join(out)


def _verdict_html(result: Mapping[str, Any], sub: str) -> str:
    sev = result.get("worst_severity")
    color = SEV_COLOR.get(sev, "#374151")
    n = len(result.get("findings") or [])
    counts = {s: sum(1 for f in result.get("findings") or [] if f.get("severity") == s) for s in ("error", "warning", "info")}
    summary = ", ".join(f"{v} {k}{'s' if v != 1 else ''}" for k, v in counts.items() if v) or "no findings"
    return (
        f'<div class="verdict" id="verdict" style="border-left-color:{color}">'
        f'<div class="head" style="color:{color}">{esc(result.get("verdict") or "no verdict")}</div>'
        f'<div class="sub">{esc(summary)} ({n} in all) · {esc(sub)}</div></div>'
    )


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No external resource may load: the report must work as an offline artifact.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _bucket_rows(rs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    return [[str(r.get("group")), f"{int(r.get('positions') or 0):,}", pct(r.get("accept_prob_mean")), pct(r.get("greedy_agree_frac")), fnum(r.get("kl_target_draft_nats")), fnum(r.get("target_entropy_nats"), ".2f")] for r in rs]


_BUCKET_HEAD = ("group", "positions", "α mean", "greedy agree", "KL nats", "H nats")


# ----------------------------------------------------------------------------- result report
def render_html(result: Mapping[str, Any]) -> str:
    """The full report for a diagnose or simulate result."""
    cfg = result.get("config") or {}
    env = result.get("environment") or {}
    m = result.get("metrics") or {}
    meas = measured(result)
    is_sim = result.get("command") == "simulate"
    ref = result.get("reference") or cfg.get("reference") or "on-policy"
    title = f"specprobe {result.get('command')}: {describe(result)}"
    parts = [f"<header><h1>{esc(describe(result))}</h1>"]
    ps = result.get("prompt_set") or {}
    parts.append(
        '<div class="meta">'
        f"<code>specprobe {esc(result.get('command'))}</code> · {esc(result.get('created'))} · specprobe {esc(result.get('specprobe_version'))}"
        f" · device {esc(env.get('device') or cfg.get('device'))} {esc(env.get('dtype') or cfg.get('dtype'))}"
        f" · temperature {esc(effective_temperatures(result)[0])} (drafter {esc(effective_temperatures(result)[1])})"
        f" · prompts {esc(ps.get('name') or cfg.get('prompts'))} ({esc(ps.get('num_prompts') or m.get('num_prompts'))}, sha256 {esc(str(ps.get('sha256') or '')[:12])})"
        f" · references {esc(ref)}</div></header>"
    )
    sub = "estimated by teacher forcing" + (" and measured by a real draft→verify loop" if is_sim and meas else "")
    parts.append(_verdict_html(result, sub))
    parts.append("<section id=\"findings\"><h2>Findings</h2>")
    parts.append(_findings_html(result.get("findings") or [], "No rule fired: nothing to report."))
    parts.append("</section>")

    # Key metrics: the handful a reader quotes.
    kpi_names = ["accept_prob_mean", "kl_target_draft_nats", "greedy_agree_frac", "tau_tokens", "best_k", "speedup_best", "cost_ratio", "accept_prob_domain_min", "num_positions"]
    kpis = "".join(f'<div class="kpi"><div class="v">{esc(metric(n, m.get(n)))}</div><div class="n">{esc(n)}</div></div>' for n in kpi_names if n in m)
    notes = [
        "α = Σ min(p, q) per position; KL(target‖draft) in nats is computed on the untruncated tempered softmax so it stays finite.",
        "Depth curves, τ(K) and speedups are estimates from teacher forcing along the reference trajectories" + ("; measured values come from real speculative decoding over the same prompts." if meas else "."),
    ]
    if ref != "on-policy":
        notes.append("References are dataset responses (off-policy): acceptance is estimated on text the target might not write.")
    parts.append('<section id="metrics"><h2>Key metrics</h2><div class="kpis">' + kpis + "</div>" + "".join(f'<p class="note">{esc(n)}</p>' for n in notes) + "</section>")

    parts.append('<section id="charts"><h2>Acceptance and speedup</h2>')
    parts.append(_depth_section(result))
    parts.append(_speedup_section(result))
    parts.append(_histogram_sections(result))
    parts.append(_bucket_section(result, "by_domain", "chart-domain", "α by domain", "domain"))
    parts.append(_bucket_section(result, "by_entropy", "chart-entropy", "α by target-entropy bucket", "target entropy"))
    parts.append(_bucket_section(result, "by_position", "chart-position", "α by context-position bucket", "position in the response (tokens)"))
    parts.append("</section>")
    parts.append(_run_section(result))
    parts.append(f"<footer>Generated by specprobe {esc(result.get('specprobe_version'))} from a {esc(result.get('command'))} result (schema {esc(result.get('schema_version'))}). Self-contained: nothing is loaded from the network.</footer>")
    return _page(title, "\n".join(parts))


def _depth_section(result: Mapping[str, Any]) -> str:
    d = result.get("depth") or {}
    md = measured(result).get("depth") or {}
    depth = list(d.get("depth") or [])
    mdepth = list(md.get("depth") or [])
    xs = sorted(set(depth) | set(mdepth), key=int) or list(range(1, 9))
    if not xs or not (d.get("cumulative") or md.get("cumulative")):
        return ""

    def align(src_depth: Sequence[int], values: Sequence[Any]) -> list[float | None]:
        lookup = {int(k): num(v) for k, v in zip(src_depth, values, strict=False)}
        return [lookup.get(int(x)) for x in xs]

    series = [
        Series("cumulative r_j (estimate)", align(depth, d.get("cumulative") or []), EST),
        Series("conditional a_j (estimate)", align(depth, d.get("conditional") or []), EST, "6 4"),
    ]
    if md.get("cumulative"):
        series += [
            Series("cumulative (measured)", align(mdepth, md.get("cumulative") or []), MEAS),
            Series("conditional (measured)", align(mdepth, md.get("conditional") or []), MEAS, "6 4"),
        ]
    chart = line_chart("chart-depth", "Acceptance by draft depth", xs, series, y_label="acceptance", x_label="draft depth j (from 1)", y_fmt=pct_axis, y_max=1.0)
    head = ["depth", "r_j est.", "a_j est."] + (["r_j meas.", "a_j meas."] if md.get("cumulative") else [])
    body = [[x] + [pct(s.values[i]) for s in series] for i, x in enumerate(xs)]
    caption = "r_j: probability that drafts 1..j are all accepted (vLLM's per-position acceptance); a_j = r_j / r_(j−1). Solid: cumulative; dashed: conditional."
    if md.get("cumulative"):
        caption += f" Orange: measured at K={md.get('k')}."
    return _row(chart, caption, _table(head, body), "Acceptance by draft depth")


def _speedup_section(result: Mapping[str, Any]) -> str:
    kt = rows(result, "k_table")
    mk = rows(measured(result), "k_table")
    if not kt and not mk:
        return ""
    ks = sorted({int(r["k"]) for r in kt + mk if r.get("k") is not None})
    est = {int(r["k"]): r for r in kt}
    mea = {int(r["k"]): r for r in mk}
    best = result.get("best_k")
    series = [Series("speedup (estimate)", [num((est.get(k) or {}).get("speedup")) for k in ks], EST)]
    if mk:
        series.append(Series("speedup (measured)", [num((mea.get(k) or {}).get("speedup")) for k in ks], MEAS, "6 4"))
    chart = line_chart(
        "chart-speedup", "Estimated speedup against draft length K", ks, series,
        y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×",
        hline=(1.0, "no speedup (1×)"), mark_x=(best, f"best K = {best}") if best is not None else None,
    )
    head = ["K", "τ(K) est.", "acc. rate", "τ i.i.d.", "speedup est."] + (["τ meas.", "speedup meas.", "tok/s"] if mk else [])
    body = []
    for k in ks:
        e = est.get(k) or {}
        r = [k, fnum(e.get("tau_tokens"), ".2f"), pct(e.get("accept_rate")), fnum(e.get("iid_tau_tokens"), ".2f"), fnum(e.get("speedup"), ".2f") + "×"]
        if mk:
            mm = mea.get(k) or {}
            r += [fnum(mm.get("tau_tokens"), ".2f"), fnum(mm.get("speedup"), ".2f") + "×", fnum(mm.get("tokens_per_s"), ".1f")]
        body.append(r)
    cost = result.get("cost") or {}
    adaptive = result.get("adaptive") or {}
    caption = (
        f"speedup(K) = τ(K) / (1 + K·c) / v with cost ratio c = {fnum(cost.get('cost_ratio'), '.3f')}"
        f" ({'measured' if cost.get('measured') else 'assumed'}) and verify factor v = {fnum(cost.get('verify_factor'), '.2f')}. τ includes the bonus token."
    )
    if adaptive:
        caption += f" Adaptive K (stop below confidence {fnum(adaptive.get('threshold'), '.2f')}): {fnum(adaptive.get('speedup'), '.2f')}× at mean K {fnum(adaptive.get('mean_k'), '.2f')}."
    return _row(chart, caption, _table(head, body, row_class=lambda i: "best" if ks[i] == best else ""), "τ and speedup by K")


def _histogram_sections(result: Mapping[str, Any]) -> str:
    hs = result.get("histograms") or {}
    out = []
    for key, chart_id, title, x_label, fmt in (
        ("accept_prob", "chart-hist-accept", "Distribution of per-position α", "α per position", lambda e: f"{100 * e:.0f}%"),
        ("kl_target_draft_nats", "chart-hist-kl", "Distribution of per-position KL(target‖draft)", "KL nats per position (last bin: at or above)", lambda e: "∞" if e is None else f"{e:g}"),
    ):
        h = hs.get(key) or {}
        edges, counts = list(h.get("edges") or []), list(h.get("counts") or [])
        if len(edges) != len(counts) + 1 or not counts:
            continue
        total = sum(c or 0 for c in counts) or 1
        labels = [fmt(e) for e in edges[:-1]]
        chart = histogram_chart(chart_id, title, labels, counts, color=EST if key == "accept_prob" else "#7c3aed", x_label=x_label)
        # The table merges neighbouring bins two by two: exact counts at half the length.
        step = 2 if len(counts) > 10 else 1
        body = []
        for i in range(0, len(counts), step):
            c = sum(int(x or 0) for x in counts[i : i + step])
            body.append([f"{fmt(edges[i])}–{fmt(edges[min(i + step, len(counts))])}", f"{c:,}", pct(c / total)])
        out.append(_row(chart, f"{total:,} positions in {len(counts)} bins.", _table(("bin", "positions", "share"), body), title))
    return "".join(out)


def _bucket_section(result: Mapping[str, Any], key: str, chart_id: str, title: str, x_label: str) -> str:
    rs = rows(result, key)
    if not rs:
        return ""
    chart = bar_chart(
        chart_id, title, [r.get("group") for r in rs], [Series("α mean", [num(r.get("accept_prob_mean")) for r in rs], EST)],
        y_label="mean α", x_label=x_label, y_fmt=pct_axis, y_max=1.0, hline=(0.7, "70% (good)"),
    )
    return _row(chart, "Bars: mean α over the positions in each group; dashed line: the 70% 'good' band.", _table(_BUCKET_HEAD, _bucket_rows(rs)), title)


def _run_section(result: Mapping[str, Any]) -> str:
    cfg = result.get("config") or {}
    env = result.get("environment") or {}
    t = result.get("target") or {}
    d = result.get("drafter") or {}
    items = [
        ("target", f"{t.get('spec')} · {t.get('name')} · {t.get('num_layers')} layers · vocab {t.get('vocab_size')}"),
        ("drafter", f"{d.get('spec')} · {d.get('kind')} · {d.get('name')}"),
    ]
    items += [(k, v) for k, v in cfg.items() if k not in ("target", "drafter")]
    items += [(f"env.{k}", v) for k, v in env.items() if k != "packages"]
    body = [[k, v if not isinstance(v, (list, dict)) else ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{a}={b}" for a, b in v.items())] for k, v in items]
    return f'<section id="run"><h2>Run</h2>{_table(("setting", "value"), body, kind="kv")}</section>'


# ----------------------------------------------------------------------------- compare report
def render_compare_html(comparison: Mapping[str, Any]) -> str:
    """The regression report: baseline against candidate."""
    b, c = comparison.get("baseline") or {}, comparison.get("candidate") or {}
    title = f"specprobe compare: {c.get('drafter')} against {b.get('drafter')}"
    parts = [
        f"<header><h1>{esc(c.get('drafter'))} <span class=\"note\">against baseline</span> {esc(b.get('drafter'))}</h1>",
        f'<div class="meta"><code>specprobe compare</code> · target {esc(c.get("target_name") or c.get("target"))} · prompts {esc(c.get("prompt_set"))} · {esc(comparison.get("created"))}'
        f" · fail-on {esc((comparison.get('config') or {}).get('fail_on'))}</div></header>",
        _verdict_html(comparison, "regression gate (SP5xx rules)"),
        '<section id="findings"><h2>Findings</h2>',
        _findings_html(comparison.get("findings") or [], "No regression rule fired."),
    ]
    if comparison.get("notes"):
        parts.append("<ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in comparison["notes"]) + "</ul>")
    parts.append("</section>")

    ov = comparison.get("overall") or []

    def cls(i: int, j: int) -> str:
        if j != 3:
            return ""
        w = ov[i].get("worse")
        return "" if w is None else ("worse" if w else "better")

    body = [[r["metric"], metric(r["metric"], r.get("baseline")), metric(r["metric"], r.get("candidate")), _signed(r.get("delta"), r["metric"]), _signed_pct(r.get("rel_change"))] for r in ov]
    parts.append(f'<section id="overall"><h2>Overall</h2>{_table(("metric", "baseline", "candidate", "Δ", "relative"), body, cell_class=cls)}</section>')

    parts.append('<section id="charts"><h2>Deltas</h2>')
    dom = comparison.get("by_domain") or []
    if dom:
        chart = bar_chart(
            "chart-domain", "α by domain: baseline and candidate", [d["group"] for d in dom],
            [Series("baseline", [num(d.get("baseline")) for d in dom], BASE), Series("candidate", [num(d.get("candidate")) for d in dom], CAND)],
            y_label="mean α", x_label="domain", y_fmt=pct_axis, y_max=1.0, hline=(0.7, "70%"),
        )
        tbody = [[d["group"], pct(d.get("baseline")), pct(d.get("candidate")), _signed(d.get("delta"), "accept_prob_mean"), _signed_pct(d.get("rel_change"))] for d in dom]
        parts.append(_row(chart, "Grey: baseline; blue: candidate.", _table(("domain", "baseline", "candidate", "Δ (points)", "relative"), tbody, cell_class=lambda i, j: "worse" if j == 4 and (num(dom[i].get("rel_change")) or 0) < -0.05 else ""), "α by domain"))
    dep = comparison.get("by_depth") or []
    if dep:
        xs = [d["depth"] for d in dep]
        series = [
            Series("baseline r_j", [num(d.get("cumulative_baseline")) for d in dep], BASE),
            Series("baseline a_j", [num(d.get("conditional_baseline")) for d in dep], BASE, "6 4"),
            Series("candidate r_j", [num(d.get("cumulative_candidate")) for d in dep], CAND),
            Series("candidate a_j", [num(d.get("conditional_candidate")) for d in dep], CAND, "6 4"),
        ]
        chart = line_chart("chart-depth", "Acceptance by draft depth: baseline and candidate", xs, series, y_label="acceptance", x_label="draft depth j (from 1)", y_fmt=pct_axis, y_max=1.0)
        tbody = [[d["depth"], pct(d.get("cumulative_baseline")), pct(d.get("cumulative_candidate")), pct(d.get("conditional_baseline")), pct(d.get("conditional_candidate")), pct(d.get("delta_conditional"))] for d in dep]
        parts.append(_row(chart, f"Depth curves ({esc(comparison.get('depth_source'))}). Solid: cumulative r_j; dashed: conditional a_j.", _table(("depth", "r_j base", "r_j cand", "a_j base", "a_j cand", "Δ a_j"), tbody), "Acceptance by draft depth"))
    kt = comparison.get("k_table") or []
    if kt:
        ks = [r["k"] for r in kt]
        series = [Series("baseline", [num(r.get("speedup_baseline")) for r in kt], BASE), Series("candidate", [num(r.get("speedup_candidate")) for r in kt], CAND)]
        best_c = max(kt, key=lambda r: num(r.get("speedup_candidate")) or -1.0)["k"]
        chart = line_chart("chart-speedup", "Estimated speedup against K", ks, series, y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×", hline=(1.0, "1×"), mark_x=(best_c, f"candidate best K = {best_c}"))
        tbody = [[r["k"], fnum(r.get("tau_baseline"), ".2f"), fnum(r.get("tau_candidate"), ".2f"), fnum(r.get("speedup_baseline"), ".2f"), fnum(r.get("speedup_candidate"), ".2f")] for r in kt]
        parts.append(_row(chart, "Estimated speedup from each side's own cost ratio.", _table(("K", "τ base", "τ cand", "speedup base", "speedup cand"), tbody, row_class=lambda i: "best" if ks[i] == best_c else ""), "τ and speedup by K"))
    parts.append("</section>")
    mrows = [[k, metric(k, v), CATALOG[k].description if k in CATALOG else ""] for k, v in (comparison.get("metrics") or {}).items()]
    parts.append(f'<section id="compare-metrics"><h2>Compare metrics</h2>{_table(("metric", "value", "definition"), mrows, kind="kv")}</section>')
    parts.append(f"<footer>Generated by specprobe {esc(comparison.get('specprobe_version'))}. Baseline: {esc(b.get('describe'))} ({esc(b.get('created'))}); candidate: {esc(c.get('describe'))} ({esc(c.get('created'))}).</footer>")
    return _page(title, "\n".join(parts))


def _signed(delta: Any, name: str) -> str:
    v = num(delta)
    if v is None:
        return "–"
    unit = CATALOG[name].unit if name in CATALOG else ""
    if unit == "frac":
        return f"{100 * v:+.1f} pts"
    return f"{v:+.3g}"


def _signed_pct(x: Any) -> str:
    v = num(x)
    return "–" if v is None else f"{100 * v:+.1f}%"
