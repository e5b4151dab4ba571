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

from shardsmith import formats
from shardsmith.records import Item, SourceInfo
from shardsmith.sources.base import MEDIA_EXTENSIONS, SourceError, read_caption


def _listing(root: Path) -> tuple[list[str], set[str], set[str]]:
    """Sorted names of media files and sub-folders (not hidden) of ``root``, which of them are
    folders, and the names of the ``.txt`` files beside them (sidecar captions, found without
    one ``stat`` per item).

    Only names are kept (not ``DirEntry`` objects): a flat folder of 50k files costs a few MB.
    """
    names: list[str] = []
    dirs: set[str] = set()
    texts: set[str] = set()
    try:
        with os.scandir(root) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=True):
                    dirs.add(e.name)
                    names.append(e.name)
                    continue
                ext = os.path.splitext(e.name)[1].lower().lstrip(".")
                if ext in MEDIA_EXTENSIONS:
                    names.append(e.name)
                if e.name.endswith(".txt") and e.is_file(follow_symlinks=True):
                    texts.add(e.name)
    except OSError as exc:
        raise SourceError(f"cannot list {root}: {exc}") from None
    names.sort()
    return names, dirs, texts


def _walk(root: Path, exclude: list[Path], rel: str = "") -> Iterator[tuple[str, str, str | None]]:
    """Sorted recursive walk yielding ``(path, relpath, sidecar path or None)`` per media file;
    never enters excluded or hidden folders. Paths are plain strings (no pathlib per item)."""
    names, dirs, texts = _listing(root)
    base = str(root)
    for name in names:
        if name in dirs:
            p = root / name
            if p.resolve() not in exclude:
                yield from _walk(p, exclude, f"{rel}{name}/")
        else:
            side = formats.without_suffix(name) + ".txt"  # Path.with_suffix(".txt")
            yield os.path.join(base, name), rel + name, os.path.join(base, side) if side in texts else None


def _class_names(root: Path, exclude: list[Path]) -> list[str]:
    with os.scandir(root) as it:  # only folder names are kept, however many files sit beside them
        dirs = [e.name for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=True)]
    return [d for d in sorted(dirs)
            if (root / d).resolve() not in exclude and next(_walk(root / d, exclude), None) is not None]


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
        sidecars = self.spec.captions == "sidecar"
        for path, rel, side in _walk(self.root, self.exclude):
            label = label_name = None
            if self.classes and "/" in rel:
                label_name = rel.split("/", 1)[0]
                label = self.classes.get(label_name)
            caption, error = None, None
            if sidecars and side is not None:
                caption, error = read_caption(Path(side), self.spec.caption_errors)
            yield Item(item_id=f"{self.spec.name}/{rel}", source=self.info.index, path=path, relpath=rel,
                       caption=caption, label=label, label_name=label_name, error=error)
