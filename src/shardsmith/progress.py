"""Rich progress bars (items/s, ETA) that vanish with ``quiet``; messages go to stderr."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.progress import ProgressColumn
from rich.text import Text


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} items/s" if speed else "- items/s")


class Progress:
    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True)

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(msg, markup=False, highlight=False)

    @contextmanager
    def task(self, label: str, total: int | None, completed: int = 0) -> Iterator[Callable[[], None]]:
        if self.quiet:
            yield lambda: None
            return
        bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                           _Rate(), TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False)
        with bar:
            tid = bar.add_task(label, total=total, completed=completed)
            yield lambda: bar.advance(tid)
