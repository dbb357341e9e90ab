"""The drill-down part of the HTML report: what-ifs, α by token class, the systematic
confusions and over-proposed tokens, the worst positions with both top-5 lists, and a
token heat map per worst prompt whose hover shows both sides' top-5.

No script: hovering is CSS (`.tk:hover .tip`), so the page keeps its Content-Security-
Policy (no script, no external resource) and works offline. Also holds the two helpers
the terminal's `explain` shares: a token's visible label and its α colour.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from specprobe.report.charts import esc
from specprobe.report.fmt import fixed, pct
from specprobe.result import Result
from specprobe.result.drill import DrillDown, PromptTokens, TopTokens, WorstPosition

_STOPS = ((0.0, (248, 113, 113)), (0.5, (253, 224, 71)), (1.0, (134, 239, 172)))  # red → yellow → green

CSS = """
#drilldown .heat { border: 1px solid var(--line); border-radius: 4px; padding: 8px 10px; margin: 10px 0; break-inside: avoid; }
#drilldown .heat .ph { color: var(--muted); font-size: 12.5px; margin-bottom: 4px; }
#drilldown .heat .ctx { color: var(--muted); font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; white-space: pre-wrap; }
#drilldown .tokens { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; line-height: 1.9; white-space: pre-wrap; word-break: break-word; margin: 4px 0 0; }
#drilldown .tk { position: relative; border-radius: 2px; padding: 1px 0; color: #111827; }
#drilldown .tk .tip { display: none; position: absolute; z-index: 10; left: 0; top: 1.6em; background: #fff; color: #111827; border: 1px solid #9ca3af; border-radius: 4px; padding: 6px 8px; font-size: 11.5px; line-height: 1.35; white-space: pre; box-shadow: 0 2px 8px rgba(0,0,0,.15); }
#drilldown .tk:hover .tip { display: block; }
#drilldown .tk:hover { outline: 1px solid #111827; }
#drilldown td.tok, #drilldown span.tok { font-family: ui-monospace, "DejaVu Sans Mono", monospace; text-align: left; }
#drilldown .pair { display: flex; flex-wrap: wrap; gap: 12px 32px; align-items: flex-start; margin: 10px 0 18px; }
#drilldown .pair > div { flex: 0 1 auto; min-width: 0; max-width: 100%; overflow-x: auto; }
#drilldown .pair table { width: auto; }
#drilldown td.wrap { white-space: pre-wrap; text-align: left; max-width: 380px; }
#drilldown mark { background: #fecaca; }
#drilldown .legend span { display: inline-block; width: 44px; text-align: center; font-size: 11px; }
"""


def token_label(text: str) -> str:
    """A token as a quoted, visible string: '" the"', '"\\n"'."""
    return json.dumps(text, ensure_ascii=False)


def alpha_rgb(a: float | None) -> tuple[int, int, int]:
    """α → red (0) … yellow (0.5) … green (1); grey when unknown."""
    if a is None:
        return (229, 231, 235)
    a = min(max(float(a), 0.0), 1.0)
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:], strict=False):
        if a <= x1:
            f = (a - x0) / (x1 - x0)
            return tuple(round(u + f * (v - u)) for u, v in zip(c0, c1, strict=True))  # type: ignore[return-value]
    return _STOPS[-1][1]


def alpha_hex(a: float | None) -> str:
    return "#{:02x}{:02x}{:02x}".format(*alpha_rgb(a))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], classes: Sequence[str] = ()) -> str:
    """Cells are already-escaped HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="{classes[j]}">{c}</td>' if j < len(classes) and classes[j] else f"<td>{c}</td>" for j, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tok(dd: DrillDown, token: int) -> str:
    return esc(token_label(dd.text(token)))


def _top_cell(dd: DrillDown, t: TopTokens) -> str:
    return "<br>".join(f"{_tok(dd, i)} {fixed(p, '.2f')} <span class=\"note\">({fixed(o, '.2f')})</span>" for i, p, o in zip(t.ids, t.probs, t.other_probs, strict=False))


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 102nd, 111th."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def sample_phrase(every: int) -> str:
    """Which prompts the what-ifs sample: "every prompt", "every 2nd prompt"."""
    return "every prompt" if every == 1 else f"every {ordinal(every)} prompt"


