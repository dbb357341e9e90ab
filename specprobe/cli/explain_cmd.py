"""`specprobe explain RESULT.json`: the token-level drill-down of a saved diagnose or
simulate result in the terminal — what-ifs, α by token class, confusions, a prompt's
text coloured by α, the worst positions with both sides' top-5 side by side.

Reads JSON only (no torch), like `report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from specprobe.cli.common import (
    handle_errors,
    out,
)
from specprobe.core.errors import InputError
from specprobe.report.drill_html import alpha_rgb, sample_phrase, token_label
from specprobe.report.fmt import EM_DASH, fixed, pct
from specprobe.report.terminal import Column, Grid
from specprobe.result import Result
from specprobe.result.drill import DrillDown, PromptTokens, WorstPosition


def _pct(x: float | None) -> str:
    return pct(x, none=EM_DASH)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return fixed(x, fmt, none=EM_DASH)


def _tok(dd: DrillDown, token: int, width: int = 18) -> str:
    s = token_label(dd.text(token))
    return s if len(s) <= width else s[: width - 2] + "…" + s[-1]


# ----------------------------------------------------------------------------- views
def what_ifs(dd: DrillDown) -> Grid | None:
    cf = dd.counterfactuals
    if cf is None or not cf.rows:
        return None
    k = f"τ K={cf.k}" if cf.k else "τ"
    g = Grid(
        [Column("what if", fallback="under", order=1), Column("positions", "n", "right", "drop", 3), Column("α", justify="right"), Column("α real", "real", "right"), Column(k, justify="right", fallback="drop", order=2), Column(f"{k} real", "real", "right", "drop", 2)],
        title="What-ifs (from the scoring logits, beside the real value on the same positions)",
        caption=f" on {sample_phrase(cf.every)}: {cf.sample_prompts} prompts, {cf.sample_positions:,} positions (the grid temperatures take turns)",
    )
    for r in cf.rows:
        g.add(r.name, f"{r.positions:,}", _pct(r.accept_prob), _pct(r.accept_prob_real), _f(r.tau_tokens, ".2f"), _f(r.tau_tokens_real, ".2f"))
    return g


def classes(dd: DrillDown) -> Grid:
    g = Grid([Column("token class"), Column("positions", "n", "right"), Column("α", justify="right"), Column("KL nats", "KL", "right", "drop", 1), Column("share of α lost", "lost", "right")], title="α by token class")
    for c in dd.token_classes:
        g.add(c.token_class, f"{c.positions:,}", _pct(c.accept_prob_mean), _f(c.kl_target_draft_nats), _pct(c.share_of_loss))
    return g


def confusions(dd: DrillDown, n: int) -> Grid:
    g = Grid(
        [Column("target top-1"), Column("drafter top-1"), Column("n", justify="right"), Column("α lost", justify="right"), Column("share", justify="right"), Column("α mean", "α", "right", "drop", 1)],
        title="Systematic confusions (target top-1 → drafter top-1), by the α they cost",
        caption=" α lost: Σ(1 − α) over those positions; share: of all α lost" if dd.confusions else " none: where the top-1s differ, no pair repeats",
    )
    for c in dd.confusions[:n]:
        g.add(_tok(dd, c.target), _tok(dd, c.draft), f"{c.count:,}", _f(c.accept_prob_lost, ".2f"), _pct(c.share_of_loss), _pct(c.accept_prob_mean))
    return g


def over_proposed(dd: DrillDown, n: int) -> Grid:
    g = Grid(
        [Column("token"), Column("excess mass", "excess", "right"), Column("drafter top-1", "d-top1", "right"), Column("target top-1", "t-top1", "right")],
        title="Over-proposed: mass the drafter puts where the target puts little",
        caption=" excess mass: Σ over positions of max(0, q − p) for the drafter's top-5",
    )
    for o in dd.over_proposed[:n]:
        g.add(_tok(dd, o.token), _f(o.excess_mass, ".2f"), f"{o.draft_top1_count:,}", f"{o.target_top1_count:,}")
    return g


def domains(dd: DrillDown) -> Grid:
    g = Grid([Column("domain"), Column("positions", "n", "right"), Column("α", justify="right"), Column("vs overall", "vs all", "right"), Column("gain if best", "gain", "right")], title="Domains ranked by the overall α they would add by matching the best")
    for d in dd.domains:
        g.add(d.domain, f"{d.positions:,}", _pct(d.accept_prob_mean), f"{100 * (d.vs_overall or 0):+.1f} pts", f"{100 * (d.gain_if_best or 0):+.1f} pts")
    return g


def prompt_text(dd: DrillDown, p: PromptTokens) -> Text:
    """The prompt's scored tokens, each on a background coloured by its α."""
    t = Text()
    for j, tok in enumerate(p.tokens):
        if j and dd.joiner:
            t.append(dd.joiner)
        r, g, b = alpha_rgb(p.accept_prob[j])
        text = dd.text(tok).replace("\n", "↵\n") or "∅"
        t.append(text, style=f"black on rgb({r},{g},{b})")
    return t


