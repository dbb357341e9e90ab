"""`specprobe merge PART…`: the parts of a sharded diagnose run (`--shard I/N`) joined
into the one result a single process would have written; and the CLI side of a
sharded or torchrun diagnose run (`diagnose_sharded`).

merge reads JSON and the target's tokenizer files (the drill-down shows token texts);
it loads no weights and runs no forward pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from specprobe.cli.common import (
    ConfigOpt,
    err,
    finish,
    gather,
    handle_errors,
    out,
    takes_settings,
)
from specprobe.core.errors import ConfigError

if TYPE_CHECKING:
    from specprobe.judge.rules import RuleTable
    from specprobe.settings.options import RunOptions
    from specprobe.settings.pipeline import DiagnoseConfig


@takes_settings("merge")
@handle_errors
def merge(
    ctx: typer.Context,
    parts: Annotated[list[Path], typer.Argument(help="Every part of one run: the files `diagnose --shard I/N --json PART` wrote.", metavar="PART…", readable=False)],
    config: ConfigOpt = None,
) -> None:
    """Join the parts of a sharded diagnose run into one result — the same one a
    single process would have written (accumulators merged, per-position rows and
    drill-down rebuilt in the single run's order). Refuses parts of different runs
    (settings, models, prompts) and a missing or repeated shard.

    Examples:
      specprobe diagnose smollm2 self:layers=28 --shard 0/2 --json part0.json

      specprobe diagnose smollm2 self:layers=28 --shard 1/2 --json part1.json

      specprobe merge part0.json part1.json --json result.json --html report.html

      specprobe merge part0.json part1.json --config probe.yaml   (its outputs, rules and fail_on)
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import InputPath
    from specprobe.probe.shards import load_part, result_from_parts
    from specprobe.report.console import render
    from specprobe.result import Result

    opts = gather(ctx, "merge", inputs=[InputPath("PART", p) for p in parts])
    loaded = [load_part(p) for p in parts]
    result = Result.model_validate(result_from_parts(loaded, rules=[str(r) for r in opts.rules]))
    err.print(f"merged {len(loaded)} parts ({result.metrics.get('num_prompts')} items, {result.metrics.get('num_positions')} positions)", highlight=False)
    finish(result, opts, lambda: render(result, out, full=not opts.brief))


# ----------------------------------------------------------------------------- diagnose, sharded
def diagnose_sharded(opts: RunOptions, cfg: DiagnoseConfig, table: RuleTable) -> NoReturn:
    """`diagnose --shard I/N`: score one shard and write its part to --json (reports
    come from the merged result). Under torchrun: join the process group, score this
    rank's shard, and let rank 0 print and write the one result; other ranks write
    nothing."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.progress import Progress, RichProgress
    from specprobe.probe import distributed
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.report.console import render
    from specprobe.result import Result

    if opts.shard is not None:
        if opts.json_path is None:
            raise ConfigError("--shard needs --json PART.json: the shard's part is written there", "e.g. --shard 0/4 --json part0.json, then specprobe merge part*.json --json result.json")
        extra = [o.origin for o in opts.outputs() if o.origin != opts.where("json_path")]
        if extra:
            raise ConfigError(f"--shard writes a part, not reports ({', '.join(extra)} given)", "write reports from the merged result: specprobe merge PART… --html …")
        cfg.shard, cfg.part_path = opts.shard, str(opts.json_path)
        result = Result.model_validate(run_diagnose(cfg, RichProgress(err), table=table))
        err.print(f"wrote part {cfg.shard[0]}/{cfg.shard[1]} to {opts.json_path} ({result.metrics.get('num_prompts')} items of this shard; merge every part for the result)", highlight=False, soft_wrap=True)
        raise typer.Exit(130 if result.interrupted else 0)
    rank, world, cfg.device = distributed.setup(cfg.device)
    cfg.shard = (rank, world)
    try:
        result = Result.model_validate(run_diagnose(cfg, RichProgress(err) if rank == 0 else Progress(), table=table))
    finally:
        distributed.teardown()
    if rank != 0:
        raise typer.Exit(0)
    finish(result, opts, lambda: render(result, out, full=not opts.brief))


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)


