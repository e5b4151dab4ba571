"""The ``--overwrite`` swap: a new build made in the hidden sibling ``.<out>.shardsmith-next``
replaces the old one only once complete, and the user's files of the old folder move into the
new one.

Contract
- :func:`swap_in` marks the old build's ledger ``superseded``, then exchanges the two folders
  in one ``renameat2(RENAME_EXCHANGE)`` (``--out`` never stops existing, so a process arriving
  meanwhile always meets a lock this build holds) or, where the filesystem cannot, renames the
  old folder to ``.<out>.shardsmith-old`` and the new one into place; then
  :func:`~shardsmith.safety.outdir.retire` carries the user's files into the new folder and
  removes the old build's own files. Returns what was carried.
- :func:`finish_interrupted` completes a swap a crash cut short (the caller holds the locks).
- The caller holds the lock of both folders for the whole swap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from shardsmith import formats
from shardsmith.safety.outdir import all_files, is_build, prune_empty_dirs, retire

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def next_sibling(out: Path) -> Path:
    return out.parent / f".{out.name}.shardsmith-next"


def old_sibling(out: Path) -> Path:
    return out.parent / f".{out.name}.shardsmith-old"


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two existing paths; False where the system or filesystem cannot."""
    libc = _libc()
    fn = getattr(libc, "renameat2", None) if libc is not None else None
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _meta(folder: Path, key: str):
    from shardsmith.plan.ledger import Ledger

    return Ledger.peek(folder / formats.LEDGER_FILE, key)[0] if is_build(folder) else None


def _complete(folder: Path) -> bool:
    return (folder / formats.MANIFEST_FILE).is_file() and bool(_meta(folder, "complete"))


def vacant(out: Path) -> bool:
    """``out`` is missing, or holds nothing but a lock (``.shardsmith/lock``)."""
    if not out.exists():
        return True
    if not out.is_dir() or [p.name for p in out.iterdir()] != [formats.STATE_DIR]:
        return False
    state = out / formats.STATE_DIR
    return state.is_dir() and {p.name for p in state.iterdir()} <= {Path(formats.LOCK_FILE).name}


def _remove_vacant(folder: Path) -> None:
    (folder / formats.LOCK_FILE).unlink(missing_ok=True)
    for d in (folder / formats.STATE_DIR, folder):
        if d.is_dir():
            d.rmdir()


def _move_into_place(new: Path, out: Path) -> None:
    """``new`` becomes ``out``, which is missing or :func:`vacant`."""
    if out.exists():
        if exchange(new, out):
            _remove_vacant(new)
            return
        _remove_vacant(out)
    os.replace(new, out)


def swap_in(new: Path, out: Path) -> list[str]:
    from shardsmith.plan.ledger import Ledger

    if not out.exists() or vacant(out):
        _move_into_place(new, out)
        return []
    if is_build(out):
        led = Ledger(out / formats.LEDGER_FILE)
        try:
            led.set_meta("superseded", True)  # after an exchange, tells the old build from a new one
        finally:
            led.close()
    if exchange(new, out):
        return retire(new, out)
    old = old_sibling(out)
    os.replace(out, old)
    os.replace(new, out)
    return retire(old, out)


def finish_interrupted(out: Path) -> list[str]:
    """Complete a swap a crash interrupted; return the user's files carried."""
    nxt, old = next_sibling(out), old_sibling(out)
    carried: list[str] = []
    if nxt.is_dir() and _meta(nxt, "superseded") and is_build(out):
        carried += retire(nxt, out)  # exchanged: the old build waits under the sibling's name
    if vacant(out) and nxt.is_dir() and _complete(nxt):
        _move_into_place(nxt, out)  # renamed away, the new one not yet into place
    if old.is_dir() and is_build(out):
        carried += retire(old, out)
    if nxt.is_dir() and not is_build(nxt) and not all_files(nxt) - {formats.LOCK_FILE}:
        (nxt / formats.LOCK_FILE).unlink(missing_ok=True)  # a retired build's emptied folder (a crash before
        prune_empty_dirs(nxt, keep_root=False)  # its last rmdir)
    return carried
