"""What kind of dataset a path is, and whether a folder is a shardsmith build."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal, NamedTuple

from shardsmith.formats.build_dir import LEDGER_FILE, MANIFEST_FILE, STATE_DIR
from shardsmith.formats.precomputed import MARKER_DIRS
from shardsmith.formats.wds import BUCKETS_INDEX_FILE, is_shard_file_name
from shardsmith.formats.zip import is_zip_file_name

DatasetKind = Literal["zip", "precomputed", "wds", "wds_buckets"]


def dataset_kind(path: Path) -> DatasetKind:
    """``zip`` for a ``.zip`` file, ``precomputed`` for a folder holding ``latents/``,
    ``conditions/`` or ``audio_latents/``, ``wds_buckets`` for a multi-bucket output (one
    WebDataset folder per bucket beside ``buckets.json``), ``wds`` for a folder with a ``*.tar``
    entry; ``ValueError`` for anything else."""
    path = Path(path)
    if path.is_file() and is_zip_file_name(path.name):
        return "zip"
    if path.is_dir() and (path / BUCKETS_INDEX_FILE).is_file():
        return "wds_buckets"
    if path.is_dir() and any((path / d).is_dir() for d in MARKER_DIRS):
        return "precomputed"
    if path.is_dir() and any(is_shard_file_name(p.name) for p in path.iterdir()):
        return "wds"
    if not path.exists() and not path.is_symlink():
        raise ValueError(f"{path} does not exist; give an EDM .zip, a folder with .tar shards or a .precomputed/ tree")
    raise ValueError(build_folder_message(path)
                     or f"{path} is neither an EDM .zip, a folder with .tar shards, nor a .precomputed/ tree")


def refuse_unreadable(path: Path, kind: DatasetKind) -> None:
    """``ValueError`` (naming the file) unless ``path`` reads as the ``kind`` it was taken for: a ``zip`` is a ZIP
    archive holding at least one sample (an image or ``.npy``); every ``.tar`` of a ``wds`` folder (of each
    bucket's folder for ``wds_buckets``) opens as a tar and holds a first member. Headers only: ``inspect``
    checks every member."""
    import tarfile
    import zipfile

    from shardsmith.formats.zip import is_sample_member

    path = Path(path)
    if kind == "zip":
        try:
            with zipfile.ZipFile(path) as zf:
                if not any(is_sample_member(n) for n in zf.namelist()):
                    raise ValueError(f"{path} is a ZIP archive without any image or .npy member: not an EDM "
                                     "dataset; register the .zip that a build (or EDM's dataset_tool) wrote")
        except (zipfile.BadZipFile, OSError) as exc:
            raise ValueError(f"{path} is not a readable ZIP archive ({exc}); register the .zip that a build (or "
                             "EDM's dataset_tool) wrote, or re-copy it") from None
        return
    if kind not in ("wds", "wds_buckets"):
        return
    folders = [path] if kind == "wds" else sorted(p for p in path.iterdir() if p.is_dir())
    for folder in folders:
        for shard in sorted(p for p in folder.iterdir() if is_shard_file_name(p.name)):
            try:
                with tarfile.open(shard, "r:") as tf:
                    first = tf.next()
            except (tarfile.TarError, OSError) as exc:
                raise ValueError(f"{shard} is not a readable tar shard ({exc}); shardsmith inspect {folder} lists "
                                 f"what is wrong, shardsmith repair {folder} rewrites truncated shards") from None
            if first is None:
                raise ValueError(f"{shard} is an empty tar: it holds no sample; remove it, or rebuild the dataset")


def build_folder_message(path: Path) -> str | None:
    """For a shardsmith build folder (a manifest or a ledger in it): what to pass instead, naming its
    datasets; None for any other path."""
    path = Path(path)
    if not (path.is_dir() and ((path / MANIFEST_FILE).is_file() or is_build(path))):
        return None
    inside = datasets_in(path)
    return (f"{path} is a shardsmith build folder, not one dataset; pass one of its datasets: "
            + (", ".join(str(path / d) for d in inside) if inside else "(none written yet)"))


def datasets_in(build: Path, depth: int = 2) -> list[str]:
    """The datasets under a build folder (each output of each split: ``wds``, ``holdout/wds``, ``x.zip``,
    ``.precomputed`` ...), relative to it and sorted; its state folder is not looked into."""
    found: list[str] = []

    def walk(folder: Path, level: int) -> None:
        for p in sorted(folder.iterdir()):
            if p.name == STATE_DIR:
                continue
            try:
                dataset_kind(p)
                found.append(p.relative_to(build).as_posix())
            except ValueError:
                if p.is_dir() and level < depth:
                    walk(p, level + 1)

    walk(build, 1)
    return found


def _is_file(path: Path) -> bool | None:
    """Whether ``path`` is a file; None when this user may not look (its folder denies access: the state
    folder of another user's build, ``chmod 700``), where pathlib's ``is_file`` raises ``PermissionError``."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except PermissionError:
        return None
    except (OSError, ValueError):
        return False


def is_build(folder: Path) -> bool:
    """True for a folder holding a shardsmith ledger (that this user can see)."""
    return bool(_is_file(Path(folder) / LEDGER_FILE))


class BuildFolder(NamedTuple):
    """A folder holding a ledger, a manifest or both. ``ledger_unreadable``: its state folder holds a ledger
    this user may not look at (then ``has_ledger`` is False: whether the build is finished cannot be told
    from it)."""

    root: Path
    has_ledger: bool
    has_manifest: bool
    ledger_unreadable: bool = False


def enclosing_build(path: Path) -> BuildFolder | None:
    """The nearest folder at or above ``path`` (resolved) holding a ledger or a manifest: the one walk up the
    parents that every command finding "the build this path belongs to" uses (for the folders strictly
    above a path, pass its parent). A ledger this user may not look at counts as absent
    (``ledger_unreadable``); never a ``PermissionError``."""
    path = Path(path).resolve()
    try:
        here = [path] if path.is_dir() else []
    except OSError:  # a folder above it denies access: start above
        here = []
    for root in here + list(path.parents):
        has_ledger = _is_file(root / LEDGER_FILE)
        has_manifest = bool(_is_file(root / MANIFEST_FILE))
        if has_ledger or has_manifest:
            return BuildFolder(root, bool(has_ledger), has_manifest, has_ledger is None)
    return None
