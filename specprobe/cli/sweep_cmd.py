"""`specprobe sweep TARGET [DRAFTER ...] --layers 16..29`: several drafters scored on one
set of references (generated once) with one target pass per batch; a table of α, KL,
cost ratio, τ and speedup per K, and the best one recommended."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from specprobe.cli.common import (
    ConfigOpt,
    err,
    handle_errors,
    out,
    takes_settings,
)
from specprobe.core.errors import ConfigError
from specprobe.report.fmt import EM_DASH, fixed, metric_se, pct, plus_minus
from specprobe.report.terminal import Column, Grid
from specprobe.settings.model import OUTPUTS_PANEL, PAIR


def render_sweep(report: object, console: Console) -> None:
    """The sweep table (one row per drafter, the recommended one marked) and speedup by K."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.probe.sweep import SweepReport

    assert isinstance(report, SweepReport)
    g = Grid(
        [
            Column("drafter"),
            Column("α accept", "α", "right", "drop", 1),  # none for an n-gram drafter: gives way after KL
            Column("KL nats", "KL", "right", "drop", 2),
            Column("cost ratio", "c", "right"),
            Column("best K", "K", "right"),
            Column("τ(K) ± SE", "τ(K)", "right"),
            Column("speedup ± SE", "×", "right"),
            Column("verdict", fallback="drop", order=3),
        ],
        title=f"sweep: {len(report.rows)} drafters against {report.target} · {report.num_prompts} prompts, {report.num_positions:,} positions ({report.reference}) · {report.target_passes} target passes",
    )
    for r in report.rows:
        mark = "bold green" if r.drafter == report.recommended else ""
        g.add(
            ("▶ " if r.drafter == report.recommended else "  ") + r.drafter, pct(r.accept_prob_mean, none=EM_DASH), fixed(r.kl_target_draft_nats, ".3f", none=EM_DASH),
            fixed(r.cost_ratio, ".3f", none=EM_DASH) + ("" if r.cost_measured or r.cost_ratio is None else "*"), str(r.best_k or EM_DASH),
            plus_minus(r.tau_tokens, r.tau_tokens_se, none=EM_DASH), metric_se("speedup_best", r.speedup_best, r.speedup_best_se, none=EM_DASH), r.stopped and "stopped: alignment errors" or r.verdict, style=mark,
        )
    console.print(g)
    # drafters with a draft length of their own (llama.cpp's n-gram types, suffix decoding)
    # have one K, shown above: the table is the drafters that take the run's K
    by_k = [r for r in report.rows if sum(v is not None for v in r.speedup_by_k) > 1]
    ks = max((len(r.speedup_by_k) for r in by_k), default=0)
    if ks:
        s = Grid([Column("drafter"), *(Column(f"K={k}", justify="right", fallback="drop" if k > 4 else "keep", order=k) for k in range(1, ks + 1))], title="estimated speedup by draft length K")
        for r in by_k:
            s.add(r.drafter, *(fixed(v, ".2f", none=EM_DASH) for v in r.speedup_by_k), *([EM_DASH] * (ks - len(r.speedup_by_k))))
        console.print("")
        console.print(s)
    if any(r.tree_best is not None or r.tree_tau_tokens is not None for r in report.rows):
        t = Grid([Column("drafter"), Column("tree τ", justify="right"), Column("tree speedup", "tree ×", "right"), Column("best tree"), Column("best tree speedup", "best ×", "right")],
                 title="draft trees (the run's tree; the best of each drafter's grid)")
        for r in report.rows:
            t.add(r.drafter, fixed(r.tree_tau_tokens, ".2f", none=EM_DASH), fixed(r.tree_speedup, ".2f", none=EM_DASH) + ("×" if r.tree_speedup is not None else ""),
                  r.tree_best or EM_DASH, fixed(r.tree_best_speedup, ".2f", none=EM_DASH) + ("×" if r.tree_best_speedup is not None else ""))
        console.print("")
        console.print(t)
    if any(not r.cost_measured and r.cost_ratio is not None for r in report.rows):
        console.print(Text(" * cost ratio given (--cost-ratio), not timed", style="dim"))
    if report.recommended:
        console.print(Text.assemble(("recommended: ", "bold"), (report.recommended, "bold green"), " (highest estimated speedup; confirm with 'specprobe simulate')"))
    else:
        console.print(Text("no drafter could be recommended (nothing was scored)", style="yellow"))
    render_groups(report, console)


def group_grid(report: object, scope: str) -> Grid:
    """One row per domain (or category): the fastest drafter there, its speedup and K, and
    the runner-up."""
    from specprobe.probe.sweep import SweepReport

    assert isinstance(report, SweepReport)
    g = Grid(
        [
            Column(scope),
            Column("tokens", None, "right", "drop", 1),
            Column("fastest"),
            Column("speedup", "×", "right"),
            Column("K", justify="right"),
            Column("runner-up", fallback="under", order=2, label="runner-up: "),
        ],
        title=f"fastest drafter by {'the prompt file' + chr(39) + 's category' if scope == 'category' else 'domain'} (each at the K best there)",
    )
    for grp in (x for x in report.by_group if x.scope == scope):
        ranked = sorted((e for e in grp.drafters if e.speedup is not None), key=lambda e: -(e.speedup or 0.0))
        best = next((e for e in ranked if e.drafter == grp.recommended), None)
        second = next((e for e in ranked if e.drafter != grp.recommended), None)
        g.add(
            grp.group, f"{grp.positions:,}", best.drafter if best else EM_DASH, fixed(best.speedup if best else None, ".2f", none=EM_DASH) + "×", str(best.best_k) if best else EM_DASH,
            f"{second.drafter} {fixed(second.speedup, '.2f', none=EM_DASH)}× (K={second.best_k})" if second else "",
            style="bold green" if best and best.drafter != report.recommended else "",
        )
    return g


