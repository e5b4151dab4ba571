"""What a build may do with its ``--out`` folder: never write around its own sources, and on
``--overwrite`` remove only what a previous shardsmith build of that folder wrote.

Contract
- :func:`refuse_around_sources` raises :class:`OutAroundSourceError` when ``--out`` equals,
  contains or lies inside a source path (both resolved through symlinks); it writes nothing.
  :func:`recorded_sources` gives the sources a build's manifest records (:class:`RecordedSource`), for
  ``decode --out`` and ``report --output``: for a table source that is the table file itself, as for
  ``build --out`` (the folder the table sits in is the user's project folder, where a build's --out
  may lie; the folders its rows point into are not recorded in the manifest).
- :func:`is_build` is True only for a folder holding a shardsmith ledger.
- :func:`owned_files` lists the files a build's ledger accounts for, relative to its folder: its
  ``manifest.json``, its ``report.html`` and ``.shardsmith/`` (not ``.shardsmith/quarantine/``: the files
  ``repair`` moved out of a ``.precomputed/`` tree are the user's, carried into a rebuilt folder); in the folders of the outputs its recorded recipe names
  (train and ``holdout/``): the recorded units (and ``NNNNN.tar`` shards a kill left between
  their rename and their record), the index files (``shard_count.json``, ``ignore_index.json``,
  ``repair.json``, ``neg_prompt_emb.npy``), the ZIP, the ``.precomputed/`` stamp and its
  ``latents/`` and ``conditions/`` ``.pt`` files; each with the ``.orig`` backup repair keeps and
  the temporary names (``.tmp-<pid>``) of an unfinished atomic write. Everything else in the
  folder is the user's (:func:`foreign_files`).
- :func:`remove_owned` deletes owned files only (the lock file of a folder still in use is
  kept) and prunes the folders left empty; :func:`retire` carries the user's files of a
  replaced build into its successor (same relative path, or ``<name>.kept``, ``.kept2``...
  when the new build has a file there), then removes the rest; nothing foreign is ever deleted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from shardsmith.errors import UserError
from shardsmith.formats.build_dir import HOLDOUT_DIR, LEDGER_FILE, LOCK_FILE, MANIFEST_FILE, REPORT_FILE, STATE_DIR
from shardsmith.formats.detect import is_build
from shardsmith.formats.precomputed import CACHE_EXT, PRECOMPUTED_STAMP, QUARANTINE_DIR, WRITTEN_DIRS
from shardsmith.formats.wds import BACKUP_SUFFIX, INDEX_FILES, is_bucket_folder, is_numbered_shard
from shardsmith.formats.zip import ZIP_FORMATS
from shardsmith.atomic import TMP_MARK

_TMP_RE = re.compile(re.escape(TMP_MARK) + r"\d+$")


class OutAroundSourceError(UserError):
    """``--out`` equals, contains or lies inside a source: a build there could destroy its input."""


@dataclass(frozen=True)
class OutputLayout:
    """Where one output of a recorded recipe writes, relative to the build folder."""

    name: str
    format: str
    target: str  # ``dir`` (wds, latent_wds, precomputed) or ``path`` (zip)


def _resolved(p: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(p)).resolve()


class RecordedSource(NamedTuple):
    """A source a build's recipe recorded: its ``name`` and its ``path`` as the recipe gave it."""

    name: str
    path: str


def recorded_sources(manifest: dict) -> list[RecordedSource]:
    """The sources the recipe recorded in a build's ``manifest.json`` (none when it recorded no recipe), for
    :func:`refuse_around_sources`."""
    recipe = manifest.get("recipe") if isinstance(manifest, dict) else None
    found = []
    for s in (recipe.get("sources") or []) if isinstance(recipe, dict) else []:
        if isinstance(s, dict) and isinstance(s.get("path"), str) and s["path"].strip():
            found.append(RecordedSource(str(s.get("name") or s["path"]), s["path"]))
    return found


def refuse_around_sources(out: str | os.PathLike, sources: Iterable[tuple[str, str]], flag: str = "--out",
                          what: str = "shardsmith never writes into or around its own sources") -> None:
    """Raise unless ``out`` is disjoint from every ``(name, path)`` source (after symlinks; a
    :class:`RecordedSource` is one); ``flag`` and ``what`` name the option and the command in the message."""
    o = _resolved(out)
    for name, path in sources:
        s = _resolved(path)
        if o == s:
            how = "is"
        elif o in s.parents:
            how = "contains"
        elif s in o.parents:
            how = "lies inside"
        else:
            continue
        raise OutAroundSourceError(
            f"{flag} {o} {how} source {name!r} ({s}); {what}, with or without --overwrite. Choose "
            f"{'an' if flag == '--out' else 'a'} {flag} outside every source folder.")


def recorded_layout(folder: Path) -> tuple[list[OutputLayout], dict[tuple[str, str], list[str]]]:
    """(outputs of the recorded recipe, unit names per (output, split)) from ``folder``'s ledger;
    empty when it recorded no recipe."""
    from shardsmith.plan.ledger import Ledger

    led = Ledger(Path(folder) / LEDGER_FILE)
    try:
        recipe = led.get_meta("recipe") or {}
        layouts = []
        for o in recipe.get("outputs") or []:
            if isinstance(o, dict) and isinstance(o.get("name"), str):
                target = o.get("path") if o.get("format") in ZIP_FORMATS else o.get("dir")
                if isinstance(target, str):
                    layouts.append(OutputLayout(o["name"], str(o.get("format")), target))
        units: dict[tuple[str, str], list[str]] = {}
        for output, split, name in led.db.execute("SELECT output, split, name FROM shards WHERE name != ''"):
            units.setdefault((output, split), []).append(name)
        return layouts, units
    finally:
        led.close()


