"""The path rules of every source, as pure functions (no filesystem access).

A source reads only what lies inside its own folder: a folder source's root, a table's own
folder. Callers resolve symlinks first (``os.path.realpath``) and hand the resolved paths
here, so a link is judged by where it lands, not by its name:

- a table's media path, absolute or relative, must resolve inside the table's folder unless the
  source sets ``allow_outside_paths`` (else ``failed:path_outside_table_dir``);
- a folder source's entry (file or folder link) must resolve inside the source folder unless the
  source sets ``follow_symlinks`` (else ``skipped:symlink_outside_source``);
- a folder link that resolves to one of the folders it sits in is a loop (``failed:symlink_loop``).

Reasons that leave no bytes to read are listed in :data:`NO_BYTES`: the probe and ``scan``
never open such an item, so no detail can quote a refused file's content.
"""

from __future__ import annotations

import errno
from collections.abc import Collection

#: the item is refused by a rule, not broken: ``skipped:<reason>``
SKIP_REASONS = frozenset({"symlink_outside_source"})

#: source verdicts after which there are no bytes to look at (the probe never opens the file)
NO_BYTES = frozenset({
    "missing_file", "no_media_path", "path_outside_table_dir", "bad_row",
    "symlink_outside_source", "symlink_loop", "broken_symlink", "unreadable_folder",
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