def _what_ifs(dd: DrillDown) -> str:
    cf = dd.counterfactuals
    if cf is None or not cf.rows:
        return ""
    rows = [[esc(r.name), f"{r.positions:,}", pct(r.accept_prob), pct(r.accept_prob_real), fixed(r.tau_tokens, ".2f"), fixed(r.tau_tokens_real, ".2f")] for r in cf.rows]
    k = f"τ at K={cf.k}" if cf.k else "τ"
    sample = sample_phrase(cf.every)
    return (
        f"<div><h3>What-ifs</h3>{_table(['what if', 'positions', 'α', 'α real', k, k + ' real'], rows)}"
        f'<p class="note">From the scoring logits, on {esc(sample)} ({cf.sample_prompts} prompts, {cf.sample_positions:,} positions; '
        "the grid temperatures take turns over them), each beside the real value on the same positions.</p></div>"
    )


def _classes(dd: DrillDown) -> str:
    if not dd.token_classes:
        return ""
    rows = [[esc(c.token_class), f"{c.positions:,}", pct(c.accept_prob_mean), fixed(c.kl_target_draft_nats), pct(c.share_of_loss)] for c in dd.token_classes]
    return f"<div><h3>α by token class</h3>{_table(['class', 'positions', 'α', 'KL nats', 'share of α lost'], rows)}</div>"


def _confusions(dd: DrillDown, n: int = 15) -> str:
    if not dd.confusions:
        return '<p class="note">No systematic confusions: wherever the drafter\'s top-1 differs from the target\'s, no pair repeats.</p>'
    rows = [[_tok(dd, c.target), _tok(dd, c.draft), f"{c.count:,}", fixed(c.accept_prob_lost, ".2f"), pct(c.share_of_loss), pct(c.accept_prob_mean)] for c in dd.confusions[:n]]
    return (
        "<h3>Systematic confusions (target top-1 → drafter top-1)</h3>"
        + _table(["target top-1", "drafter top-1", "positions", "α lost Σ(1−α)", "share of α lost", "α mean"], rows, ["tok", "tok"])
        + '<p class="note">A shifted or shuffled vocabulary, an off-by-one id map, a missing special token: the same pairs repeat at the top.</p>'
    )


def _over(dd: DrillDown, n: int = 12) -> str:
    if not dd.over_proposed:
        return ""
    rows = [[_tok(dd, o.token), fixed(o.excess_mass, ".2f"), fixed(o.excess_per_position, ".4f"), f"{o.draft_top1_count:,}", f"{o.target_top1_count:,}"] for o in dd.over_proposed[:n]]
    return "<div><h3>Over-proposed tokens</h3>" + _table(["token", "excess mass Σmax(0, q−p)", "per position", "drafter top-1", "target top-1"], rows, ["tok"]) + "</div>"


def _domains(dd: DrillDown) -> str:
    if not dd.domains:
        return ""
    rows = [[esc(d.domain), f"{d.positions:,}", pct(d.accept_prob_mean), f"{100 * (d.vs_overall or 0):+.1f} pts", f"{100 * (d.gain_if_best or 0):+.1f} pts"] for d in dd.domains]
    return (
        "<div><h3>Domains: where distillation data pays most</h3>" + _table(["domain", "positions", "α", "vs overall", "gain if best"], rows)
        + '<p class="note">gain if best: overall α added if this domain reached the best domain\'s α.</p></div>'
    )


