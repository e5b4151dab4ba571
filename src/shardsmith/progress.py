"""Rich progress bars (items/s, ETA) that vanish with ``quiet``; messages go to stderr."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.progress import ProgressColumn
from rich.text import Text


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} items/s" if speed else "- items/s")


class Tick:
    """One task's handle: call it to advance by one; ``set_total(n)`` once the total is known."""

    def __init__(self, bar=None, tid=None):
        self._bar, self._tid = bar, tid

    def __call__(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._tid)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._tid, n)

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._tid, total=total)


class Progress:
    """Progress bars on stderr. Tasks open at the same time (a plan running ahead of the first
    output's shards, on another thread) share one live display; each keeps its own row."""

    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self._lock = threading.Lock()
        self._bar: RichProgress | None = None
        self._open = 0

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(msg, markup=False, highlight=False)

    @contextmanager
    def task(self, label: str, total: int | None, completed: int = 0) -> Iterator[Tick]:
        if self.quiet:
            yield Tick()
            return
        with self._lock:
            if self._bar is None:
                self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                         TaskProgressColumn(), _Rate(), TimeElapsedColumn(), TimeRemainingColumn(),
                                         console=self.console, transient=False)
                self._bar.start()
            bar = self._bar
            self._open += 1
            tid = bar.add_task(label, total=total, completed=completed)
        try:
            yield Tick(bar, tid)
        finally:
            with self._lock:
                bar.stop_task(tid)
                self._open -= 1
                if self._open == 0:
                    bar.stop()
                    self._bar = None
