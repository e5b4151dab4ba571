"""The sample keys and dotted members of a folder's shards, kept on disk instead of in memory.

Contract: :class:`FolderKeys` is a throwaway SQLite database without a file name: SQLite spills it to
an unlinked temporary file once it outgrows its page cache, and it is gone when closed, whatever
happened (nothing appears in the folder read, nor anywhere else). Its page cache is capped at
:data:`CACHE_KIB` and no query sorts, so host memory stays bounded whatever the number of keys. Shards are numbered in folder order by the caller. :meth:`FolderKeys.add_shard` takes one
shard's distinct sample keys and its members whose suffix holds a dot (read order);
:meth:`FolderKeys.add_samples` takes one shard's keys with what their samples hold (their members'
suffixes and sizes, and where their bytes are in the shard);
:meth:`FolderKeys.cross_shard` yields the keys held by more than one shard (with
:meth:`FolderKeys.cross_shard_samples`, what each of those shards holds under the key) and
:meth:`FolderKeys.dotted` gives one shard's dotted members back in read order.

:class:`CrossShardKeys` tells a key several shards hold for one sample (the same members, the same
bytes: a shard copied beside itself, every sample trained twice) from a key each shard uses for a sample
of its own (keys numbered from 0 in every shard: distinct samples, the loader keys them by shard and key).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shardsmith.formats.wds import IGNORE_INDEX_FILE

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
        # sig / loc (add_samples only): the sample's members as "suffix:size" and their data offsets, in suffix order
        self._db.execute("CREATE TABLE keys (key TEXT NOT NULL, shard INTEGER NOT NULL, sig TEXT, loc TEXT, "
                         "PRIMARY KEY (key, shard)) WITHOUT ROWID")
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

    def add_samples(self, shard: int, samples: Iterable[tuple[str, str, str]]) -> None:
        """Record shard number ``shard``'s samples as ``(key, sig, loc)``: ``sig`` what the sample holds (its
        members' suffixes and sizes), ``loc`` where their bytes are; a key given twice keeps its first sample."""
        first: dict[str, tuple[str, str]] = {}
        for key, sig, loc in samples:
            first.setdefault(key, (sig, loc))
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO keys (key, shard, sig, loc) VALUES (?, ?, ?, ?)",
                                 ((k, shard, *first[k]) for k in sorted(first)))

    def _cross(self) -> Iterator[tuple[str, list[tuple[int, str | None, str | None]]]]:
        rows = self._db.execute(
            "SELECT key, shard, sig, loc FROM keys WHERE key IN (SELECT key FROM keys GROUP BY key HAVING COUNT(*) > 1) "
            "ORDER BY key, shard")
        cur: str | None = None
        held: list[tuple[int, str | None, str | None]] = []
        for key, shard, sig, loc in rows:
            if key != cur:
                if cur is not None:
                    yield cur, held
                cur, held = key, []
            held.append((shard, sig, loc))
        if cur is not None:
            yield cur, held

    def cross_shard(self) -> Iterator[tuple[str, list[int]]]:
        """Each key found in more than one shard, in key order, with its shard numbers in order."""
        for key, held in self._cross():
            yield key, [shard for shard, _, _ in held]

    def cross_shard_samples(self) -> Iterator[tuple[str, list[tuple[int, str | None, str | None]]]]:
        """Each key found in more than one shard, in key order, with ``(shard, sig, loc)`` per shard in order
        (sig and loc as :meth:`add_samples` got them; None for a shard given by :meth:`add_shard`)."""
        return self._cross()

    def dotted(self, shard: int) -> Iterator[DottedMember]:
        """Shard number ``shard``'s dotted members, in read order."""
        if shard not in self._dotted_shards:
            return
        for name, key, suffix in self._db.execute(
                "SELECT name, key, suffix FROM dotted WHERE shard = ? ORDER BY seq", (shard,)):
            yield DottedMember(name, key, suffix)


CHUNK = 1 << 20  # bytes hashed per read
HEAD = 1 << 16  # bytes of each member compared before whole members are


def _sig_loc(members: dict) -> tuple[str, str]:
    """``{suffix: (data offset, size)}`` as ``(sig, loc)`` for :meth:`FolderKeys.add_samples`."""
    order = sorted(members)
    return ("/".join(f"{s}:{members[s][1]}" for s in order), ",".join(str(members[s][0]) for s in order))


