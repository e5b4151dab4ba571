"""What one simulated rank saw, in order, on disk: no id strings held in any process.

Contract
- :class:`SeenWriter` (in a rank): ``add(pos, sample_id)`` for each sample, in the order the loader
  yields them; ``pos`` is the sample's expected position (``verify.expected``) or None for an id
  no full pass yields (then ``sample_id`` is kept). Positions go to ``<base>.pos`` as int64, at most
  ``BUFFER`` of them in memory; an unknown id is written as ``-1 - j`` there and as line ``j`` of
  ``<base>.unknown`` (JSON strings, one a line). ``close()`` flushes; ``count`` is the samples added.
- :class:`SeenFile` (in the main process) reads that log back: ``chunks()`` yields int64 arrays of at
  most ``BUFFER`` entries in order; ``unknown()`` the unknown ids in order.
- :class:`SeenList`: the same reading interface over ids already in memory (``coverage`` of lists).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BUFFER = 1 << 14


class SeenWriter:
    def __init__(self, base: str | Path):
        self.base = Path(base)
        self.pos = open(self.base.with_suffix(".pos"), "wb")
        self.unk = open(self.base.with_suffix(".unknown"), "w", encoding="utf-8")
        self.buf = array("q")
        self.count = self.n_unknown = 0

    def add(self, pos: int | None, sample_id: str) -> None:
        if pos is None:
            self.unk.write(json.dumps(sample_id) + "\n")
            pos = -1 - self.n_unknown
            self.n_unknown += 1
        self.buf.append(pos)
        self.count += 1
        if len(self.buf) >= BUFFER:
            self.buf.tofile(self.pos)
            del self.buf[:]

    def close(self) -> None:
        self.buf.tofile(self.pos)
        del self.buf[:]
        self.pos.close()
        self.unk.close()


class SeenFile:
    def __init__(self, base: str | Path):
        self.base = Path(base)

    def chunks(self) -> Iterator[np.ndarray]:
        with open(self.base.with_suffix(".pos"), "rb") as f:
            while True:
                a = np.fromfile(f, dtype=np.int64, count=BUFFER)
                if not len(a):
                    return
                yield a

    def unknown(self) -> list[str]:
        with open(self.base.with_suffix(".unknown"), encoding="utf-8") as f:
            return [json.loads(line) for line in f]


class SeenList:
    """Ids in memory, numbered by ``first`` (id -> its first expected position)."""

    def __init__(self, ids: list[str], first: dict[str, int]):
        self.positions = np.empty(len(ids), np.int64)
        self._unknown: list[str] = []
        for i, s in enumerate(ids):
            p = first.get(s)
            if p is None:
                p = -1 - len(self._unknown)
                self._unknown.append(s)
            self.positions[i] = p

    def chunks(self) -> Iterator[np.ndarray]:
        for lo in range(0, len(self.positions), BUFFER):
            yield self.positions[lo:lo + BUFFER]

    def unknown(self) -> list[str]:
        return self._unknown
