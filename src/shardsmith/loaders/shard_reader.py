"""How the loader lists a shard folder and reads a shard: the shards in loader order, each
shard's samples from its tar headers only (cached per process), one member's bytes with
``os.pread``, and the per-shard sample counts of ``shard_count.json``.

Layout rules (names, grouping, index files) come from :mod:`shardsmith.formats.wds`; the
header-only tar lister from :mod:`shardsmith.formats.tar`.
"""

from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path
from typing import Optional

import numpy as np

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.tar import ShardUnreadable, tar_members
from shardsmith.formats.wds import SHARD_COUNT_FILE, MemberRef, group_members

log = logging.getLogger(__name__)


def sort_shard_names(names) -> list[str]:
    """FastGen order (see :func:`shardsmith.formats.wds.sort_shard_names`), warning when not numeric."""
    ordered, numeric = wds_layout.sort_shard_names(names)
    if not numeric:
        log.warning("shard names are not all numeric (NNNNN.tar); sorting them by name")
    return ordered


def list_shards(folder) -> list[str]:
    """The shards of ``folder`` (:func:`shardsmith.formats.wds.list_shards`) in loader order;
    ``FileNotFoundError`` without the folder, ``ValueError`` without a shard."""
    names = wds_layout.list_shards(folder).names
    if not names:
        raise ValueError(f"no .tar shards directly inside {folder}")
    return sort_shard_names(names)


class _MemberIndex:
    """Listings of shards already scanned in this process, kept compact (one bytes object of
    names and one int64 array of offsets and sizes per shard: no per-member Python objects, so
    forked DataLoader workers share the pages instead of copying them on reference counting).
    Keyed by path, inode, size and mtime: a shard that changed is scanned again. At most
    ``MAX_BYTES`` in all; beyond that shards are simply not remembered."""

    MAX_BYTES = 128 << 20

    def __init__(self) -> None:
        self.entries: dict[tuple, tuple[bytes, np.ndarray]] = {}
        self.nbytes = 0

    @staticmethod
    def key(path, st: os.stat_result) -> tuple:
        return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def get(self, key: tuple) -> Optional[list[tuple[str, int, int]]]:
        hit = self.entries.get(key)
        if hit is None:
            return None
        names, nums = hit
        return list(zip(names.decode("utf-8", "surrogateescape").split("\0"), nums[0].tolist(),
                        nums[1].tolist())) if len(nums[0]) else []

    def put(self, key: tuple, members: list[tuple[str, int, int]]) -> None:
        if any("\0" in n for n, _, _ in members):
            return
        names = "\0".join(n for n, _, _ in members).encode("utf-8", "surrogateescape")
        nums = np.array([[o for _, o, _ in members], [z for _, _, z in members]], dtype=np.int64).reshape(2, -1)
        size = len(names) + nums.nbytes
        if self.nbytes + size <= self.MAX_BYTES:
            self.entries[key] = (names, nums)
            self.nbytes += size


_INDEX = _MemberIndex()


def shard_samples(path, fd: Optional[int] = None, remember: bool = True) -> list[tuple[str, dict[str, MemberRef]]]:
    """The samples of one shard, ``[(key, {suffix: (data offset, size)})]``, headers only.
    A shard listed before in this process (or in the process this one was forked from) is
    not read again unless it changed (see :class:`_MemberIndex`). ``remember=False``: a shard
    read now is not added to that index (a pass over a whole dataset that must not keep a
    listing per sample, e.g. ``verify``'s main process). A shard ``tarfile`` cannot read raises
    :class:`~shardsmith.formats.tar.ShardUnreadable` (a ``tarfile.ReadError`` and a user error naming it)."""
    key = _MemberIndex.key(path, os.fstat(fd) if fd is not None else os.stat(path))
    members = _INDEX.get(key)
    if members is None:
        try:
            members = tar_members(path, fd)
        except (tarfile.TarError, EOFError) as exc:  # truncated, empty, not a tar: named, with the way on
            raise ShardUnreadable(path, str(exc) or type(exc).__name__) from None
        if remember:
            _INDEX.put(key, members)
    return group_members(members)


def read_member(fd: int, ref: MemberRef, where: str = "", writable: bool = False) -> bytes | memoryview:
    """The member's bytes; ``writable=True`` reads them into fresh writable memory (a writable
    ``memoryview``, not zero-filled first: the read overwrites all of it) that a tensor can then
    use as its memory without another copy (``.pth`` members)."""
    off, size = ref
    if writable and size:
        data = np.empty(size, np.uint8).data  # bytearray(size) would first zero it: ~25 % slower reads
        if os.preadv(fd, [data], off) != size:
            raise tarfile.ReadError(f"unexpected end of data{' in ' + where if where else ''}")
        return data
    data = os.pread(fd, size, off) if size else b""
    if len(data) != size:
        raise tarfile.ReadError(f"unexpected end of data{' in ' + where if where else ''}")
    return data


def count_tar_samples(path) -> int:
    """Number of samples in one shard, from the tar headers only."""
    return len(shard_samples(path))


def read_shard_counts(folder, shards: list[str]) -> dict[str, int]:
    """Counts from ``shard_count.json``; shards it lacks (or the whole file, when absent)
    are counted once from their tar headers, with a logged warning. A file that is not
    ``{shard: int}`` raises ``ValueError``."""
    folder = Path(folder)
    path = folder / SHARD_COUNT_FILE
    counts: dict[str, int] = {}
    if path.is_file():
        data, err = wds_layout.load_shard_counts(folder)
        if err:
            raise ValueError(f"{path}: {err}")
        counts = {k: v for k, v in data.items() if k in shards}
        extra = sorted(set(data) - set(shards))
        if extra:
            log.warning("%s lists %d shard(s) not in %s (ignored): %s", path, len(extra), folder, extra[:5])
        missing = [s for s in shards if s not in counts]
        if missing:
            log.warning("%s lacks %d shard(s); counting their samples from the tar headers: %s",
                        path, len(missing), missing[:5])
    else:
        missing = list(shards)
        log.warning("%s has no %s (not written by shardsmith?); counting samples of %d shard(s) "
                    "from their tar headers once", folder, SHARD_COUNT_FILE, len(missing))
    for s in missing:
        counts[s] = count_tar_samples(folder / s)
    return {s: counts[s] for s in shards}