class CrossShardKeys:
    """The sample keys under which more than one shard of a folder holds the same sample (each such sample is
    trained once per shard it is in: a loader keys samples by shard and key, so it sees no duplicate), fed
    shard by shard in folder order (:meth:`visit`, e.g. from ``ExpectedWds.scan``'s one pass over the headers)
    and kept on disk (:class:`FolderKeys`).

    :meth:`finish` compares, for each key several shards hold, what they hold under it: the member suffixes
    and sizes the headers gave, then, only where those agree, the members' bytes (sha256 read from the
    shards, so a copied shard is read once more; distinct samples of equal sizes too). Keys holding the same
    sample in several shards are counted in ``n`` with the first :data:`SHOWN` in ``examples`` (key, the
    shards holding that sample); keys each shard uses for a sample of its own (different members, sizes or
    bytes: distinct samples, nothing trains twice) in ``n_distinct`` / ``distinct_examples``.
    Use as a context manager."""

    SHOWN = 5
    OPEN = 8  # shard files kept open while hashing

    def __init__(self, folder: str | Path) -> None:
        self._folder = Path(folder)
        self._keys = FolderKeys()
        self._names: list[str] = []
        self._fds: dict[int, int] = {}
        self.n = 0
        self.examples: list[tuple[str, list[str]]] = []
        self.n_distinct = 0
        self.distinct_examples: list[tuple[str, list[str]]] = []

    @staticmethod
    def _where(key: str, shards: list[str]) -> str:
        """``key in a.tar, b.tar`` (at most 4 shards named, then how many more)."""
        more = f" and {len(shards) - 4} more" if len(shards) > 4 else ""
        return f"{key} in {', '.join(shards[:4])}{more}"

    def same_sample_text(self, folder: str | Path) -> str:
        """What verify's ``no_duplicates`` and inspect say of the keys holding one sample in several shards."""
        return (f"{self.n} key(s) hold the same sample (same members, same bytes) in several shards, each trained "
                "once per shard that holds it: " + "; ".join(self._where(k, w) for k, w in self.examples)
                + ("; ..." if self.n > self.SHOWN else "")
                + f"; if a shard is a copy of another, move it out of {folder}, else list each repeated key in "
                f"{IGNORE_INDEX_FILE} under the shard(s) that should not train it")

    def distinct_note(self) -> str:
        """The note on keys each shard uses for a sample of its own (nothing to fix)."""
        return (f"{self.n_distinct} key(s) occur in several shards with different content in each (e.g. "
                + "; ".join(self._where(k, w) for k, w in self.distinct_examples[:3])
                + "): distinct samples, which the loader keys by shard and key, so each trains once; nothing to fix")

    def __enter__(self) -> "CrossShardKeys":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_fds()
        self._keys.close()

    def _close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def visit(self, shard: str, samples) -> None:
        self._keys.add_samples(len(self._names), ((key, *_sig_loc(members)) for key, members in samples))
        self._names.append(shard)

    def _digest(self, shard: int, sig: str, loc: str, head: int | None = None) -> str | None:
        """sha256 over the sample's member bytes in suffix order (``head``: each member's first ``head`` bytes
        only); None if the shard cannot give them all."""
        fd = self._fds.pop(shard, None)
        try:
            if fd is None:
                if len(self._fds) >= self.OPEN:
                    os.close(self._fds.pop(next(iter(self._fds))))
                fd = os.open(self._folder / self._names[shard], os.O_RDONLY)
            self._fds[shard] = fd  # most recently used last
            h = hashlib.sha256()
            sizes = [int(m.rsplit(":", 1)[1]) for m in sig.split("/")] if sig else []
            for off, size in zip((int(o) for o in loc.split(",")) if loc else (), sizes):
                size = size if head is None else min(size, head)
                while size:
                    data = os.pread(fd, min(size, CHUNK), off)
                    if not data:
                        return None
                    h.update(data)
                    off, size = off + len(data), size - len(data)
            return h.hexdigest()
        except OSError:
            return None

    def _groups(self, sig: str, group: list[tuple[int, str | None]], head: int | None):
        """``group``'s shards that hold the same bytes (``head``: in each member's first bytes), per digest."""
        by_hash: dict[str, list[tuple[int, str | None]]] = {}
        for shard, loc in group:
            digest = self._digest(shard, sig, loc or "", head)
            if digest is not None:
                by_hash.setdefault(digest, []).append((shard, loc))
        return [g for g in by_hash.values() if len(g) > 1]

    def _same(self, sig: str, group: list[tuple[int, str | None]]) -> list[int]:
        """The first shards of ``group`` (samples of equal members and sizes) whose samples have the same bytes:
        each member's first bytes, then all of them where those agree (distinct samples of equal sizes, e.g.
        fixed-shape latents, differ early, so only copies are read in full); [] when none."""
        for near in self._groups(sig, group, HEAD):
            for equal in self._groups(sig, near, None):
                return [shard for shard, _ in equal]
        return []

    def finish(self) -> None:
        try:
            for key, held in self._keys.cross_shard_samples():
                same: list[int] = []
                by_sig: dict[str | None, list[tuple[int, str | None]]] = {}
                for shard, sig, loc in held:
                    by_sig.setdefault(sig, []).append((shard, loc))
                for sig, group in by_sig.items():
                    if len(group) < 2 or sig is None:
                        continue
                    same = self._same(sig, group)
                    if same:
                        break
                if same:
                    self.n += 1
                    if len(self.examples) < self.SHOWN:
                        self.examples.append((key, [self._names[i] for i in same]))
                else:
                    self.n_distinct += 1
                    if len(self.distinct_examples) < self.SHOWN:
                        self.distinct_examples.append((key, [self._names[s] for s, _, _ in held]))
        finally:
            self._close_fds()
