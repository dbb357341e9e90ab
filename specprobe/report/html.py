"""Self-contained HTML reports: one file, inline CSS and inline SVG (drawn by `report.charts`).

Nothing is fetched when the file is opened (no scripts, fonts, CDNs), so it works as an
offline CI artifact and prints cleanly. The reader sees the verdict and the findings
first, then each chart with its numbers in a table beside it — the table is the
accessible and exact form, the chart the quick read.

Every function here is pure: a typed result in, a string out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from specprobe.judge.catalog import CATALOG
from specprobe.judge.compare import overall_se, rel_change_noise
from specprobe.report.charts import (
    Series,
    bar_chart,
    esc,
    histogram_chart,
    line_chart,
    pct_axis,
    tree_chart,
)
from specprobe.report.drill_html import drill_section
from specprobe.report.fmt import (
    NGRAM_NOTE,
    adaptive_wording,
    alignment_note,
    change_with_noise,
    greedy_procedure,
    is_ngram,
    k_change_lines,
    metric,
    metric_se,
    ngram_cost_note,
    ngram_headline,
    noise_words,
    pct,
    pct_pm,
    plus_minus,
    procedure_headline,
    signed_delta,
    signed_pct,
    top_trees,
    tree_depth_rows,
    tree_label,
    tree_lines,
)
from specprobe.report.fmt import fixed as fnum
from specprobe.result import (
    BucketRow,
    Comparison,
    DomainRow,
    Finding,
    Histogram,
    MeasuredRow,
    Result,
)

if TYPE_CHECKING:
    from specprobe.probe.sweep import SweepReport

SEV_COLOR = {"error": "#b91c1c", "warning": "#b45309", "info": "#0369a1", None: "#15803d"}
EST = "#2563eb"  # estimate (teacher forcing)
MEAS = "#ea580c"  # measured (real draft→verify loop)
BASE = "#6b7280"  # compare: baseline
CAND = "#2563eb"  # compare: candidate


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
td.worse { color: #b91c1c; } td.better { color: #15803d; } td.noise { color: var(--muted); }
td.thin { color: #9ca3af; }
svg .errbar { stroke-width: 1.3; } svg .faded { opacity: 0.3; }
table.kv td { text-align: left; white-space: normal; } table.kv td:first-child { width: 26%; white-space: nowrap; }
.note { color: var(--muted); font-size: 12.5px; }
.tag { display: inline-block; border: 1px solid; border-radius: 3px; padding: 0 5px; font-size: 11px; margin-left: 6px; }
.tag.est { color: #2563eb; } .tag.meas { color: #ea580c; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
.stack { margin: 10px 0 18px; break-inside: avoid; } .stack figure { max-width: 560px; margin-bottom: 10px; }
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


def _row(chart: str, caption: str, table: str, title: str, *, stack: bool = False) -> str:
    """A chart with its table beside it; `stack`: a table too wide for that goes under it."""
    if stack:
        return f'<div class="stack"><figure>{chart}<figcaption>{caption}</figcaption></figure><h3>{esc(title)}</h3>{table}</div>'
    return f'<div class="row"><figure>{chart}<figcaption>{caption}</figcaption></figure><div><h3>{esc(title)}</h3>{table}</div></div>'


def _findings_html(findings: Sequence[Finding], empty: str) -> str:
    if not findings:
        return f'<p class="note">{esc(empty)}</p>'
    out = []
    for f in findings:
        color = SEV_COLOR.get(f.severity, "#374151")
        ev = "".join(f"<li>{esc(e)}</li>" for e in f.evidence)
        out.append(
            f'<div class="finding" style="border-left-color:{color}" id="finding-{esc(f.rule_id)}">'
            f'<span class="sev" style="background:{color}">{esc(f.severity)}</span>'
            f'<span class="id">{esc(f.rule_id)} {esc(f.name)}</span>'
            f'<div class="msg">{esc(f.message)}</div>'
            f'<div class="thr">threshold: {esc(f.threshold)}</div>'
            f'<div class="remedy"><b>Remedy</b> {esc(f.remedy)}</div>'
            + (f"<ul>{ev}</ul>" if ev else "")
            + "</div>"
        )
    return "\n".join(out)


def _verdict_html(result: Result | Comparison, sub: str) -> str:
    color = SEV_COLOR.get(result.worst_severity, "#374151")
    n = len(result.findings)
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    summary = ", ".join(f"{v} {k}{'s' if v != 1 else ''}" for k, v in counts.items() if v) or "no findings"
    return (
        f'<div class="verdict" id="verdict" style="border-left-color:{color}">'
        f'<div class="head" style="color:{color}">{esc(result.verdict or "no verdict")}</div>'
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


def _bucket_rows(rs: Sequence[DomainRow | BucketRow], greedy: bool = False) -> list[list[str]]:
    return [[r.group, f"{r.positions:,}", pct(r.accept_prob_mean), *([pct(r.accept_prob_engine_mean)] if greedy else []), pct(r.greedy_agree_frac), fnum(r.kl_target_draft_nats), fnum(r.target_entropy_nats, ".2f")] for r in rs]


def _bucket_head(greedy: bool = False) -> tuple[str, ...]:
    """α: the alignment measure; under greedy drafting the procedure's acceptance beside it."""
    return ("group", "positions", "α mean (alignment)", *(("accept (greedy drafts)",) if greedy else ()), "greedy agree", "KL nats", "H nats")


