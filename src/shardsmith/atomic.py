"""Atomic file writes: write to a temporary sibling, flush + fsync, rename into place; and the
safe way to read a JSON file back (:func:`read_json`, :func:`loads_json`).

Temporary names are ``<name>.tmp-<pid>``, or a short hidden ``.<16 hex><suffix>.tmp-<pid>`` where the
long form would pass the file system's name limit (:func:`tmp_path`); :func:`remove_stale_tmp` deletes leftovers of a
killed run (they were never committed to the ledger, so nothing is lost).

Every JSON file a user can hand over or damage (a table source, ``manifest.json``, the index files
beside shards, a camera file) is parsed with :func:`loads_json` / :func:`read_json`: arrays or
objects nested deeper than Python's parser follows (``'[' * 100000``) raise :class:`JSONNestingError`,
a :class:`json.JSONDecodeError` (so a ``ValueError``), instead of a ``RecursionError`` that no
handler of bad JSON catches.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from shardsmith.safety.space import FULL_ERRNOS

TMP_MARK = ".tmp-"


def fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _name_max(folder: Path) -> int:
    """The longest file name, in bytes, the file system of ``folder`` takes (255 where it cannot be asked)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def tmp_path(path: Path) -> Path:
    """The temporary sibling ``path`` is written to: ``<name>.tmp-<pid>``, or, where that would be longer than a
    file name may be (a final name within a few bytes of the limit), the short hidden
    ``.<16 hex of the name><suffix>.tmp-<pid>`` (a leftover of either is removed by :func:`remove_stale_tmp`), so
    that only the final name's own length can stop a write."""
    pid = os.getpid()
    tmp = f"{path.name}{TMP_MARK}{pid}"
    if len(os.fsencode(tmp)) <= _name_max(path.parent):
        return path.with_name(tmp)
    suffix = path.suffix if len(os.fsencode(path.suffix)) <= 16 else ""
    digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]
    return path.with_name(f".{digest}{suffix}{TMP_MARK}{pid}")


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """Yield a binary file that appears at ``path`` only if the block completes. A write that
    fails for want of space (disk full, quota, file too large) is re-raised naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    f = open(tmp, "wb")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        try:
            f.close()
        except OSError:
            pass  # the buffered tail could not be written either: the first error is the one to report
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS and exc.filename is None:
            # a failed write names no file: name the one being written
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode("utf-8"))


class JSONNestingError(json.JSONDecodeError):
    """JSON nested too deeply for Python's parser (it raised ``RecursionError``): bad JSON to us, caught
    wherever a ``ValueError`` or ``json.JSONDecodeError`` of a user's file is."""

    MESSAGE = "arrays or objects nested too deeply to read (more levels than Python's JSON parser follows)"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE, "", 0)
        self.args = (self.MESSAGE,)  # no "line 1 column 1": the position is not known

    def __reduce__(self):
        return self.__class__, ()


def loads_json(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``, except that too deep a nesting raises :class:`JSONNestingError`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JSONNestingError() from None


def read_json(path: str | Path) -> Any:
    """The JSON document in the UTF-8 file ``path``: ``OSError`` when it cannot be read,
    ``ValueError`` (``UnicodeDecodeError``, ``json.JSONDecodeError``, :class:`JSONNestingError`) when
    it is not UTF-8 JSON."""
    return loads_json(Path(path).read_text(encoding="utf-8"))


def remove_stale_tmp(root: Path) -> list[Path]:
    """Delete ``*.tmp-<pid>`` files below ``root`` left by a killed run; return them."""
    gone = []
    if root.exists():
        for p in root.rglob(f"*{TMP_MARK}*"):
            if p.is_file():
                p.unlink()
                gone.append(p)
    return gone
