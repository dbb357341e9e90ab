"""What every command shares: option aliases, the error boundary, consoles."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from specprobe.errors import SpecprobeError

F = TypeVar("F", bound=Callable[..., Any])

# Data goes to stdout, diagnostics (progress, errors) to stderr.
out = Console()
err = Console(stderr=True)

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


RulesOpt = Annotated[
    list[Path] | None,
    typer.Option("--rules", help="Extra rules YAML file(s): add rules or override/disable default ones by id."),
]
FailOnOpt = Annotated[
    str,
    typer.Option("--fail-on", help="Exit 1 when a finding at or above this severity: error | warning | info | never.", callback=check_fail_on),
]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the full result as JSON to this file.")]
CsvOpt = Annotated[Path | None, typer.Option("--csv", help="Write CSV tables (summary, per-position rows) into this folder.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda (auto: cuda when available).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (auto: bf16 on GPU, fp32 on CPU).")]


def is_tty() -> bool:
    return sys.stderr.isatty()