# ----------------------------------------------------------------------------- result report
def render_html(result: Result) -> str:
    """The full report for a diagnose or simulate result."""
    cfg = result.config
    env = result.environment
    m = result.metrics
    meas = result.measured is not None
    is_sim = result.command == "simulate"
    ref = result.reference or cfg.reference or "on-policy"
    title = f"specprobe {result.command}: {result.describe()}"
    parts = [f"<header><h1>{esc(result.describe())}</h1>"]
    ps = result.prompt_set
    t_temp, d_temp = result.temperatures()
    parts.append(
        '<div class="meta">'
        f"<code>specprobe {esc(result.command)}</code> · {esc(result.created)} · specprobe {esc(result.specprobe_version)}"
        f" · device {esc((env.device if env else None) or cfg.device)} {esc((env.dtype if env else None) or cfg.dtype)}"
        f" · temperature {esc(t_temp)} (drafter {esc(d_temp)})"
        f" · prompts {esc(ps.name if ps else cfg.prompts)} ({esc((ps.num_prompts if ps else None) or m.get('num_prompts'))}, sha256 {esc((ps.sha256 if ps else '')[:12])})"
        f" · references {esc(ref)}</div></header>"
    )
    sub = "estimated by teacher forcing" + (" and measured by a real draft→verify loop" if is_sim and meas else "")
    parts.append(_verdict_html(result, sub))
    ngram = is_ngram(result)
    if result.scored and m.get("num_positions") and ngram:
        parts.append(f'<p class="note" id="procedure"><b>{esc(procedure_headline(result))}</b> · {esc(ngram_headline(result))} · no model: α, KL and greedy agreement do not apply</p>')
    elif result.scored and m.get("num_positions"):
        parts.append(
            f'<p class="note" id="procedure"><b>{esc(procedure_headline(result))}</b> · acceptance {esc(pct(m.get("accept_prob_engine_mean", m.get("accept_prob_mean"))))} per draft token'
            f" · {esc(alignment_note(result))}</p>"
        )
    parts.append("<section id=\"findings\"><h2>Findings</h2>")
    parts.append(_findings_html(result.findings, "No rule fired: nothing to report."))
    parts.append("</section>")

    # Key metrics: the handful a reader quotes.
    kpi_names = ["accept_prob_mean", "accept_prob_engine_mean", "ngram_proposal_frac", "ngram_draft_tokens_mean", "ngram_accept_frac", "kl_target_draft_nats", "greedy_agree_frac", "tau_tokens", "best_k", "speedup_best", "cost_ratio", "accept_prob_domain_min", "num_positions"]
    kpis = "".join(f'<div class="kpi"><div class="v">{esc(metric_se(n, m.get(n), overall_se(result, n)))}</div><div class="n">{esc(n)}</div></div>' for n in kpi_names if n in m)
    notes = [
        "α = Σ min(p, q) per position, the alignment measure the drafter-quality findings read; KL(target‖draft) in nats is computed on the untruncated tempered softmax so it stays finite.",
        "τ(K), speedups and adaptive K follow the procedure: " + (result.procedure.description if result.procedure else "acceptance = α") + ".",
        "Depth curves, τ(K) and speedups are estimates from teacher forcing along the reference trajectories" + ("; measured values come from real speculative decoding over the same prompts." if meas else "."),
    ]
    if ngram:
        notes = [NGRAM_NOTE, ngram_cost_note(result) + "."]
    if ref != "on-policy":
        notes.append("References are dataset responses (off-policy): acceptance is estimated on text the target might not write.")
    parts.append('<section id="metrics"><h2>Key metrics</h2><div class="kpis">' + kpis + "</div>" + "".join(f'<p class="note">{esc(n)}</p>' for n in notes) + "</section>")

    parts.append('<section id="charts"><h2>Acceptance and speedup</h2>')
    parts.append(_depth_section(result))
    parts.append(_speedup_section(result))
    parts.append(_live_section(result))
    parts.append(_batch_section(result))
    parts.append(_tree_section(result))
    parts.append(_histogram_sections(result))
    if ngram:
        parts.append(_ngram_section(result.by_domain, "chart-ngram-domain", "n-gram proposals by domain", "domain"))
        parts.append(_ngram_section(result.categories, "chart-ngram-category", "n-gram proposals by the prompt file's category", "category"))
    else:
        greedy = greedy_procedure(result)
        parts.append(_bucket_section(result.by_domain, "chart-domain", "α by domain", "domain", greedy))
        if result.categories:
            parts.append(_bucket_section(result.categories, "chart-category", "α by the prompt file's category", "category", greedy))
        parts.append(_bucket_section(result.by_entropy, "chart-entropy", "α by target-entropy bucket", "target entropy", greedy))
        parts.append(_bucket_section(result.by_position, "chart-position", "α by context-position bucket", "position in the response (tokens)", greedy))
    parts.append("</section>")
    parts.append(drill_section(result))  # token-level drill-down (report.drill_html)
    parts.append(_run_section(result))
    parts.append(f"<footer>Generated by specprobe {esc(result.specprobe_version)} from a {esc(result.command)} result (schema {esc(result.schema_version)}). Self-contained: nothing is loaded from the network.</footer>")
    return _page(title, "\n".join(parts))