def _inside(rel: str) -> bool:
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts


def _base_name(name: str) -> str:
    """``00003.tar.tmp-812`` -> ``00003.tar``; ``00003.tar.orig`` -> ``00003.tar``."""
    m = _TMP_RE.search(name)
    if m:
        name = name[:m.start()]
    return name[:-len(BACKUP_SUFFIX)] if name.endswith(BACKUP_SUFFIX) else name


def _files_in(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if not p.is_dir() or p.is_symlink()] if d.is_dir() else []


def owned_files(folder: str | os.PathLike) -> set[str]:
    """Relative paths of the files in ``folder`` that its shardsmith build wrote (see module doc)."""
    folder = Path(folder)
    if not is_build(folder):
        return set()
    layouts, units = recorded_layout(folder)
    kept = folder / STATE_DIR / QUARANTINE_DIR  # the files repair moved out of a tree: never the build's to delete
    found: list[Path] = [p for p in (folder / STATE_DIR).rglob("*") if (not p.is_dir() or p.is_symlink())
                         and kept not in p.parents]
    found += [p for p in _files_in(folder) if _base_name(p.name) in (MANIFEST_FILE, REPORT_FILE)]
    for lay in layouts:
        if not _inside(lay.target):
            continue
        for split, prefix in (("train", ""), ("holdout", f"{HOLDOUT_DIR}/")):
            dest = folder / f"{prefix}{lay.target}"
            if lay.format in ZIP_FORMATS:
                found += [p for p in _files_in(dest.parent) if _base_name(p.name) == dest.name]
                continue
            if lay.format == "precomputed":
                found += [p for p in _files_in(dest) if _base_name(p.name) == PRECOMPUTED_STAMP]
                for tree in WRITTEN_DIRS:
                    if (dest / tree).is_dir() and not (dest / tree).is_symlink():
                        found += [p for p in (dest / tree).rglob("*") if p.is_file() and not p.is_symlink()
                                  and _base_name(p.name).endswith(CACHE_EXT)]
                continue
            # recorded units, and shards a kill left between their rename and their record
            recorded = set(units.get((lay.name, split), [])) | set(INDEX_FILES)
            found += [p for p in _files_in(dest)
                      if _base_name(p.name) in recorded or is_numbered_shard(_base_name(p.name))]
            for sub in (dest.iterdir() if dest.is_dir() and not dest.is_symlink() else []):
                if sub.is_dir() and not sub.is_symlink() and is_bucket_folder(sub.name):  # a multi-bucket output
                    found += [p for p in _files_in(sub)
                              if _base_name(p.name) in INDEX_FILES or is_numbered_shard(_base_name(p.name))]
    return {p.relative_to(folder).as_posix() for p in found}


def all_files(folder: Path) -> set[str]:
    """Every non-directory below ``folder`` (symlinks not followed), relative."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        d = Path(dirpath)
        out.update((d / n).relative_to(folder).as_posix() for n in filenames)
        out.update((d / n).relative_to(folder).as_posix() for n in dirnames if (d / n).is_symlink())
    return out


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """Files in ``folder`` that its build did not write (all of them for a folder no build wrote)."""
    folder = Path(folder)
    return sorted(all_files(folder) - owned_files(folder))


def prune_empty_dirs(folder: Path, keep_root: bool) -> None:
    for dirpath, dirnames, filenames in sorted(os.walk(folder, topdown=False), key=lambda t: -len(t[0])):
        d = Path(dirpath)
        if d == folder and keep_root:
            continue
        try:
            d.rmdir()  # only succeeds on an empty folder
        except OSError:
            pass


def remove_owned(folder: str | os.PathLike, *, keep_lock: bool) -> list[str]:
    """Delete the files ``folder``'s build wrote (its ledger last, its lock file only when
    ``keep_lock`` is False) and the folders left empty; return the foreign files left."""
    folder = Path(folder)
    owned = owned_files(folder)
    last = {LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm"}
    if keep_lock:
        owned.discard(LOCK_FILE)
    for rel in sorted(owned - last) + sorted(owned & last):
        (folder / rel).unlink(missing_ok=True)
    prune_empty_dirs(folder, keep_root=keep_lock)
    return foreign_files(folder) if folder.exists() else []


def remove_owned_under(folder: str | os.PathLike, rel: str) -> int:
    """Delete the files below ``folder/rel`` that ``folder``'s build wrote (the user's stay) and
    the folders left empty; return how many were deleted."""
    folder = Path(folder)
    prefix = rel.rstrip("/") + "/"
    gone = [r for r in owned_files(folder) if r.startswith(prefix)]
    for r in gone:
        (folder / r).unlink(missing_ok=True)
    if (folder / rel).is_dir():
        prune_empty_dirs(folder / rel, keep_root=False)
    return len(gone)


def _free_name(dest: Path) -> Path:
    n = 1
    cand = dest.with_name(dest.name + ".kept")
    while cand.exists() or cand.is_symlink():
        n += 1
        cand = dest.with_name(f"{dest.name}.kept{n}")
    return cand


def retire(old: str | os.PathLike, into: str | os.PathLike) -> list[str]:
    """Carry the user's files of the replaced build ``old`` into ``into`` (same filesystem),
    then remove ``old``'s own files and ``old`` itself; return what was carried (``a -> b`` where
    renamed because the new build has a file of that name)."""
    old, into = Path(old), Path(into)
    carried = []
    for rel in foreign_files(old):
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() or dest.is_symlink():
            kept = _free_name(dest)
            os.rename(old / rel, kept)
            carried.append(f"{rel} -> {kept.relative_to(into).as_posix()}")
        else:
            os.rename(old / rel, dest)
            carried.append(rel)
    remove_owned(old, keep_lock=False)
    return carried
