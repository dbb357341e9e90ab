"""`specprobe export RESULT.json --engine E [--k K] [--synthetic] [-o FILE]`: the engine's
serving config for the result's recommendation; `--training specforge|speculators -o DIR`:
retraining data where the drafter is weakest.

The serving-config export reads JSON only and never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specprobe.cli.common import err, gather, handle_errors, takes_settings
from specprobe.engines import ENGINES, get


@takes_settings("export")
@handle_errors
def export(
    ctx: typer.Context,
    result_file: Annotated[Path, typer.Argument(help="A result JSON written by 'diagnose --json' or 'simulate --json'.", metavar="RESULT.json", readable=False)],
    export_out: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write: the config file (default: stdout), or the folder for --training.", metavar="FILE|DIR", show_default=False)] = None,
    write_draft: Annotated[Path | None, typer.Option("--write-draft", help="For a layer-skip self-draft (self:layers=N), which no engine runs as such: write the target's first N layers, final norm and LM head into DIR as a checkpoint of its own, and export it as the draft model.", metavar="DIR", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Write the serving config even where the result predicts it slower than plain decoding (speedup below 1×, SP301); without it such an export is refused with exit code 1.")] = False,
) -> None:
    """Turn a result into something to run: the engine's config for the recommended K, its synthetic-acceptance form, or retraining data.

    --engine writes vLLM's --speculative-config JSON (a 'vllm serve --config' YAML when -o ends in .yaml), an SGLang launch YAML, a llama-server args file or a TensorRT-LLM speculative_config YAML, with the adaptive threshold in the engine's own knob (llama.cpp --spec-draft-p-min, when adaptive K beats the fixed K), a per-batch-size schedule where the result timed several batch sizes, and TensorRT-LLM's acceptance floor; the numbers it rests on are named in comments (and on stderr). Models are named as files the engine opens: for llama.cpp a built-in's GGUF, or a Hugging Face folder's GGUF with the conversion command that must run first; for vLLM a built-in or GGUF as the checkpoint folder specprobe dequantised it into.

    Examples:

      specprobe export result.json --engine vllm -o spec.json


      specprobe export result.json --engine llama.cpp --synthetic -o synth.args


      specprobe export result.json --training specforge -o retrain/ --budget 200
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.errors import ConfigError
    from specprobe.core.files import InputPath, OutputPath, check_outputs, write_text_atomic
    from specprobe.report.load import load_result
    from specprobe.settings.model import check

    opts = gather(ctx, "export", inputs=[InputPath("RESULT.json", result_file)])
    engine, training, synthetic = opts.engine, opts.training, opts.synthetic
    ks = opts.k
    if ks is not None and len(ks) != 1:
        raise ConfigError(f"--k {','.join(map(str, ks))}: export writes one K", "pass one draft length, e.g. --k 3")
    k = ks[0] if ks else None
    if (engine is None) == (training is None):
        raise ConfigError("export needs one of --engine (a serving config) or --training (retraining data)", "e.g. specprobe export result.json --engine vllm, or --training specforge -o DIR")
    if training is not None:
        if export_out is None:
            raise ConfigError("--training writes a folder", "give it with -o DIR")
        if synthetic or k is not None or opts.tree is not None:
            raise ConfigError(f"--training takes neither {'--synthetic' if synthetic else '--k' if k is not None else '--tree'}", "leave it out, or export a serving config with --engine")
    check("engine", engine, "--engine")
    if engine is not None and not get(engine).serving_config:
        raise ConfigError(f"--engine {engine} has no serving config", "use " + ", ".join(e.name for e in ENGINES if e.serving_config))
    # every output checked, and kept off the input, before anything is read or written
    outs = [OutputPath("--output", export_out, "dir" if training else "file")] if export_out is not None else []
    if write_draft is not None:
        outs.append(OutputPath("--write-draft", write_draft, "dir"))
    if outs:
        check_outputs(outs, [InputPath("RESULT.json", result_file)])
    if write_draft is not None:
        from specprobe.models.cut import check_draft_folder

        check_draft_folder(write_draft)  # never a folder of the user's files: the cut replaces its folder whole
    result = load_result(result_file)

    if training is not None:
        from specprobe.export.training import export_training

        written = export_training(result, result_file, training, export_out, opts.budget, progress_note=lambda m: err.print(m, highlight=False))  # type: ignore[arg-type]
        err.print(f"wrote {len(written)} files into {export_out}", highlight=False, soft_wrap=True)
        return

    from specprobe.export.serving import export_config, slower_than_plain

    ex = export_config(result, result_file, engine, k=k, synthetic=synthetic, output=export_out, tree=opts.tree, tree_given=opts.origins.get("tree", "default") != "default", draft_folder=write_draft)
    slow = slower_than_plain(ex)
    if slow is not None and not force:
        err.print(f"[bold red]refused:[/] {slow}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if slow is not None:
        ex = export_config(result, result_file, engine, k=k, synthetic=synthetic, output=export_out, tree=opts.tree, tree_given=opts.origins.get("tree", "default") != "default", forced=True, draft_folder=write_draft)
    if write_draft is not None:
        from specprobe.export.serving import write_draft as write_draft_folder

        err.print(f"writing the draft checkpoint into {write_draft}", highlight=False)
        write_draft_folder(result, write_draft)
    for line in ex.note:
        err.print(f"note: {line}", highlight=False, soft_wrap=True)
    if export_out is None:
        typer.echo(ex.text, nl=False)
    else:
        write_text_atomic(export_out, ex.text)
        err.print(f"wrote {export_out}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
