"""Bounded, ordered parallel map over worker processes.

``ordered_map(tasks, workers, makers)`` yields ``(task, result)`` in input order while
keeping at most ``window`` tasks in flight, so host memory stays bounded whatever the
dataset size. ``workers <= 1`` runs inline. Makers (picklable callables) are installed once
per worker process, keyed by name; a task is ``(maker_name, item)``.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_MAKERS: dict[str, Any] = {}


def _install(makers: dict[str, Any]) -> None:
    _MAKERS.clear()
    _MAKERS.update(makers)


def _noop() -> None:
    return None


def _run(name: str, item: Any) -> Any:
    return _MAKERS[name](item)


class Workers:
    """A process pool (or inline runner) that knows every output's sample maker."""

    def __init__(self, makers: dict[str, Any], workers: int):
        self.makers, self.n = makers, workers
        self.pool = None
        if workers > 1:
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"),
                                            initializer=_install, initargs=(makers,))
            # start every worker now (the executor forks lazily), before the caller loads models
            for f in [self.pool.submit(_noop) for _ in range(workers * 2)]:
                f.result()

    def map(self, name: str, items: Iterable[Any], window: int | None = None) -> Iterator[tuple[Any, Any]]:
        if self.pool is None:
            fn = self.makers[name]
            for it in items:
                yield it, fn(it)
            return
        window = window or self.n * 8
        q: deque = deque()
        for it in items:
            q.append((it, self.pool.submit(_run, name, it)))
            if len(q) >= window:
                it0, fut = q.popleft()
                yield it0, fut.result()
        while q:
            it0, fut = q.popleft()
            yield it0, fut.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
