"""Image folder source: class subfolders become labels; sidecar ``.txt`` files are captions.

Walks the folder in sorted order (deterministic), skipping hidden entries and excluded
paths (the build's own output). A folder whose top level holds sub-folders with media is
labelled: sorted sub-folder names -> contiguous ids 0..K-1 (``labels: none`` turns it off);
media directly at the top level of a labelled folder get no label.

Links are judged by where they land (:mod:`shardsmith.sources.paths`): a file or folder link
that resolves outside the source folder is the item ``skipped:symlink_outside_source`` and is
never opened (``follow_symlinks: true`` opts in); a link loop, a dangling media link and a
sub-folder that cannot be listed are per-item failures, and the walk goes on. A media name that is a named
pipe, a device or a socket (or a link to one) is ``failed:not_a_regular_file`` and never opened. Only the
source folder itself being unlistable stops the build (:class:`SourceError`).

A media name whose bytes are not UTF-8 (a Latin-1 ``caf\\xe9.jpg``, or any file under a folder so named) is
``failed:name_not_utf8``, never opened: no output, manifest or ledger could hold its name; its id and paths are
spelled with ``\\xNN`` for each such byte (stable, valid UTF-8), and such a folder is no class. A source folder
whose own path is not UTF-8 is refused (:class:`SourceError`).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from shardsmith import formats
from shardsmith.records import TARGET, Item, MediaRef, SourceInfo
from shardsmith.sources import paths
from shardsmith.sources.base import (MEDIA_EXTENSIONS, SourceError, not_utf8_error, read_caption, refuse_root_not_utf8,
                                     resolve, shown, utf8_ok)
from shardsmith.sources.extsort import SortedNames

Error = tuple[str, str]  # (reason, detail)


class Entry(NamedTuple):
    """One thing the walk found: a media file, or a refused / failed entry (``error`` set).
    ``sidecar_error`` is set when the file's sidecar caption is a link that may not be read."""

    path: str
    rel: str
    sidecar: str | None = None
    error: Error | None = None
    sidecar_error: Error | None = None


@dataclass
class Ignored:
    """What a folder source's walk passed over without making an item: names starting with ``.`` (``hidden``;
    a hidden folder counts once, unwalked) and files with no media extension (``no_media_extension``; sidecar
    ``.txt`` captions are not counted), with the first :attr:`EXAMPLES` of them by relative path."""

    EXAMPLES = 5
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def take(self, counts: dict[str, int], first: list[tuple[str, str]]) -> None:
        """Add one folder's ``counts`` by reason and its first passed-over entries ``(rel, reason)``."""
        for reason, n in counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
        self.examples += [rel for rel, _ in first][:self.EXAMPLES - len(self.examples)]

    def to_json(self) -> dict | None:
        """``{"hidden": n, "no_media_extension": n, "examples": [...]}`` (reasons that occurred), None if none."""
        return {**dict(sorted(self.counts.items())), "examples": self.examples} if self.counts else None


@dataclass
class _Walk:
    """What every level of one walk shares: the resolved source root, its exclusions and opt-ins."""

    real_root: str
    exclude: frozenset[str]
    follow: bool
    ancestors: set[str] = field(default_factory=set)  # resolved folders of the current branch
    ignored: Ignored | None = None  # counted by the walk that makes the items


@dataclass
class _Listing:
    """One folder's non-hidden entries, sorted: media files and folders to walk (``names``),
    which of them are folders, sidecar ``.txt`` names, and the entries refused by a path rule."""

    names: SortedNames = field(default_factory=SortedNames)  # iterated once, in sorted order
    dirs: set[str] = field(default_factory=set)
    texts: set[str] = field(default_factory=set)
    refused: dict[str, Error] = field(default_factory=dict)  # name -> (reason, detail); media and folders
    refused_texts: dict[str, Error] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)  # reason -> entries passed over (see Ignored)
    passed_first: list[tuple[str, str]] = field(default_factory=list)  # the smallest (name, reason), bounded

    def pass_over(self, name: str, reason: str) -> None:
        self.passed[reason] = self.passed.get(reason, 0) + 1
        bisect.insort(self.passed_first, (name, reason))
        del self.passed_first[Ignored.EXAMPLES:]


def _is_media(name: str) -> bool:
    return os.path.splitext(name)[1].lower().lstrip(".") in MEDIA_EXTENSIONS


