"""The path rules of every source, as pure functions (no filesystem access).

A source reads only what lies inside its own folder: a folder source's root, a table's own
folder. Callers resolve symlinks first (``os.path.realpath``) and hand the resolved paths
here, so a link is judged by where it lands, not by its name:

- a table's media path, absolute or relative, must resolve inside the table's folder unless the
  source sets ``allow_outside_paths`` (else ``failed:path_outside_table_dir``);
- a folder source's entry (file or folder link) must resolve inside the source folder unless the
  source sets ``follow_symlinks`` (else ``skipped:symlink_outside_source``);
- a folder link that resolves to one of the folders it sits in is a loop (``failed:symlink_loop``);
- a table's media path has one name however it is spelled (:func:`table_name`): ``a//b.mp4``,
  ``./a/b.mp4``, ``a/../a/b.mp4`` and its absolute path are ``a/b.mp4``, as a folder source names it.

Reasons that leave no bytes to read are listed in :data:`NO_BYTES`: the probe and ``scan``
never open such an item, so no detail can quote a refused file's content.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Collection

#: a media name that is a named pipe, a device or a socket: opening it could block forever or read without end
NOT_REGULAR = "not_a_regular_file"

#: a media path that is not valid UTF-8 (a Latin-1 name): no output, manifest or ledger can hold it; never opened
NAME_NOT_UTF8 = "name_not_utf8"

#: the item is refused by a rule, not broken: ``skipped:<reason>``
SKIP_REASONS = frozenset({"symlink_outside_source"})

#: source verdicts after which there are no bytes to look at (the probe never opens the file)
NO_BYTES = frozenset({
    "missing_file", "no_media_path", "path_outside_table_dir", "bad_row",
    "symlink_outside_source", "symlink_loop", "broken_symlink", "unreadable_folder", NOT_REGULAR,
    NAME_NOT_UTF8,
})


def within(target: str, root: str) -> bool:
    """True when ``target`` is ``root`` or lies under it. Both are absolute, resolved,
    normalised paths; the test is on path components (``/a/bc`` is not inside ``/a/b``)."""
    if target == root:
        return True
    prefix = root if root.endswith("/") else root + "/"
    return target.startswith(prefix)


def table_target(raw: str, table_dir: str) -> str:
    """Where a table's media path points before symlinks are resolved: an absolute path as
    written, a relative one joined to the table's folder."""
    return raw if raw.startswith("/") else f"{table_dir.rstrip('/')}/{raw}"


def clean(path: str, parents: bool = True) -> str:
    """``path`` (``/``-separated) spelled once, by its components alone (no filesystem access): repeated
    slashes and ``.`` components dropped (``a//b.mp4``, ``./a/b.mp4``, ``a/./b.mp4/`` -> ``a/b.mp4``); with
    ``parents``, ``x/..`` removed as well (``a/../a/b.mp4`` -> ``a/b.mp4``; ``/..`` is ``/``), a leading ``..``
    of a relative path kept (``../x.mp4``). An absolute path stays absolute (one leading slash); a path that
    names its start is ``.`` (or ``/``). Without ``parents`` every ``..`` stays where it is: that spelling
    names the same file as ``path`` even where a symbolic link comes before a ``..``."""
    absolute = path.startswith("/")
    kept: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parents:
            if kept and kept[-1] != "..":
                kept.pop()
                continue
            if absolute:
                continue
        kept.append(part)
    text = "/".join(kept)
    return f"/{text}" if absolute else text or "."


def table_name(raw: str, table_dirs: Collection[str], parents: bool = True) -> str:
    """The one spelling of a table's media path ``raw`` that every row naming the same file shares, so that
    a file listed twice (``a/b.mp4``, ``a//b.mp4``, ``./a/b.mp4``, ``a/../a/b.mp4``, its absolute path) is
    one name, the one a folder source at the table's folder gives it: ``raw`` :func:`clean` (``parents`` as
    there), then, where it lies under one of ``table_dirs`` (the table's folder, absolute and normalised: as
    written and with links resolved), relative to that folder (a relative ``raw`` is taken from the first
    of ``table_dirs``, so ``../<table folder>/a/b.mp4`` is ``a/b.mp4`` too). A path outside them stays as
    written, cleaned (``../x.mp4``, ``/elsewhere/x.mp4``): the path rules refuse it unless the source allows
    outside paths. Pure: a caller that may meet a symbolic link before a ``..`` (or in ``table_dirs``) checks
    that the name resolves where ``raw`` does, else uses ``clean(raw, parents=False)``."""
    if not table_dirs:
        return clean(raw, parents)
    dirs = list(table_dirs)
    full = clean(raw if raw.startswith("/") else f"{dirs[0].rstrip('/')}/{raw}", parents)
    for d in dirs:
        if within(full, d):
            return full[len(d):].lstrip("/") or "."
    return clean(raw, parents)


def special_file(path: str) -> str | None:
    """What ``path`` (links followed) is when it exists and is not a regular file or a folder: ``"a named pipe
    (FIFO)"``, ``"a character device"``, ``"a block device"``, ``"a socket"``; else None. One ``stat``, no open."""
    import stat  # noqa: PLC0415

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


class NotRegularFile(OSError):
    """A listed path that is, by the time it is read, a named pipe, a device or a socket (``what``)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def open_regular(path: str):
    """``path`` opened for reading (a binary file object), refused (:class:`NotRegularFile`) unless it is a
    regular file: the open does not block on a named pipe (``O_NONBLOCK``) and nothing is read from a pipe or
    a device. Other failures raise ``OSError`` as ``open`` does."""
    import stat  # noqa: PLC0415

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(special_file(path) or "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_regular_error(path: str, what: str) -> tuple[str, str]:
    """The source verdict for a media name that is ``what`` (:func:`special_file`): never opened."""
    return NOT_REGULAR, (f"{path} is {what}, not a regular file; it is not read (opening it could wait forever "
                         "or read without end); remove it, or copy its media into a regular file")


def status_of(reason: str) -> str:
    """The ledger status of a source verdict: ``skipped:<reason>`` for rule refusals, else
    ``failed:<reason>``."""
    return f"{'skipped' if reason in SKIP_REASONS else 'failed'}:{reason}"


def read_error_reason(err: int | None) -> str:
    """The reason for an ``OSError`` (its ``errno``) met reading a file the source listed:
    gone since the listing -> ``vanished``; a link loop -> ``symlink_loop``; else ``unreadable``."""
    if err in (errno.ENOENT, errno.ENOTDIR):
        return "vanished"
    if err == errno.ELOOP:
        return "symlink_loop"
    return "unreadable"


def is_loop(real_dir: str, ancestors: Collection[str]) -> bool:
    """True when a folder resolves to itself or to a folder it sits in (walking it never ends)."""
    return real_dir in ancestors