# Error bars span ± ERR_BAR_SE standard errors; tables give ± one.
ERR_BAR_SE = 2
SE_NOTE = f"± one standard error over prompts in the tables; bars span ± {ERR_BAR_SE} standard errors."
THIN_NOTE = "Grey, faded: depths too thin to read — too few prompts or drafts reach them, or the standard error is as large as the rate itself."


def _bars(se: Sequence[float | None], n: int | None = None) -> list[float | None]:
    """Error-bar half-widths from standard errors (None where there is none)."""
    out = [None if x is None else ERR_BAR_SE * x for x in se]
    return out if n is None else (out + [None] * n)[:n]


def _times(x: float | None, se: float | None) -> str:
    """A speedup ± its standard error: '1.31× ± 0.04' (the speedup alone without one)."""
    v = fnum(x, ".2f")
    return f"{v}×" + (f" ± {fnum(se, '.2f')}" if se is not None and x is not None else "")


def _pct_thin(x: float | None, se: float | None, thin: bool | None) -> str:
    return pct_pm(x, se) + (" (thin)" if thin else "")


def _depth_section(result: Result) -> str:
    d = result.depth
    md = result.measured.depth if result.measured else None
    depth = list(d.depth) if d else []
    mdepth = list(md.depth) if md else []
    xs = sorted(set(depth) | set(mdepth)) or list(range(1, 9))
    if not xs or not ((d and d.cumulative) or (md and md.cumulative)):
        return ""

    def align(src_depth: Sequence[int], values: Sequence[Any]) -> list[Any]:
        lookup = dict(zip(src_depth, values, strict=False))
        return [lookup.get(x) for x in xs]

    est_se = align(depth, d.cumulative_se if d else [])
    est_thin = [bool(t) for t in align(depth, d.thin if d else [])]
    series = [
        Series("cumulative r_j (estimate)", align(depth, d.cumulative if d else []), EST, err=_bars(est_se), faded=est_thin),
        Series("conditional a_j (estimate)", align(depth, d.conditional if d else []), EST, "6 4", faded=est_thin),
    ]
    ses: list[list[float | None]] = [est_se, [None] * len(xs)]
    thins: list[list[bool]] = [est_thin, est_thin]
    row = next((r for r in result.k_table if md is not None and r.k == md.k and r.per_position_renewal), None)
    if md and md.cumulative:
        m_se = align(mdepth, md.cumulative_se)
        m_thin = [bool(t) for t in align(mdepth, md.thin)]
        series += [
            Series("cumulative (measured)", align(mdepth, md.cumulative), MEAS, err=_bars(m_se), faded=m_thin),
            Series("conditional (measured)", align(mdepth, md.conditional), MEAS, "6 4", faded=m_thin),
        ]
        ses += [m_se, [None] * len(xs)]
        thins += [m_thin, m_thin]
        if row is not None:  # the estimate counted as the loop counts: per draft at its K
            per_draft = list(range(1, len(row.per_position_renewal) + 1))
            r_se = align(per_draft, row.per_position_renewal_se)
            series.append(Series(f"per draft at K={md.k} (estimate)", align(per_draft, row.per_position_renewal), EST, "2 3", err=_bars(r_se)))
            ses.append(r_se)
            thins.append([False] * len(xs))
    chart = line_chart("chart-depth", "Acceptance by draft depth", xs, series, y_label="acceptance", x_label="draft depth j (from 1)", y_fmt=pct_axis, y_max=1.0)
    head = ["depth", "r_j est.", "a_j est."] + (["r_j meas.", "a_j meas."] if md and md.cumulative else []) + (["per draft est."] if md and md.cumulative and row is not None else [])
    body = [[x] + [_pct_thin(s.values[i], ses[j][i], thins[j][i]) for j, s in enumerate(series)] for i, x in enumerate(xs)]
    caption = "r_j: probability that drafts 1..j are all accepted, averaged over every start position; a_j = r_j / r_(j−1). Solid: cumulative; dashed: conditional."
    if md and md.cumulative:
        caption += f" Orange: measured at K={md.k}."
        if row is not None:
            caption += (" Dotted: the estimate counted as the loop counts, rounds starting where the previous one ended (the one to compare with the"
                        " measured curve; r_j counts every start position and reads higher where a rejection is followed by harder text).")
    if any(x is not None for se in ses for x in se):
        caption += " " + SE_NOTE
    if any(t for th in thins for t in th):
        caption += " " + THIN_NOTE
    return _row(chart, esc(caption), _table(head, body, cell_class=lambda i, j: "thin" if j > 0 and thins[j - 1][i] else ""), "Acceptance by draft depth")