def _link_verdict(path: str, name: str, walk: _Walk) -> tuple[str, Error | None]:
    """Where a link entry belongs: ``("dir" | "file" | "text" | "ignore", None)`` for a usable
    link, or ``("refused" | "refused_text" | "ignore", error)``. Only the link is resolved; the
    target is never opened."""
    real, problem = resolve(path)
    if problem == "symlink_loop":
        return "refused", ("symlink_loop", f"{path} is a symbolic link loop; fix or remove the link")
    if problem is not None:
        if not _is_media(name):
            return "ignore", None
        return "refused", ("broken_symlink", f"{path} is a symbolic link to {real}, which cannot be reached "
                           f"({problem}); fix or remove the link")
    is_dir = os.path.isdir(real)
    kind = "dir" if is_dir else "file" if _is_media(name) else "text" if name.endswith(".txt") else "ignore"
    if kind in ("file", "text"):
        special = paths.special_file(real)
        if special is not None:  # a link to a pipe or a device: never opened
            return ("refused" if kind == "file" else "refused_text"), paths.not_regular_error(path, special)
    if kind == "ignore" or walk.follow or paths.within(real, walk.real_root):
        return kind, None
    error = ("symlink_outside_source", f"{path} links to {real}, outside the source folder {walk.real_root}; "
             "it is not read (set follow_symlinks: true on this source to read it)")
    return ("refused_text" if kind == "text" else "refused"), error


def _sort_entry(e: os.DirEntry, walk: _Walk, out: _Listing) -> None:
    """File one directory entry into ``out`` (no ``stat`` for plain files)."""
    name = e.name
    error = None
    if e.is_symlink():
        kind, error = _link_verdict(e.path, name, walk)
    elif e.is_dir(follow_symlinks=False):
        kind = "dir"
    elif _is_media(name):
        kind = "file"
        if not e.is_file(follow_symlinks=False):  # a pipe, a device, a socket named like media
            kind, error = "refused", paths.not_regular_error(e.path, paths.special_file(e.path) or "not a file")
    else:
        kind = "text" if name.endswith(".txt") and e.is_file(follow_symlinks=False) else "ignore"
    if kind == "file":
        out.names.add(name)
    elif kind == "text":
        out.texts.add(name)
    elif kind == "dir":
        out.dirs.add(name)
        out.names.add(name)
    elif kind == "refused":
        out.names.add(name)
        out.refused[name] = error
    elif kind == "refused_text":
        out.refused_texts[name] = error
    elif walk.ignored is not None:  # "ignore": no media extension (nor a sidecar caption)
        out.pass_over(name, "no_media_extension")


def _listing(root: str, walk: _Walk, rel: str = "") -> _Listing:
    """The sorted listing of ``root``; raises ``OSError`` when the folder cannot be listed.

    Only names are kept (not ``DirEntry`` objects), and a large folder's names are sorted on
    disk (:class:`~shardsmith.sources.extsort.SortedNames`): memory stays bounded however many
    files one folder holds.
    """
    out = _Listing()
    with os.scandir(root) as it:
        for e in it:
            if not e.name.startswith("."):
                _sort_entry(e, walk, out)
            elif walk.ignored is not None:
                out.pass_over(e.name, "hidden")
    if walk.ignored is not None:  # in name order, whatever order the folder lists them in
        walk.ignored.take(out.passed, [(shown(rel + name), reason) for name, reason in out.passed_first])
    return out


def _sub_folder(path: str, rel: str, walk: _Walk) -> Iterator[Entry]:
    """Walk one sub-folder, or yield the one failed entry that stands for it (a loop back to a
    folder it sits in, a folder that cannot be listed); excluded folders yield nothing."""
    real = os.path.realpath(path)
    if real in walk.exclude:
        return
    if paths.is_loop(real, walk.ancestors):
        yield Entry(path, rel, error=("symlink_loop", f"{path} leads back to {real}, a folder it sits in; "
                                      "fix or remove the link"))
        return
    try:
        listing = _listing(path, walk, rel + "/")
    except OSError as exc:
        yield Entry(path, rel, error=("unreadable_folder", f"folder {path} cannot be listed "
                                      f"({exc.strerror or type(exc).__name__}); its files are not in the dataset"))
        return
    walk.ancestors.add(real)
    try:
        yield from _entries(path, listing, walk, rel + "/")
    finally:
        walk.ancestors.discard(real)


def _entries(base: str, listing: _Listing, walk: _Walk, rel: str) -> Iterator[Entry]:
    """The entries of one listed folder, in sorted order, sub-folders walked where they sort."""
    for name in listing.names:
        path = os.path.join(base, name)
        if name in listing.refused:
            yield Entry(path, rel + name, error=listing.refused[name])
        elif name in listing.dirs:
            yield from _sub_folder(path, rel + name, walk)
        else:
            side = formats.without_suffix(name) + ".txt"  # Path.with_suffix(".txt")
            yield Entry(path, rel + name, sidecar=os.path.join(base, side) if side in listing.texts else None,
                        sidecar_error=listing.refused_texts.get(side))


