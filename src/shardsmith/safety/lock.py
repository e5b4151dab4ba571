"""An exclusive OS lock on a dataset folder, held for the whole life of a build or repair.

``hold(folder, what)`` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<folder>/.shardsmith/lock``
and writes the holder's PID and command into it; a second holder is refused at once with
:class:`FolderLockedError` naming that PID. The OS releases the lock when the holder dies
(even by ``kill -9``), so a resume is never blocked by a stale lock file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from shardsmith import formats
from shardsmith.errors import UserError


class FolderLockedError(UserError):
    """Another live process holds the folder's lock."""


class FolderNotWritableError(UserError):
    """A dataset folder that cannot be created or written (a file in its path, no permission, a read-only
    or pseudo filesystem)."""


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def cannot_write(folder: Path, exc: OSError, what: str) -> FolderNotWritableError:
    """The message for ``folder`` that ``what`` (``build``, ``repair``) cannot create or write (``exc``)."""
    why = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        part = next((q for q in [folder, *folder.parents] if q.exists() and not q.is_dir()), None)
        if part is not None:
            return FolderNotWritableError(f"{folder} cannot be a {what}'s folder: {part} is a file, not a folder; "
                                          "choose another folder (--out)")
    if exc.errno in _NOT_WRITABLE:
        return FolderNotWritableError(f"{folder}: {exc.filename or folder} cannot be written ({why}); make it "
                                      f"writable for this user, or choose another folder (--out)")
    return FolderNotWritableError(f"{folder} cannot be created or written ({why}: {exc.filename or folder}); "
                                  "choose a folder on a writable disk (--out)")


def lock_path(folder: Path) -> Path:
    return Path(folder) / formats.LOCK_FILE


def holder(folder: Path) -> str | None:
    """The text the current holder wrote (``pid=… what=…``), or None when unlocked/absent."""
    p = lock_path(folder)
    if not p.exists():
        return None
    fd = os.open(p, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextmanager
def hold(folder: str | os.PathLike, what: str, read_only: bool = False) -> Iterator[Path]:
    """Hold ``folder``'s exclusive lock for the block (``what`` names the operation in the
    refusal a second process gets); raises :class:`FolderLockedError` at once if it is held, and
    :class:`FolderNotWritableError` when the folder or its lock file cannot be created. With
    ``read_only``, a lock file that exists but cannot be opened for writing (a finished dataset made
    read-only) is locked through a read-only descriptor, for a caller that then only reads."""
    folder = Path(folder)
    p = lock_path(folder)
    writable = True
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not (read_only and exc.errno in _NOT_WRITABLE and p.is_file()):
            raise cannot_write(folder, exc, what) from None
        fd = os.open(p, os.O_RDONLY)
        writable = False  # the holder's text cannot be written
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise FolderLockedError(
                f"{folder} is in use by another shardsmith process ({who}); wait for it to finish, "
                f"or stop that process (its lock is released when it exits) and re-run this command") from None
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} {what}: {' '.join(sys.argv[:3])}\n".encode(), 0)
        yield p
    finally:
        os.close(fd)  # closing the descriptor releases the lock
