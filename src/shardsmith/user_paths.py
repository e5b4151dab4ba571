"""Resolving a path the user gave (``--out``, a source, a dataset, ``--config`` ...) where a symlink
loop is the user's mistake, never a traceback.

Contract
- :func:`resolve_user_path` is ``Path(path).expanduser().resolve()``, except that a path that is, or
  passes through, a symlink loop (a link that leads back to itself, directly or through other links)
  raises :class:`SymlinkLoopError` (a :class:`~shardsmith.errors.UserError`: exit code 2) naming the
  path, the link and the fix. It reads only the path's own components (``os.stat``/``readlink``) and
  writes nothing. ``what`` (e.g. ``"--out"``) prefixes the path in the message.
- :func:`check_no_loop` is the same check without the result.
Every place that resolves a user's path calls it (pathlib's own ``resolve`` raises ``RuntimeError``
on a loop before Python 3.13 and returns the unresolved path after it).

:func:`user_path_exists` tells whether a path the user gave exists (a link to nothing counts, as
``os.path.lexists``); a path this user may not read (a folder on its way without search permission, or
the file or folder itself unreadable: ``chmod 000``, another user's ``chmod 700``) raises
:class:`PathPermissionError` (exit code 2): ``cannot read PATH: permission denied``, naming the folder
that denies it and the fix, where pathlib's ``Path.exists`` raises a bare ``PermissionError`` (Python 3.11).

Where a command will write (``verify --out-json``, ``decode --out``), checked before any slow work and writing
nothing that stays:
- :func:`nearest_folder`: the nearest existing folder at or above a path, where what is missing would be
  created. A folder on the way that this user may not look into is a :class:`PathNotWritableError`
  (``PATH cannot be written (permission denied on FOLDER ...)``, with the fix); a file on the way
  (``file.txt/out.json``) is a :class:`PathNotWritableError` naming that file (``... is a file, not a folder``).
- :func:`check_writable`: a folder this user cannot create a file in (no write permission, a read-only disk) is
  a :class:`PathNotWritableError` (``PATH cannot be written (Permission denied in FOLDER)``, with the fix),
  found by creating and removing a temporary file there (permission bits tell neither a read-only disk nor
  ACLs).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from shardsmith.errors import UserError


class SymlinkLoopError(UserError):
    """A path the user gave is, or runs through, a symlink loop."""


class PathPermissionError(UserError):
    """A path the user gave cannot be read by this user (permission denied on it or on a folder above it)."""


class PathNotWritableError(UserError):
    """A path the user gave for a command to write cannot be written by this user (see the module doc)."""


def _loop_link(path: Path) -> Path | None:
    """The first component of the absolute ``path`` that the system refuses as a symlink loop, else None."""
    cur = Path(path.anchor)
    for part in path.parts[1:]:
        cur = cur / part
        try:
            os.stat(cur)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return cur
            return None  # missing (or not a folder): nothing below it can loop
    return None


def _message(given: str, link: Path | None, what: str | None) -> str:
    name = f"{what} {given}" if what else given
    if link is None:
        return f"{name} is a symlink loop: remove or fix the link"
    try:
        points = f" (it points to {os.readlink(link)}, which leads back to it)"
    except OSError:
        points = ""
    shown = link if Path(given).is_absolute() else Path(os.path.relpath(link))
    if os.path.normpath(os.path.abspath(given)) == os.path.normpath(str(link)):
        return f"{name} is a symlink loop{points}: remove or fix the link"
    return f"{name}: {shown} is a symlink loop{points}: remove or fix the link"


def check_no_loop(path: str | os.PathLike, what: str | None = None) -> None:
    """Raise :class:`SymlinkLoopError` when ``path`` is or runs through a symlink loop."""
    given = os.fspath(path)
    link = _loop_link(Path(os.path.expanduser(given)).absolute())
    if link is not None:
        raise SymlinkLoopError(_message(given, link, what))


def resolve_user_path(path: str | os.PathLike, what: str | None = None) -> Path:
    """``path`` made absolute through its symlinks; a symlink loop is a :class:`SymlinkLoopError`."""
    check_no_loop(path, what)
    try:
        return Path(os.path.expanduser(os.fspath(path))).resolve()
    except RuntimeError:  # pathlib (< 3.13): "Symlink loop from ...", e.g. a loop made since the check
        raise SymlinkLoopError(_message(os.fspath(path), None, what)) from None


def _denied_at(path: Path) -> Path | None:
    """The folder of the absolute ``path`` whose permissions stop this user: the parent of the first component
    that cannot be looked at (``EACCES``), else None (every component can be looked at)."""
    cur = Path(path.anchor)
    for part in path.parts[1:]:
        nxt = cur / part
        try:
            os.lstat(nxt)
        except PermissionError:
            return cur
        except OSError:
            return None
        cur = nxt
    return None


def _owner(path: Path) -> str:
    """`` (it belongs to NAME)`` for a path another user owns, else ''."""
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return ""
    if uid == os.geteuid():
        return ""
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        name = f"user id {uid}"
    return f" (it belongs to {name})"


def permission_error(given: str | os.PathLike, blocked: str | os.PathLike | None = None,
                     what: str | None = None) -> PathPermissionError:
    """The :class:`PathPermissionError` for ``given`` that this user may not read, ``blocked`` being the
    folder (or the path itself) whose permissions deny it (found when not given)."""
    given = os.fspath(given)
    absolute = Path(os.path.abspath(os.path.expanduser(given)))
    where = Path(blocked) if blocked is not None else (_denied_at(absolute) or absolute)
    name = f"{what} {given}" if what else given
    on = "" if os.path.normpath(str(where)) == os.path.normpath(str(absolute)) else f" on {where}"
    return PathPermissionError(
        f"cannot read {name}: permission denied{on}{_owner(where)} (fix: give this user read access, e.g. "
        f"chmod u+rX {where} if you own it, or ask its owner to; or run as a user who can read it)")


def user_path_exists(path: str | os.PathLike, what: str | None = None) -> bool:
    """Whether ``path`` exists (a link to nothing counts); a path this user may not read (see the module
    doc) is a :class:`PathPermissionError`. Reads only metadata; writes nothing."""
    p = Path(os.path.expanduser(os.fspath(path)))
    try:
        st = os.lstat(p)
    except PermissionError:
        raise permission_error(path, what=what) from None
    except OSError:  # missing, a file where a folder is on its way, a loop (check_no_loop names that)
        return False
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(p)
        except PermissionError:
            raise permission_error(path, _denied_at(p.resolve()), what) from None
        except OSError:
            return True  # a link to nothing: the command says what it is
    need = os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)
    if not os.access(p, need):
        raise permission_error(path, p, what)
    return True


def _named(given: str, what: str | None) -> str:
    return f"{what} {given}" if what else given


def nearest_folder(start: str | os.PathLike, given: str | os.PathLike | None = None, what: str | None = None) -> Path:
    """The nearest existing folder at or above ``start`` (absolute, links followed), where a command writing at
    ``given`` (default: ``start``; ``what``: its flag, e.g. ``"--out"``) creates what is missing; a
    :class:`PathNotWritableError` when a folder on the way may not be looked into, or an entry on the way (or
    ``start`` itself) is a file. Reads only metadata."""
    given = os.fspath(start if given is None else given)
    name = _named(given, what)
    first = Path(os.path.abspath(os.path.expanduser(os.fspath(start))))
    def denied(where: Path) -> PathNotWritableError:
        return PathNotWritableError(
            f"{name} cannot be written (permission denied on {where}{_owner(where)}: this user may not look into "
            f"it); give this user access, e.g. chmod u+rwx {where} if you own it, or ask its owner to; or pick a "
            "folder you can write to")

    for q in (first, *first.parents):
        try:
            st = os.stat(q)
        except PermissionError:
            raise denied(_denied_at(q) or q.parent) from None
        except OSError:  # missing (created), or a file on the way (found as the loop goes up), a loop
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                os.stat(os.path.join(q, "."))  # (looking into it: the search permission the write needs)
            except PermissionError:
                raise denied(q) from None
            except OSError:
                pass
            return q
        if os.path.normpath(str(q)) == os.path.normpath(os.path.abspath(os.path.expanduser(given))):
            raise PathNotWritableError(f"{name} is a file; give a folder (it is created)")
        raise PathNotWritableError(f"{name}: {q} is a file, not a folder; give a path inside a folder")
    raise PathNotWritableError(f"{name}: no folder above it exists")  # (not reached: / exists)


def check_writable(folder: str | os.PathLike, given: str | os.PathLike, what: str | None = None) -> None:
    """A :class:`PathNotWritableError` when this user cannot create a file in the existing ``folder`` (where the
    command will write ``given``; ``what``: its flag): a temporary file is made there and removed at once."""
    import tempfile  # noqa: PLC0415

    name, folder = _named(os.fspath(given), what), Path(folder)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise PathNotWritableError(
                f"{name} cannot be written ({why} in {folder}{_owner(folder)}); give this user write access, e.g. "
                f"chmod u+w {folder} if you own it, or pick a folder you can write to") from None
        raise PathNotWritableError(f"{name} cannot be written ({why} in {folder}); pick a folder you can write "
                                   "to") from None  # (a read-only disk, no space, ...)
