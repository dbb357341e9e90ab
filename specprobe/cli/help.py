"""`--help` that reads at 80 columns, in a pipe and in a CI log: usage, the docstring
reflowed (example lines kept whole), then two columns — the flag with a plain metavar,
and its help wrapped under itself. A flag whose name does not fit the column gets its
help on the next line; nothing is cut. Flags that take no value show none (typer's
`<bool>` invited `--brief true`, which fails) and types read as TEXT/INT/PATH rather
than `<list[Path]>`.

Built on click's public `get_help_record` and `collect_usage_pieces`, so it does not
depend on how a typer version draws its own panels."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import typer
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from specprobe.report import terminal

# typer's type labels -> the metavars click users know
_METAVARS = {
    "str": "TEXT", "int": "INT", "float": "FLOAT", "path": "PATH", "bool": "",
    "int range": "INT", "float range": "FLOAT", "list[str]": "TEXT", "list[path]": "PATH", "list[int]": "INT",
}
_TYPE_RE = re.compile(r"\s*<([^<>]+)>")


def _metavar(term: str) -> str:
    """'--url <list[str]>' -> '--url TEXT'; '--once <bool>' -> '--once'."""

    def plain(m: re.Match[str]) -> str:
        label = m.group(1).strip()
        mv = _METAVARS.get(label.lower(), label.upper())
        return f" {mv}" if mv else ""

    return _TYPE_RE.sub(plain, term)


def _help_text(text: str) -> str:
    return re.sub(r"\bx\s*>=\s*(-?\d+(?:\.\d+)?)", r"≥ \1", re.sub(r"\bx\s*<=\s*(-?\d+(?:\.\d+)?)", r"≤ \1", text)).replace("  [", " [")


def paragraphs(doc: str) -> Iterator[tuple[str, bool]]:
    """Docstring -> (line, verbatim) pairs: running text joined into one line per
    paragraph or sentence group; indented lines and lines ending with ':' kept as they
    are (examples, headings); '' between paragraphs."""
    doc = doc.replace("\b", "")
    first = True
    for para in re.split(r"\n\s*\n", doc.strip()):
        if not first:
            yield "", False
        first = False
        buf: list[str] = []
        for line in para.splitlines():
            if line[:1].isspace() and line.strip():
                if buf:
                    yield " ".join(buf), False
                    buf = []
                yield line.rstrip(), True
            elif line.rstrip().endswith(":"):
                if buf:
                    yield " ".join(buf), False
                    buf = []
                yield line.strip(), False
            else:
                buf.append(line.strip())
        if buf:
            yield " ".join(buf), False


def summary(doc: str) -> str:
    """A command's line in the group's help: its docstring's whole first paragraph (a
    sentence that runs on past a colon is not cut there)."""
    return " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines()).replace("\b", "").strip()


def _wrapped(console: Any, text: Text, indent: int, first: int, width: int) -> Iterator[Text]:
    """text wrapped into width-indent columns, each line after the first indented by
    `indent`; the first line indented by `first`."""
    lines = text.wrap(console, max(width - indent, 20))
    for k, line in enumerate(lines):
        line.rstrip()
        yield Text(" " * (first if k == 0 else indent)) + line


def _two_columns(console: Any, rows: list[tuple[str, str]], width: int) -> Iterator[Text]:
    if not rows:
        return
    col = min(max(len(t) for t, _ in rows), max(16, width // 3))
    for term, help_ in rows:
        help_text = Text(_help_text(help_))
        term_text = Text(term, style="bold cyan")
        if len(term) <= col:
            lines = list(_wrapped(console, help_text, col + 4, 0, width))
            head = Text("  ") + term_text + Text(" " * (col - len(term) + 2))
            yield head + (lines[0] if lines else Text(""))
            yield from lines[1:]
        else:
            yield Text("  ") + term_text
            yield from _wrapped(console, help_text, col + 4, col + 4, width)


def render_help(cmd: Any, ctx: Any) -> None:
    console = terminal.console()
    width = console.width
    out: list[Text] = []
    pieces = " ".join(cmd.collect_usage_pieces(ctx))
    out.append(Text("Usage: ", style="bold") + Text(f"{ctx.command_path} {pieces}"))
    if cmd.help:
        out.append(Text(""))
        out.extend(_prose(console, cmd.help, width))
    args, opts = [], []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        rec = p.get_help_record(ctx)
        if rec is None:
            if p.param_type_name == "argument":
                args.append((p.human_readable_name, ""))
            continue
        term, help_ = rec
        if p.param_type_name == "argument":  # its name is its metavar
            args.append((_TYPE_RE.sub("", term), help_ or ""))
        else:
            opts.append((_metavar(term), help_ or ""))
    commands = []
    if isinstance(cmd, TyperGroup) or hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            commands.append((name, summary(sub.help or "")))
    for title, rows in (("Arguments", args), ("Options", opts), ("Commands", commands)):
        if rows:
            out.append(Text(""))
            out.append(Text(f"{title}:", style="bold"))
            out.extend(_two_columns(console, rows, width))
    if getattr(cmd, "epilog", None):
        out.append(Text(""))
        out.extend(_prose(console, cmd.epilog, width))
    for line in out:
        console.print(line, highlight=False, crop=False, soft_wrap=True)


def _prose(console: Any, doc: str, width: int) -> Iterator[Text]:
    for line, verbatim in paragraphs(doc):
        if verbatim:  # an example: kept whole, a long one continued under itself
            stripped = line.lstrip()
            lead = 2 + len(line) - len(stripped)
            yield from _wrapped(console, Text(stripped), lead + 4, lead, width)
        elif line:
            yield from _wrapped(console, Text(line), 2, 2, width)
        else:
            yield Text("")


# typer carries its own copy of click; its exception classes are reached through the one
# typer exports (BadParameter is a UsageError, a ClickException)
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_EXCEPTION: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class HelpCommand(TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        render_help(self, ctx)


class HelpGroup(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        render_help(self, ctx)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """click's usage mistakes (a bad choice, a value out of a flag's range, a missing
        argument) as the one `error:` line every other mistake gets, exit 2 — not a usage box."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[misc]
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[misc]
        except _USAGE_ERROR as e:
            where = e.ctx.command_path if e.ctx is not None else "specprobe"  # type: ignore[attr-defined]
            message = e.format_message().rstrip(".")  # type: ignore[attr-defined]
            terminal.console(stderr=True).print(f"[bold red]error:[/] {message} — see {where} --help", highlight=False, soft_wrap=True)
            sys.exit(2)
        except _CLICK_EXCEPTION as e:
            e.show()  # type: ignore[attr-defined]
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        except typer.Abort:
            terminal.console(stderr=True).print("Aborted!")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class App(typer.Typer):
    """typer.Typer whose commands and groups print the help above."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", HelpGroup)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", HelpCommand)
        return super().command(*args, **kwargs)
