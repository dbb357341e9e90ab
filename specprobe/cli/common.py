"""What every command shares: option aliases, the one options merge, the one place
outputs are written, the error boundary, consoles."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from specprobe.core.errors import SpecprobeError
from specprobe.core.interrupts import shielded, terminate_as_interrupt
from specprobe.report import terminal

if TYPE_CHECKING:
    from specprobe.result import Comparison, Result
    from specprobe.settings.options import RunOptions

F = TypeVar("F", bound=Callable[..., Any])

# Data goes to stdout, diagnostics (progress, errors) to stderr; both as wide as the
# terminal, COLUMNS, or a CI log (report.terminal).
out = terminal.console()
err = terminal.console(stderr=True)

FAIL_ON_CHOICES = ("error", "warning", "info", "never")


def fail(message: str, hint: str = "") -> typer.Exit:
    text = message.rstrip(".") + (f" — {hint}" if hint else "")
    err.print(f"[bold red]error:[/] {text}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def handle_errors(func: F) -> F:
    """Translate SpecprobeError into one line on stderr and exit code 2.

    SPECPROBE_DEBUG=1 re-raises so the traceback shows."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with terminate_as_interrupt():  # SIGTERM keeps what was computed, as Ctrl-C does
                return func(*args, **kwargs)
        except SpecprobeError as e:
            if os.environ.get("SPECPROBE_DEBUG") == "1":
                raise
            err.print(f"[bold red]error:[/] {e.one_line()}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def check_fail_on(value: str) -> str:
    if value not in FAIL_ON_CHOICES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FAIL_ON_CHOICES)}")
    return value


def is_tty() -> bool:
    return sys.stderr.isatty()