def _worst(dd: DrillDown, rows_in: Sequence[WorstPosition], n: int = 10) -> str:
    if not rows_in:
        return ""
    rows = []
    for w in rows_in[:n]:
        j = dd.joiner
        ctx = f"{esc(w.before + (j if w.before else ''))}<mark>{esc(dd.text(w.token))}</mark>{esc((j if w.after else '') + w.after)}"
        rows.append([f"{esc(w.prompt_id)} #{w.index}", pct(w.accept_prob), fixed(w.kl_target_draft_nats, ".2f"), ctx, _top_cell(dd, w.target), _top_cell(dd, w.draft)])
    return (
        "<h3>Worst positions (lowest α)</h3>"
        + _table(["prompt · token", "α", "KL", "text (the token marked)", "target top-5 p (q)", "drafter top-5 q (p)"], rows, ["", "", "", "wrap", "tok", "tok"])
    )


def _tip(dd: DrillDown, p: PromptTokens, j: int) -> str:
    """The hover text of token j: α, KL and both top-5 lists side by side."""
    head = f"α {pct(p.accept_prob[j])}  KL {fixed(p.kl_target_draft_nats_by_token[j], '.2f')} nats"
    if p.tops is None:
        return head + f"\ntarget top-1 {token_label(dd.text(p.target_top1[j]))} {fixed(p.target_top1_prob[j], '.2f')}\ndrafter top-1 {token_label(dd.text(p.draft_top1[j]))} {fixed(p.draft_top1_prob[j], '.2f')}"
    t = p.tops
    lines = [head, f"{'target':<22}drafter"]
    for r in range(len(t.target_ids[j])):
        left = f"{token_label(dd.text(t.target_ids[j][r]))[:15]:<15} {fixed(t.target_probs[j][r], '.2f')}"
        right = f"{token_label(dd.text(t.draft_ids[j][r]))[:15]:<15} {fixed(t.draft_probs[j][r], '.2f')}"
        lines.append(f"{left:<22}{right}")
    return "\n".join(lines)


def _heat(dd: DrillDown, p: PromptTokens) -> str:
    spans = []
    for j, tok in enumerate(p.tokens):
        text = dd.text(tok)
        shown = esc(text.replace("\n", "↵\n")) or "&#8203;"  # an empty token still gets a hover target
        spans.append(f'<span class="tk" style="background:{alpha_hex(p.accept_prob[j])}">{shown}<span class="tip">{esc(_tip(dd, p, j))}</span></span>')
    sep = esc(dd.joiner)
    return (
        f'<div class="heat" id="heat-{esc(p.prompt_id)}"><div class="ph"><b>{esc(p.prompt_id)}</b> · {esc(p.domain)} · α {pct(p.accept_prob_mean)} · KL {fixed(p.kl_target_draft_nats, ".2f")} nats · {len(p.tokens)} tokens</div>'
        f'<div class="ctx">…{esc(p.prompt_tail[-160:])}</div><p class="tokens">{sep.join(spans)}</p></div>'
    )


def _legend() -> str:
    cells = "".join(f'<span style="background:{alpha_hex(a)}">{int(100 * a)}%</span>' for a in (0.0, 0.25, 0.5, 0.75, 1.0))
    return f'<p class="legend note">α per token: {cells} · hover a token for both sides\' top-5</p>'


def drill_section(result: Result, heat_prompts: int = 8) -> str:
    """The report's drill-down section ('' when the result has none)."""
    dd = result.drilldown
    if dd is None:
        return ""
    heat = [p for p in dd.prompts if p.tops is not None][:heat_prompts] or dd.prompts[:heat_prompts]
    parts = [
        f'<section id="drilldown"><style>{CSS}</style><h2>Drill-down: where acceptance is lost</h2>',
        f'<p class="note">{dd.positions:,} positions. Probabilities are {esc(dd.distributions)}; p is the target\'s, q the drafter\'s. '
        "<code>specprobe explain RESULT.json</code> shows the same in a terminal.</p>",
        f'<div class="pair">{_what_ifs(dd)}{_classes(dd)}</div>',
        _confusions(dd),
        f'<div class="pair">{_over(dd)}{_domains(dd)}</div>',
        _worst(dd, dd.worst),
        f"<h3>Token heat map: the {len(heat)} prompts with the lowest α</h3>",
        _legend(),
        *(_heat(dd, p) for p in heat),
        "</section>",
    ]
    return "\n".join(parts)
