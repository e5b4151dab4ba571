"""The sample keys and dotted members of a folder's shards, kept on disk instead of in memory.

Contract: :class:`FolderKeys` is a throwaway SQLite database without a file name: SQLite spills it to
an unlinked temporary file once it outgrows its page cache, and it is gone when closed, whatever
happened (nothing appears in the folder read, nor anywhere else). Its page cache is capped at
:data:`CACHE_KIB` and no query sorts, so host memory stays bounded whatever the number of keys. Shards are numbered in folder order by the caller. :meth:`FolderKeys.add_shard` takes one
shard's distinct sample keys and its members whose suffix holds a dot (read order);
:meth:`FolderKeys.cross_shard` yields the keys held by more than one shard and
:meth:`FolderKeys.dotted` gives one shard's dotted members back in read order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CACHE_KIB = 128  # SQLite page cache in KiB


@dataclass(frozen=True)
class DottedMember:
    """A member whose suffix (the part of its basename after the first dot) holds another dot."""

    name: str
    key: str
    suffix: str


class FolderKeys:
    """Keys per shard and dotted members per shard, on disk; use as a context manager."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("")  # "": a private temporary database, deleted on close
        self._db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        # keys kept in (key, shard) order as they come: finding the keys of several shards is then a scan
        # of the table, not a sort (SQLite's sorter held ~1 MiB more at 200k keys)
        self._db.execute("CREATE TABLE keys (key TEXT NOT NULL, shard INTEGER NOT NULL, PRIMARY KEY (key, shard)) "
                         "WITHOUT ROWID")
        self._db.execute("CREATE TABLE dotted (shard INTEGER NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, "
                         "key TEXT NOT NULL, suffix TEXT NOT NULL, PRIMARY KEY (shard, seq)) WITHOUT ROWID")
        self._dotted_shards: set[int] = set()

    def __enter__(self) -> "FolderKeys":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def add_shard(self, shard: int, keys: Iterable[str], dotted: Iterable[DottedMember] = ()) -> None:
        """Record shard number ``shard``'s sample keys (a key given twice counts once) and its dotted
        members in read order."""
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO keys (key, shard) VALUES (?, ?)",
                                 ((k, shard) for k in sorted(keys)))
            before = self._db.total_changes
            self._db.executemany("INSERT INTO dotted VALUES (?, ?, ?, ?, ?)",
                                 ((shard, i, d.name, d.key, d.suffix) for i, d in enumerate(dotted)))
            if self._db.total_changes != before:
                self._dotted_shards.add(shard)

    def cross_shard(self) -> Iterator[tuple[str, list[int]]]:
        """Each key found in more than one shard, in key order, with its shard numbers in order."""
        rows = self._db.execute(
            "SELECT key, shard FROM keys WHERE key IN (SELECT key FROM keys GROUP BY key HAVING COUNT(*) > 1) "
            "ORDER BY key, shard")
        cur: str | None = None
        shards: list[int] = []
        for key, shard in rows:
            if key != cur:
                if cur is not None:
                    yield cur, shards
                cur, shards = key, []
            shards.append(shard)
        if cur is not None:
            yield cur, shards

    def dotted(self, shard: int) -> Iterator[DottedMember]:
        """Shard number ``shard``'s dotted members, in read order."""
        if shard not in self._dotted_shards:
            return
        for name, key, suffix in self._db.execute(
                "SELECT name, key, suffix FROM dotted WHERE shard = ? ORDER BY seq", (shard,)):
            yield DottedMember(name, key, suffix)


class CrossShardKeys:
    """The sample keys that more than one shard of a folder holds (each such sample is trained once per shard
    it is in: a loader keys samples by shard and key, so it sees no duplicate), fed shard by shard in folder
    order (:meth:`visit`, e.g. from ``ExpectedWds.scan``'s one pass over the headers) and kept on disk
    (:class:`FolderKeys`); :meth:`finish` counts them (``n``) and keeps the first :data:`SHOWN` with their
    shards (``examples``). Use as a context manager."""

    SHOWN = 5

    def __init__(self) -> None:
        self._keys = FolderKeys()
        self._names: list[str] = []
        self.n = 0
        self.examples: list[tuple[str, list[str]]] = []

    def __enter__(self) -> "CrossShardKeys":
        return self

    def __exit__(self, *exc: object) -> None:
        self._keys.close()

    def visit(self, shard: str, samples) -> None:
        self._keys.add_shard(len(self._names), {key for key, _ in samples})
        self._names.append(shard)

    def finish(self) -> None:
        for key, where in self._keys.cross_shard():
            self.n += 1
            if len(self.examples) < self.SHOWN:
                self.examples.append((key, [self._names[i] for i in where]))