def _speedup_section(result: Result) -> str:
    kt = result.k_table
    mk: list[MeasuredRow] = result.measured.k_table if result.measured else []
    if not kt and not mk:
        return ""
    ks = sorted({r.k for r in kt} | {r.k for r in mk})
    est = {r.k: r for r in kt}
    mea = {r.k: r for r in mk}
    best = result.best_k
    series = [Series("speedup (estimate)", [est[k].speedup if k in est else None for k in ks], EST, err=_bars([est[k].speedup_se if k in est else None for k in ks]))]
    if mk:
        series.append(Series("speedup (measured)", [mea[k].speedup if k in mea else None for k in ks], MEAS, "6 4", err=_bars([mea[k].speedup_se if k in mea else None for k in ks])))
    chart = line_chart(
        "chart-speedup", "Estimated speedup against draft length K", ks, series,
        y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×",
        hline=(1.0, "no speedup (1×)"), mark_x=(best, f"best K = {best}") if best is not None else None,
    )
    head = ["K", "τ(K) est.", "τ window", "acc. rate", "τ i.i.d.", "v_K", "speedup est."] + (["τ meas.", "speedup meas.", "tok/s"] if mk else [])
    body = []
    any_se = False
    for k in ks:
        e = est.get(k)
        renewal = e is not None and e.tau_renewal_tokens is not None
        tau = (e.tau_renewal_tokens if renewal else e.tau_tokens) if e else None
        tau_se = e.tau_renewal_se if e and renewal else None
        rate_renewal = e is not None and e.accept_rate_renewal is not None
        rate = (e.accept_rate_renewal if rate_renewal else e.accept_rate) if e else None
        rate_se = e.accept_rate_renewal_se if e and rate_renewal else None
        sp_se = e.speedup_se if e else None
        r: list[Any] = [
            k, plus_minus(tau, tau_se), fnum(e.tau_tokens if e else None, ".2f"), pct_pm(rate, rate_se), fnum(e.iid_tau_tokens if e else None, ".2f"),
            fnum(e.verify_factor if e else None, ".2f"), _times(e.speedup if e else None, sp_se),
        ]
        any_se = any_se or any(x is not None for x in (tau_se, rate_se, sp_se))
        if mk:
            mm = mea.get(k)
            r += [plus_minus(mm.tau_tokens if mm else None, mm.tau_se if mm else None), _times(mm.speedup if mm else None, mm.speedup_se if mm else None), fnum(mm.tokens_per_s if mm else None, ".1f")]
            any_se = any_se or bool(mm and (mm.tau_se is not None or mm.speedup_se is not None))
        body.append(r)
    cost, adaptive = result.cost, result.adaptive
    src = cost.sources if cost else {}
    caption = (
        f"speedup(K) = τ(K) / (K·c + v_K): a round costs K drafter steps and one target pass over K + 1 tokens, in target decode steps"
        f" (with a given v: (1 + K·c)·v). Cost ratio c = {fnum(cost.cost_ratio if cost else None, '.3f')} ({esc(src.get('cost_ratio', 'measured' if cost and cost.measured else 'assumed'))}),"
        f" v_K {esc(src.get('verify_factor', 'given'))}{f' at batch size {cost.batch_size}' if cost and cost.batch_size else ''}."
        " τ(K): renewal estimate (rounds start where the previous one ended); τ window: every start position averaged. τ includes the bonus token."
    )
    if is_ngram(result):
        caption = f"K: the longest draft the n-gram drafter may make. {ngram_cost_note(result)}. τ includes the bonus token."
    if adaptive and adaptive.beats_fixed is False:
        caption += f" Adaptive K: no confidence threshold beats fixed K = {esc(str(result.metrics.get('best_k')))} (the best gives {fnum(adaptive.speedup, '.2f')}×)."
    elif adaptive:
        caption += f" Adaptive K ({esc(adaptive_wording(result, adaptive.threshold))}): {fnum(adaptive.speedup, '.2f')}× at mean K {fnum(adaptive.mean_k, '.2f')}."
    if any_se:
        seeds = max((m.seeds for m in mk), default=1)
        caption += " " + SE_NOTE + (f" Measured over {seeds} seeds." if seeds > 1 else "") + " The speedup's standard error is τ's; the cost timing's own spread is not in it."
    # with the measured columns and standard errors the table is too wide to sit beside the chart
    return _row(chart, caption, _table(head, body, row_class=lambda i: "best" if ks[i] == best else ""), "τ and speedup by K", stack=bool(mk) and any_se)


def _live_section(result: Result) -> str:
    """diagnose --against: the live server's acceptance by draft position beside the
    prediction, each with ±2-SE bars, and accepted ÷ drafted with the gap in standard errors."""
    v = result.live
    if v is None or not (v.per_position or v.predicted_per_position):
        return ""
    n = max(len(v.per_position), len(v.predicted_per_position))
    xs = list(range(1, n + 1))

    def padded(xs_: Sequence[float | None]) -> list[float | None]:
        return (list(xs_) + [None] * n)[:n]

    series = [
        Series(f"served ({v.engine})", padded(v.per_position), MEAS, err=_bars(v.per_position_se, n)),
        Series("predicted (renewal estimate)", padded(v.predicted_per_position), EST, "6 4", err=_bars(v.predicted_per_position_se, n)),
    ]
    chart = line_chart("chart-live", f"Acceptance by draft position: {v.engine} against the prediction", xs, series, y_label="acceptance", x_label="draft position (from 1)", y_fmt=pct_axis, y_max=1.0)
    ses = [padded(v.per_position_se), padded(v.predicted_per_position_se)]
    body: list[list[Any]] = [[f"position {x}", pct_pm(series[0].values[i], ses[0][i]), pct_pm(series[1].values[i], ses[1][i]), ""] for i, x in enumerate(xs)]
    gap = change_with_noise(v.gap_rel, None if v.gap_rel is None or not v.gap_z else abs(v.gap_rel / v.gap_z), v.gap_z)
    body.append(["accepted ÷ drafted", pct_pm(v.accept_rate, v.accept_rate_se), pct_pm(v.predicted_accept_rate, v.predicted_accept_rate_se), gap])
    caption = (f"{v.engine} {v.engine_version or ''} at {v.url}, K = {v.k}: {v.requests} of {v.prompts} prompts ({v.counting}{'; ' + v.stopped if v.stopped else ''}). "
               "Per position: accepted at that position ÷ drafts (vLLM's per-position rate). Gap: (served − predicted) ÷ predicted. " + SE_NOTE)
    return _row(chart, esc(caption), _table(("", "served", "predicted", "gap"), body), "Against the live server")


