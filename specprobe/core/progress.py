"""A tiny progress interface so library code can report progress without knowing rich.
The CLI passes a rich-backed reporter; tests and library callers get the silent one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    def note(self, message: str) -> None:  # a one-off status line
        pass

    @contextmanager
    def task(self, description: str, total: int) -> Iterator[Any]:
        yield lambda n=1: None

    def __call__(self, message: str) -> None:
        self.note(message)


class RichProgress(Progress):
    """Progress bars on stderr (rich), one bar per task."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def note(self, message: str) -> None:
        self.console.print(f"[dim]· {message}[/]", highlight=False)

    @contextmanager
    def task(self, description: str, total: int) -> Iterator[Any]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RP
        from rich.table import Column

        # At 80 columns (a pipe, a CI log) the description wraps; counts and times stay whole.
        with RP(
            TextColumn("{task.description}", table_column=Column(ratio=1, overflow="fold")), BarColumn(bar_width=20), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, transient=False,
        ) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(tid, n)
