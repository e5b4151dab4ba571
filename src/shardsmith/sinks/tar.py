"""Deterministic tar writing: same members in the same order give the same bytes.

``webdataset.TarWriter`` stamps the current time into every header, so two runs of one
recipe would differ; here mtime, owner and mode are fixed, and the format is PAX (long
names allowed), which ``tarfile`` and ``webdataset`` read.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import BinaryIO

FIXED_MTIME = 946684800  # 2000-01-01T00:00:00Z


class HashingWriter:
    """A write-only file wrapper that sha256-hashes and counts what passes through."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.size


class DeterministicTar:
    def __init__(self, fileobj: BinaryIO):
        self.tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT)

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = FIXED_MTIME
        info.mode = 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self.tar.close()
