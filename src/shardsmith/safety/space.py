"""Disk space: a build that cannot fit is refused before it writes, and a full disk (or a file
size limit) mid-write ends in one message that says how to resume.

Contract
- :func:`free_bytes` is the free space of the filesystem holding ``folder`` (its nearest
  existing ancestor), as ``shutil.disk_usage`` reports it to this user.
- :func:`check_fits` raises :class:`OutOfSpaceError` when ``needed`` bytes exceed the free space,
  with a ``du``-style summary of what ``folder`` holds.
- :func:`write_failed` turns an ``OSError`` with an errno of :data:`FULL_ERRNOS` (or SQLite's
  "database or disk is full") into an :class:`OutOfSpaceError` naming the file being written, the
  bytes still needed (when estimated) and free, and "re-run the same command to resume".
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path

from shardsmith.errors import UserError

FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None)) if e is not None)
SQLITE_FULL = 13
RESUME = "re-run the same command to resume (what is written stays; nothing is redone)"


class OutOfSpaceError(UserError, OSError):
    """The output's filesystem (or a quota or file-size limit) cannot take what the build writes
    (an ``OSError`` too, so callers that catch a failed write still do)."""


def _human(n: float) -> str:
    from shardsmith.scan import human_bytes

    return human_bytes(n)


def _amount(n: int) -> str:
    """``120.6 KiB (123464 B)``; ``1000 B`` below a KiB."""
    return _human(n) if n < 1024 else f"{_human(n)} ({n} B)"


def free_bytes(folder: str | os.PathLike) -> int:
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _size(p: Path) -> int:
    if p.is_symlink() or not p.is_dir():
        return p.lstat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(p):
        for n in files:
            try:
                total += (Path(dirpath) / n).lstat().st_size
            except OSError:
                pass
    return total


def du_summary(folder: str | os.PathLike, top: int = 10) -> list[str]:
    """``du -sh *``-style lines for ``folder``'s entries, largest first (at most ``top``)."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"  {folder}: (does not exist yet)"]
    sizes = sorted(((_size(p), p.name + ("/" if p.is_dir() and not p.is_symlink() else ""))
                    for p in folder.iterdir()), reverse=True)
    if not sizes:
        return [f"  {folder}: (empty)"]
    lines = [f"  {_human(n):>10}  {name}" for n, name in sizes[:top]]
    if len(sizes) > top:
        lines.append(f"  {_human(sum(n for n, _ in sizes[top:])):>10}  ({len(sizes) - top} more)")
    return [f"  {folder} holds {_human(sum(n for n, _ in sizes))}:"] + lines


def check_fits(folder: str | os.PathLike, needed: int, what: list[str], show: str | os.PathLike | None = None) -> None:
    """Refuse a build whose estimated ``needed`` bytes (``what`` says of which outputs) exceed the
    free space of ``folder``'s filesystem, summarising what ``show`` (default ``folder``) holds."""
    free = free_bytes(folder)
    if needed <= free:
        return
    raise OutOfSpaceError(
        f"this build needs about {_amount(needed)} more but the filesystem of {folder} has "
        f"{_amount(free)} free; nothing was written to the outputs. Estimated:\n"
        + "\n".join(f"  {w}" for w in what) + "\n" + "\n".join(du_summary(show or folder))
        + f"\nFree some space (or choose an --out on another disk), then {RESUME}.")


def is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "disk is full" in str(exc)
    return False


def write_failed(exc: BaseException, folder: str | os.PathLike, ledger: str | os.PathLike,
                 needed: int | None) -> OutOfSpaceError:
    """The message for a write that failed with :func:`is_full` (``ledger``: the file named when
    SQLite failed; ``needed``: estimated bytes still to write, None when not estimated)."""
    if isinstance(exc, OSError):
        name = exc.filename or "a file of the build"
        reason = exc.strerror or os.strerror(exc.errno)
        code = errno.errorcode.get(exc.errno, str(exc.errno))
    else:
        name, reason, code = str(ledger), str(exc), "SQLITE_FULL"
    free = free_bytes(folder)
    need = f"about {_amount(needed)} still to write" if needed is not None else \
        "an amount not estimated (latent outputs)"
    hint = ("a file-size limit (ulimit -f) or the filesystem's largest file size was reached"
            if isinstance(exc, OSError) and exc.errno == errno.EFBIG else "the disk or quota is full")
    return OutOfSpaceError(
        f"cannot write {name}: {reason} ({code}): {hint}. The build needs {need}; "
        f"{_amount(free)} free on the filesystem of {folder}. Make room, then {RESUME}.")
