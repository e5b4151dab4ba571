"""Loader for the LTX-style ``.precomputed/`` tree, with the trainer's matching rule made loud.

``PrecomputedDataset(root, dirs)`` pairs files across sub-folders by relative path, like
LTX's ``PrecomputedDataset`` (the rule: :mod:`shardsmith.formats.precomputed`). Unlike the
trainer (a DEBUG line per miss), unmatched files are listed in ``.unmatched`` with the folders
they lack, and a folder that does not exist is an error at once.
Every ``.pt`` is read with ``torch.load(weights_only=True)`` semantics (the fast reader of
:mod:`shardsmith.loaders.pth_fast` for plain files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shardsmith.formats.precomputed import DEFAULT_DIRS, cache_files, primary_dir
from shardsmith.loaders.pth_fast import load_pth_bytes


class PrecomputedDataset(torch.utils.data.Dataset):
    def __init__(self, root: str | Path, dirs: tuple[str, ...] | list[str] = DEFAULT_DIRS):
        self.root = Path(root)
        missing = [d for d in dirs if not (self.root / d).is_dir()]
        if missing:
            raise FileNotFoundError(f"{self.root} lacks {missing}; every listed folder must exist "
                                    "(LTX trainers refuse to start without them)")
        self.dirs = list(dirs)
        self.primary = primary = primary_dir(self.dirs)
        rels = cache_files(self.root, primary)
        others = {d: set(cache_files(self.root, d)) for d in self.dirs if d != primary}
        self.items: list[str] = []
        self.unmatched: list[tuple[str, list[str]]] = []
        for rel in rels:
            lacking = [d for d, have in others.items() if rel not in have]
            if lacking:
                self.unmatched.append((rel, lacking))
            else:
                self.items.append(rel)
        if not self.items:
            raise ValueError(f"no valid samples in {self.root}: {len(rels)} file(s) in {primary}/, "
                             f"{len(self.unmatched)} without a match in {[d for d in self.dirs if d != primary]}")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        rel = self.items[i]
        out: dict[str, Any] = {"path": rel}
        for d in self.dirs:
            out[d] = load_pth_bytes((self.root / d / rel).read_bytes())
        return out