def _batch_section(result: Result) -> str:
    """Estimated speedup per (batch size, K), when more than one batch size was timed."""
    cost = result.cost
    if cost is None or len(cost.batches) < 2:
        return ""
    ks = [r.k for r in cost.batches[0].rows]
    palette = ("#2563eb", "#7c3aed", "#db2777", "#ea580c", "#16a34a", "#0891b2")
    series = [
        Series(f"batch {b.batch_size}", [{r.k: r.speedup for r in b.rows}.get(k) for k in ks], palette[i % len(palette)], "" if b.batch_size == cost.batch_size else "6 4")
        for i, b in enumerate(cost.batches)
    ]
    chart = line_chart(
        "chart-batch", "Estimated speedup by batch size and draft length K", ks, series,
        y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×", hline=(1.0, "no speedup (1×)"),
    )
    head = ["batch size", "c", "target step ms", "best K", "speedup at best K", "range (IQR)"]
    body = []
    for b in cost.batches:
        best = next((r for r in b.rows if r.k == b.best_k), None)
        body.append([
            b.batch_size, fnum(b.cost_ratio, ".3f"), fnum(b.target_step.median_ms if b.target_step else None, ".1f"), b.best_k if b.best_k is not None else "n/a",
            fnum(b.speedup_best, ".2f") + "×", f"{fnum(best.speedup_low if best else None, '.2f')}–{fnum(best.speedup_high if best else None, '.2f')}×",
        ])
    caption = (
        f"Each line: τ(K) over a round's cost timed at that batch size (solid: the run's batch size {cost.batch_size}). "
        "Where a line stays under 1×, speculative decoding slows that batch size down."
    )
    return _row(chart, caption, _table(head, body, row_class=lambda i: "best" if cost.batches[i].batch_size == cost.batch_size else ""), "Speedup by batch size")


def _tree_section(result: Result) -> str:
    """Draft trees: the run's tree drawn node by node with each node's acceptance, its
    depth × rank table, and the grid's fastest shapes."""
    tr = result.trees
    if tr is None:
        return ""
    out = []
    t = tr.tree
    if t is not None:
        chart = tree_chart("chart-tree", f"Draft tree {tree_label(t)}: P(node on the accepted path)", [(n.path, n.verified, n.accepted) for n in t.nodes])
        table = _table(("depth", "accepted", "rank 1", "rank 2", "rank 3", "rank ≥ 4"), tree_depth_rows(result))
        caption = ("Each node is a rank path: 1.2 is the second candidate below the first. Teacher-forced along the references; "
                   "a node's acceptance is Σ over rounds of Π p_target along its path. " + " ".join(tree_lines(result)))
        out.append(_row(chart, esc(caption), table, "Acceptance by depth and accepted rank"))
    best = top_trees(result)
    if best:
        body = [[tree_label(r), fnum(r.tau_tokens, ".2f"), fnum(r.tau_window_tokens, ".2f"), fnum(r.round_cost, ".2f"), fnum(r.speedup, ".2f") + "×"] for r in best]
        marks = {id(tr.best_tree): "best", id(tr.best_chain): "best"}
        out.append(f'<div><h3>Fastest draft trees and chains</h3>{_table(("tree", "τ", "τ window", "round cost", "speedup"), body, row_class=lambda i: marks.get(id(best[i]), ""))}</div>')
    return "".join(out)


def _histogram_sections(result: Result) -> str:
    hs = result.histograms
    out = []
    for key, chart_id, title, x_label, fmt in (
        ("accept_prob", "chart-hist-accept", "Distribution of per-position α", "α per position", lambda e: f"{100 * e:.0f}%"),
        ("kl_target_draft_nats", "chart-hist-kl", "Distribution of per-position KL(target‖draft)", "KL nats per position (last bin: at or above)", lambda e: "∞" if e is None else f"{e:g}"),
    ):
        h: Histogram | None = getattr(hs, key) if hs else None
        edges, counts = (list(h.edges), list(h.counts)) if h else ([], [])
        if len(edges) != len(counts) + 1 or not counts:
            continue
        total = sum(c or 0 for c in counts) or 1
        labels = [fmt(e) for e in edges[:-1]]
        chart = histogram_chart(chart_id, title, labels, counts, color=EST if key == "accept_prob" else "#7c3aed", x_label=x_label)
        # The table merges neighbouring bins two by two: exact counts at half the length.
        step = 2 if len(counts) > 10 else 1
        body = []
        for i in range(0, len(counts), step):
            c = sum(counts[i : i + step])
            body.append([f"{fmt(edges[i])}–{fmt(edges[min(i + step, len(counts))])}", f"{c:,}", pct(c / total)])
        out.append(_row(chart, f"{total:,} positions in {len(counts)} bins.", _table(("bin", "positions", "share"), body), title))
    return "".join(out)


