"""The terminal, for every command: consoles whose width is the real terminal's, COLUMNS,
or a CI log's (wider than a pipe's 80), and the one table layout they all print.

A `Grid` fits the width it is rendered at: headers shorten first, then columns give way
in their stated order — long text moves under its row, minor numbers are dropped (and a
line says which) — and no cell is ever cut or wrapped, so an id, a flag or a number is
always whole."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Literal

from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderResult
from rich.text import Text

# GitHub Actions' log viewer (and most CI logs) show long lines; a pipe's 80 columns
# would fold every table there.
CI_WIDTH = 120
PIPE_WIDTH = 80


def _terminal_columns() -> int | None:
    for fd in (0, 1, 2):
        try:
            cols = os.get_terminal_size(fd).columns
        except (OSError, ValueError):
            continue
        if cols > 0:
            return cols
    return None


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("GITHUB_ACTIONS") == "true" or environ.get("CI", "").lower() in ("true", "1", "yes")


def width(environ: Mapping[str, str] = os.environ) -> int:
    """COLUMNS when set, else the terminal on any standard stream, else a CI log's width
    (GITHUB_ACTIONS / CI), else a pipe's 80."""
    cols = environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return _terminal_columns() or (CI_WIDTH if in_ci(environ) else PIPE_WIDTH)


class Terminal(Console):
    """A rich console whose width is `width()` at the moment it prints (so COLUMNS set
    after start-up, or a resized terminal, is honoured); an explicit width wins."""

    def _size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is not None:
            return dims
        return ConsoleDimensions(width(self._environ), dims.height)

    size = property(_size, Console.size.fset)  # type: ignore[assignment,attr-defined]


def console(stderr: bool = False, file: IO[str] | None = None, width: int | None = None) -> Terminal:
    return Terminal(stderr=stderr, file=file, width=width)


# ----------------------------------------------------------------------------- the table
Cell = str | Text
Fallback = Literal["keep", "under", "drop"]


@dataclass(frozen=True)
class Column:
    """header: the full header; short: the header when the full one does not fit;
    fallback: what the column does when the row is too wide — "keep" (never gives way),
    "under" (its text moves under the row), "drop" (left out; a line says so);
    order: columns give way from the highest order down."""

    header: str
    short: str | None = None
    justify: Literal["left", "right"] = "left"
    fallback: Fallback = "keep"
    order: int = 0
    label: str = ""  # prefix of the text when it moves under the row, e.g. "remedy: "


@dataclass
class Row:
    cells: list[Cell]
    notes: list[Cell] = field(default_factory=list)  # lines always shown under the row
    style: str = ""


def _text(cell: Cell) -> Text:
    return cell.copy() if isinstance(cell, Text) else Text(str(cell))


GAP = 2
INDENT = 1
UNDER = 5  # indent of text under a row


def _indented(console: Console, text: Text, max_width: int) -> Iterator[Text]:
    """Text wrapped at word boundaries under a row (no trailing padding, so a pipe or a
    CI log gets clean lines; a word longer than the line is folded, never dropped)."""
    for line in text.wrap(console, max(max_width - UNDER, 20)):
        line.rstrip()
        yield Text(" " * UNDER) + line


@dataclass
class Grid:
    """A table that fits: see the module docstring. `caption` prints under it."""

    columns: Sequence[Column]
    rows: list[Row] = field(default_factory=list)
    title: str = ""
    caption: str = ""
    spaced: bool = False  # a blank line between rows (rows with text under them read better)

    def add(self, *cells: Cell, notes: Iterable[Cell] = (), style: str = "") -> None:
        self.rows.append(Row(list(cells), list(notes), style))

    # ---- layout
    def layout(self, max_width: int) -> tuple[list[int], list[int], list[int], bool]:
        """(shown, under, dropped) column indices and whether headers are short."""
        n = len(self.columns)
        content = [max((_text(r.cells[i]).cell_len for r in self.rows), default=0) for i in range(n)]

        def need(shown: list[int], short: bool) -> int:
            w = [max(content[i], Text(self._header(i, short)).cell_len) for i in shown]
            return INDENT + sum(w) + GAP * max(len(w) - 1, 0)

        # give way one column at a time (least important first); at each step try the
        # full headers before the short ones
        giving = sorted((i for i in range(n) if self.columns[i].fallback != "keep"), key=lambda i: (-self.columns[i].order, -i))
        for k in range(len(giving) + 1):
            shown = [i for i in range(n) if i not in giving[:k]]
            for short in (False, True):
                if need(shown, short) <= max_width or (k == len(giving) and short):
                    under = sorted(i for i in giving[:k] if self.columns[i].fallback == "under")
                    dropped = [i for i in giving[:k] if self.columns[i].fallback == "drop"]
                    return shown, under, dropped, short
        raise AssertionError("unreachable")

    def _header(self, i: int, short: bool) -> str:
        c = self.columns[i]
        return (c.short if short and c.short is not None else c.header) or ""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.render(console, options.max_width)

    def render(self, console: Console, max_width: int) -> Iterator[Text]:
        shown, under, dropped, short = self.layout(max_width)
        headers = [self._header(i, short) for i in shown]
        widths = [max([Text(h).cell_len] + [_text(r.cells[i]).cell_len for r in self.rows]) for h, i in zip(headers, shown, strict=True)]
        total = INDENT + sum(widths) + GAP * max(len(widths) - 1, 0)
        if self.title:
            yield Text(self.title, style="bold")
        yield self._line([Text(h, style="bold") for h in headers], shown, widths)
        yield Text(" " * INDENT + "─" * (total - INDENT), style="dim")
        for k, row in enumerate(self.rows):
            if self.spaced and k:
                yield Text("")
            yield self._line([_text(row.cells[i]) for i in shown], shown, widths, row.style)
            for i in under:
                cell = _text(row.cells[i])
                if cell.plain.strip():
                    yield from _indented(console, Text(self.columns[i].label, style="dim") + cell if self.columns[i].label else cell, max_width)
            for note in row.notes:
                yield from _indented(console, _text(note), max_width)
        if dropped:
            names = ", ".join(self.columns[i].header for i in dropped)
            wide = next((w for w in range(max_width + 1, 1000) if not self.layout(w)[2]), 1000)  # the narrowest width that drops none
            yield Text(f" (not shown at {max_width} columns: {names}; a terminal {wide} wide, or COLUMNS={wide}, shows them)", style="dim")
        if self.caption:
            yield Text(self.caption, style="dim")

    def _line(self, cells: list[Text], shown: list[int], widths: list[int], style: str = "") -> Text:
        line = Text(" " * INDENT, style=style)
        for k, (cell, i, w) in enumerate(zip(cells, shown, widths, strict=True)):
            if k:
                line.append(" " * GAP)
            pad = " " * (w - cell.cell_len)
            if self.columns[i].justify == "right":
                line.append(pad)
                line.append_text(cell)
            else:
                line.append_text(cell)
                if k < len(cells) - 1:
                    line.append(pad)
        line.no_wrap = False
        return line
