"""`specprobe simulate TARGET DRAFTER`: real speculative decoding (draft→verify as the
--engine does it: greedy drafts verified by rejection sampling or by sample-and-compare,
or sampled drafts) on the same prompts as `diagnose`, measured next to its teacher-forced
estimate, with the SP6xx calibration rules on top."""

from __future__ import annotations

import typer

from specprobe.cli import common
from specprobe.cli.common import takes_settings


@takes_settings("simulate")
@common.handle_errors
def simulate(
    ctx: typer.Context,
    config: common.ConfigOpt = None,
) -> None:
    """Real speculative decoding, measured: τ, acceptance per draft position, tokens/s
    and speedup against plain target decoding for each K — next to diagnose's
    teacher-forced estimate on the same prompts, with the gap between them. Drafts are
    made and verified as the --engine does it (vLLM by default: greedy drafts, each
    accepted with the target's probability of it).

    Examples:
      specprobe simulate smollm2 self:layers=28 --temperature 0.7 --k 1,2,4 --max-prompts 8

      specprobe simulate ./target ./drafter --k 2,4,6 --adaptive-threshold 0.4 --json sim.json --csv sim/

      specprobe simulate --config sample_configs/probe-smollm2.yaml --k 2,4
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.progress import RichProgress
    from specprobe.judge.rules import load_table
    from specprobe.probe.diagnose import load_prompt_set
    from specprobe.report.console import measured_tables, render
    from specprobe.simulate import run_simulate

    # every bad input fails here, before any model is loaded or file written
    opts = common.gather(ctx, "simulate")
    table = load_table(opts.rules)
    cfg = opts.simulate_config()
    load_prompt_set(cfg.diagnose)
    result = run_simulate(cfg, RichProgress(common.err), table=table, on_partial=common.keep_partial(opts))

    def show() -> None:
        render(result, common.out, full=not opts.brief)
        if not opts.brief:
            measured_tables(result, common.out)

    common.finish(result, opts, show)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)