def _bucket_section(rs: Sequence[DomainRow | BucketRow], chart_id: str, title: str, x_label: str, greedy: bool = False) -> str:
    if not rs:
        return ""
    chart = bar_chart(
        chart_id, title, [r.group for r in rs], [Series("α mean", [r.accept_prob_mean for r in rs], EST)],
        y_label="mean α", x_label=x_label, y_fmt=pct_axis, y_max=1.0, hline=(0.7, "70% (good)"),
    )
    return _row(chart, "Bars: mean α over the positions in each group; dashed line: the 70% 'good' band.", _table(_bucket_head(greedy), _bucket_rows(rs, greedy)), title)


def _ngram_section(rs: Sequence[DomainRow], chart_id: str, title: str, x_label: str) -> str:
    """An n-gram drafter by group: how often it proposed and how much of it was accepted
    (bars), with τ and the speedup there in the table."""
    if not rs:
        return ""
    chart = bar_chart(
        chart_id, title, [r.group for r in rs],
        [Series("verify steps that proposed", [r.ngram_proposal_frac for r in rs], EST), Series("accepted per drafted token", [r.accept_prob_engine_mean for r in rs], MEAS)],
        y_label="share", x_label=x_label, y_fmt=pct_axis, y_max=1.0,
    )
    head = ("group", "verify steps", "proposed", "tokens a draft", "accepted per token", "τ", "speedup")
    body = [[r.group, f"{r.positions:,}", pct(r.ngram_proposal_frac), fnum(r.ngram_draft_tokens_mean, ".2f"), pct(r.accept_prob_engine_mean), fnum(r.tau_tokens, ".2f"), fnum(r.speedup, ".2f") + "×"] for r in rs]
    caption = "Blue: verify steps at which the drafter proposed anything; orange: drafted tokens the target accepted. Where both are high, prompt lookup pays."
    return _row(chart, caption, _table(head, body), title)


