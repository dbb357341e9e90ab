"""`specprobe diagnose TARGET DRAFTER`: teacher-forced acceptance, KL, depth curves,
τ(K), speedup, rules — from flags over a probe config."""

from __future__ import annotations

import typer

from specprobe.cli import common
from specprobe.cli.common import takes_settings


@takes_settings("diagnose")
@common.handle_errors
def diagnose(
    ctx: typer.Context,
    config: common.ConfigOpt = None,
) -> None:
    """Teacher-forced diagnosis: acceptance α, KL(target‖draft), depth curves, τ(K),
    speedup per K, best K, adaptive-K threshold; by domain, entropy and context position.

    Examples:
      specprobe diagnose smollm2 self:layers=28 --temperature 0.7

      specprobe diagnose ./target ./drafter --prompts spec_bench.jsonl --json out.json --csv out/

      specprobe diagnose --config sample_configs/probe-smollm2.yaml --max-prompts 6
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.progress import RichProgress
    from specprobe.judge.rules import load_table
    from specprobe.probe.diagnose import load_prompt_set, run_diagnose
    from specprobe.report.console import render
    from specprobe.result import Result

    # every bad input fails here, before any model is loaded or file written
    opts = common.gather(ctx, "diagnose")
    table = load_table(opts.rules)
    cfg = opts.diagnose_config()
    load_prompt_set(cfg)
    from specprobe.probe.distributed import from_env

    if opts.shard is not None or from_env() is not None:  # --shard I/N, or one rank of torchrun
        from specprobe.cli.merge_cmd import diagnose_sharded

        diagnose_sharded(opts, cfg, table)
    result = Result.model_validate(run_diagnose(cfg, RichProgress(common.err), table=table, on_partial=common.keep_partial(opts)))
    common.finish(result, opts, lambda: render(result, common.out, full=not opts.brief))


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose)
