"""`specprobe compare BASELINE.json CANDIDATE.json`: the drafter-release regression gate.

Reads two saved results (no torch), computes deltas and compare metrics, judges them
with the SP5xx rules of the rules table, prints the verdict, writes the asked-for
reports, and exits 1 when a regression is at or above --fail-on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specprobe.cli.common import FailOnOpt, JsonOpt, RulesOpt, handle_errors, out
from specprobe.cli.report_cmd import SEV_STYLE, HtmlOpt, JunitOpt, MarkdownOpt, write_outputs


@handle_errors
def compare(
    baseline: Annotated[Path, typer.Argument(help="The baseline result JSON (the drafter in production).", metavar="BASELINE.json")],
    candidate: Annotated[Path, typer.Argument(help="The candidate result JSON (the release under test).", metavar="CANDIDATE.json")],
    fail_on: FailOnOpt = "error",
    rules: RulesOpt = None,
    html: HtmlOpt = None,
    markdown: MarkdownOpt = None,
    junit: JunitOpt = None,
    json_out: JsonOpt = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write the delta tables as CSV into this folder.")] = None,
    allow_target_change: Annotated[bool, typer.Option("--allow-target-change", help="Compare even when the two were measured on different target models.")] = False,
    allow_prompt_change: Annotated[bool, typer.Option("--allow-prompt-change", help="Compare even when the two used different prompt sets.")] = False,
) -> None:
    """Compare a candidate drafter's result against a baseline's; exit 1 on a regression.

    Judged by the SP5xx rules ('specprobe rules list --family 5'): acceptance dropped more than 20% relative; a domain fell below 70% while the overall rate held; the depth curve decays faster; KL rose past a band boundary. Results from another target model or prompt set are refused unless allowed.

    Examples:

      specprobe compare baseline.json candidate.json --fail-on warning


      specprobe compare prod.json new.json --html compare.html --junit compare.xml --markdown "$GITHUB_STEP_SUMMARY"
    """
    from specprobe.catalog import CATALOG, format_value
    from specprobe.compare import compare_results, judge
    from specprobe.report.load import (
        gate_exit_code,
        load_result,
        num,
        to_json_text,
        write_text_atomic,
    )
    from specprobe.rules import load_table

    table = load_table(rules or [])
    base = load_result(baseline)
    cand = load_result(candidate)
    comparison = compare_results(base, cand, table=table, allow_target_change=allow_target_change, allow_prompt_change=allow_prompt_change)
    comparison = judge(comparison, table, fail_on=fail_on)
    comparison["config"].update({"baseline": str(baseline), "candidate": str(candidate), "allow_target_change": allow_target_change, "allow_prompt_change": allow_prompt_change})

    b, c = comparison["baseline"], comparison["candidate"]
    out.print(f"[bold]{c['drafter']}[/] against baseline [bold]{b['drafter']}[/] on {c['target_name'] or c['target']}")
    for note in comparison["notes"]:
        out.print(f"[dim]note: {note}[/]")
    sev = comparison["worst_severity"]
    out.print(f"verdict: [{SEV_STYLE.get(sev, 'bold')}]{comparison['verdict']}[/]")
    if comparison["findings"]:
        t = Table(show_header=True, header_style="bold")
        for col in ("rule", "severity", "diagnosis", "remedy"):
            t.add_column(col, overflow="fold")
        for f in comparison["findings"]:
            t.add_row(f"{f['rule_id']} {f['name']}", f"[{SEV_STYLE.get(f['severity'], '')}]{f['severity']}[/]", f["message"], f["remedy"])
        out.print(t)
    t = Table(title="overall", show_header=True, header_style="bold")
    for col, just in (("metric", "left"), ("baseline", "right"), ("candidate", "right"), ("relative", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in comparison["overall"]:
        name = r["metric"]
        unit = CATALOG[name].unit if name in CATALOG else ""

        def show(v: object, name: str = name, unit: str = unit) -> str:
            x = num(v)
            return "n/a" if x is None else format_value(name, int(x) if unit in ("count", "bool") else x)

        rel = num(r["rel_change"])
        style = "red" if r["worse"] and rel is not None and abs(rel) >= 0.05 else ""
        t.add_row(name, show(r["baseline"]), show(r["candidate"]), f"[{style}]{100 * rel:+.1f}%[/]" if rel is not None and style else ("n/a" if rel is None else f"{100 * rel:+.1f}%"))
    out.print(t)

    if json_out is not None:
        write_text_atomic(json_out, to_json_text(comparison))
    write_outputs(comparison, html=html, csv=csv, junit=junit, markdown=markdown, fail_on=fail_on)
    raise typer.Exit(gate_exit_code(comparison, fail_on))


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
