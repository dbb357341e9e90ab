"""`specprobe report RESULT.json`: re-render a saved diagnose/simulate result.

Reads JSON only, so it must never import torch or transformers: it runs where the
models are not (a CI artifact viewer, a laptop). Heavy-ish imports (pandas for CSV)
load only when their output is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specprobe.cli.common import check_fail_on, err, handle_errors, out

SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", None: "green"}

HtmlOpt = Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report (inline CSS and SVG; opens offline).")]
JunitOpt = Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML: one testcase per rule evaluated.")]
MarkdownOpt = Annotated[Path | None, typer.Option("--markdown", help="Write a Markdown summary (for $GITHUB_STEP_SUMMARY or a PR comment).")]


def _check_optional_fail_on(value: str | None) -> str | None:
    return None if value is None else check_fail_on(value)


def print_summary(result: Mapping[str, Any]) -> None:
    """Verdict, findings table and key metrics of a diagnose/simulate result."""
    from specprobe.catalog import CATALOG, format_value
    from specprobe.report.load import describe, measured, num

    sev = result.get("worst_severity")
    out.print(f"[bold]{describe(result)}[/]  [dim]({result.get('command')}, {result.get('created')})[/]")
    out.print(f"verdict: [{SEV_STYLE.get(sev, 'bold')}]{result.get('verdict')}[/]")
    findings = result.get("findings") or []
    if findings:
        t = Table(show_header=True, header_style="bold", expand=False)
        for col in ("rule", "severity", "diagnosis", "remedy"):
            t.add_column(col, overflow="fold")
        for f in findings:
            s = f.get("severity")
            t.add_row(f"{f.get('rule_id')} {f.get('name')}", f"[{SEV_STYLE.get(s, '')}]{s}[/]", str(f.get("message")), str(f.get("remedy")))
        out.print(t)
    else:
        out.print("[green]no findings[/]")
    m = result.get("metrics") or {}
    names = ["accept_prob_mean", "kl_target_draft_nats", "greedy_agree_frac", "accept_prob_domain_min", "tau_tokens", "best_k", "speedup_best", "cost_ratio", "num_prompts", "num_positions"]
    t = Table(title="key metrics (estimates from teacher forcing)", show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for n in names:
        if n in m:
            v = num(m.get(n))
            unit = CATALOG[n].unit if n in CATALOG else ""
            t.add_row(n, "n/a" if v is None else format_value(n, int(v) if unit in ("count", "bool") else v))
    out.print(t)
    mk = measured(result).get("k_table") or []
    if mk:
        best = max(mk, key=lambda r: num(r.get("speedup")) or -1.0)
        out.print(f"measured (real draft→verify loop): best K={best.get('k')} τ={num(best.get('tau_tokens')) or 0:.2f} speedup {num(best.get('speedup')) or 0:.2f}×")


def write_outputs(result: Mapping[str, Any], *, html: Path | None, csv: Path | None, junit: Path | None, markdown: Path | None, fail_on: str | None) -> None:
    """Render each asked-for format; shared by `report` and `compare`."""
    from specprobe.report.load import write_text_atomic

    is_compare = result.get("command") == "compare"
    if html is not None:
        from specprobe.report.html import render_compare_html, render_html

        write_text_atomic(html, render_compare_html(result) if is_compare else render_html(result))
        err.print(f"wrote {html}")
    if csv is not None:
        from specprobe.report.csv_out import write_csv

        paths = write_csv(result, csv)
        err.print(f"wrote {len(paths)} CSV tables into {csv}")
    if junit is not None:
        from specprobe.report.junit import render_junit

        write_text_atomic(junit, render_junit(result, fail_on=fail_on))
        err.print(f"wrote {junit}")
    if markdown is not None:
        from specprobe.report.markdown import render_markdown

        write_text_atomic(markdown, render_markdown(result, fail_on=fail_on))
        err.print(f"wrote {markdown}")


@handle_errors
def report(
    result_file: Annotated[Path, typer.Argument(help="A result JSON written by 'diagnose --json' or 'simulate --json'.", metavar="RESULT.json")],
    html: HtmlOpt = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write CSV tables into this folder.")] = None,
    junit: JunitOpt = None,
    markdown: MarkdownOpt = None,
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity (error | warning | info | never). Default: only render, exit 0; JUnit uses the run's own --fail-on.", callback=_check_optional_fail_on),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the summary.")] = False,
) -> None:
    """Re-render a saved result as HTML, CSV, JUnit XML or Markdown, and print its summary.

    Needs no model and no torch: run it anywhere the JSON is.

    Examples:

      specprobe report out/result.json --html out/report.html


      specprobe report out/result.json --junit junit.xml --markdown "$GITHUB_STEP_SUMMARY" --fail-on error
    """
    from specprobe.report.load import gate_exit_code, load_result

    result = load_result(result_file)
    if not quiet:
        print_summary(result)
    gate = fail_on or (result.get("config") or {}).get("fail_on") or "error"
    write_outputs(result, html=html, csv=csv, junit=junit, markdown=markdown, fail_on=gate)
    if fail_on is not None:
        raise typer.Exit(gate_exit_code(result, fail_on))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
