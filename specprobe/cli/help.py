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
from specprobe.settings.model import HELP_GROUP_ABOVE, PANELS

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


def _column(rows: list[tuple[str, str]], width: int) -> int:
    """The flag column's width: the longest flag, but at most a third of the screen."""
    return min(max((len(t) for t, _ in rows), default=0), max(16, width // 3))


def _two_columns(console: Any, rows: list[tuple[str, str]], width: int, col: int | None = None) -> Iterator[Text]:
    if not rows:
        return
    col = _column(rows, width) if col is None else col
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
    args: list[tuple[str | None, str, str]] = []  # (panel, term, help)
    opts: list[tuple[str | None, str, str]] = []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        panel = getattr(p, "rich_help_panel", None)
        rec = p.get_help_record(ctx)
        if rec is None:
            if p.param_type_name == "argument":
                args.append((panel, p.human_readable_name, ""))
            continue
        term, help_ = rec
        if p.param_type_name == "argument":  # its name is its metavar
            args.append((panel, _TYPE_RE.sub("", term), help_ or ""))
        else:
            opts.append((panel, _metavar(term), help_ or ""))
    commands = []
    if isinstance(cmd, TyperGroup) or hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            commands.append((name, summary(sub.help or "")))
    sections = _sections(args, opts, grouped=len(opts) - 1 > HELP_GROUP_ABOVE)  # --help itself not counted
    col = _column([row for _, rows in sections for row in rows], width)  # one flag column for every group
    for title, rows in [*sections, ("Commands", commands)]:
        if rows:
            out.append(Text(""))
            out.append(Text(f"{title}:", style="bold"))
            out.extend(_two_columns(console, rows, width, None if title == "Commands" else col))
    if getattr(cmd, "epilog", None):
        out.append(Text(""))
        out.extend(_prose(console, cmd.epilog, width))
    for line in out:
        console.print(line, highlight=False, crop=False, soft_wrap=True)


def _sections(args: list[tuple[str | None, str, str]], opts: list[tuple[str | None, str, str]], grouped: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """The help's groups of (flag, help) rows. A command with many options shows them by
    their panel (`rich_help_panel`, from the settings model or the command's own
    declaration), in the settings model's order of panels, its arguments in theirs; a
    command with few, or a parameter without a panel (--help), under Arguments / Options."""
    if not grouped:
        return [("Arguments", [(t, h) for _, t, h in args]), ("Options", [(t, h) for _, t, h in opts])]
    by_panel: dict[str, list[tuple[str, str]]] = {}
    loose_args = [(t, h) for panel, t, h in args if not panel]
    loose_opts = [(t, h) for panel, t, h in opts if not panel]
    for panel, term, help_ in [*args, *opts]:
        if panel:
            by_panel.setdefault(panel, []).append((term, help_))
    order = sorted(by_panel, key=lambda p: PANELS.index(p) if p in PANELS else len(PANELS))  # stable: an unknown panel keeps its place after the known
    return [("Arguments", loose_args), *((p, by_panel[p]) for p in order), ("Options", loose_opts)]


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
