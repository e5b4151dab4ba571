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
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from shardsmith.errors import UserError


class SymlinkLoopError(UserError):
    """A path the user gave is, or runs through, a symlink loop."""


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
