"""What every command shares: option aliases, the one options merge, the one place
outputs are written, the error boundary, consoles."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from specprobe.core.errors import SpecprobeError
from specprobe.core.interrupts import shielded, terminate_as_interrupt
from specprobe.report import terminal
from specprobe.settings.model import BY_NAME, PAIR, for_command

if TYPE_CHECKING:
    from specprobe.core.files import InputPath
    from specprobe.result import Comparison, Result
    from specprobe.settings.options import RunOptions

F = TypeVar("F", bound=Callable[..., Any])

# Data goes to stdout, diagnostics (progress, errors) to stderr; both as wide as the
# terminal, COLUMNS, or a CI log (report.terminal).
out = terminal.console()
err = terminal.console(stderr=True)

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


def is_tty() -> bool:
    return sys.stderr.isatty()


# ----------------------------------------------------------------------------- options from the settings model
# Every setting's flag, help, type and default come from `specprobe.settings.model`; a
# command says which command it is and declares only its own parameters.
def option(name: str, command: str) -> Any:
    """The typer annotation of one setting for one command."""
    s = BY_NAME[name]
    kw: dict[str, Any] = {"help": s.help_for(command), "show_default": s.show_default, "rich_help_panel": s.panel or None}
    if s.metavar:
        kw["metavar"] = s.metavar
    if s.argument:
        return Annotated[s.type, typer.Argument(**{**kw, "metavar": s.flag})]
    # input paths are read by specprobe itself (readable=False: not click's usage box), so
    # an unreadable file is one line naming the file, the reason and what to do
    return Annotated[s.type, typer.Option(s.flag, **kw, readable=False) if s.file_type == list[Path] else typer.Option(s.flag, **kw)]


ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Probe config file (YAML or TOML); flags given on the command line override it.", metavar="FILE", readable=False, rich_help_panel=PAIR)]


def takes_settings(command: str) -> Callable[[F], F]:
    """Give a command every setting the model lists for it (arguments first, then its own
    parameters, then the options), so typer shows them and `gather` merges them. The
    command function receives only its own parameters; the settings reach it through
    `gather(ctx, command)`."""

    def decorate(func: F) -> F:
        own = list(inspect.signature(func, eval_str=True).parameters.values())
        own_names = {p.name for p in own}
        listed = {s.name for s in for_command(command)}
        mine = [s for s in for_command(command) if s.name not in own_names and not s.declared_by_command]

        def param(s: Any) -> inspect.Parameter:
            return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default_for(command), annotation=option(s.name, command))

        def own_param(p: inspect.Parameter) -> inspect.Parameter:
            # a setting the command reads itself (declared plainly, for its type): the model's flag and help
            if p.name in listed and not BY_NAME[p.name].declared_by_command:
                return p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=option(p.name, command))
            return p.replace(kind=inspect.Parameter.KEYWORD_ONLY)

        ctx = [p for p in own if p.annotation is typer.Context]
        rest = [own_param(p) for p in own if p.annotation is not typer.Context]
        params = ctx + [param(s) for s in mine if s.argument] + rest + [param(s) for s in mine if not s.argument]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **{k: v for k, v in kwargs.items() if k in own_names})

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


# ----------------------------------------------------------------------------- the one merge
def gather(ctx: typer.Context, command: str, only: tuple[str, ...] | None = None, inputs: Sequence[InputPath] = ()) -> RunOptions:
    """The command's options: flags typed on the command line over the --config file
    over the defaults, validated (values, device, dtype, every output path) before any
    model loads or any file is written. `only`: the parameters to take (others are the
    command's own business); `inputs`: the files the command reads through its own
    parameters (report's RESULT.json, merge's parts), which no output may overwrite."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.settings.options import merge

    params = {k: v for k, v in ctx.params.items() if only is None or k in only}
    given = set()
    for name in params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            given.add(name)
    return merge(command, params, given, ctx.params.get("config"), inputs)


# ----------------------------------------------------------------------------- the one writer
def write_outputs(result: Result | Comparison, opts: RunOptions, *, fail_on: str | None) -> None:
    """Write every output asked for, each saying where it went. The paths were all
    checked when the options were built: a bad last one never leaves the first written."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import write_text_atomic
    from specprobe.result import Comparison

    if opts.json_path is not None:
        write_text_atomic(opts.json_path, result.to_json())
        err.print(f"wrote {opts.json_path}", highlight=False, soft_wrap=True)
    if opts.csv_dir is not None:
        from specprobe.report.csv_out import write_csv

        paths = write_csv(result, opts.csv_dir)
        err.print(f"wrote {len(paths)} CSV tables into {opts.csv_dir}", highlight=False, soft_wrap=True)
    if opts.html is not None:
        from specprobe.report.html import render_compare_html, render_html

        write_text_atomic(opts.html, render_compare_html(result) if isinstance(result, Comparison) else render_html(result))
        err.print(f"wrote {opts.html}", highlight=False, soft_wrap=True)
    if opts.junit is not None:
        from specprobe.report.junit import render_junit

        write_text_atomic(opts.junit, render_junit(result, fail_on=fail_on))
        err.print(f"wrote {opts.junit}", highlight=False, soft_wrap=True)
    if opts.markdown is not None:
        from specprobe.report.markdown import render_markdown

        write_text_atomic(opts.markdown, render_markdown(result, fail_on=fail_on))
        err.print(f"wrote {opts.markdown}", highlight=False, soft_wrap=True)


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
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.report.load import gate_exit_code

    if result.interrupted:
        with shielded():
            write_outputs(result, opts, fail_on=opts.fail_on)
        show()
        raise typer.Exit(130)
    show()
    write_outputs(result, opts, fail_on=opts.fail_on)
    raise typer.Exit(gate_exit_code(result, opts.fail_on))
