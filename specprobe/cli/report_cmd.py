"""`specprobe report RESULT.json`: re-render a saved diagnose/simulate result.

Reads JSON only, so it must never import torch or transformers: it runs where the
models are not (a CI artifact viewer, a laptop). Heavy-ish imports (pandas for CSV)
load only when their output is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specprobe.cli.common import (
    gather,
    handle_errors,
    out,
    takes_settings,
    write_outputs,
)
from specprobe.result import Result
from specprobe.settings.model import check


def print_summary(result: Result) -> None:
    """Verdict, findings table and key metrics of a diagnose/simulate result."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.report.console import render_summary

    render_summary(result, out)


@takes_settings("report")
@handle_errors
def report(
    ctx: typer.Context,
    result_file: Annotated[Path, typer.Argument(help="A result JSON written by 'diagnose --json' or 'simulate --json'.", metavar="RESULT.json", readable=False)],
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity (error | warning | info | never). Default: only render, exit 0; JUnit uses the run's own --fail-on.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the summary.")] = False,
) -> None:
    """Re-render a saved result as HTML, CSV, JUnit XML or Markdown, and print its summary.

    Needs no model and no torch: run it anywhere the JSON is.

    Examples:

      specprobe report out/result.json --html out/report.html


      specprobe report out/result.json --junit junit.xml --markdown "$GITHUB_STEP_SUMMARY" --fail-on error
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import InputPath
    from specprobe.report.load import gate_exit_code, load_result

    check("fail_on", fail_on, "--fail-on")
    opts = gather(ctx, "report", inputs=[InputPath("RESULT.json", result_file)])  # every output checked before any is written
    result = load_result(result_file)
    if not quiet:
        print_summary(result)
    gate = fail_on or result.config.fail_on or "error"
    write_outputs(result, opts, fail_on=gate)
    if fail_on is not None:
        raise typer.Exit(gate_exit_code(result, fail_on))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
