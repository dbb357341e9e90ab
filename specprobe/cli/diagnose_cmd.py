"""`specprobe diagnose TARGET DRAFTER`: teacher-forced acceptance, KL, depth curves,
τ(K), speedup, rules — from flags over a probe config."""

from __future__ import annotations

from typing import Annotated

import typer

from specprobe.cli.common import (
    BatchSizeOpt,
    BatchSizesOpt,
    ConfigOpt,
    CostRatioOpt,
    CsvOpt,
    DeviceMapOpt,
    DeviceOpt,
    DomainsOpt,
    DrafterArg,
    DraftTempOpt,
    DraftTopKOpt,
    DraftTopPOpt,
    DtypeOpt,
    FailOnOpt,
    ForceOpt,
    HtmlOpt,
    JsonOpt,
    JunitOpt,
    KMaxOpt,
    MarkdownOpt,
    MaxMemoryOpt,
    MaxPromptsOpt,
    MinPOpt,
    NoCacheOpt,
    PromptsOpt,
    ReferenceOpt,
    RulesOpt,
    SeedOpt,
    SemanticsOpt,
    ShardOpt,
    TargetArg,
    TempOpt,
    TopKOpt,
    TopPOpt,
    VerifyFactorOpt,
    err,
    finish,
    gather,
    handle_errors,
    keep_partial,
    out,
)


@handle_errors
def diagnose(
    ctx: typer.Context,
    target: TargetArg = None,
    drafter: DrafterArg = None,
    prompts: PromptsOpt = "builtin",
    domains: DomainsOpt = None,
    max_prompts: MaxPromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Reference continuation length per prompt.")] = 64,
    reference: ReferenceOpt = "on-policy",
    temperature: TempOpt = None,
    draft_temperature: DraftTempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    draft_top_k: DraftTopKOpt = None,
    draft_top_p: DraftTopPOpt = None,
    sampling_semantics: SemanticsOpt = "vllm",
    seed: SeedOpt = 0,
    batch_size: BatchSizeOpt = 8,
    batch_sizes: BatchSizesOpt = None,
    k_max: KMaxOpt = 8,
    verify_factor: VerifyFactorOpt = None,
    cost_ratio: CostRatioOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    rules: RulesOpt = None,
    fail_on: FailOnOpt = "error",
    json_path: JsonOpt = None,
    csv_dir: CsvOpt = None,
    html: HtmlOpt = None,
    junit: JunitOpt = None,
    markdown: MarkdownOpt = None,
    force: ForceOpt = False,
    no_cache: NoCacheOpt = False,
    brief: Annotated[bool, typer.Option("--brief", help="Verdict and findings only.")] = False,
    shard: ShardOpt = None,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Teacher-forced diagnosis: acceptance α, KL(target‖draft), depth curves, τ(K),
    speedup per K, best K, adaptive-K threshold; by domain, entropy and context position.

    Examples:
      specprobe diagnose smollm2 self:layers=28 --temperature 0.7

      specprobe diagnose ./target ./drafter --prompts spec_bench.jsonl --json out.json --csv out/

      specprobe diagnose --config sample_configs/probe-smollm2.yaml --max-prompts 6
    """
    from specprobe.core.progress import RichProgress
    from specprobe.judge.rules import load_table
    from specprobe.probe.diagnose import load_prompt_set, run_diagnose
    from specprobe.report.console import render
    from specprobe.result import Result

    # every bad input fails here, before any model is loaded or file written
    opts = gather(ctx, "diagnose")
    table = load_table(opts.rules)
    cfg = opts.diagnose_config()
    load_prompt_set(cfg)
    from specprobe.probe.distributed import from_env

    if opts.shard is not None or from_env() is not None:  # --shard I/N, or one rank of torchrun
        from specprobe.cli.merge_cmd import diagnose_sharded

        diagnose_sharded(opts, cfg, table)
    result = Result.model_validate(run_diagnose(cfg, RichProgress(err), table=table, on_partial=keep_partial(opts)))
    finish(result, opts, lambda: render(result, out, full=not opts.brief))


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose)