def _run_section(result: Result) -> str:
    cfg = result.config.model_dump(exclude_unset=True)
    env = result.environment.model_dump() if result.environment else {}
    t, d = result.target, result.drafter
    items: list[tuple[str, Any]] = [
        ("target", f"{t.spec} · {t.name} · {t.num_layers} layers · vocab {t.vocab_size}"),
        ("drafter", f"{d.spec} · {d.kind} · {d.name}"),
    ]
    items += [(k, v) for k, v in cfg.items() if k not in ("target", "drafter")]
    items += [(f"env.{k}", v) for k, v in env.items() if k != "packages"]
    body = [[k, v if not isinstance(v, (list, dict)) else ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{a}={b}" for a, b in v.items())] for k, v in items]
    return f'<section id="run"><h2>Run</h2>{_table(("setting", "value"), body, kind="kv")}</section>'


# ----------------------------------------------------------------------------- compare report
def render_compare_html(comparison: Comparison) -> str:
    """The regression report: baseline against candidate."""
    b, c = comparison.baseline, comparison.candidate
    title = f"specprobe compare: {c.drafter} against {b.drafter}"
    parts = [
        f"<header><h1>{esc(c.drafter)} <span class=\"note\">against baseline</span> {esc(b.drafter)}</h1>",
        f'<div class="meta"><code>specprobe compare</code> · target {esc(c.target_name or c.target)} · prompts {esc(c.prompt_set)} · {esc(comparison.created)}'
        f" · fail-on {esc(comparison.config.fail_on)}</div></header>",
        _verdict_html(comparison, "regression gate (SP5xx rules)"),
        '<section id="findings"><h2>Findings</h2>',
        _findings_html(comparison.findings, "No regression rule fired."),
    ]
    if comparison.notes:
        parts.append("<ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in comparison.notes) + "</ul>")
    parts.append("</section>")

    ov = comparison.overall

    def cls(i: int, j: int) -> str:
        if j not in (3, 4):
            return ""
        w = ov[i].worse
        if noise_words(ov[i].delta_z) == "within noise":
            return "noise"
        return "" if w is None else ("worse" if w else "better")

    body = [
        [r.metric, metric_se(r.metric, r.baseline, r.baseline_se), metric_se(r.metric, r.candidate, r.candidate_se), signed_delta(r.metric, r.delta), change_with_noise(r.rel_change, r.rel_change_se, r.delta_z)]
        for r in ov
    ]
    se_note = ("± one standard error over prompts where the results carry one; the change's is the difference's, sqrt(se_b² + se_c²), "
               "and a change beyond two of them is beyond noise (grey: within noise).")
    k_lines = k_change_lines(comparison)
    k_html = (f'<h3>At K = {esc(comparison.metrics.get("compare_k"))}, the draft length the gate compares</h3><ul id="compare-k">'
              + "".join(f"<li>{esc(line)}</li>" for line in k_lines) + "</ul>") if k_lines else ""
    parts.append(f'<section id="overall"><h2>Overall</h2>{_table(("metric", "baseline", "candidate", "Δ", "relative"), body, cell_class=cls)}'
                 f'<p class="note">{esc(se_note)}</p>{k_html}</section>')

    parts.append('<section id="charts"><h2>Deltas</h2>')
    dom = comparison.by_domain
    if dom:
        chart = bar_chart(
            "chart-domain", "α by domain: baseline and candidate", [d.group for d in dom],
            [Series("baseline", [d.baseline for d in dom], BASE), Series("candidate", [d.candidate for d in dom], CAND)],
            y_label="mean α", x_label="domain", y_fmt=pct_axis, y_max=1.0, hline=(0.7, "70%"),
        )
        tbody = [[d.group, pct(d.baseline), pct(d.candidate), signed_delta("accept_prob_mean", d.delta), signed_pct(d.rel_change)] for d in dom]
        parts.append(_row(chart, "Grey: baseline; blue: candidate.", _table(("domain", "baseline", "candidate", "Δ (points)", "relative"), tbody, cell_class=lambda i, j: "worse" if j == 4 and (dom[i].rel_change or 0) < -0.05 else ""), "α by domain"))
    dep = comparison.by_depth
    if dep:
        xs = [d.depth for d in dep]
        b_thin = [bool(d.thin_baseline) for d in dep]
        c_thin = [bool(d.thin_candidate) for d in dep]
        series = [
            Series("baseline r_j", [d.cumulative_baseline for d in dep], BASE, err=_bars([d.cumulative_baseline_se for d in dep]), faded=b_thin),
            Series("baseline a_j", [d.conditional_baseline for d in dep], BASE, "6 4", faded=b_thin),
            Series("candidate r_j", [d.cumulative_candidate for d in dep], CAND, err=_bars([d.cumulative_candidate_se for d in dep]), faded=c_thin),
            Series("candidate a_j", [d.conditional_candidate for d in dep], CAND, "6 4", faded=c_thin),
        ]
        chart = line_chart("chart-depth", "Acceptance by draft depth: baseline and candidate", xs, series, y_label="acceptance", x_label="draft depth j (from 1)", y_fmt=pct_axis, y_max=1.0)
        dbody: list[list[Any]] = [
            [d.depth, _pct_thin(d.cumulative_baseline, d.cumulative_baseline_se, d.thin_baseline), _pct_thin(d.cumulative_candidate, d.cumulative_candidate_se, d.thin_candidate),
             pct(d.conditional_baseline), pct(d.conditional_candidate), pct(d.delta_conditional)]
            for d in dep
        ]
        thin_cols = {1: b_thin, 2: c_thin, 3: b_thin, 4: c_thin}
        caption = f"Depth curves ({comparison.depth_source}). Solid: cumulative r_j; dashed: conditional a_j."
        if any(d.cumulative_baseline_se is not None or d.cumulative_candidate_se is not None for d in dep):
            caption += " " + SE_NOTE
        if any(b_thin) or any(c_thin):
            caption += " " + THIN_NOTE
        parts.append(_row(chart, esc(caption), _table(("depth", "r_j base", "r_j cand", "a_j base", "a_j cand", "Δ a_j"), dbody, cell_class=lambda i, j: "thin" if j in thin_cols and thin_cols[j][i] else ""), "Acceptance by draft depth"))
    kt = comparison.k_table
    if kt:
        ks = [r.k for r in kt]
        series = [
            Series("baseline", [r.speedup_baseline for r in kt], BASE, err=_bars([r.speedup_baseline_se for r in kt])),
            Series("candidate", [r.speedup_candidate for r in kt], CAND, err=_bars([r.speedup_candidate_se for r in kt])),
        ]
        best_c = max(kt, key=lambda r: r.speedup_candidate or -1.0).k
        chart = line_chart("chart-speedup", "Estimated speedup against K", ks, series, y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×", hline=(1.0, "1×"), mark_x=(best_c, f"candidate best K = {best_c}"))

        def tau_change(r: Any) -> str:
            return change_with_noise(*rel_change_noise(r.tau_baseline, r.tau_baseline_se, r.tau_candidate, r.tau_candidate_se))

        kbody: list[list[Any]] = [
            [r.k, plus_minus(r.tau_baseline, r.tau_baseline_se), plus_minus(r.tau_candidate, r.tau_candidate_se), tau_change(r),
             pct_pm(r.accept_rate_baseline, r.accept_rate_baseline_se), pct_pm(r.accept_rate_candidate, r.accept_rate_candidate_se),
             _times(r.speedup_baseline, r.speedup_baseline_se), _times(r.speedup_candidate, r.speedup_candidate_se)]
            for r in kt
        ]
        caption = "Estimated speedup from each side's own cost ratio; acceptance: accepted ÷ drafted tokens."
        if any(x is not None for r in kt for x in (r.tau_baseline_se, r.tau_candidate_se, r.speedup_baseline_se, r.speedup_candidate_se)):
            caption += " " + SE_NOTE + " The speedup's standard error is τ's; the cost timing's own spread is not in it."
        def k_cls(i: int, j: int) -> str:
            if j != 3:
                return ""
            r = kt[i]
            z = rel_change_noise(r.tau_baseline, r.tau_baseline_se, r.tau_candidate, r.tau_candidate_se)[2]
            if noise_words(z) == "within noise":
                return "noise"
            return "worse" if (r.tau_candidate or 0) < (r.tau_baseline or 0) else ""

        ktable = _table(("K", "τ base", "τ cand", "τ change", "accept base", "accept cand", "speedup base", "speedup cand"), kbody, row_class=lambda i: "best" if ks[i] == best_c else "", cell_class=k_cls)
        parts.append(_row(chart, esc(caption), ktable, "τ, acceptance and speedup by K", stack=True))  # eight columns: under the chart
    parts.append("</section>")
    mrows = [[k, metric(k, v), CATALOG[k].description if k in CATALOG else ""] for k, v in comparison.metrics.items()]
    parts.append(f'<section id="compare-metrics"><h2>Compare metrics</h2>{_table(("metric", "value", "definition"), mrows, kind="kv")}</section>')
    parts.append(f"<footer>Generated by specprobe {esc(comparison.specprobe_version)}. Baseline: {esc(b.describe)} ({esc(b.created)}); candidate: {esc(c.describe)} ({esc(c.created)}).</footer>")
    return _page(title, "\n".join(parts))


# ----------------------------------------------------------------------------- sweep
def render_sweep_html(report: SweepReport) -> str:
    """`sweep --html`: the table of every drafter (α, KL, cost ratio, best K, τ, speedup)
    and their estimated speedup against K, one line each, the recommended one marked."""
    palette = ["#2563eb", "#ea580c", "#15803d", "#9333ea", "#b91c1c", "#0891b2", "#a16207", "#4b5563"]
    ks = list(range(1, max((len(r.speedup_by_k) for r in report.rows), default=0) + 1))
    series = [Series(r.drafter, list(r.speedup_by_k) + [None] * (len(ks) - len(r.speedup_by_k)), palette[i % len(palette)], "" if r.drafter == report.recommended else "6 4") for i, r in enumerate(report.rows)]
    chart = line_chart("chart-sweep", "Estimated speedup against draft length K, per drafter", ks, series, y_label="speedup ×", x_label="draft length K", y_fmt=lambda v: f"{v:.2g}×", hline=(1.0, "no speedup (1×)")) if ks else ""
    head = ["drafter", "α (alignment)", "accept", "KL nats", "cost ratio c", "best K", "τ(best K)", "speedup", "verdict"]
    body = [
        [r.drafter, pct(r.accept_prob_mean), pct(r.accept_prob_engine_mean), fnum(r.kl_target_draft_nats, ".2f"), fnum(r.cost_ratio, ".3f") + ("" if r.cost_measured else " (given)"), r.best_k if r.best_k is not None else "–",
         fnum(r.tau_tokens, ".2f"), fnum(r.speedup_best, ".2f") + "×", r.stopped or r.verdict]
        for r in report.rows
    ]
    best = report.recommended
    verdict = f"recommended: {best} (highest estimated speedup; confirm with specprobe simulate)" if best else "no drafter could be recommended (nothing was scored)"
    body_html = (
        f'<h1>specprobe sweep — {esc(report.target)}</h1>'
        f'<div class="verdict" id="verdict"><div class="head">{esc(verdict)}</div>'
        f'<div class="sub">{len(report.rows)} drafters on {report.num_prompts} prompts ({report.num_positions} positions, {esc(report.reference)} references), '
        f'{report.target_passes} target passes shared by all{" · interrupted" if report.interrupted else ""}'
        f'{" · τ and speedups " + esc(report.procedure) if report.procedure else ""}</div></div>'
        + _row(chart, "Teacher-forced estimates on one set of references; speedup(K) = τ(K) / (K·c + v_K), each drafter at its own timed cost ratio.",
               _table(head, body, row_class=lambda i: "best" if report.rows[i].drafter == best else ""), "Drafters")
        + _sweep_groups_html(report)
    )
    return _page(f"specprobe sweep — {report.target}", body_html)


def _sweep_groups_html(report: SweepReport) -> str:
    """The fastest drafter in each domain or category (the scope the advice reads): every
    drafter's speedup there at the K best for it, the fastest marked."""
    scope = report.advice_scope()
    groups = [g for g in report.by_group if g.scope == scope]
    if not groups or len(report.rows) < 2:
        return ""
    names = [r.drafter for r in report.rows]
    head = [scope, "tokens", "fastest", *names]
    body = []
    for g in groups:
        by = {e.drafter: e for e in g.drafters}
        body.append([g.group, f"{g.positions:,}", g.recommended or "–", *(f"{fnum(by[n].speedup, '.2f')}× (K={by[n].best_k})" if n in by and by[n].speedup is not None else "–" for n in names)])
    said = "; ".join(f"{d} for {', '.join(gs)}" for d, gs in report.advice(scope))
    return (
        f'<section id="by-group"><h2>Fastest drafter by {esc(scope)}</h2>'
        f'<p class="note">Use {esc(said)} (highest estimated speedup in each, each drafter at the K best there; confirm with specprobe simulate).</p>'
        + _table(head, body) + "</section>"
    )
