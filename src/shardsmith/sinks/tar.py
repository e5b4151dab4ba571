"""Deterministic tar writing: same members in the same order give the same bytes.

``webdataset.TarWriter`` stamps the current time into every header, so two runs of one
recipe would differ; here mtime, owner and mode are fixed, and the format is PAX (long
names allowed), which ``tarfile`` and ``webdataset`` read.
"""

from __future__ import annotations

import hashlib
import tarfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

from shardsmith.formats.tar import padding

FIXED_MTIME = 946684800  # 2000-01-01T00:00:00Z


class HashingWriter:
    """A write-only file wrapper that sha256-hashes and counts what passes through.

    Large immutable buffers (``bytes`` of ``ASYNC_HASH_BYTES`` or more) are hashed on a helper
    thread while the file write of the same bytes runs (both release the interpreter lock), in
    the order written; smaller or mutable ones are hashed at once, after the helper has caught
    up. :meth:`hexdigest` waits for the helper."""

    ASYNC_HASH_BYTES = 1 << 16

    def __init__(self, f: BinaryIO):
        self.f, self._sha256, self.size = f, hashlib.sha256(), 0
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None  # the helper's latest update (it runs them in order)

    def write(self, data) -> int:
        if type(data) is bytes and len(data) >= self.ASYNC_HASH_BYTES:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsmith-sha256")
            self._last = self._pool.submit(self._sha256.update, data)
        else:
            self._catch_up()
            self._sha256.update(data)
        self.size += len(data)
        return self.f.write(data)

    def _catch_up(self) -> None:
        if self._last is not None:
            self._last.result()
            self._last = None

    def hexdigest(self) -> str:
        """The sha256 of everything written (waits for the helper, then stops it)."""
        self._catch_up()
        self.close()
        return self._sha256.hexdigest()

    def close(self) -> None:
        """Stop the helper thread (after its queued updates); the file is the caller's to close."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def tell(self) -> int:
        return self.size


class DeterministicTar:
    def __init__(self, fileobj: BinaryIO):
        self.tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT)

    def add(self, name: str, data: bytes) -> None:
        """Append one member: the bytes ``tarfile.addfile`` writes, with the data written in one
        piece (``addfile`` copies it through a 16 KiB buffer)."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = FIXED_MTIME
        info.mode = 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        t = self.tar
        header = info.tobuf(t.format, t.encoding, t.errors)
        pad = padding(len(data))
        t.fileobj.write(header)
        if data:
            t.fileobj.write(data)
        if pad:
            t.fileobj.write(tarfile.NUL * pad)
        t.offset += len(header) + len(data) + pad

    def close(self) -> None:
        self.tar.close()