def _utf8(e: Entry) -> Entry:
    """``e`` as the ledger and every output can hold it: an entry whose path is not valid UTF-8 becomes
    ``failed:name_not_utf8`` (a refused one keeps its reason) with its path and relative path spelled by
    :func:`~shardsmith.sources.base.shown` (deterministic, so its id and split are stable); details that quote
    a link target that is not UTF-8 are spelled the same way."""
    details = [x[1] for x in (e.error, e.sidecar_error) if x is not None]
    if utf8_ok(e.path) and utf8_ok(e.rel) and all(utf8_ok(d) for d in details):
        return e
    error, sidecar, side = e.error, e.sidecar, e.sidecar_error
    if not (utf8_ok(e.path) and utf8_ok(e.rel)):
        sidecar = side = None  # never read: the item fails on its name
        if error is None:
            error = not_utf8_error(e.path, e.rel)
    fix = (lambda x: None if x is None else (x[0], shown(x[1])))
    return Entry(shown(e.path), shown(e.rel), sidecar, fix(error), fix(side))


def _walk(root: Path, walk: _Walk) -> Iterator[Entry]:
    """Sorted recursive walk of the source folder ``root``; raises :class:`SourceError` when
    ``root`` itself cannot be listed (every failure below it is an entry)."""
    try:
        listing = _listing(str(root), walk)
    except OSError as exc:
        raise SourceError(f"cannot list {shown(str(root))}: {exc.strerror or exc}") from None
    walk.ancestors.add(walk.real_root)
    for e in _entries(str(root), listing, walk, ""):
        yield _utf8(e)


def _class_names(root: Path, walk: _Walk) -> list[str]:
    """Sorted names of the top-level folders holding at least one usable media file."""
    top = _listing(str(root), walk)
    top.names.close()  # only its folders are needed
    names = []
    for d in sorted(top.dirs):
        sub = _Walk(walk.real_root, walk.exclude, walk.follow, {walk.real_root})
        if utf8_ok(d) and any(e.error is None and utf8_ok(e.rel) for e in _sub_folder(str(root / d), d, sub)):
            names.append(d)
    return names


class FolderSource:
    passed_over: Ignored | None = None  # after a walk of :meth:`items`

    def __init__(self, index: int, spec, exclude: list[Path]):
        self.root = Path(spec.path)
        if not self.root.is_dir():
            raise SourceError(f"source {spec.name!r}: {shown(str(self.root))} is not a folder")
        refuse_root_not_utf8(spec, self.root)
        self.spec = spec
        self.exclude = frozenset(os.path.realpath(p) for p in exclude)
        self.real_root = os.path.realpath(self.root)
        try:
            names = _class_names(self.root, self._walk_state()) if spec.labels == "auto" else []
        except OSError as exc:
            raise SourceError(f"source {spec.name!r}: cannot list {self.root}: {exc.strerror or exc}") from None
        self.classes = {n: i for i, n in enumerate(names)}
        self.info = SourceInfo(index=index, name=spec.name, path=str(self.root), kind="folder",
                               origin=spec.origin, license=spec.license,
                               label_names=tuple(names) if names else None)

    def _walk_state(self) -> _Walk:
        return _Walk(self.real_root, self.exclude, self.spec.follow_symlinks)

    def count(self) -> int:
        """How many items :meth:`items` yields: the same walk, no caption read, nothing opened."""
        return sum(1 for _ in _walk(self.root, self._walk_state()))

    def items(self) -> Iterator[Item]:
        """One item per entry of the walk; refused and failed entries carry their ``error``. Once the walk has
        ended, :attr:`passed_over` holds what it passed over (:class:`Ignored`)."""
        sidecars = self.spec.captions == "sidecar"
        walk = self._walk_state()
        walk.ignored = self.passed_over = Ignored()
        for e in _walk(self.root, walk):
            label = label_name = None
            if self.classes and "/" in e.rel:
                label_name = e.rel.split("/", 1)[0]
                label = self.classes.get(label_name)
            caption, error = None, e.error
            if error is None and sidecars:
                if e.sidecar_error is not None:
                    error = e.sidecar_error
                elif e.sidecar is not None:
                    caption, error = read_caption(Path(e.sidecar), self.spec.caption_errors)
            yield Item(item_id=f"{self.spec.name}/{e.rel}", source=self.info.index, path=e.path, relpath=e.rel,
                       caption=caption, label=label, label_name=label_name, error=error,
                       media={TARGET: MediaRef(e.path, e.rel)})
