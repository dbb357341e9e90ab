"""`specprobe compare BASELINE.json CANDIDATE.json`: the drafter-release regression gate.

Reads two saved results (no torch), computes deltas and compare metrics, judges them
with the SP5xx rules of the rules table, prints the verdict, writes the asked-for
reports, and exits 1 when a regression is at or above --fail-on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specprobe.cli.common import (
    ConfigOpt,
    gather,
    handle_errors,
    out,
    takes_settings,
    write_outputs,
)
from specprobe.settings.model import GATE


@takes_settings("compare")
@handle_errors
def compare(
    ctx: typer.Context,
    baseline: Annotated[Path | None, typer.Argument(help="The baseline result JSON (the drafter in production). Default: the --config file's baseline.", metavar="BASELINE.json", show_default=False, readable=False)] = None,
    candidate: Annotated[Path | None, typer.Argument(help="The candidate result JSON (the release under test). Default: the --config file's outputs.json, where its diagnose run writes.", metavar="CANDIDATE.json", show_default=False, readable=False)] = None,
    allow_target_change: Annotated[bool, typer.Option("--allow-target-change", help="Compare even when the two were measured on different target models.", rich_help_panel=GATE)] = False,
    allow_prompt_change: Annotated[bool, typer.Option("--allow-prompt-change", help="Compare even when the two used different prompt sets.", rich_help_panel=GATE)] = False,
    allow_procedure_change: Annotated[bool, typer.Option("--allow-procedure-change", help="Compare even when one result follows greedy drafts and the other sampled ones (--draft-sampling).", rich_help_panel=GATE)] = False,
    config: ConfigOpt = None,
) -> None:
    """Compare a candidate drafter's result against a baseline's; exit 1 on a regression.

    Judged by the SP5xx rules ('specprobe rules list --family 5'): acceptance dropped more than 20% relative; a domain fell below 70% while the overall rate held; the depth curve decays faster; KL rose past a band boundary; τ fell more than 15% at the compared K (the baseline's best K, or --k: never each side's own best K, which a cost timing can move) and beyond two standard errors of the difference — a fall within them is reported as within noise (SP506, info), not as a regression. Every change of τ, acceptance and speedup is printed with its standard error over prompts where the results carry one. Results from another target model or prompt set, or whose acceptance follows another drafting (greedy against sampled drafts), are refused unless allowed; another engine's procedure with the same drafting is noted.

    With --config, the probe config's baseline is the baseline and its outputs.json (what its diagnose run wrote) the candidate; its rules and fail_on apply unless given here.

    Examples:

      specprobe compare baseline.json candidate.json --fail-on warning


      specprobe compare prod.json new.json --html compare.html --junit compare.xml --markdown "$GITHUB_STEP_SUMMARY"


      specprobe compare --config sample_configs/probe-smollm2.yaml
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.errors import ConfigError
    from specprobe.judge.compare import compare_results, judge
    from specprobe.judge.rules import load_table
    from specprobe.report.console import render_comparison
    from specprobe.report.load import gate_exit_code, load_result

    opts = gather(ctx, "compare")  # every output checked, and kept off both results, before anything is read or written
    if opts.baseline is None or opts.candidate is None:
        raise ConfigError("compare needs a BASELINE.json and a CANDIDATE.json", "give them as arguments, or a --config file with baseline and outputs.json")
    table = load_table(opts.rules)
    base = load_result(opts.baseline)
    cand = load_result(opts.candidate)
    ks = opts.k if opts.origins.get("k", "default") != "default" else None  # --k or the config's k
    comparison = compare_results(
        base, cand, table=table, allow_target_change=allow_target_change, allow_prompt_change=allow_prompt_change, allow_procedure_change=allow_procedure_change, files=(str(opts.baseline), str(opts.candidate)), ks=ks,
    )
    comparison = judge(comparison, table, fail_on=opts.fail_on)
    render_comparison(comparison, out)
    write_outputs(comparison, opts, fail_on=opts.fail_on)
    raise typer.Exit(gate_exit_code(comparison, opts.fail_on))


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
