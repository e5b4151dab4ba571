"""Rich progress bars (n/N, items/s, ETA) and spinners on stderr; messages go to stderr too.

Contract
- Bars are drawn only when stderr is a terminal and not ``quiet`` (``Progress.bars``); messages
  (:meth:`Progress.say`) are printed unless ``quiet``, terminal or not.
- :meth:`Progress.task` is a counted task: ``n/N``, percentage, rate, elapsed and ETA once its total
  is known (``Tick.set_total``; until then ``n/?``). :meth:`Progress.spin` is a phase without a
  count (loading models): a spinner, what is happening, and the elapsed time.
- :func:`total_in_background` counts a task's total on a thread while the task runs (the plan's
  total is the number of listed items, counted from the listings while the probe works).
- ``Progress.history`` records every finished task and spinner: ``{label, total, completed, spin}``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, ProgressColumn, SpinnerColumn,
                           TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} items/s" if speed else "- items/s")


class _CountOnly(ProgressColumn):
    """``column`` for counted tasks, nothing for a spinner's row."""

    def __init__(self, column: ProgressColumn):
        super().__init__()
        self.column = column

    def render(self, task) -> Any:
        return Text("") if task.fields.get("spin") else self.column.render(task)


class _BarOrSpinner(ProgressColumn):
    def __init__(self):
        super().__init__()
        self.bar, self.spinner = BarColumn(), SpinnerColumn()

    def render(self, task) -> Any:
        return self.spinner.render(task) if task.fields.get("spin") else self.bar.render(task)


class Tick:
    """One task's handle: call it to advance by one; ``set_total(n)`` once the total is known."""

    def __init__(self, bar=None, tid=None):
        self._bar, self._tid = bar, tid
        self.total: int | None = None
        self.completed = 0
        self._lock = threading.Lock()

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def __call__(self) -> None:
        self.advance(1)

    def advance(self, n: int) -> None:
        with self._lock:
            self.completed += n
        if self._bar is not None:
            self._bar.advance(self._tid, n)

    def set_total(self, total: int | None) -> None:
        self.total = total
        if self._bar is not None and total is not None:
            self._bar.update(self._tid, total=total)


class Progress:
    """Progress bars on stderr. Tasks open at the same time (a plan running ahead of the first
    output's shards, on another thread) share one live display; each keeps its own row."""

    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.bars = not quiet and self.console.is_terminal
        self.history: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._bar: RichProgress | None = None
        self._open = 0

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(msg, markup=False, highlight=False)

    @contextmanager
    def task(self, label: str, total: int | None, completed: int = 0) -> Iterator[Tick]:
        """A counted task (see the module)."""
        with self._row(label, total, completed, spin=False) as tick:
            yield tick

    @contextmanager
    def spin(self, label: str) -> Iterator[Tick]:
        """A phase without a count: a spinner, ``label`` (say what loads, on which device) and the time."""
        with self._row(label, None, 0, spin=True) as tick:
            yield tick

    @contextmanager
    def _row(self, label: str, total: int | None, completed: int, spin: bool) -> Iterator[Tick]:
        if not self.bars:
            tick = Tick()
            tick.total, tick.completed = total, completed
            try:
                yield tick
            finally:
                if not self.quiet:
                    self._record(label, tick, spin)
            return
        with self._lock:
            if self._bar is None:
                self._bar = RichProgress(TextColumn("{task.description}"), _BarOrSpinner(),
                                         _CountOnly(MofNCompleteColumn()), _CountOnly(TaskProgressColumn()),
                                         _CountOnly(_Rate()), TimeElapsedColumn(),
                                         _CountOnly(TimeRemainingColumn()), console=self.console, transient=False)
                self._bar.start()
            bar = self._bar
            self._open += 1
            tid = bar.add_task(label, total=total, completed=completed, spin=spin)
        tick = Tick(bar, tid)
        tick.total, tick.completed = total, completed
        try:
            yield tick
        finally:
            with self._lock:
                if spin:
                    bar.update(tid, total=1, completed=1)  # the spinner stops; the row keeps its time
                bar.stop_task(tid)
                self._record(label, tick, spin)
                self._open -= 1
                if self._open == 0:
                    bar.stop()
                    self._bar = None

    def _record(self, label: str, tick: Tick, spin: bool) -> None:
        self.history.append({"label": label, "total": tick.total, "completed": tick.completed, "spin": spin})


def count_in_background(tick: Tick, count: Callable[[], int | None]) -> threading.Thread | None:
    """Start ``count()`` on a daemon thread that gives its result to ``tick.set_total``; None (and
    nothing counted) when the task is not shown. A count that fails leaves the total unknown."""
    if not tick.shown:
        return None

    def run() -> None:
        try:
            n = count()
        except Exception:  # noqa: BLE001 - the work itself reports what is wrong with a source
            return
        if n is not None:
            tick.set_total(n)

    t = threading.Thread(target=run, name="shardsmith-count", daemon=True)
    t.start()
    return t


@contextmanager
def total_in_background(tick: Tick, count: Callable[[], int | None]) -> Iterator[None]:
    """:func:`count_in_background` for the block; its end waits for the count (a listing is
    cheaper than the work it counts)."""
    t = count_in_background(tick, count)
    try:
        yield
    finally:
        if t is not None:
            t.join()