def prompt_view(console: Console, dd: DrillDown, p: PromptTokens, worst: int = 8) -> None:
    console.print(Text.assemble((p.prompt_id, "bold"), f" · {p.domain} · α {_pct(p.accept_prob_mean)} · KL {_f(p.kl_target_draft_nats, '.2f')} nats · {len(p.tokens)} tokens"))
    console.print(Text("…" + p.prompt_tail[-200:], style="dim"))
    console.print(prompt_text(dd, p))
    legend = Text(" α: ")
    for a in (0.0, 0.25, 0.5, 0.75, 1.0):
        r, g, b = alpha_rgb(a)
        legend.append(f" {int(100 * a)}% ", style=f"black on rgb({r},{g},{b})")
    console.print(legend)
    grid = Grid([Column("#", justify="right"), Column("token"), Column("α", justify="right"), Column("KL", justify="right"), Column("target top-1"), Column("drafter top-1")], title=f"its {worst} lowest-α tokens")
    alpha = [a if a is not None else 1.0 for a in p.accept_prob]
    for j in sorted(range(len(p.tokens)), key=lambda j: alpha[j])[:worst]:
        grid.add(str(j), _tok(dd, p.tokens[j], 14), _pct(p.accept_prob[j]), _f(p.kl_target_draft_nats_by_token[j], ".2f"), f"{_tok(dd, p.target_top1[j], 14)} {_f(p.target_top1_prob[j], '.2f')}", f"{_tok(dd, p.draft_top1[j], 14)} {_f(p.draft_top1_prob[j], '.2f')}")
    console.print(grid)


def worst_view(console: Console, dd: DrillDown, rows: list[WorstPosition], n: int) -> None:
    for k, w in enumerate(rows[:n], 1):
        console.print(Text.assemble((f"#{k} ", "bold"), (w.prompt_id, "bold"), f" token {w.index} · α {_pct(w.accept_prob)} · KL {_f(w.kl_target_draft_nats, '.2f')} nats · {w.domain}"))
        j = dd.joiner
        console.print(Text.assemble(("  …" + w.before[-60:] + (j if w.before else ""), "dim"), (dd.text(w.token), "bold reverse"), ((j if w.after else "") + w.after[:30], "dim")))
        g = Grid([Column("#", justify="right"), Column("target top-5"), Column("p", justify="right"), Column("q", justify="right"), Column("drafter top-5"), Column("q", justify="right"), Column("p", justify="right")])
        for r in range(max(len(w.target.ids), len(w.draft.ids))):
            ti = (_tok(dd, w.target.ids[r], 16), _f(w.target.probs[r], ".2f"), _f(w.target.other_probs[r], ".2f")) if r < len(w.target.ids) else ("", "", "")
            di = (_tok(dd, w.draft.ids[r], 16), _f(w.draft.probs[r], ".2f"), _f(w.draft.other_probs[r], ".2f")) if r < len(w.draft.ids) else ("", "", "")
            g.add(str(r + 1), *ti, *di)
        console.print(g)
        console.print("")


