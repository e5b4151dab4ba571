"""The samples a full pass over a dataset must yield, as positions ``0 .. N-1``, without a list of ids.

Contract
- :class:`ExpectedWds` (a WebDataset folder): the shards in loader order and, per shard, the
  position of its first expected sample (``offsets``; a shard's expected samples are its
  samples in tar order less ``ignore_index.json``). Sample ``p`` is the ``p - offsets[i]``-th
  expected sample of shard ``i``; its id is ``shard/key``. Memory: a few numbers per shard,
  none per sample; a sample's key is found again by re-reading its shard's tar headers.
  An id listed twice in one shard (a key whose members are not adjacent) has two positions;
  the later one is an *alias* of the first (a loader seeing that id counts for the first).
- :class:`ExpectedRange` (an EDM ZIP): positions are the image indices, the id is ``str(i)``.
- :class:`Locator` (one per simulated rank): ``position(shard, key)`` -> the position of that id,
  or None for an id no full pass should yield; keeps at most ``Locator.SHARDS`` shards' keys.
- Both kinds round-trip through ``to_spec()`` / :func:`expected_from_spec` (JSON-able), so a
  rank gets the same numbering as the main process.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

Sample = tuple[str, dict]  # (key, {suffix: (offset, size)}) as shard_reader.shard_samples gives it


def shard_expected(folder: Path, shard: str, skip: set[str] | frozenset[str]) -> list[Sample]:
    """One shard's samples a full pass must yield (``skip``: its ignored keys), headers only and not
    remembered by the loader's listing index."""
    from shardsmith.loaders.shard_reader import shard_samples

    return [s for s in shard_samples(Path(folder) / shard, remember=False) if s[0] not in skip]


@dataclass(frozen=True)
class ExpectedWds:
    folder: str
    shards: tuple[str, ...]
    offsets: tuple[int, ...]  # len(shards) + 1; offsets[-1] == N
    ignore: dict[str, tuple[str, ...]]  # ignore_index.json, only the shards of this folder
    aliases: tuple[tuple[int, int], ...] = ()  # (later position, first position) of an id listed twice
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def scan(cls, folder: Path, ignore: dict[str, list[str]],
             on_shard: Optional[Callable[[str, list[Sample]], None]] = None) -> ExpectedWds:
        """Read every shard's tar headers once (in loader order); ``on_shard(shard, samples)`` sees
        each shard's expected samples while they are at hand (nothing of them is kept here)."""
        from shardsmith.loaders.shard_reader import list_shards

        shards = tuple(list_shards(folder))
        ign = {s: tuple(ignore[s]) for s in shards if s in ignore}
        offsets, aliases, n = [0], [], 0
        for shard in shards:
            samples = shard_expected(folder, shard, frozenset(ign.get(shard, ())))
            first: dict[str, int] = {}
            for j, (key, _) in enumerate(samples):
                at = first.setdefault(key, n + j)
                if at != n + j:
                    aliases.append((n + j, at))
            n += len(samples)
            offsets.append(n)
            if on_shard is not None:
                on_shard(shard, samples)
        return cls(str(folder), shards, tuple(offsets), ign, tuple(aliases))

    def __len__(self) -> int:
        return self.offsets[-1]

    def shard_index(self, shard: str) -> int | None:
        if not self._index:
            self._index.update((s, i) for i, s in enumerate(self.shards))
        return self._index.get(shard)

    def keys(self, i: int) -> list[str]:
        """The expected keys of shard ``i``, in order (re-read from its tar headers)."""
        return [k for k, _ in shard_expected(Path(self.folder), self.shards[i], frozenset(self.ignore.get(self.shards[i], ())))]

    def id_at(self, pos: int) -> str:
        i = bisect.bisect_right(self.offsets, pos) - 1
        return f"{self.shards[i]}/{self.keys(i)[pos - self.offsets[i]]}"

    def ids(self, positions: list[int]) -> list[str]:
        """The ids at ascending or unordered ``positions`` (each shard re-read once)."""
        keys: dict[int, list[str]] = {}
        out = []
        for pos in positions:
            i = bisect.bisect_right(self.offsets, pos) - 1
            if i not in keys:
                keys[i] = self.keys(i)
            out.append(f"{self.shards[i]}/{keys[i][pos - self.offsets[i]]}")
        return out

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "wds", "folder": self.folder, "shards": list(self.shards), "offsets": list(self.offsets),
                "ignore": {k: list(v) for k, v in self.ignore.items()}}


@dataclass(frozen=True)
class ExpectedRange:
    n: int
    aliases: tuple[tuple[int, int], ...] = ()

    def __len__(self) -> int:
        return self.n

    def ids(self, positions: list[int]) -> list[str]:
        return [str(p) for p in positions]

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "range", "n": self.n}


Expected = ExpectedWds | ExpectedRange


def expected_from_spec(spec: dict[str, Any]) -> Expected:
    if spec["kind"] == "range":
        return ExpectedRange(int(spec["n"]))
    return ExpectedWds(spec["folder"], tuple(spec["shards"]), tuple(spec["offsets"]),
                       {k: tuple(v) for k, v in spec["ignore"].items()})


class Locator:
    """``position(shard, key)`` for one rank: the first position of that id, None when no full pass
    yields it. Keeps the key tables of the ``SHARDS`` shards used last."""

    SHARDS = 8

    def __init__(self, expected: ExpectedWds):
        self.expected = expected
        self.tables: OrderedDict[int, dict[str, int]] = OrderedDict()

    def position(self, shard: str, key: str) -> int | None:
        i = self.expected.shard_index(shard)
        if i is None:
            return None
        table = self.tables.get(i)
        if table is None:
            table = {}
            for j, k in enumerate(self.expected.keys(i)):
                table.setdefault(k, self.expected.offsets[i] + j)
            self.tables[i] = table
            if len(self.tables) > self.SHARDS:
                self.tables.popitem(last=False)
        else:
            self.tables.move_to_end(i)
        return table.get(key)