def render_groups(report: object, console: Console) -> None:
    """The per-group table for the scope the advice reads, and the advice in one line."""
    from specprobe.probe.sweep import SweepReport

    assert isinstance(report, SweepReport)
    scope = report.advice_scope()
    advice = report.advice(scope)
    if not advice or len(report.rows) < 2:
        return
    console.print("")
    console.print(group_grid(report, scope))
    if len(advice) == 1 and advice[0][0] == report.recommended:
        console.print(Text(f"by {scope}: {report.recommended} is the fastest in every {scope}", style="dim"), highlight=False)
        return
    said = "; ".join(f"{d} for {', '.join(gs)}" for d, gs in advice)
    console.print(Text.assemble(("by " + scope + ": ", "bold"), f"use {said} (highest estimated speedup in each; confirm with 'specprobe simulate')"), highlight=False)


@takes_settings("sweep")
@handle_errors
def sweep(
    ctx: typer.Context,
    drafters: Annotated[list[str] | None, typer.Argument(help="Drafters to compare (checkpoint folders, .gguf files, 'self:layers=N', heads).", metavar="[DRAFTER]...", show_default=False, rich_help_panel=PAIR)] = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Self-draft depths to add: a range '16..29' and/or a list '20,24,28' (self:layers=N each).", metavar="RANGE", rich_help_panel=PAIR)] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the sweep table as JSON to this file.", metavar="FILE", show_default=False, rich_help_panel=OUTPUTS_PANEL)] = None,
    results_dir: Annotated[Path | None, typer.Option("--results", help="Also write each drafter's full diagnose result (for 'report' and 'explain') into this folder.", metavar="DIR", show_default=False, rich_help_panel=OUTPUTS_PANEL)] = None,
    config: ConfigOpt = None,
) -> None:
    """Score several drafters on ONE set of references with one target pass per batch:
    α, KL, cost ratio, τ and speedup per K for each, and the best recommended.

    Examples:

      specprobe sweep smollm2 --layers 16..29 --temperature 0.7 --max-prompts 24

      specprobe sweep ./target ./draft-a ./draft-b self:layers=20 --json sweep.json --results out/ --html sweep.html

    Exit code: 1 when the recommended drafter has a finding at or above --fail-on (or no
    drafter could be recommended), as diagnose's gate on that drafter.
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import write_text_atomic
    from specprobe.core.progress import RichProgress
    from specprobe.judge.rules import load_table
    from specprobe.probe.sweep import parse_layers, run_sweep
    from specprobe.report.load import gate_exit_code
    from specprobe.settings.options import DIAGNOSE, merge

    specs = list(drafters or []) + [f"self:layers={n}" for n in (parse_layers(layers) if layers else [])]
    if not specs:
        raise ConfigError("sweep needs drafters to compare", "give DRAFTER arguments and/or --layers, e.g. specprobe sweep smollm2 --layers 16..29")
    if len(set(specs)) != len(specs):
        raise ConfigError("a drafter is listed twice", "list each drafter once")
    if results_dir is not None and results_dir.exists() and not results_dir.is_dir():
        raise ConfigError(f"--results {results_dir} is a file, not a folder", "give a folder to write the results into")
    # the diagnose options machinery validates the shared flags (and reads --config)
    params = {k: v for k, v in ctx.params.items() if k not in ("drafters", "layers", "json_path", "results_dir")}
    given = {k for k in params if (src := ctx.get_parameter_source(k)) is not None and src.name == "COMMANDLINE"}
    opts = merge(DIAGNOSE, {**params, "drafter": specs[0]}, given, config)
    cfg = opts.diagnose_config(keep_positions=False)
    table = load_table(opts.rules)
    sw = run_sweep(cfg, specs, RichProgress(err), table=table)
    render_sweep(sw.report, out)
    if json_path is not None:
        write_text_atomic(json_path, sw.report.to_json())
        err.print(f"wrote {json_path}", highlight=False, soft_wrap=True)
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        for r in sw.results:
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in r.drafter.spec).strip("_") or "drafter"
            write_text_atomic(results_dir / f"{name}.json", r.to_json())
        err.print(f"wrote {len(sw.results)} results into {results_dir}", highlight=False, soft_wrap=True)
    if opts.csv_dir is not None:
        from specprobe.report.csv_out import write_sweep_csv

        write_sweep_csv(sw.report, opts.csv_dir)
        err.print(f"wrote the sweep table into {opts.csv_dir}", highlight=False, soft_wrap=True)
    if opts.html is not None:
        from specprobe.report.html import render_sweep_html

        write_text_atomic(opts.html, render_sweep_html(sw.report))
        err.print(f"wrote {opts.html}", highlight=False, soft_wrap=True)
    if sw.report.interrupted:
        raise typer.Exit(130)
    # the gate: the drafter the sweep recommends, as one would deploy it
    best = next((r for r in sw.results if r.drafter.spec == sw.report.recommended), None)
    if best is None:
        raise typer.Exit(0 if opts.fail_on == "never" else 1)
    raise typer.Exit(gate_exit_code(best, opts.fail_on))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