# ----------------------------------------------------------------------------- shared options
# Each option is one key of a probe config (specprobe.settings.options.KEYS); the help says so once.
# Output paths are parsed as text so an empty one ("$GITHUB_STEP_SUMMARY" outside CI) is
# caught by name instead of turning into the current folder.
TargetArg = Annotated[str | None, typer.Argument(help="Target model: a checkpoint folder, a .gguf file, or 'smollm2' (built-in).", metavar="TARGET", show_default=False)]
DrafterArg = Annotated[str | None, typer.Argument(help="Drafter: a checkpoint folder, a .gguf file, 'smollm2', 'self' or 'self:layers=N'.", metavar="DRAFTER", show_default=False)]
# Input paths are read by specprobe itself (readable=False: not click's usage box), so an
# unreadable file is one line naming the file, the reason and what to do, like any other.
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Probe config file (YAML or TOML); flags given on the command line override it.", metavar="FILE", readable=False)]
TempOpt = Annotated[float | None, typer.Option("--temperature", help="Target sampling temperature (0 = greedy). Default: generation_config, else 1.")]
DraftTempOpt = Annotated[float | None, typer.Option("--draft-temperature", help="Drafter temperature. Default: its generation_config, else the target's.")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Target top-k (0 = off).")]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Target top-p (1 = off).")]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help="Target min-p (0 = off).")]
DraftTopKOpt = Annotated[int | None, typer.Option("--draft-top-k", help="Drafter top-k (default: the target's).")]
DraftTopPOpt = Annotated[float | None, typer.Option("--draft-top-p", help="Drafter top-p (default: the target's).")]
SemanticsOpt = Annotated[
    str,
    typer.Option("--sampling-semantics", help="Whose sampling to reproduce: vllm | sglang | transformers (order of the transforms, defaults such as transformers' top-k 50 and do_sample)."),
]
PromptsOpt = Annotated[str, typer.Option("--prompts", help="'builtin' or a JSONL file (Spec-Bench/MT-Bench questions, or {prompt, domain} lines).")]
DomainsOpt = Annotated[str | None, typer.Option("--domains", help="Comma-separated domains to keep, e.g. code,math.")]
MaxPromptsOpt = Annotated[int | None, typer.Option("--max-prompts", help="At most this many prompts, taken round-robin across domains.")]
ReferenceOpt = Annotated[str, typer.Option("--reference", help="on-policy (sampled from the target, default) or dataset (responses in the prompts file; off-policy).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for sampling (on-policy references; the simulate loop).")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass.")]
KMaxOpt = Annotated[int, typer.Option("--k-max", help="Largest draft length K in the estimated τ(K)/speedup table (at most 32).")]
VerifyFactorOpt = Annotated[float | None, typer.Option("--verify-factor", help="Override: a round costs (1 + K·c)·v target steps; default: the verify pass over K+1 tokens timed on the device for every K.")]
CostRatioOpt = Annotated[float | None, typer.Option("--cost-ratio", help="Override: drafter/target cost per step c; default: timed on the device.")]
BatchSizesOpt = Annotated[str | None, typer.Option("--batch-sizes", help="Also time the costs at these batch sizes, e.g. 1,8,32, and estimate the speedup at each (the run's --batch-size is always timed).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even when alignment errors make the numbers meaningless.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Regenerate on-policy references instead of reusing the disk cache.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N (auto: cuda when available).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (auto: bf16 on GPU, fp32 on CPU).")]
RulesOpt = Annotated[
    list[Path] | None,
    typer.Option("--rules", help="Extra rules YAML file(s): add rules or override/disable default ones by id.", metavar="FILE", readable=False),
]
FailOnOpt = Annotated[
    str,
    typer.Option("--fail-on", help="Exit 1 when a finding at or above this severity: error | warning | info | never.", callback=check_fail_on),
]
JsonOpt = Annotated[str | None, typer.Option("--json", help="Write the full result as JSON to this file.", metavar="FILE", show_default=False)]
CsvOpt = Annotated[str | None, typer.Option("--csv", help="Write CSV tables (summary, per-position rows, …) into this folder.", metavar="DIR", show_default=False)]
HtmlOpt = Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report (inline CSS and SVG; opens offline).", metavar="FILE", show_default=False)]
JunitOpt = Annotated[str | None, typer.Option("--junit", help="Write JUnit XML: one testcase per rule evaluated.", metavar="FILE", show_default=False)]
DeviceMapOpt = Annotated[str | None, typer.Option("--device-map", help="Spread a target larger than one GPU over the devices with accelerate: auto | balanced | sequential | cpu.", show_default=False)]
MaxMemoryOpt = Annotated[str | None, typer.Option("--max-memory", help="Memory per device for --device-map, e.g. 0=70GiB,1=70GiB (cpu=… too).", metavar="DEV=SIZE,…", show_default=False)]
ShardOpt = Annotated[
    str | None,
    typer.Option("--shard", help="Score shard I of N (whole reference batches, b % N == I) and write its part to --json; `specprobe merge` joins the parts. Under torchrun the ranks shard by themselves.", metavar="I/N", show_default=False),
]
MarkdownOpt = Annotated[str | None, typer.Option("--markdown", help="Write a Markdown summary (for $GITHUB_STEP_SUMMARY or a PR comment).", metavar="FILE", show_default=False)]


# ----------------------------------------------------------------------------- the one merge
def gather(ctx: typer.Context, command: str, only: tuple[str, ...] | None = None) -> RunOptions:
    """The command's options: flags typed on the command line over the --config file
    over the defaults, validated (values, device, dtype, every output path) before any
    model loads or any file is written. `only`: the parameters to take (others are the
    command's own business)."""
    from specprobe.settings.options import merge

    params = {k: v for k, v in ctx.params.items() if only is None or k in only}
    given = set()
    for name in params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            given.add(name)
    return merge(command, params, given, ctx.params.get("config"))


# ----------------------------------------------------------------------------- the one writer
def write_outputs(result: Result | Comparison, opts: RunOptions, *, fail_on: str | None) -> None:
    """Write every output asked for, each saying where it went. The paths were all
    checked when the options were built: a bad last one never leaves the first written."""
    from specprobe.core.files import write_text_atomic
    from specprobe.result import Comparison

    if opts.json_path is not None:
        write_text_atomic(opts.json_path, result.to_json())
        err.print(f"wrote {opts.json_path}", highlight=False)
    if opts.csv_dir is not None:
        from specprobe.report.csv_out import write_csv

        paths = write_csv(result, opts.csv_dir)
        err.print(f"wrote {len(paths)} CSV tables into {opts.csv_dir}", highlight=False)
    if opts.html is not None:
        from specprobe.report.html import render_compare_html, render_html

        write_text_atomic(opts.html, render_compare_html(result) if isinstance(result, Comparison) else render_html(result))
        err.print(f"wrote {opts.html}", highlight=False)
    if opts.junit is not None:
        from specprobe.report.junit import render_junit

        write_text_atomic(opts.junit, render_junit(result, fail_on=fail_on))
        err.print(f"wrote {opts.junit}", highlight=False)
    if opts.markdown is not None:
        from specprobe.report.markdown import render_markdown

        write_text_atomic(opts.markdown, render_markdown(result, fail_on=fail_on))
        err.print(f"wrote {opts.markdown}", highlight=False)


def _any_output(opts: RunOptions) -> bool:
    return any(p is not None for p in (opts.json_path, opts.csv_dir, opts.html, opts.junit, opts.markdown))


def keep_partial(opts: RunOptions) -> Callable[[Result], None]:
    """What the first Ctrl-C hands over: written at once, before the run finishes (a
    second Ctrl-C, or SIGKILL after a SIGTERM, then loses nothing)."""

    def keep(result: Result) -> None:
        if _any_output(opts):
            err.print("[yellow]interrupted:[/] writing what was computed so far", highlight=False)
            write_outputs(result, opts, fail_on=opts.fail_on)

    return keep


def finish(result: Result, opts: RunOptions, show: Callable[[], None]) -> NoReturn:
    """Print and write a finished run, then exit with its gate code. An interrupted run
    is written before it is printed and exits 130."""
    from specprobe.report.load import gate_exit_code

    if result.interrupted:
        with shielded():
            write_outputs(result, opts, fail_on=opts.fail_on)
        show()
        raise typer.Exit(130)
    show()
    write_outputs(result, opts, fail_on=opts.fail_on)
    raise typer.Exit(gate_exit_code(result, opts.fail_on))
