"""`specprobe simulate TARGET DRAFTER`: real speculative decoding (draft→verify with
rejection sampling) on the same prompts as `diagnose`, measured next to its
teacher-forced estimate, with the SP6xx calibration rules on top."""

from __future__ import annotations

from typing import Annotated

import typer

from specprobe.cli.common import (
    BatchSizesOpt,
    ConfigOpt,
    CostRatioOpt,
    CsvOpt,
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
    MaxPromptsOpt,
    MinPOpt,
    NoCacheOpt,
    PromptsOpt,
    ReferenceOpt,
    RulesOpt,
    SeedOpt,
    SemanticsOpt,
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
def simulate(
    ctx: typer.Context,
    target: TargetArg = None,
    drafter: DrafterArg = None,
    k: Annotated[str, typer.Option("--k", help="Draft lengths to measure, comma-separated (each at most 32).")] = "1,2,4",
    adaptive_threshold: Annotated[float | None, typer.Option("--adaptive-threshold", help="Also measure adaptive K: stop drafting at the first depth whose drafter confidence max q is below this.")] = None,
    prompts: PromptsOpt = "builtin",
    domains: DomainsOpt = None,
    max_prompts: MaxPromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt (and reference length for the estimate).")] = 64,
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
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts decoded together; each row advances by its own accepted count.")] = 8,
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
    config: ConfigOpt = None,
) -> None:
    """Real speculative decoding, measured: τ, acceptance per draft position, tokens/s
    and speedup against plain target decoding for each K — next to diagnose's
    teacher-forced estimate on the same prompts, with the gap between them.

    Examples:
      specprobe simulate smollm2 self:layers=28 --temperature 0.7 --k 1,2,4 --max-prompts 8

      specprobe simulate ./target ./drafter --k 2,4,6 --adaptive-threshold 0.4 --json sim.json --csv sim/

      specprobe simulate --config sample_configs/probe-smollm2.yaml --k 2,4
    """
    from specprobe.core.progress import RichProgress
    from specprobe.judge.rules import load_table
    from specprobe.probe.diagnose import load_prompt_set
    from specprobe.report.console import measured_tables, render
    from specprobe.simulate import run_simulate

    # every bad input fails here, before any model is loaded or file written
    opts = gather(ctx, "simulate")
    table = load_table(opts.rules)
    cfg = opts.simulate_config()
    load_prompt_set(cfg.diagnose)
    result = run_simulate(cfg, RichProgress(err), table=table, on_partial=keep_partial(opts))

    def show() -> None:
        render(result, out)
        measured_tables(result, out)

    finish(result, opts, show)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)

