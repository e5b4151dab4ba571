"""Image folder source: class subfolders become labels; sidecar ``.txt`` files are captions.

Walks the folder in sorted order (deterministic), skipping hidden entries and excluded
paths (the build's own output). A folder whose top level holds sub-folders with media is
labelled: sorted sub-folder names -> contiguous ids 0..K-1 (``labels: none`` turns it off);
media directly at the top level of a labelled folder get no label.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from shardsmith.records import Item, SourceInfo
from shardsmith.sources.base import MEDIA_EXTENSIONS, SourceError, read_caption


def _walk(root: Path, exclude: list[Path]) -> Iterator[Path]:
    """Sorted recursive walk yielding media files; never follows excluded or hidden dirs."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise SourceError(f"cannot list {root}: {exc}") from None
    for e in entries:
        if e.name.startswith("."):
            continue
        p = Path(e.path)
        if e.is_dir(follow_symlinks=True):
            if any(p.resolve() == x for x in exclude):
                continue
            yield from _walk(p, exclude)
        elif os.path.splitext(e.name)[1].lower().lstrip(".") in MEDIA_EXTENSIONS:
            yield p


def _class_names(root: Path, exclude: list[Path]) -> list[str]:
    names = []
    for e in sorted(os.scandir(root), key=lambda e: e.name):
        if e.name.startswith(".") or not e.is_dir() or Path(e.path).resolve() in exclude:
            continue
        if next(_walk(Path(e.path), exclude), None) is not None:
            names.append(e.name)
    return names


class FolderSource:
    def __init__(self, index: int, spec, exclude: list[Path]):
        self.root = Path(spec.path)
        if not self.root.is_dir():
            raise SourceError(f"source {spec.name!r}: {self.root} is not a folder")
        self.spec = spec
        self.exclude = [p.resolve() for p in exclude]
        names = _class_names(self.root, self.exclude) if spec.labels == "auto" else []
        self.classes = {n: i for i, n in enumerate(names)}
        self.info = SourceInfo(index=index, name=spec.name, path=str(self.root), kind="folder",
                               origin=spec.origin, license=spec.license,
                               label_names=tuple(names) if names else None)

    def items(self) -> Iterator[Item]:
        for p in _walk(self.root, self.exclude):
            rel = p.relative_to(self.root).as_posix()
            label = label_name = None
            if self.classes and "/" in rel:
                label_name = rel.split("/", 1)[0]
                label = self.classes.get(label_name)
            caption, error = None, None
            if self.spec.captions == "sidecar":
                side = p.with_suffix(".txt")
                if side.is_file():
                    caption, error = read_caption(side, self.spec.caption_errors)
            yield Item(item_id=f"{self.spec.name}/{rel}", source=self.info.index, path=str(p), relpath=rel,
                       caption=caption, label=label, label_name=label_name, error=error)
