"""Sorting file names in bounded memory (an external merge sort).

Contract
- :class:`SortedNames` takes names one by one (``add``) and yields them once, in ``sorted()``
  order (code-point order of the ``str``, duplicates kept), however many there are.
- At most ``chunk`` names are held in memory: each full chunk is sorted and spilled to an
  anonymous temporary file (removed when closed, even after a crash); the runs are merged
  lazily. At most ``fan_in`` runs are open at once: more are first merged into one run.
- Fewer than ``chunk`` names never touch the disk.
- Names are any ``str`` a directory listing gives (``os.fsdecode``'d bytes, surrogate escapes
  included); they never contain NUL, which separates them on disk.
"""

from __future__ import annotations

import heapq
import os
import tempfile
from collections.abc import Iterator
from typing import IO

CHUNK = 8192  # names held in memory at most (a few ten bytes each)
FAN_IN = 16  # runs merged at once (open files; each holds a read block and its names)
_READ = 1 << 14


def _write_run(names: Iterator[str]) -> IO[bytes]:
    f = tempfile.TemporaryFile(prefix="shardsmith-names-")
    buf: list[bytes] = []
    for name in names:
        buf.append(os.fsencode(name))
        if len(buf) >= 4096:
            f.write(b"\0".join(buf) + b"\0")
            buf = []
    if buf:
        f.write(b"\0".join(buf) + b"\0")
    f.seek(0)
    return f


def _read_run(f: IO[bytes]) -> Iterator[str]:
    try:
        rest = b""
        while block := f.read(_READ):
            parts = (rest + block).split(b"\0")
            rest = parts.pop()
            for p in parts:
                yield os.fsdecode(p)
        if rest:
            raise ValueError("truncated run of sorted names")
    finally:
        f.close()


class SortedNames:
    """Names added one by one, iterated once in sorted order (see the module contract)."""

    def __init__(self, chunk: int | None = None, fan_in: int | None = None):
        self.chunk, self.fan_in = max(1, chunk or CHUNK), max(2, fan_in or FAN_IN)
        self._mem: list[str] = []
        self._runs: list[IO[bytes]] = []
        self.count = 0

    def add(self, name: str) -> None:
        self._mem.append(name)
        self.count += 1
        if len(self._mem) >= self.chunk:
            self._spill()

    def _spill(self) -> None:
        self._mem.sort()
        self._runs.append(_write_run(iter(self._mem)))
        self._mem = []
        if len(self._runs) >= self.fan_in:  # keep the open files bounded: merge these into one run
            runs, self._runs = self._runs, []
            self._runs.append(_write_run(heapq.merge(*(_read_run(f) for f in runs))))

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        self._mem.sort()
        if not self._runs:
            return iter(self._mem)
        runs, mem, self._runs, self._mem = self._runs, self._mem, [], []
        return heapq.merge(*(_read_run(f) for f in runs), iter(mem))

    def close(self) -> None:
        """Close the spilled runs not yet iterated (iterating to the end closes them too)."""
        for f in self._runs:
            f.close()
        self._runs, self._mem = [], []
