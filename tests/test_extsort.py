"""Folder listings are sorted in bounded memory (issue 24): :class:`SortedNames` gives exactly
``sorted()``'s order whatever its chunk and fan-in, and a folder walk spilled to disk yields
the same items as one sorted in memory."""

import os
import random

import pytest

from shardsmith.recipe import SourceSpec
from shardsmith.sources import extsort
from shardsmith.sources.extsort import SortedNames
from shardsmith.sources.folder import FolderSource


def _names(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = ["a", "B", "z", "0", "9", ".", "_", "é", "ß", "漢", "\U0001f600", os.fsdecode(b"\xff"), " "]
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return names + names[: n // 10]  # duplicates too


@pytest.mark.parametrize("chunk,fan_in", [(1, 2), (3, 2), (7, 3), (50, 64), (10_000, 64)])
def test_sorted_names_is_sorted_order(chunk, fan_in):
    names = _names(500)
    s = SortedNames(chunk=chunk, fan_in=fan_in)
    for x in names:
        s.add(x)
    assert len(s) == len(names)
    assert list(s) == sorted(names)


def test_only_chunk_names_stay_in_memory():
    s = SortedNames(chunk=16, fan_in=4)
    for x in _names(1000):
        s.add(x)
        assert len(s._mem) < 16 and len(s._runs) < 4
    assert len(list(s)) == 1100


def test_nothing_spills_below_a_chunk():
    s = SortedNames(chunk=100)
    for x in _names(50):
        s.add(x)
    assert s._runs == [] and list(s) == sorted(_names(50))


def _walk_items(root) -> list[tuple]:
    src = FolderSource(0, SourceSpec(path=str(root), name="s"), [])
    return [(i.item_id, i.path, i.relpath, i.caption, i.label, i.label_name, i.error) for i in src.items()]


def test_a_spilled_folder_walk_gives_the_same_items(tmp_path, monkeypatch):
    root = tmp_path / "src"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i, name in enumerate(sorted(set(_names(60, seed=len(cls)))) ):
            if "." in name or name.strip() != name:
                continue
            (root / cls / f"{name}{i}.png").write_bytes(b"not an image")
            if i % 3 == 0:
                (root / cls / f"{name}{i}.txt").write_text(f"caption {i}", encoding="utf-8")
    (root / "top.jpg").write_bytes(b"x")
    in_memory = _walk_items(root)
    assert len(in_memory) > 60
    monkeypatch.setattr(extsort, "CHUNK", 3)
    monkeypatch.setattr(extsort, "FAN_IN", 2)
    assert _walk_items(root) == in_memory
