"""Shared source helpers: media kinds by extension, sidecar captions, symlink resolution,
source resolution."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from shardsmith.errors import UserError
from shardsmith.records import Item, SourceInfo
from shardsmith.sources.paths import NAME_NOT_UTF8

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "avif", "heic", "heif"})
VIDEO_EXTENSIONS = frozenset({"mp4", "mov", "webm", "mkv", "avi", "m4v", "mpg", "mpeg", "ogv", "wmv"})
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "m4a", "aac", "opus"})
MEDIA_EXTENSIONS = IMAGE_EXTENSIONS | VIDEO_EXTENSIONS | AUDIO_EXTENSIONS
TABLE_EXTENSIONS = frozenset({"csv", "json", "jsonl", "parquet"})


class SourceError(UserError, ValueError):
    """A whole source cannot be read (missing folder, unreadable table): stops before writing."""


def utf8_ok(text: str) -> bool:
    """Whether ``text`` is valid Unicode that UTF-8 can hold: a name ``os.listdir`` decoded from bytes that are
    not UTF-8 (a Latin-1 ``caf\\xe9.jpg``) carries surrogate escapes, and so does a JSON string with an unpaired
    ``\\udXXX`` escape; neither can go into the ledger, a manifest, a tar or a ZIP name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(text: str) -> str:
    """``text`` as valid UTF-8 for messages and records: each byte a file name holds that is not UTF-8 spelled
    ``\\xNN`` (``caf\\xe9.jpg``), any other unpaired surrogate ``\\udXXX``; valid text is returned as it is."""
    if utf8_ok(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name gives (a JSON escape): spelled as the escape
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def refuse_root_not_utf8(spec, root: Path) -> None:
    """:class:`SourceError` where the source folder's own path is not valid UTF-8 (the manifest and ledger record
    it); a symbolic link with a UTF-8 name cannot help, since the recipe records the folder it leads to."""
    if not utf8_ok(str(root)):
        raise SourceError(f"source '{shown(spec.name)}': the folder path {shown(str(root))} is not "
                          "valid UTF-8 (\\xNN marks each byte that is not), and the manifest and ledger cannot "
                          "hold it; rename the folder to a UTF-8 name (a symbolic link to it does not help: the "
                          "recipe records the folder it leads to)")


def not_utf8_error(path: str, rel: str) -> tuple[str, str]:
    """The per-item verdict for a media file whose name (or a folder's on the way, within ``rel``, its path
    relative to the source) is not valid UTF-8; ``path`` as the walk gives it."""
    parts = rel.split("/")
    bad = next((i for i, part in enumerate(parts) if not utf8_ok(part)), len(parts) - 1)
    what = "file name" if bad == len(parts) - 1 else "folder name"
    return NAME_NOT_UTF8, (f"{shown(path)}: the {what} '{shown(parts[bad])}' is not valid UTF-8 (\\xNN marks each "
                           "byte that is not), and no dataset format, manifest or ledger can hold it; rename it to "
                           "UTF-8 (e.g. with `convmv -f latin1 -t utf8`) and build again")


def media_kind(path: str) -> str:
    """``image`` / ``video`` / ``audio`` / ``other`` from the file extension (case-insensitive)."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in VIDEO_EXTENSIONS:
        return "video"
    if ext in AUDIO_EXTENSIONS:
        return "audio"
    return "other"


def resolve(path: str) -> tuple[str, str | None]:
    """``(real path, problem)``: ``path`` with every symlink resolved. ``problem`` is None when
    the target exists, ``symlink_loop`` for a link loop, ``missing`` when the target (or a
    folder on the way) does not exist, ``unreadable`` for any other error; the real path is then
    resolved as far as it goes."""
    try:
        return os.path.realpath(path, strict=True), None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            problem = "symlink_loop"
        elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
            problem = "missing"
        else:
            problem = "unreadable"
        return os.path.realpath(path), problem


def read_caption(path: Path, errors: str) -> tuple[str | None, tuple[str, str] | None]:
    """Read a sidecar caption. Returns (caption, error); ``error`` is (reason, detail).

    UTF-8 (with or without BOM) is required; ``errors="replace"`` substitutes U+FFFD instead
    of failing the item.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, ("caption_unreadable", f"caption file {path} cannot be read: {exc}")
    try:
        return raw.decode("utf-8-sig").strip(), None
    except UnicodeDecodeError as exc:
        if errors == "replace":
            return raw.decode("utf-8-sig", errors="replace").strip(), None
        return None, ("caption_not_utf8",
                      f"caption file {path} is not UTF-8 (bad byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                      "re-save it as UTF-8, or set caption_errors: replace on this source")


def open_sources(recipe, exclude: list[Path] | None = None) -> list[tuple[SourceInfo, Callable[[], Iterator[Item]]]]:
    """Resolve each recipe source; raises :class:`SourceError` for a missing or unknown path."""
    from shardsmith.sources.folder import FolderSource
    from shardsmith.sources.table import TableSource
    from shardsmith.sources.wds import WdsSource

    out = []
    for i, spec in enumerate(recipe.sources):
        p = Path(spec.path)
        kind = spec.kind
        if kind == "auto":
            if p.is_dir():
                kind = "wds" if is_shard_folder(p) else "folder"
            elif p.is_file() and p.suffix.lower().lstrip(".") in TABLE_EXTENSIONS:
                kind = "table"
            elif not p.exists():
                raise SourceError(f"source '{shown(spec.name)}': {shown(str(p))} does not exist; fix sources[{i}].path")
            else:
                raise SourceError(f"source '{shown(spec.name)}': {shown(str(p))} is neither a folder nor a table "
                                  f"({', '.join(sorted(TABLE_EXTENSIONS))}); fix sources[{i}].path")
        src = {"folder": FolderSource, "table": TableSource, "wds": WdsSource}[kind](i, spec, exclude or [])
        out.append((src.info, src.items))
    return out


def is_shard_folder(path: Path) -> bool:
    """A WebDataset folder (``NNNNN.tar`` shards directly inside, or a bucketed output's
    ``buckets.json``; no media file beside them): a
    ``kind: auto`` source there is read as ``kind: wds`` (prompts), not as a folder of media."""
    from shardsmith.formats.wds import BUCKETS_INDEX_FILE, is_shard_file_name

    shards = False
    try:
        with os.scandir(path) as it:  # streamed: a folder of media stops at its first media file
            for e in it:
                if not e.is_file():
                    continue
                if media_kind(e.name) != "other":
                    return False
                shards = shards or e.name == BUCKETS_INDEX_FILE or is_shard_file_name(e.name)
    except OSError:
        return False
    return shards


def count_listed(opened: list[tuple[SourceInfo, Callable[[], Iterator[Item]]]]) -> int | None:
    """How many items the sources ``open_sources`` gave will yield, counted from their listings (a
    folder walk, a table's rows) without probing anything; None when a source cannot say."""
    total = 0
    for _, items in opened:
        count = getattr(getattr(items, "__self__", None), "count", None)
        if count is None:
            return None
        total += count()
    return total