def overview(console: Console, result: Result, dd: DrillDown, n: int) -> None:
    console.print(Text.assemble(("drill-down ", "bold"), result.describe(), f" · {dd.positions:,} positions · α {_pct(result.metric('accept_prob_mean'))}"))
    console.print(Text(f" p: the target's probability, q: the drafter's — {dd.distributions}", style="dim"))
    for grid in (what_ifs(dd), classes(dd), confusions(dd, n), domains(dd) if dd.domains else None):
        if grid is not None:
            console.print("")
            console.print(grid)
    console.print("")
    worst = ", ".join(f"{p.prompt_id} ({_pct(p.accept_prob_mean)})" for p in dd.prompts[:6])
    console.print(Text(f"lowest-α prompts: {worst}", overflow="fold"))
    console.print(Text(" more: --prompt ID (text by α) · --worst N (top-5 lists) · --confusions", style="dim"))


# ----------------------------------------------------------------------------- the command
def load_drilldown(path: Path) -> tuple[Result, DrillDown]:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.report.load import load_result

    result = load_result(path)
    if result.drilldown is None:
        why = "it stopped before scoring" if not result.scored else "it was written by a specprobe without the drill-down"
        raise InputError(f"{path} has no token-level drill-down ({why})", "re-run 'specprobe diagnose … --json FILE' with this specprobe")
    return result, result.drilldown


@handle_errors
def explain(
    result_file: Annotated[Path, typer.Argument(help="A result JSON written by 'diagnose --json' or 'simulate --json'.", metavar="RESULT.json", readable=False)],
    prompt: Annotated[str | None, typer.Option("--prompt", help="Show this prompt's text with each token coloured by α.", metavar="ID")] = None,
    worst: Annotated[int | None, typer.Option("--worst", help="Show the N worst positions with both sides' top-5 side by side.", metavar="N", min=1)] = None,
    by: Annotated[str, typer.Option("--by", help="Rank --worst by 'alpha' (lowest first) or 'kl' (highest first).")] = "alpha",
    show_confusions: Annotated[bool, typer.Option("--confusions", help="Show the ranked (target top-1 → drafter top-1) pairs and the over-proposed tokens.")] = False,
    top: Annotated[int, typer.Option("--top", help="Rows per ranked table.", min=1)] = 10,
) -> None:
    """Explain a saved result token by token: where, on what and why the drafter loses
    acceptance, and what-ifs (aligned sampling, greedy, other temperatures, vocabulary
    ceiling). Needs no model and no torch.

    Examples:

      specprobe explain out/result.json

      specprobe explain out/result.json --prompt code-3

      specprobe explain out/result.json --worst 5 --confusions
    """
    if by not in ("alpha", "kl"):
        raise typer.BadParameter(f"{by!r} is not one of alpha, kl", param_hint="--by")
    result, dd = load_drilldown(result_file)
    if prompt is not None:
        p = dd.prompt(prompt)
        if p is None:
            known = ", ".join(x.prompt_id for x in dd.prompts[:8])
            more = " (the file kept only the lowest-α prompts)" if dd.prompts_omitted else ""
            raise InputError(f"no prompt {prompt!r} in {result_file}{more}", f"use one of: {known}{', …' if len(dd.prompts) > 8 else ''}")
        prompt_view(out, dd, p)
    if worst is not None:
        worst_view(out, dd, list(dd.worst if by == "alpha" else dd.worst_kl), worst)
    if show_confusions:
        out.print(confusions(dd, top))
        out.print("")
        out.print(over_proposed(dd, top))
    if prompt is None and worst is None and not show_confusions:
        overview(out, result, dd, top)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
